//! The HTTP surface: the router (the one list of routes), health, token minting and
//! fallbacks.

use super::preview;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri};
use axum::routing::{get, post, put};
use axum::{Json, Router};

use super::auth;
use super::bodies::{self, JsonBody};
use super::constants::MAX_API_BODY;
use super::error::ApiError;
use super::power;
use super::sandboxes;
use super::secrets;
use super::state::Relay;
use super::tunnel;
use crate::caller::Caller;
use tether_client::api::{TokenRequest, TokenResponse};
use tether_store::{Role, Tenant};

/// Every route of the relay; see [`tether_client::api`] for the contract. API bodies are
/// read by [`bodies::guard`] within `body_timeout`.
pub(super) fn router(relay: Arc<Relay>, body_timeout: Duration) -> Router {
    let api = Router::new()
        .route("/v1/health", get(health))
        .route(
            "/v1/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(sandboxes::get).delete(sandboxes::delete),
        )
        .route("/v1/sandboxes/{id}/renew", post(sandboxes::renew))
        .route("/v1/sandboxes/{id}/pause", post(power::pause))
        .route("/v1/sandboxes/{id}/resume", post(power::resume))
        .route("/v1/sandboxes/{id}/stop", post(power::stop))
        .route("/v1/sandboxes/{id}/start", post(power::start))
        .route("/v1/orphans", get(super::orphans::list))
        .route("/v1/sandboxes/{id}/ws", get(tunnel::open))
        .route("/v1/tokens", post(create_token))
        .route("/v1/secrets", get(secrets::list))
        .route(
            "/v1/secrets/{name}",
            put(secrets::put).delete(secrets::delete),
        )
        .merge(super::hop::routes())
        // A route layer: an unknown path is answered 404 without reading its body.
        .route_layer(axum::middleware::from_fn_with_state(
            body_timeout,
            bodies::guard,
        ))
        // The guard's limit is the one that applies; the extractors' own must not be lower.
        .layer(DefaultBodyLimit::max(MAX_API_BODY));
    Router::new()
        .merge(api)
        .merge(preview::routes())
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        // Outermost, so `{port}-{id}.localhost` hosts never reach the API routes.
        .layer(axum::middleware::from_fn_with_state(
            relay.clone(),
            preview::by_host,
        ))
        .with_state(relay)
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok", "version": tether_proto::TETHER_VERSION }))
}

async fn create_token(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    JsonBody(req): JsonBody<TokenRequest>,
) -> Result<(StatusCode, Json<TokenResponse>), ApiError> {
    let tenant = Tenant::parse(&req.tenant).map_err(|e| ApiError::Invalid(e.to_string()))?;
    let relay_admin_file = relay.admin_token_file.display();
    match caller.role {
        Role::RelayAdmin => {}
        Role::Member => {
            return Err(ApiError::Forbidden(format!(
                "only admin tokens may mint tokens, and tenant {}'s token is not one; use the \
                 relay's admin token in {relay_admin_file}",
                caller.tenant
            )))
        }
        Role::Admin if req.admin => {
            return Err(ApiError::Forbidden(format!(
                "only the relay's own admin token (in {relay_admin_file}) mints admin tokens; \
                 tenant {}'s admin token mints member tokens only",
                caller.tenant
            )))
        }
        Role::Admin if tenant != caller.tenant => {
            return Err(ApiError::Forbidden(format!(
                "tenant {}'s admin token mints tokens for tenant {} only, not for {tenant}; \
                 use the relay's admin token in {relay_admin_file}",
                caller.tenant, caller.tenant
            )))
        }
        Role::Admin => {}
    }
    let role = if req.admin { Role::Admin } else { Role::Member };
    let token = auth::create_token(&relay.store, tenant.clone(), role).await?;
    let tenant = tenant.to_string();
    Ok((StatusCode::CREATED, Json(TokenResponse { token, tenant })))
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!(
        "no endpoint {method} {}; the relay serves /v1/sandboxes, /v1/secrets, /v1/tokens and \
         /v1/health",
        uri.path()
    ))
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!(
        "{method} is not allowed on {}; see the relay's API for the methods it takes",
        uri.path()
    ))
}

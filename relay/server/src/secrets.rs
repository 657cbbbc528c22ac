//! The secret store's routes: `PUT /v1/secrets/{name}`, `GET /v1/secrets` and
//! `DELETE /v1/secrets/{name}`, on the caller's tenant (the relay's admin token may name
//! another with `?tenant=T`).
//!
//! No answer, error or log line carries a value: bodies are read by hand, so a malformed one
//! is described without being quoted, and what is logged is names and tenants.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use tracing::info;

use super::constants::MAX_SECRETS_PER_TENANT;
use super::error::ApiError;
use super::state::{now_ms, Relay};
use crate::caller::Caller;
use tether_client::api::{check_secret_name, check_secret_value, SecretInfo, SecretValue};
use tether_store::{Role, StoredSecret, Tenant};

/// `PUT /v1/secrets/{name}`: 201 when new, 200 when it replaced a value.
pub(super) async fn put(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<SecretInfo>), ApiError> {
    let tenant = target_tenant(&relay, &caller, query.as_deref())?;
    check_secret_name(&name).map_err(ApiError::Invalid)?;
    let body = body.map_err(super::bodies::rejection)?;
    let value = parse_value(&body)?;
    check_secret_value(&name, value.expose()).map_err(ApiError::Invalid)?;
    let put = relay
        .store
        .put_secret(&tenant, &name, &value, now_ms(), MAX_SECRETS_PER_TENANT);
    let Some((stored, created)) = put.await? else {
        return Err(ApiError::Forbidden(format!(
            "tenant {tenant} holds {MAX_SECRETS_PER_TENANT} secrets, the most a tenant may; \
             delete some (`tether secret rm NAME`) or replace one"
        )));
    };
    info!(
        tenant = %tenant,
        secret = %name,
        "{} secret {name} of tenant {tenant}",
        if created { "stored" } else { "replaced" }
    );
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(secret_info(&tenant, stored))))
}

/// `GET /v1/secrets`: names and times, by name.
pub(super) async fn list(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<SecretInfo>>, ApiError> {
    let tenant = target_tenant(&relay, &caller, query.as_deref())?;
    let stored = relay.store.secrets(&tenant).await?;
    Ok(Json(
        stored
            .into_iter()
            .map(|s| secret_info(&tenant, s))
            .collect(),
    ))
}

/// `DELETE /v1/secrets/{name}`: 204, or 404 when the tenant holds no such secret.
pub(super) async fn delete(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, ApiError> {
    let tenant = target_tenant(&relay, &caller, query.as_deref())?;
    check_secret_name(&name).map_err(ApiError::Invalid)?;
    if !relay.store.remove_secret(&tenant, &name).await? {
        return Err(ApiError::NotFound(format!(
            "tenant {tenant} has no secret {name}; `tether secret list` lists them"
        )));
    }
    info!(tenant = %tenant, secret = %name, "deleted secret {name} of tenant {tenant}");
    Ok(StatusCode::NO_CONTENT)
}

/// The tenant whose store a request acts on: the caller's, or the one `?tenant=T` names,
/// which only the relay's admin token may name when it is not its own.
fn target_tenant(relay: &Relay, caller: &Caller, query: Option<&str>) -> Result<Tenant, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|e| ApiError::Invalid(format!("malformed query string: {e}")))?;
    let mut named = None;
    for (key, value) in pairs {
        if key != "tenant" || named.is_some() {
            return Err(ApiError::Invalid(format!(
                "unexpected query parameter `{key}`; the secret routes take one `tenant=NAME` \
                 at most"
            )));
        }
        named = Some(Tenant::parse(&value).map_err(|e| ApiError::Invalid(e.to_string()))?);
    }
    let Some(tenant) = named.filter(|t| *t != caller.tenant) else {
        return Ok(caller.tenant.clone());
    };
    if caller.role == Role::RelayAdmin {
        return Ok(tenant);
    }
    Err(ApiError::Forbidden(format!(
        "tenant {}'s token manages tenant {}'s secrets only, not tenant {tenant}'s; use the \
         relay's admin token (in {}) to manage another tenant's",
        caller.tenant,
        caller.tenant,
        relay.admin_token_file.display()
    )))
}

/// The value in a `{"value": "..."}` body. A malformed body is described, never quoted: it may
/// be the secret.
fn parse_value(body: &[u8]) -> Result<SecretValue, ApiError> {
    let shape = "the body must be a JSON object with one field, a string: {\"value\": \"...\"}";
    let parsed: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        // Line and column only: serde_json's message may quote the text it choked on.
        ApiError::Invalid(format!(
            "{shape}; the body is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    let serde_json::Value::Object(mut fields) = parsed else {
        return Err(ApiError::Invalid(format!("{shape}; it is not an object")));
    };
    if fields.keys().any(|k| k != "value") {
        return Err(ApiError::Invalid(format!(
            "{shape}; it has other fields than `value`"
        )));
    }
    match fields.remove("value") {
        Some(serde_json::Value::String(value)) => Ok(SecretValue::new(value)),
        Some(_) => Err(ApiError::Invalid(format!(
            "{shape}; `value` is not a string"
        ))),
        None => Err(ApiError::Invalid(format!("{shape}; `value` is missing"))),
    }
}

fn secret_info(tenant: &Tenant, stored: StoredSecret) -> SecretInfo {
    SecretInfo {
        name: stored.name,
        tenant: tenant.to_string(),
        created_ms: stored.created_ms,
        updated_ms: stored.updated_ms,
    }
}

//! The fake preview proxy: one listener on `127.0.0.1` per sandbox port asked for, its URL
//! handed out by `preview-url`. Like Daytona's proxy it first tries an `Authorization: Bearer`
//! as a Daytona credential (an API key), counting a refusal in the failed-auth limiter; then
//! the sandbox's current preview token in `X-Daytona-Preview-Token` (or the
//! `DAYTONA_SANDBOX_AUTH_KEY` query parameter), which it strips; anything else is answered
//! 401, as newer Daytona does (older versions redirected with 307). A public sandbox needs no
//! token. The request is then carried to the port inside ([`crate::edge`]).

use std::sync::{Arc, Weak};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;

use super::Daytona;
use crate::edge::{self, PortListener, ProxyError};
use crate::serve::rfc3339;

/// The header the preview token comes in.
const TOKEN_HEADER: &str = "x-daytona-preview-token";
/// The query parameter it may come in instead.
const TOKEN_QUERY: &str = "DAYTONA_SANDBOX_AUTH_KEY";

#[derive(Clone)]
struct Target {
    fake: Weak<Daytona>,
    id: String,
    port: u16,
}

/// The preview URL of `port` in sandbox `id`, opening its listener on first use.
pub(super) async fn url(fake: &Arc<Daytona>, id: &str, port: u16) -> std::io::Result<String> {
    let key = (id.to_string(), port);
    if let Some(listener) = fake.previews.lock().expect("previews").get(&key) {
        return Ok(format!("http://{}", listener.addr));
    }
    let target = Target {
        fake: Arc::downgrade(fake),
        id: id.to_string(),
        port,
    };
    let listener = PortListener::bind(Router::new().fallback(serve).with_state(target)).await?;
    let mut previews = fake.previews.lock().expect("previews");
    let listener = previews.entry(key).or_insert(listener);
    Ok(format!("http://{}", listener.addr))
}

/// Closes every preview listener of sandbox `id`.
pub(super) fn close(fake: &Daytona, id: &str) {
    fake.previews
        .lock()
        .expect("previews")
        .retain(|(sandbox, _), _| sandbox != id);
}

async fn serve(State(target): State<Target>, mut req: Request) -> Response {
    let Some(fake) = target.fake.upgrade() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let path = req.uri().path().to_string();
    if let Some(retry) = fake.failed_auth.blocked() {
        return super::limiter::too_many(&path, retry);
    }
    let Some(sandbox) = fake.find(&target.id) else {
        return proxy_error(StatusCode::NOT_FOUND, &path, "sandbox not found");
    };
    // A bearer is tried first, as a Daytona credential; a refused one counts against the
    // caller, and is passed on (the proxy does not strip it).
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|a| a.to_str().ok())
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(|b| b.trim().to_string());
    let bearer_ok = match bearer {
        Some(b) if b == fake.config.api_key => true,
        Some(_) => {
            tracing::info!("preview proxy: refused a bearer for {path}");
            if let Some(retry) = fake.failed_auth.fail() {
                return super::limiter::too_many(&path, retry);
            }
            false
        }
        None => false,
    };
    let header_token = req
        .headers()
        .get(TOKEN_HEADER)
        .and_then(|t| t.to_str().ok())
        .map(str::to_string);
    let query_token = req
        .uri()
        .query()
        .and_then(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).ok())
        .and_then(|pairs| {
            pairs
                .into_iter()
                .find(|(k, _)| k == TOKEN_QUERY)
                .map(|(_, v)| v)
        });
    req.headers_mut().remove(TOKEN_HEADER);
    let authed = sandbox.public
        || bearer_ok
        || header_token.as_deref() == Some(sandbox.auth_token.as_str())
        || query_token.as_deref() == Some(sandbox.auth_token.as_str());
    if !authed {
        return proxy_error(
            StatusCode::UNAUTHORIZED,
            &path,
            "missing authentication: provide a preview access token (via header, query \
             parameter, or cookie) or use an API key or JWT",
        );
    }
    if sandbox.state != "started" {
        return proxy_error(
            StatusCode::BAD_GATEWAY,
            &path,
            &format!("sandbox is {}", sandbox.state),
        );
    }
    match edge::proxy(&fake.sandboxes, &target.id, target.port, req).await {
        Ok(resp) => resp,
        Err(ProxyError::Dial(e)) => proxy_error(
            StatusCode::BAD_GATEWAY,
            &path,
            &format!("failed to proxy request: {e}"),
        ),
        Err(e) => proxy_error(StatusCode::BAD_GATEWAY, &path, &e.to_string()),
    }
}

/// The proxy's error body (`common-go`'s): `{statusCode, message, code, timestamp, path, method}`.
fn proxy_error(status: StatusCode, path: &str, message: &str) -> Response {
    let body = json!({
        "statusCode": status.as_u16(),
        "message": message,
        "code": status.canonical_reason().unwrap_or("").to_uppercase().replace(' ', "_"),
        "timestamp": rfc3339(std::time::SystemTime::now()),
        "path": path,
        "method": "GET",
    });
    (status, Json(body)).into_response()
}

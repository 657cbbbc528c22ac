//! The owner's side of the relay-to-relay hop: `GET /v1/cluster/sandboxes/{id}/ws` joins a
//! peer's WebSocket to the sandbox's agent (carried as the tunnel carries a client's, spliced
//! or forwarded, so flow control stays end to end); `DELETE /v1/cluster/sandboxes/{id}`
//! deletes the sandbox at its provider (the peer then forgets it in the database), and
//! `POST .../pause`, `.../resume`, `.../stop` and `.../start` change its state there. Each
//! takes a grant only, never an API token: a request without a valid one is a 401, whatever
//! it carries.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tracing::debug;

use crate::cluster::grant::{Grant, Op, GRANT_HEADER};
use crate::error::ApiError;
use crate::state::{now_ms, Relay};
use crate::tunnel::{admit, carry_session, ClientUpgrade};
use tether_relay_core::provider::{ProviderError, SandboxState};
use tether_store::{SandboxId, SandboxRecord, Tenant};

/// The cluster routes, for the router to merge.
pub(crate) fn routes() -> Router<Arc<Relay>> {
    Router::new()
        .route("/v1/cluster/sandboxes/{id}/ws", get(session))
        .route("/v1/cluster/sandboxes/{id}", axum::routing::delete(delete))
        .route("/v1/cluster/sandboxes/{id}/pause", post(pause))
        .route("/v1/cluster/sandboxes/{id}/resume", post(resume))
        .route("/v1/cluster/sandboxes/{id}/stop", post(stop))
        .route("/v1/cluster/sandboxes/{id}/start", post(start))
}

/// Checks the request's grant for `op` on sandbox `id`.
fn granted(relay: &Relay, headers: &HeaderMap, op: Op, id: &str) -> Result<Grant, ApiError> {
    let presented = headers.get(GRANT_HEADER).and_then(|v| v.to_str().ok());
    relay
        .cluster
        .grants
        .verify(presented, op, id, &relay.node, now_ms())
        .map_err(|refused| {
            debug!("refused a relay-to-relay request for sandbox {id}: {refused}");
            ApiError::PeerRefused(refused.to_string())
        })
}

/// The granted tenant's sandbox `id`, which must be on this relay's host.
async fn owned(relay: &Relay, grant: &Grant, id: &str) -> Result<Option<SandboxRecord>, ApiError> {
    let tenant = Tenant::parse(&grant.tenant).map_err(|e| ApiError::Invalid(e.to_string()))?;
    let id = SandboxId::from(id.to_string());
    let Some(sandbox) = relay.store.get(&tenant, &id).await? else {
        return Ok(None);
    };
    if !relay.is_here(&sandbox) {
        return Err(ApiError::Invalid(format!(
            "sandbox {id} is not on this relay's host (relay {}); ask its owner",
            relay.node
        )));
    }
    Ok(Some(sandbox))
}

/// `GET /v1/cluster/sandboxes/{id}/ws`.
async fn session(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    upgrade: Result<ClientUpgrade, ApiError>,
) -> Result<Response, ApiError> {
    let grant = granted(&relay, &headers, Op::Session, &id)?;
    let upgrade = upgrade?;
    let sandbox = owned(&relay, &grant, &id)
        .await?
        .ok_or_else(|| ApiError::no_sandbox(&SandboxId::from(id.clone())))?;
    if sandbox.state == SandboxState::Dead {
        return Err(ApiError::dead(&sandbox.id));
    }
    let provider = relay.provider_of(&sandbox)?;
    let guard = admit(&relay, &sandbox.id)?;
    let agent = match provider.connect(&sandbox.handle()).await {
        Ok(agent) => agent,
        Err(e @ ProviderError::Gone(_)) => {
            return Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e))
        }
        Err(ProviderError::Unavailable(message)) => return Err(ApiError::Unavailable(message)),
        Err(e) => {
            return Err(ApiError::Provider(format!(
                "cannot reach the agent of sandbox {}: {e:#}",
                sandbox.id
            )))
        }
    };
    debug!(
        "tunnel from relay {} to sandbox {} open",
        grant.from, sandbox.id
    );
    // The entry relay keeps the sandbox alive at its provider and touches it; this side
    // only carries the session.
    Ok(carry_session(relay, upgrade, agent, guard, None))
}

/// `DELETE /v1/cluster/sandboxes/{id}`: 204 once the provider has no such sandbox.
async fn delete(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let grant = granted(&relay, &headers, Op::Delete, &id)?;
    let Some(sandbox) = owned(&relay, &grant, &id).await? else {
        return Ok(StatusCode::NO_CONTENT);
    };
    let provider = relay.provider_of(&sandbox)?;
    let work_relay = relay.clone();
    relay
        .detached(async move {
            match provider.delete(&sandbox.handle()).await {
                Ok(()) | Err(ProviderError::Gone(_)) => {}
                Err(e) => return Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e)),
            }
            work_relay.egress.detach(&sandbox.id);
            Ok(())
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/cluster/sandboxes/{id}/pause`: 204 once the provider has paused it.
async fn pause(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    act(&relay, &headers, Op::Pause, &id).await
}

/// `POST /v1/cluster/sandboxes/{id}/resume`: 204 once the provider has resumed it.
async fn resume(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    act(&relay, &headers, Op::Resume, &id).await
}

/// `POST /v1/cluster/sandboxes/{id}/stop`: 204 once the provider has stopped it.
async fn stop(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    act(&relay, &headers, Op::Stop, &id).await
}

/// `POST /v1/cluster/sandboxes/{id}/start`: 204 once the provider has started it (and this
/// relay, its owner, has recorded its new metadata and attached its egress proxy).
async fn start(
    State(relay): State<Arc<Relay>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    act(&relay, &headers, Op::Start, &id).await
}

/// Pauses, resumes, stops or starts (`op`) the granted sandbox at its provider; the entry
/// relay records its new state.
async fn act(relay: &Relay, headers: &HeaderMap, op: Op, id: &str) -> Result<StatusCode, ApiError> {
    let grant = granted(relay, headers, op, id)?;
    let mut sandbox = owned(relay, &grant, id)
        .await?
        .ok_or_else(|| ApiError::no_sandbox(&SandboxId::from(id.to_string())))?;
    let provider = relay.provider_of(&sandbox)?;
    relay
        .act_at_provider(op, &*provider, &mut sandbox)
        .await
        .map_err(|e| ApiError::provider(&sandbox.provider, Some(&sandbox.id), e))?;
    Ok(StatusCode::NO_CONTENT)
}

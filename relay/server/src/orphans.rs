//! Orphans: sandboxes at a provider that carry Tether's id label (local: a sandbox directory
//! under this relay's data directory) but that the store does not know, left behind by a
//! relay that crashed between a provider's create and its own record, that lost its data
//! directory or its database, or kept at start because nothing proved them its own to remove
//! (`recovery`). The relay admin lists them (`GET /v1/orphans`, `tether ls --orphans`) and
//! removes them (`DELETE /v1/sandboxes/{id}` of an orphan's id). Each provider is asked live;
//! nothing is deleted without being asked.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use tether_client::api::{Orphan, OrphanList, ProviderProblem};

use super::error::ApiError;
use super::state::Relay;
use crate::caller::Caller;
use tether_relay_core::provider::{ProviderError, SandboxHandle};
use tether_store::Role;

/// Refuses everyone but the relay admin: orphans belong to no tenant.
fn relay_admin_only(relay: &Relay, caller: &Caller) -> Result<(), ApiError> {
    if caller.role == Role::RelayAdmin {
        return Ok(());
    }
    Err(ApiError::Forbidden(format!(
        "orphans belong to no tenant: only the relay's admin token (in {}) lists and removes \
         them",
        relay.admin_token_file.display()
    )))
}

/// Every orphan at every configured provider.
pub(super) async fn find(relay: &Relay) -> Result<OrphanList, ApiError> {
    let known: HashSet<(String, String)> = relay
        .store
        .all()
        .await?
        .into_iter()
        .map(|s| (s.provider.clone(), s.provider_ref.clone()))
        .collect();
    // A create in flight (journaled, not yet registered) is not an orphan: `--rm` would race
    // it. One interrupted by a crash is the start-up recovery's, which removes it.
    let creating: HashSet<String> = relay
        .store
        .pending_creates(None)
        .await?
        .into_iter()
        .map(|p| p.id.to_string())
        .collect();
    let mut list = OrphanList::default();
    for (name, provider) in &relay.providers {
        let labelled = match provider.labelled().await {
            Ok(Some(labelled)) => labelled,
            Ok(None) => continue,
            // Not configured here: it can hold no sandbox of this relay's.
            Err(ProviderError::Auth(_)) => continue,
            Err(e) => {
                list.unreachable.push(ProviderProblem {
                    provider: name.to_string(),
                    error: e.to_string(),
                });
                continue;
            }
        };
        list.orphans.extend(
            labelled
                .into_iter()
                .filter(|l| !known.contains(&(name.to_string(), l.provider_ref.clone())))
                .filter(|l| !creating.contains(&l.id))
                .map(|l| Orphan {
                    id: l.id,
                    provider: name.to_string(),
                    provider_ref: l.provider_ref,
                }),
        );
    }
    Ok(list)
}

/// `GET /v1/orphans`.
pub(super) async fn list(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
) -> Result<Json<OrphanList>, ApiError> {
    relay_admin_only(&relay, &caller)?;
    Ok(Json(find(&relay).await?))
}

/// Removes the orphans whose relay id or provider id is `id`, for a relay admin's delete of
/// an id the store does not know; `false` when there is none.
pub(super) async fn remove(relay: &Relay, caller: &Caller, id: &str) -> Result<bool, ApiError> {
    if caller.role != Role::RelayAdmin {
        return Ok(false);
    }
    let found: Vec<Orphan> = find(relay)
        .await?
        .orphans
        .into_iter()
        .filter(|o| o.id == id || o.provider_ref == id)
        .collect();
    for orphan in &found {
        let Some(provider) = relay.providers.get(orphan.provider.as_str()) else {
            continue;
        };
        // What the store would have kept is lost; the provider's id is all a delete needs.
        let handle = SandboxHandle {
            id: orphan.id.clone(),
            provider_ref: orphan.provider_ref.clone(),
            agent_token: String::new(),
            meta: serde_json::Value::Null,
        };
        tracing::info!(
            "removing orphan {} ({} sandbox {})",
            orphan.id,
            orphan.provider,
            orphan.provider_ref
        );
        provider
            .delete(&handle)
            .await
            .map_err(|e| ApiError::provider(&orphan.provider, None, e))?;
    }
    Ok(!found.is_empty())
}

//! Pausing, resuming, stopping and starting sandboxes: `POST /v1/sandboxes/{id}/pause`,
//! `.../resume`, `.../stop` and `.../start`, and waking, which resumes or starts a sandbox
//! before a session or a preview reaches it.
//!
//! The provider does the work ([`Provider::pause`], [`Provider::stop`]); the relay records
//! the state it leaves and decides when traffic may wake a sandbox: unless it was created
//! with `auto_resume: false`, the first session or preview request resumes a paused sandbox
//! and starts a stopped one. The idle reaper pauses or stops sandboxes created with
//! `on_idle: pause` or `stop` through [`Relay::change_power`].

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use tracing::warn;

use super::error::ApiError;
use super::sandboxes::{info, reattach_one};
use super::state::{find, Relay};
use crate::caller::Caller;
use crate::cluster::grant::Op;
use tether_client::api::{NetworkPolicy, SandboxInfo};
use tether_relay_core::provider::{Provider, ProviderError, SandboxState};
use tether_store::{state_name, SandboxRecord};

/// `POST /v1/sandboxes/{id}/pause`: freezes the sandbox's processes, keeping their memory.
pub(super) async fn pause(
    relay: State<Arc<Relay>>,
    caller: Caller,
    id: Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    route(relay, caller, id, Op::Pause).await
}

/// `POST /v1/sandboxes/{id}/resume`: continues a paused sandbox's processes where they were.
pub(super) async fn resume(
    relay: State<Arc<Relay>>,
    caller: Caller,
    id: Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    route(relay, caller, id, Op::Resume).await
}

/// `POST /v1/sandboxes/{id}/stop`: ends every process, keeping the disk.
pub(super) async fn stop(
    relay: State<Arc<Relay>>,
    caller: Caller,
    id: Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    route(relay, caller, id, Op::Stop).await
}

/// `POST /v1/sandboxes/{id}/start`: boots a stopped sandbox again, its files as they were.
pub(super) async fn start(
    relay: State<Arc<Relay>>,
    caller: Caller,
    id: Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    route(relay, caller, id, Op::Start).await
}

/// Finds the caller's sandbox and changes its state (`op`), to completion even if the
/// client goes away.
async fn route(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(id): Path<String>,
    op: Op,
) -> Result<Json<SandboxInfo>, ApiError> {
    let sandbox = find(&relay, &caller, id).await?;
    let work_relay = relay.clone();
    let sandbox = relay
        .detached(async move { work_relay.change_power(op, sandbox).await })
        .await?;
    Ok(Json(info(&relay, &sandbox, false)))
}

/// The state `op` leaves a sandbox in.
pub(crate) fn state_after(op: Op) -> SandboxState {
    match op {
        Op::Pause => SandboxState::Paused,
        Op::Stop => SandboxState::Stopped,
        _ => SandboxState::Running,
    }
}

impl Relay {
    /// Pauses, resumes, stops or starts (`op`) `sandbox` at its provider (through its owner,
    /// for another relay's host) and records the state that leaves.
    pub(crate) async fn change_power(
        &self,
        op: Op,
        mut sandbox: SandboxRecord,
    ) -> Result<SandboxRecord, ApiError> {
        let provider = self.provider_of(&sandbox)?;
        if sandbox.state == SandboxState::Dead {
            return Err(ApiError::dead(&sandbox.id));
        }
        let done = self.act_at_provider(op, &*provider, &mut sandbox).await;
        match done {
            Ok(()) => {
                self.record_state(&mut sandbox, state_after(op)).await;
                Ok(sandbox)
            }
            Err(e @ ProviderError::Gone(_)) => {
                // Dead (what it holds is still there, for `rm`) or gone: asked again.
                self.refresh_state(&*provider, &mut sandbox).await;
                if sandbox.state == SandboxState::Dead {
                    return Err(ApiError::dead(&sandbox.id));
                }
                Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e))
            }
            Err(e) => Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e)),
        }
    }

    /// Starts `sandbox` at its provider on this relay's host, records what the provider now
    /// knows it by, and attaches its egress proxy to its new network namespace.
    pub(crate) async fn start_here(
        &self,
        provider: &dyn Provider,
        sandbox: &mut SandboxRecord,
    ) -> Result<(), ProviderError> {
        if let Some(meta) = provider.start(&sandbox.handle()).await? {
            sandbox.meta = meta;
            if let Err(e) = self
                .store
                .set_meta(&sandbox.id, &sandbox.meta, SandboxState::Running)
                .await
            {
                // Kept running, the sandbox would be unreachable under its old metadata.
                let _ = provider.stop(&sandbox.handle()).await;
                return Err(ProviderError::Unavailable(format!(
                    "cannot record the started sandbox {}: {e}; it was stopped again",
                    sandbox.id
                )));
            }
        }
        if sandbox.spec.network == NetworkPolicy::Allowlist {
            if let Err(e) = reattach_one(self, provider, sandbox).await {
                warn!(sandbox = %sandbox.id, "cannot attach the egress proxy after a start: {e}");
            }
        }
        Ok(())
    }

    /// Resumes or starts `sandbox` if the relay has it paused or stopped, before traffic
    /// reaches it; refused when it was created without auto-resume. Finding it awake already
    /// (another session woke it first) is as good as waking it.
    pub(crate) async fn wake(
        &self,
        provider: &dyn Provider,
        sandbox: &mut SandboxRecord,
    ) -> Result<(), ApiError> {
        let op = match sandbox.state {
            SandboxState::Paused => Op::Resume,
            SandboxState::Stopped if provider.capabilities().stop => Op::Start,
            _ => return Ok(()),
        };
        if sandbox.spec.auto_resume == Some(false) {
            return Err(ApiError::Conflict(format!(
                "sandbox {} is {}, and was created without auto-resume; `tether {} {}` wakes it",
                sandbox.id,
                state_name(sandbox.state),
                op.name(),
                sandbox.id
            )));
        }
        match self.act_at_provider(op, provider, sandbox).await {
            Ok(()) | Err(ProviderError::Conflict(_)) => {}
            Err(e) => return Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e)),
        }
        self.record_state(sandbox, SandboxState::Running).await;
        Ok(())
    }

    /// Stores `state` for `sandbox`; a store that cannot take it is logged, since the
    /// provider's own state is what `get` reads back.
    async fn record_state(&self, sandbox: &mut SandboxRecord, state: SandboxState) {
        sandbox.state = state;
        if let Err(e) = self.store.set_state(&sandbox.id, state).await {
            warn!("cannot record sandbox {} as {state:?}: {e}", sandbox.id);
        }
    }
}

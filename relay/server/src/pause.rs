//! Pausing and resuming sandboxes: `POST /v1/sandboxes/{id}/pause` and `.../resume`, and
//! auto-resume, which wakes a paused sandbox before a session or a preview reaches it.
//!
//! The provider does the work ([`Provider::pause`]); the relay records the state it leaves
//! (`paused`, `running`) and decides when traffic may resume a sandbox: unless it was created
//! with `auto_resume: false`, the first session or preview request resumes it. The idle
//! reaper pauses sandboxes created with `on_idle: pause` through [`Relay::pause_sandbox`].

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use tracing::warn;

use super::error::ApiError;
use super::sandboxes::info;
use super::state::{find, Relay};
use crate::caller::Caller;
use tether_client::api::{IdleAction, SandboxInfo, SandboxSpec};
use tether_relay_core::provider::{Provider, ProviderError, SandboxState};
use tether_store::SandboxRecord;

/// `POST /v1/sandboxes/{id}/pause`: freezes the sandbox's processes, keeping their memory.
pub(super) async fn pause(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let sandbox = find(&relay, &caller, id).await?;
    let work_relay = relay.clone();
    let sandbox = relay
        .detached(async move { work_relay.pause_sandbox(sandbox).await })
        .await?;
    Ok(Json(info(&relay, &sandbox, false)))
}

/// `POST /v1/sandboxes/{id}/resume`: continues a paused sandbox's processes where they were.
pub(super) async fn resume(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let mut sandbox = find(&relay, &caller, id).await?;
    let work_relay = relay.clone();
    let sandbox = relay
        .detached(async move {
            let provider = work_relay.provider_of(&sandbox)?;
            refuse_dead(&sandbox)?;
            let resumed = work_relay.resume_at_provider(&*provider, &sandbox).await;
            work_relay
                .settle(&*provider, &mut sandbox, resumed, SandboxState::Running)
                .await?;
            Ok(sandbox)
        })
        .await?;
    Ok(Json(info(&relay, &sandbox, false)))
}

impl Relay {
    /// Pauses `sandbox` at its provider and records it paused.
    pub(crate) async fn pause_sandbox(
        &self,
        mut sandbox: SandboxRecord,
    ) -> Result<SandboxRecord, ApiError> {
        let provider = self.provider_of(&sandbox)?;
        refuse_dead(&sandbox)?;
        let paused = self.pause_at_provider(&*provider, &sandbox).await;
        self.settle(&*provider, &mut sandbox, paused, SandboxState::Paused)
            .await?;
        Ok(sandbox)
    }

    /// Resumes `sandbox` if the relay has it paused, before traffic reaches it; refused when
    /// it was created without auto-resume. A resume that finds it running already (another
    /// session woke it first) is as good as its own.
    pub(crate) async fn wake(
        &self,
        provider: &dyn Provider,
        sandbox: &mut SandboxRecord,
    ) -> Result<(), ApiError> {
        if sandbox.state != SandboxState::Paused {
            return Ok(());
        }
        if sandbox.spec.auto_resume == Some(false) {
            return Err(ApiError::Conflict(format!(
                "sandbox {} is paused, and was created without auto-resume; `tether resume {}` \
                 resumes it",
                sandbox.id, sandbox.id
            )));
        }
        match self.resume_at_provider(provider, sandbox).await {
            Ok(()) | Err(ProviderError::Conflict(_)) => {}
            Err(e) => return Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e)),
        }
        self.record_state(sandbox, SandboxState::Running).await;
        Ok(())
    }

    /// Records the outcome of a pause or resume: on success the sandbox is in `state`; a
    /// provider that says it has no such sandbox leaves it dead or gone, as asked again.
    async fn settle(
        &self,
        provider: &dyn Provider,
        sandbox: &mut SandboxRecord,
        outcome: Result<(), ProviderError>,
        state: SandboxState,
    ) -> Result<(), ApiError> {
        match outcome {
            Ok(()) => {
                self.record_state(sandbox, state).await;
                Ok(())
            }
            Err(e @ ProviderError::Gone(_)) => {
                self.refresh_state(provider, sandbox).await;
                if sandbox.state == SandboxState::Dead {
                    return Err(ApiError::dead(&sandbox.id));
                }
                Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e))
            }
            Err(e) => Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e)),
        }
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

/// Refuses a create whose idle timeout is to pause a sandbox its provider cannot pause.
pub(super) fn check_idle_action(
    provider: &dyn Provider,
    spec: &SandboxSpec,
) -> Result<(), ApiError> {
    if spec.on_idle != IdleAction::Pause {
        return Ok(());
    }
    if spec.idle_timeout.is_none() {
        return Err(ApiError::Invalid(
            "on_idle: pause needs an idle_timeout (e.g. `--idle-timeout 10m --on-idle pause`)"
                .to_string(),
        ));
    }
    if !provider.capabilities().pause {
        return Err(ApiError::Unsupported(format!(
            "on_idle: pause needs a provider that can pause sandboxes, and `{}` cannot on this \
             relay; use on_idle: delete",
            provider.name()
        )));
    }
    Ok(())
}

/// A sandbox known dead (its agent exited) can be neither paused nor resumed.
fn refuse_dead(sandbox: &SandboxRecord) -> Result<(), ApiError> {
    match sandbox.state {
        SandboxState::Dead => Err(ApiError::dead(&sandbox.id)),
        _ => Ok(()),
    }
}

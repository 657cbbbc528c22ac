//! Pausing and resuming an E2B sandbox, and what E2B's answers mean in Tether's model of
//! pause (a paused sandbox is a conflict to pause, a running one a conflict to resume).
//!
//! - Pause: `POST /sandboxes/{id}/pause`, with no body: E2B's default is a full snapshot,
//!   memory and processes kept, which is Tether's pause (`memory: false` would reboot the
//!   sandbox on resume and lose the agent). 204; 409 when it is already paused, or changing
//!   state; 404 when E2B has no such sandbox.
//! - Resume: `POST /v2/sandboxes/{id}/connect {timeout}`, as E2B's SDKs resume: 201 when it
//!   resumed the sandbox, 200 when the sandbox was running (then only its timeout grows),
//!   which is the conflict. A deployment without `connect` (404 to the route) gets the
//!   deprecated `POST /sandboxes/{id}/resume` (409 when running) after a read of its state.

use reqwest::Method;

use super::{api, load_meta, E2bProvider};
use crate::cloud::http::ControlPlane;
use tether_relay_core::provider::{ProviderError, SandboxHandle};

/// E2B's status for a connect that resumed a paused sandbox (200: it was running).
const RESUMED: u16 = 201;

impl E2bProvider {
    /// Pauses `sandbox` at E2B; a paused one is a [`ProviderError::Conflict`].
    pub(super) async fn pause_sandbox(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        let e2b = self.ready()?;
        let id = &sandbox.id;
        match pause(&e2b.api, &sandbox.provider_ref).await? {
            Paused::Now => Ok(()),
            Paused::Already => Err(ProviderError::Conflict(format!(
                "sandbox {id} is already paused; resume it with `tether resume {id}`"
            ))),
            Paused::Busy(why) => Err(ProviderError::Conflict(format!(
                "E2B cannot pause sandbox {id} while it changes state ({why}); try again in a \
                 moment"
            ))),
            Paused::Gone => Err(ProviderError::Gone(id.clone())),
        }
    }

    /// Resumes `sandbox` at E2B; a running one is a [`ProviderError::Conflict`].
    pub(super) async fn resume_sandbox(
        &self,
        sandbox: &SandboxHandle,
    ) -> Result<(), ProviderError> {
        let e2b = self.ready()?;
        let meta = load_meta(sandbox)?;
        let id = &sandbox.id;
        // The agent was paused with the sandbox's memory and runs on: `connect` reaches it.
        match resume(&e2b.api, &sandbox.provider_ref, meta.timeout_secs).await? {
            Resumed::Now => Ok(()),
            Resumed::WasRunning => Err(ProviderError::Conflict(format!(
                "sandbox {id} is not paused: it is running (`tether pause {id}` pauses it)"
            ))),
            Resumed::Busy(why) => Err(ProviderError::Conflict(format!(
                "E2B cannot resume sandbox {id} while it changes state ({why}); try again in a \
                 moment"
            ))),
            Resumed::Gone => Err(ProviderError::Gone(id.clone())),
        }
    }
}

/// What a pause found.
#[derive(Debug, PartialEq, Eq)]
enum Paused {
    /// It ran, and is paused now.
    Now,
    /// It was paused already.
    Already,
    /// E2B refused (409) for another reason, in its words: the sandbox is changing state.
    Busy(String),
    /// E2B has no such sandbox.
    Gone,
}

/// What a resume found.
#[derive(Debug, PartialEq, Eq)]
enum Resumed {
    /// It was paused, and runs again.
    Now,
    /// It was running already.
    WasRunning,
    /// E2B refused (409) for another reason, in its words: the sandbox is changing state.
    Busy(String),
    /// E2B has no such sandbox.
    Gone,
}

/// `POST /sandboxes/{id}/pause`. A 409 is told apart by a read of the sandbox's state; a 404
/// means gone only once a read confirms it (a 404 of the route alone proves nothing).
async fn pause(api: &ControlPlane, id: &str) -> Result<Paused, ProviderError> {
    let path = format!("/sandboxes/{id}/pause");
    let refusal = match api.call(Method::POST, &path, None, "a pause").await {
        Ok(_) => return Ok(Paused::Now),
        Err(e) if matches!(e.status(), Some(404 | 409)) => e,
        Err(e) => return Err(e.into()),
    };
    match api::get(api, id).await? {
        None => Ok(Paused::Gone),
        Some(detail) if detail.state == "paused" => Ok(Paused::Already),
        Some(_) if refusal.status() == Some(409) => Ok(Paused::Busy(refusal.to_string())),
        Some(_) => Err(ProviderError::Other(anyhow::anyhow!(
            "E2B answered 404 to pausing sandbox {id}, which it still lists: {refusal}"
        ))),
    }
}

/// Resumes sandbox `id` for `timeout` seconds from now (E2B's timeout restarts on resume).
async fn resume(api: &ControlPlane, id: &str, timeout: u64) -> Result<Resumed, ProviderError> {
    let body = serde_json::json!({ "timeout": timeout });
    let path = format!("/v2/sandboxes/{id}/connect");
    match api.call(Method::POST, &path, Some(&body), "a resume").await {
        Ok(answer) if answer.status == RESUMED => return Ok(Resumed::Now),
        Ok(_) => return Ok(Resumed::WasRunning),
        Err(e) if e.status() == Some(409) => return Ok(Resumed::Busy(e.to_string())),
        // No such sandbox, or no `connect` on this deployment: a read tells.
        Err(e) if e.status() == Some(404) => {
            tracing::debug!("E2B answered 404 to connect ({e}); reading sandbox {id}");
        }
        Err(e) => return Err(e.into()),
    }
    let Some(detail) = api::get(api, id).await? else {
        return Ok(Resumed::Gone);
    };
    if detail.state != "paused" {
        return Ok(Resumed::WasRunning);
    }
    let path = format!("/sandboxes/{id}/resume");
    match api.call(Method::POST, &path, Some(&body), "a resume").await {
        Ok(_) => Ok(Resumed::Now),
        // Resumed meanwhile by someone else.
        Err(e) if e.status() == Some(409) => Ok(Resumed::WasRunning),
        Err(e) if e.is_not_found() => Ok(Resumed::Gone),
        Err(e) => Err(e.into()),
    }
}

//! Pausing and resuming a container: the engine's `pause` and `unpause` (the cgroup freezer:
//! every process, the agent too, frozen with its memory), and what the container's state
//! makes of them in Tether's model: only a running sandbox pauses, only a paused one
//! resumes, and anything else is a conflict that says what to do.

use bollard::models::ContainerStateStatusEnum;
use bollard::models::ContainerStateStatusEnum::{PAUSED, RUNNING};
use bollard::Docker;

use super::{engine, DockerProvider};
use tether_relay_core::provider::{ProviderError, SandboxHandle};

impl DockerProvider {
    /// Freezes `sandbox`'s container; [`ProviderError::Conflict`] unless it runs.
    pub(super) async fn pause_container(
        &self,
        sandbox: &SandboxHandle,
    ) -> Result<(), ProviderError> {
        self.set_paused(sandbox, true).await
    }

    /// Thaws `sandbox`'s container; [`ProviderError::Conflict`] unless it is paused.
    pub(super) async fn unpause_container(
        &self,
        sandbox: &SandboxHandle,
    ) -> Result<(), ProviderError> {
        self.set_paused(sandbox, false).await
    }

    /// Pauses (`pause`) or unpauses `sandbox`'s container, from the one state that allows it.
    async fn set_paused(&self, sandbox: &SandboxHandle, pause: bool) -> Result<(), ProviderError> {
        let host = self.host()?;
        let docker = host.client()?;
        let id = &sandbox.id;
        let (from, to, verb, doing) = match pause {
            true => (RUNNING, PAUSED, "paused", "pausing the container"),
            false => (PAUSED, RUNNING, "resumed", "resuming the container"),
        };
        match self.status(&docker, sandbox).await? {
            Some(status) if status == from => {}
            Some(status) if status == to && pause => {
                return Err(ProviderError::Conflict(format!(
                    "sandbox {id} is already paused; resume it with `tether resume {id}`"
                )))
            }
            Some(status) if status == to => {
                return Err(ProviderError::Conflict(format!(
                    "sandbox {id} is not paused: it is running (`tether pause {id}` pauses it)"
                )))
            }
            other => return Err(not_running(id, other)),
        }
        let done = match pause {
            true => docker.pause_container(&sandbox.provider_ref).await,
            false => docker.unpause_container(&sandbox.provider_ref).await,
        };
        match done {
            Ok(()) => Ok(()),
            // Paused, resumed or stopped meanwhile, by someone else.
            Err(e) if engine::status(&e) == Some(409) => Err(ProviderError::Conflict(format!(
                "sandbox {id} cannot be {verb} now ({}); `tether info {id}` shows its state",
                host.error(doing, e)
            ))),
            Err(e) => Err(host.error(doing, e)),
        }
    }

    /// The engine's status of `sandbox`'s container; [`ProviderError::Gone`] when it has none.
    async fn status(
        &self,
        docker: &Docker,
        sandbox: &SandboxHandle,
    ) -> Result<Option<ContainerStateStatusEnum>, ProviderError> {
        match self.inspect(docker, sandbox).await? {
            Some(found) => Ok(found.state.and_then(|s| s.status)),
            None => Err(ProviderError::Gone(sandbox.id.clone())),
        }
    }
}

/// The conflict of pausing or resuming a container that is neither running nor paused.
fn not_running(id: &str, status: Option<ContainerStateStatusEnum>) -> ProviderError {
    let status = status.map_or_else(|| "unknown".to_string(), |s| s.to_string());
    ProviderError::Conflict(format!(
        "sandbox {id} is not running (its container is {status}): only a running sandbox \
         pauses and only a paused one resumes; a session (`tether exec {id} ...`) starts it"
    ))
}

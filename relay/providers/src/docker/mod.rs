//! The `docker` provider: each sandbox is a container of a Docker or Podman engine on the
//! relay's host, made from an image with `tether-agent` as its entrypoint (`tether image
//! build --target docker`, which builds the OCI image and loads it into the engine).
//!
//! - Engine: the Engine API over a Unix socket ([`engine`]), through bollard.
//! - Create: a container named `tether-<id>`, labelled with the sandbox id and the relay
//!   ([`constants::LABEL_SANDBOX`], [`constants::LABEL_RELAY`]), the agent token in
//!   `TETHER_AGENT_TOKEN` as for the cloud providers, unprivileged, `no-new-privileges`, all
//!   capabilities dropped but the agent's, a pids limit, and the spec's CPU, memory and disk
//!   sizes as engine limits ([`config`]).
//! - Connect: inside the container's network namespace ([`reach`]), so a sandbox needs no
//!   network of its own and publishes no port.
//! - Pause and resume: the engine's `pause` and `unpause` ([`pause`]); a paused container is
//!   [`SandboxState::Paused`], and a connect unpauses it.
//! - Delete: the container with its anonymous volumes (`v=true`); Tether makes no network,
//!   named volume or image per sandbox.
//! - Image builds: [`build`].

pub(crate) mod build;
mod config;
mod constants;
pub(crate) mod engine;
mod pause;
mod reach;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use async_trait::async_trait;
use bollard::models::{ContainerInspectResponse, ContainerStateStatusEnum};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions,
    StartContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use self::constants::{
    AGENT_START_TIMEOUT, LABEL_RELAY, LABEL_SANDBOX, LOG_TAIL_LINES, MAX_LOG_BYTES, NAME_PREFIX,
    POLL_INTERVAL, UNREADABLE_TRIES,
};
use self::engine::Host;
use self::reach::ReachError;
use tether_relay_core::provider::network::{self, Guarantees};
use tether_relay_core::provider::{
    AgentSocket, Capabilities, Created, Labelled, NetworkInfo, NetworkPolicy, Provider,
    ProviderContext, ProviderError, SandboxHandle, SandboxSpec, SandboxState,
};

/// Runs sandboxes as containers of the local engine.
#[derive(Clone, Debug)]
pub struct DockerProvider {
    /// `Err` when the configured host is not a Unix socket: every call reports it.
    host: Result<Host, String>,
    /// This relay, as its containers' [`constants::LABEL_RELAY`] names it: its data directory.
    relay: String,
}

/// What the registry keeps for a container.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Meta {
    /// The container's full id.
    container: String,
}

impl DockerProvider {
    /// A provider for the engine `ctx` names (else `DOCKER_HOST`, else the default socket).
    pub fn new(ctx: &ProviderContext) -> DockerProvider {
        let relay = std::fs::canonicalize(&ctx.data_dir)
            .unwrap_or_else(|_| ctx.data_dir.clone())
            .display()
            .to_string();
        DockerProvider {
            host: Host::resolve(ctx.docker_host.as_deref()),
            relay,
        }
    }

    fn host(&self) -> Result<&Host, ProviderError> {
        self.host
            .as_ref()
            .map_err(|e| ProviderError::Unavailable(format!("the docker provider: {e}")))
    }

    /// The container of `sandbox`, or `None` when the engine has none by that id. A container
    /// that is not labelled as this sandbox's is never treated as it.
    async fn inspect(
        &self,
        docker: &Docker,
        sandbox: &SandboxHandle,
    ) -> Result<Option<ContainerInspectResponse>, ProviderError> {
        let host = self.host()?;
        match inspect_container(docker, &sandbox.provider_ref).await {
            Ok(found) => {
                let label = found
                    .config
                    .as_ref()
                    .and_then(|c| c.labels.as_ref())
                    .and_then(|l| l.get(LABEL_SANDBOX));
                if label.map(String::as_str) != Some(sandbox.id.as_str()) {
                    return Err(ProviderError::Other(anyhow!(
                        "container {} is not labelled as sandbox {}'s ({LABEL_SANDBOX}); Tether \
                         leaves it alone",
                        short(&sandbox.provider_ref),
                        sandbox.id
                    )));
                }
                Ok(Some(found))
            }
            Err(e) if engine::status(&e) == Some(404) => Ok(None),
            Err(e) => Err(host.error("inspecting the container", e)),
        }
    }

    /// Waits until the agent of `container` accepts a session, or says why it never will.
    async fn open_agent(
        &self,
        docker: &Docker,
        container: &str,
        sandbox: &SandboxHandle,
        wait: bool,
    ) -> Result<AgentSocket, ProviderError> {
        let host = self.host()?;
        let deadline = Instant::now() + AGENT_START_TIMEOUT;
        loop {
            let found =
                inspect_container(docker, container).await.map_err(|e| {
                    match engine::status(&e) {
                        Some(404) => ProviderError::Gone(sandbox.id.clone()),
                        _ => host.error("inspecting the container", e),
                    }
                })?;
            let state = found.state.unwrap_or_default();
            let pid = state.pid.unwrap_or(0);
            if state.running != Some(true) || pid <= 0 {
                let logs = logs(docker, container).await;
                return Err(ProviderError::Other(anyhow!(
                    "the container of sandbox {} stopped ({}, exit code {}); is tether-agent its \
                     entrypoint? Its last output:\n{logs}",
                    sandbox.id,
                    state.status.map(|s| s.to_string()).unwrap_or_default(),
                    state.exit_code.unwrap_or_default(),
                )));
            }
            match reach::open(container, pid, &sandbox.id, &sandbox.agent_token).await {
                Ok(socket) => return Ok(socket),
                Err(ReachError::NotListening | ReachError::Exited(_))
                    if wait && Instant::now() < deadline =>
                {
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
                Err(ReachError::Exited(pid)) => {
                    return Err(ProviderError::Other(anyhow!(
                        "the first process ({pid}) of sandbox {}'s container exited; try again",
                        sandbox.id
                    )))
                }
                Err(ReachError::NotListening) => {
                    return Err(ProviderError::Other(anyhow!(
                        "the agent of sandbox {} did not listen on its port within {:?}; its \
                         last output:\n{}",
                        sandbox.id,
                        AGENT_START_TIMEOUT,
                        logs(docker, container).await
                    )))
                }
                Err(ReachError::Untrusted(why)) => {
                    return Err(ProviderError::Other(anyhow!(
                        "refusing to reach sandbox {}: {why}",
                        sandbox.id
                    )))
                }
                Err(ReachError::Other(e)) => return Err(e),
            }
        }
    }

    async fn remove(&self, docker: &Docker, container: &str) -> Result<(), ProviderError> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match docker.remove_container(container, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if engine::status(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.host()?.error("removing the container", e)),
        }
    }
}

/// `GET /containers/{id}/json`, asked again while the engine reports a state outside the
/// Engine API's list: Podman says `stopped` for a moment between a container's exit and its
/// cleanup, which the API's schema (and so bollard) has no word for.
async fn inspect_container(
    docker: &Docker,
    container: &str,
) -> Result<ContainerInspectResponse, bollard::errors::Error> {
    let mut tries = 0;
    loop {
        match docker.inspect_container(container, None).await {
            Err(bollard::errors::Error::JsonDataError { .. }) if tries < UNREADABLE_TRIES => {
                tries += 1;
                tokio::time::sleep(POLL_INTERVAL).await;
            }
            other => return other,
        }
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// The container's last lines of output, at most [`MAX_LOG_BYTES`] of them whatever it wrote.
async fn logs(docker: &Docker, container: &str) -> String {
    let options = LogsOptions {
        stdout: true,
        stderr: true,
        tail: LOG_TAIL_LINES.to_string(),
        ..Default::default()
    };
    let mut stream = docker.logs(container, Some(options));
    let mut out = Vec::new();
    while out.len() < MAX_LOG_BYTES {
        match stream.next().await {
            Some(Ok(chunk)) => out.extend_from_slice(&chunk.into_bytes()),
            Some(Err(e)) => {
                out.extend_from_slice(format!("(reading its logs failed: {e})").as_bytes());
                break;
            }
            None => break,
        }
    }
    out.truncate(MAX_LOG_BYTES);
    let text = String::from_utf8_lossy(&out);
    if text.trim().is_empty() {
        "(nothing)".into()
    } else {
        text.trim_end().to_string()
    }
}

#[async_trait]
impl Provider for DockerProvider {
    fn host_bound(&self) -> bool {
        // Reached through the container's network namespace, on the engine's host.
        true
    }

    fn name(&self) -> &'static str {
        "docker"
    }

    async fn create(
        &self,
        id: &str,
        agent_token: &str,
        spec: &SandboxSpec,
    ) -> Result<Created, ProviderError> {
        let host = self.host()?;
        let body = config::container(id, &self.relay, agent_token, spec)?;
        let image = body.image.clone().unwrap_or_default();
        let docker = host.client()?;
        match docker.inspect_image(&image).await {
            Ok(_) => {}
            Err(e) if engine::status(&e) == Some(404) => {
                return Err(ProviderError::InvalidSpec(format!(
                    "the engine at {} has no image {image}: build and load it with `tether image \
                     build --target docker --name {image}` (or pull it into the engine)",
                    host.socket.display()
                )))
            }
            Err(e) => return Err(host.error("looking up the image", e)),
        }
        let options = CreateContainerOptions {
            name: Some(format!("{NAME_PREFIX}{id}")),
            ..Default::default()
        };
        let created = match docker.create_container(Some(options), body).await {
            Ok(created) => created,
            Err(e) if engine::status(&e) == Some(409) => {
                return Err(ProviderError::InvalidSpec(format!(
                    "the engine already has a container named {NAME_PREFIX}{id}; remove it \
                     (`docker rm -f {NAME_PREFIX}{id}`) and try again"
                )))
            }
            Err(e) if spec.disk_bytes.is_some() && engine::status(&e) == Some(500) => {
                return Err(ProviderError::InvalidSpec(format!(
                    "the engine refused the container ({}); if it cannot limit disk (--disk \
                     needs overlay on xfs with project quotas), drop --disk",
                    host.error("creating the container", e)
                )))
            }
            Err(e) => return Err(host.error("creating the container", e)),
        };
        let handle = SandboxHandle {
            id: id.to_string(),
            provider_ref: created.id.clone(),
            agent_token: agent_token.to_string(),
            meta: serde_json::Value::Null,
        };
        let started = async {
            docker
                .start_container(&created.id, None::<StartContainerOptions>)
                .await
                .map_err(|e| host.error("starting the container", e))?;
            self.open_agent(&docker, &created.id, &handle, true).await
        }
        .await;
        if let Err(e) = started {
            if let Err(cleanup) = self.remove(&docker, &created.id).await {
                tracing::warn!(
                    sandbox = id,
                    "cannot remove the failed container: {cleanup}"
                );
            }
            return Err(e);
        }
        Ok(Created {
            provider_ref: created.id.clone(),
            meta: serde_json::to_value(Meta {
                container: created.id,
            })
            .map_err(|e| ProviderError::Other(e.into()))?,
        })
    }

    async fn state(&self, sandbox: &SandboxHandle) -> Result<SandboxState, ProviderError> {
        let docker = self.host()?.client()?;
        let Some(found) = self.inspect(&docker, sandbox).await? else {
            return Ok(SandboxState::Gone);
        };
        let status = found.state.and_then(|s| s.status);
        Ok(match status {
            Some(ContainerStateStatusEnum::RUNNING) => SandboxState::Running,
            Some(ContainerStateStatusEnum::PAUSED) => SandboxState::Paused,
            Some(ContainerStateStatusEnum::CREATED | ContainerStateStatusEnum::EXITED) => {
                SandboxState::Stopped
            }
            Some(ContainerStateStatusEnum::DEAD | ContainerStateStatusEnum::REMOVING) => {
                SandboxState::Gone
            }
            _ => SandboxState::Unknown,
        })
    }

    /// This relay's containers (its label), stopped ones included: the engine may hold other
    /// relays' too, and those are theirs to find.
    async fn labelled(&self) -> Result<Option<Vec<Labelled>>, ProviderError> {
        let host = self.host()?;
        let docker = host.client()?;
        let filters = HashMap::from([(
            "label".to_string(),
            vec![
                LABEL_SANDBOX.to_string(),
                format!("{LABEL_RELAY}={}", self.relay),
            ],
        )]);
        let options = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let listed = docker
            .list_containers(Some(options))
            .await
            .map_err(|e| host.error("listing containers", e))?;
        Ok(Some(
            listed
                .into_iter()
                .filter_map(|c| {
                    Some(Labelled {
                        id: c.labels?.get(LABEL_SANDBOX)?.clone(),
                        provider_ref: c.id?,
                    })
                })
                .collect(),
        ))
    }

    async fn delete(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        let docker = self.host()?.client()?;
        // Only a container labelled as this sandbox's is removed.
        if self.inspect(&docker, sandbox).await?.is_none() {
            return Ok(());
        }
        self.remove(&docker, &sandbox.provider_ref).await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pause: true,
            ..Capabilities::default()
        }
    }

    async fn pause(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        self.pause_container(sandbox).await
    }

    async fn resume(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        self.unpause_container(sandbox).await
    }

    async fn renew(&self, _sandbox: &SandboxHandle, _ttl: Duration) -> Result<(), ProviderError> {
        // An engine keeps a container until it is removed; the relay's TTL is the only one.
        Ok(())
    }

    async fn connect(&self, sandbox: &SandboxHandle) -> Result<AgentSocket, ProviderError> {
        let host = self.host()?;
        let docker = host.client()?;
        let Some(found) = self.inspect(&docker, sandbox).await? else {
            return Err(ProviderError::Gone(sandbox.id.clone()));
        };
        let status = found.state.and_then(|s| s.status);
        let container = &sandbox.provider_ref;
        let woken = match status {
            Some(ContainerStateStatusEnum::PAUSED) => {
                docker
                    .unpause_container(container)
                    .await
                    .map_err(|e| host.error("resuming the paused container", e))?;
                true
            }
            Some(ContainerStateStatusEnum::CREATED | ContainerStateStatusEnum::EXITED) => {
                docker
                    .start_container(container, None::<StartContainerOptions>)
                    .await
                    .map_err(|e| host.error("starting the stopped container", e))?;
                true
            }
            _ => false,
        };
        self.open_agent(&docker, container, sandbox, woken).await
    }

    fn network_info(&self, spec: &SandboxSpec) -> NetworkInfo {
        let guarantees = match spec.network {
            NetworkPolicy::None => Guarantees::new(
                &[
                    "no network: the container's network mode is `none`, its own loopback only; \
                   the relay reaches the agent from inside that namespace, and no port is \
                   published",
                ],
                &[],
            ),
            NetworkPolicy::Host => Guarantees::new(
                &[],
                &[
                    "the container is on the engine's default bridge network: it reaches \
                     whatever the host can, through the engine's NAT",
                    "other containers on that network can reach its ports",
                ],
            ),
            NetworkPolicy::Allowlist => Guarantees::new(
                &[],
                &["allowlists are refused: the docker provider has none"],
            ),
        };
        network::info(spec, "docker", guarantees)
    }
}

//! The provider trait: how the relay creates, finds, deletes and reaches sandboxes, whatever
//! runs them. The local runtime (`tether-local`) and the other providers (`tether-providers`)
//! implement it; the relay's server registers them, the one place that names them all.

pub mod network;
pub mod upgrade;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
pub use tether_client::api::{Capabilities, NetworkInfo, NetworkPolicy, SandboxSpec};
use tokio::io::{AsyncRead, AsyncWrite};

/// A byte stream to a sandbox's agent, before the WebSocket handshake.
pub trait AgentIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> AgentIo for T {}

pub use upgrade::AgentSocket;

/// What a provider reports back from a create; the relay persists it in the store.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Created {
    /// The provider's own id for the sandbox (equal to the relay's id for `local`).
    pub provider_ref: String,
    /// Provider-specific facts needed to reach or delete it later (paths, pids, URLs).
    pub meta: serde_json::Value,
}

/// A sandbox as the store knows it, handed back to its provider for every later call.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SandboxHandle {
    /// The relay's id, e.g. `sb-3f9a2c`.
    pub id: String,
    /// The provider's id.
    pub provider_ref: String,
    /// The per-sandbox agent token (never shown to clients).
    pub agent_token: String,
    /// What the provider stored at create.
    pub meta: serde_json::Value,
}

/// A sandbox's state as its provider sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Running; its agent should answer.
    Running,
    /// Paused: its processes are frozen with their memory kept, and `resume` continues them
    /// where they were. Its agent may still answer (local sandboxes keep it running, so
    /// attached sessions stay open); traffic resumes it unless it was created without
    /// auto-resume.
    Paused,
    /// Paused or stopped by the provider; connect may resume it.
    Stopped,
    /// Gone, on positive evidence only: the provider said it has no such sandbox or that it
    /// ended.
    Gone,
    /// Its agent is known to have exited (local: the sandbox's first process, which is the
    /// agent, ended), but what the sandbox holds on the host is still there. Nothing can run
    /// in it any more; the relay keeps it, shown as `dead`, until a client removes it or its
    /// TTL or idle timeout runs out, and never reuses it for a get-or-create.
    Dead,
    /// Neither proven running nor proven gone: the provider could not be asked, or answered
    /// something that proves neither. The relay logs it, asks again on every reaper tick, and
    /// never deletes a sandbox for it.
    Unknown,
}

/// What removing the remains of an interrupted create did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unfinished {
    /// Whatever the create made is removed (or it had made nothing).
    Removed,
    /// The provider cannot find what the create made without the id it would have answered
    /// with; the text says what to look for there.
    Untraceable(String),
}

/// Why a provider call failed. Each message says what the user can do.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The host lacks something the provider needs (namespaces, cgroups, a binary).
    #[error("{0}")]
    Unavailable(String),
    /// The request is invalid for this provider (bad image, bad limit).
    #[error("{0}")]
    InvalidSpec(String),
    /// The sandbox does not exist at the provider any more.
    #[error("sandbox {0} no longer exists at its provider")]
    Gone(String),
    /// Credentials are missing or refused; the message names the variable to set.
    #[error("{0}")]
    Auth(String),
    /// The provider has no such feature (pausing, for one); the message names the provider
    /// and what it lacks.
    #[error("{0}")]
    Unsupported(String),
    /// The sandbox is in a state the call cannot start from (pausing a paused sandbox); the
    /// message says what to do instead.
    #[error("{0}")]
    Conflict(String),
    /// Anything else, with context.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// One way of running sandboxes.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The name users pass to `--provider`.
    fn name(&self) -> &'static str;
    /// Whether sandboxes run on the relay's own host (the local provider). The relay then
    /// fills in its policy's default sizes (`memory_bytes`, `cpus`, `pids`, `disk_bytes`),
    /// which providers that size a sandbox by its image refuse, and treats an image that is
    /// not `oci:` as a directory of this host, which only admins may use.
    fn runs_here(&self) -> bool {
        false
    }
    /// Whether its sandboxes can be reached only from the relay's own host (local sandboxes,
    /// a Docker engine's containers): relays sharing a database then reach one through the
    /// relay that made it. By default, [`Provider::runs_here`].
    fn host_bound(&self) -> bool {
        self.runs_here()
    }
    /// Creates and starts a sandbox whose agent will accept `agent_token`.
    async fn create(
        &self,
        id: &str,
        agent_token: &str,
        spec: &SandboxSpec,
    ) -> Result<Created, ProviderError>;
    /// The sandbox's current state.
    async fn state(&self, sandbox: &SandboxHandle) -> Result<SandboxState, ProviderError>;
    /// Removes everything the sandbox had. Deleting a gone sandbox succeeds.
    async fn delete(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError>;
    /// Removes what an interrupted create of sandbox `id` made (a relay killed mid-create
    /// finds it in the create journal when it starts again). `provider_ref` is the provider's
    /// id for it, if the provider had answered before the crash. By default: deletes it by that
    /// id, or, without one, says to look for the `tether.sandbox=<id>` label every cloud
    /// provider tags its sandboxes with.
    async fn remove_unfinished(
        &self,
        id: &str,
        provider_ref: Option<&str>,
    ) -> Result<Unfinished, ProviderError> {
        let Some(provider_ref) = provider_ref else {
            return Ok(Unfinished::Untraceable(format!(
                "look for a sandbox labelled tether.sandbox={id} at {} and delete it",
                self.name()
            )));
        };
        let handle = SandboxHandle {
            id: id.to_string(),
            provider_ref: provider_ref.to_string(),
            agent_token: String::new(),
            meta: serde_json::Value::Null,
        };
        match self.delete(&handle).await {
            Ok(()) | Err(ProviderError::Gone(_)) => Ok(Unfinished::Removed),
            Err(e) => Err(e),
        }
    }
    /// At relay start, before any create: the sandboxes this provider holds for this relay
    /// that are not in `accounted` (every sandbox the store has, and every journaled
    /// create), and where each is. Removes nothing: nothing proves such a sandbox this relay's
    /// to remove (its store row may be in another store, or restored later), so it is
    /// reported and kept until an admin removes it (`tether ls --orphans`, `tether rm ID`).
    /// Also clears what the provider made for itself and no sandbox holds (a half-written
    /// template). Fails, removing nothing, when it cannot read what exists. By default none:
    /// a cloud provider's sandboxes are listed by `tether ls --orphans` instead.
    async fn unaccounted(
        &self,
        _accounted: &std::collections::HashSet<String>,
    ) -> Result<Vec<Unaccounted>, ProviderError> {
        Ok(Vec::new())
    }
    /// What this provider's sandboxes can do beyond create, connect and delete (`tether
    /// info`); by default nothing.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// Freezes every process of the sandbox, keeping its memory, until [`Provider::resume`].
    /// A paused sandbox is a [`ProviderError::Conflict`]. By default the provider cannot.
    async fn pause(&self, _sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        Err(self.lacks("pause and resume"))
    }
    /// Continues a paused sandbox's processes where they were. A sandbox that is not paused
    /// is a [`ProviderError::Conflict`].
    async fn resume(&self, _sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        Err(self.lacks("pause and resume"))
    }
    /// Ends every process of the sandbox and keeps its disk, until [`Provider::start`]. A
    /// stopped sandbox is a [`ProviderError::Conflict`]. By default the provider cannot.
    async fn stop(&self, _sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        Err(self.lacks("stop and start"))
    }
    /// Boots a stopped sandbox again, its disk as it was; answers its new metadata when what
    /// the provider stored at create changed (a local sandbox's new first process). A
    /// sandbox that is not stopped is a [`ProviderError::Conflict`].
    async fn start(
        &self,
        _sandbox: &SandboxHandle,
    ) -> Result<Option<serde_json::Value>, ProviderError> {
        Err(self.lacks("stop and start"))
    }
    /// The error for a feature this provider lacks.
    fn lacks(&self, feature: &str) -> ProviderError {
        ProviderError::Unsupported(format!(
            "provider `{}` cannot {feature} sandboxes; `tether info ID` lists what a sandbox \
             can do",
            self.name()
        ))
    }
    /// Extends the provider-side lifetime, where the provider has one.
    async fn renew(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), ProviderError>;

    /// The network namespace of `sandbox`, opened, when its sandboxes run on this host in one
    /// of their own (the egress proxy attaches to it); `None` for other providers.
    fn network_namespace(
        &self,
        _sandbox: &SandboxHandle,
    ) -> Result<Option<std::fs::File>, ProviderError> {
        Ok(None)
    }
    /// Opens a new, authenticated WebSocket to the sandbox's agent.
    async fn connect(&self, sandbox: &SandboxHandle) -> Result<AgentSocket, ProviderError>;
    /// What the native allowlist of a sandbox of this provider created from `spec` must also
    /// hold for it to reach the relay's egress listener at `url` (`tether serve --egress-url`),
    /// through which its secrets go; or why this provider's egress controls cannot hold it.
    /// By default the URL's host, by name or by address as the URL gives it.
    fn relay_egress_entry(
        &self,
        _spec: &SandboxSpec,
        url: &crate::egress::route::EgressUrl,
    ) -> Result<crate::egress::route::RelayEntry, ProviderError> {
        Ok(crate::egress::route::RelayEntry::of(url))
    }
    /// What a sandbox created from `spec` may reach, who enforces it and which guarantees hold
    /// (`tether info`). By default the relay's own: a provider whose sandboxes the relay does
    /// not fence in itself states its own controls.
    fn network_info(&self, spec: &SandboxSpec) -> NetworkInfo {
        network::relay_enforced(spec)
    }
    /// The live sandboxes at the provider that carry Tether's id label (`tether.sandbox`),
    /// whichever relay made them: how sandboxes a relay lost (a crash, a deleted store)
    /// are found again. `None` for a provider that cannot list its sandboxes.
    async fn labelled(&self) -> Result<Option<Vec<Labelled>>, ProviderError> {
        Ok(None)
    }
    /// How often [`Provider::keep_alive`] must run while a client is connected, for a
    /// provider that ends sandboxes on a timer of its own the relay does not mean to apply
    /// (E2B's timeout of a sandbox without a TTL); `None` by default.
    fn keep_alive_every(&self, _sandbox: &SandboxHandle) -> Option<Duration> {
        None
    }
    /// Pushes the provider's timer ahead while a client is connected.
    async fn keep_alive(&self, _sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        Ok(())
    }
}

/// A sandbox a provider holds for this relay that neither its store nor its create
/// journal accounts for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unaccounted {
    /// Its relay id.
    pub id: String,
    /// Where it is, in words an admin can look at (local: its directory).
    pub place: String,
}

/// A sandbox at a provider that carries Tether's id label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labelled {
    /// The relay id in its label.
    pub id: String,
    /// The provider's own id.
    pub provider_ref: String,
}

/// Settings every provider may read.
#[derive(Clone, Debug)]
pub struct ProviderContext {
    /// The relay's data directory; a provider keeps its files under `data_dir/<provider>/`.
    pub data_dir: PathBuf,
    /// The `tether-agent` binary to run in local sandboxes or upload to images.
    pub agent_binary: PathBuf,
    /// Egress CAs for the local provider to install in sandboxes it is about to create.
    pub trust: crate::egress::TrustShelf,
    /// The Docker engine's socket (`tether serve --docker-host`); `None`: `DOCKER_HOST`, else
    /// `/var/run/docker.sock`.
    pub docker_host: Option<String>,
}

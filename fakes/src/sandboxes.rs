//! The real sandboxes behind every fake: each fake sandbox is a local sandbox made by the
//! relay's `local` provider (namespaces and a cgroup on this machine, no network beyond its
//! own loopback), whose PID 1 is the real `tether-agent`. A fake starts the provider's
//! "entrypoint" (`tether-agent serve --listen 0.0.0.0:7421`, as a real image would) as a
//! background process through that agent, and its edge dials ports inside the sandbox
//! through the agent's port forwarding.
//!
//! The fake's binary must call [`tether_local::run_if_sandbox_init`] first
//! thing: the local provider re-executes it to build each sandbox.
//!
//! A sandbox has no network but its loopback, unless the fake was given addresses to reach
//! (`--sandbox-reach ADDR`, for tests whose sandboxes must reach a relay's egress listener as
//! a cloud sandbox would): for each, the sandbox's own `127.0.0.1` on that address's port is
//! a listener the fake opened inside the sandbox's network namespace, relaying every
//! connection to the address on the fake's host. Nothing else leaves either way.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, Context};
use tether_client::{Process, RawStream, Session};
use tether_local::LocalProvider;
use tether_proto::op::ExecSpec;
use tether_relay_core::provider::{
    NetworkPolicy, Provider, ProviderContext, ProviderError, SandboxHandle, SandboxSpec,
};

/// `PATH` inside fake sandboxes: the agent's directory first, so an entrypoint that names
/// `tether-agent` finds it as it would in a real image.
const SANDBOX_PATH: &str = "/.tether:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Random bytes in the token of a sandbox's PID-1 agent (known only to the fake).
const TOKEN_BYTES: usize = 16;

/// Every local sandbox a fake runs, by the fake's sandbox id.
pub struct Sandboxes {
    data_dir: PathBuf,
    provider: LocalProvider,
    live: Mutex<HashMap<String, SandboxHandle>>,
    /// Addresses on this host every sandbox reaches at its own 127.0.0.1 (`--sandbox-reach`).
    reach: Vec<SocketAddr>,
    /// The relays of `reach`, per sandbox, ended when it is deleted.
    relays: Mutex<HashMap<String, Vec<tokio::task::JoinHandle<()>>>>,
}

/// Why a port inside a sandbox could not be dialled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    /// No such sandbox (any more).
    #[error("sandbox {0} is not running")]
    NoSandbox(String),
    /// Nothing listens on the port.
    #[error("nothing listens on port {port} in sandbox {id}: {reason}")]
    NotListening {
        /// The sandbox.
        id: String,
        /// The port.
        port: u16,
        /// The agent's explanation.
        reason: String,
    },
}

impl Sandboxes {
    /// Sandboxes kept under `data_dir/local/`, running `agent_binary`, without network.
    pub fn new(data_dir: PathBuf, agent_binary: PathBuf) -> Sandboxes {
        Sandboxes::reaching(data_dir, agent_binary, Vec::new())
    }

    /// Sandboxes as [`Sandboxes::new`] makes them, each reaching `reach` (addresses on this
    /// host) at its own 127.0.0.1 on the same ports.
    pub fn reaching(data_dir: PathBuf, agent_binary: PathBuf, reach: Vec<SocketAddr>) -> Sandboxes {
        let ctx = ProviderContext {
            data_dir: data_dir.clone(),
            agent_binary,
            trust: Default::default(),
            docker_host: None,
        };
        Sandboxes {
            data_dir,
            provider: LocalProvider::new(ctx),
            live: Mutex::new(HashMap::new()),
            reach,
            relays: Mutex::new(HashMap::new()),
        }
    }

    /// The fake's data directory (its image store lives under it).
    pub(crate) fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Makes the local sandbox `id` from the OCI image layout at `image` (a template,
    /// snapshot or image the fake built), or on the default root file system when `None`.
    pub(crate) async fn create_from(&self, id: &str, image: Option<&Path>) -> anyhow::Result<()> {
        let token = random_hex(TOKEN_BYTES);
        let spec = SandboxSpec {
            env: BTreeMap::from([("PATH".to_string(), SANDBOX_PATH.to_string())]),
            network: NetworkPolicy::None,
            image: image.map(|dir| format!("oci:{}", dir.display())),
            ..Default::default()
        };
        let created = self
            .provider
            .create(id, &token, &spec)
            .await
            .map_err(|e| anyhow!("the local sandbox behind {id} cannot start: {e}"))?;
        let handle = SandboxHandle {
            id: id.to_string(),
            provider_ref: created.provider_ref,
            agent_token: token,
            meta: created.meta,
        };
        if let Err(e) = self.open_reach(id, &handle).await {
            let _ = self.provider.delete(&handle).await;
            return Err(e);
        }
        self.live
            .lock()
            .expect("sandbox table")
            .insert(id.to_string(), handle);
        Ok(())
    }

    /// Opens the listeners of `--sandbox-reach` in sandbox `id`'s network namespace and
    /// starts relaying them.
    async fn open_reach(&self, id: &str, handle: &SandboxHandle) -> anyhow::Result<()> {
        if self.reach.is_empty() {
            return Ok(());
        }
        let ns = self
            .provider
            .network_namespace(handle)
            .map_err(|e| anyhow!("sandbox {id}: {e}"))?
            .ok_or_else(|| anyhow!("sandbox {id} has no network namespace of its own"))?;
        let ports: Vec<u16> = self.reach.iter().map(SocketAddr::port).collect();
        let listeners = tokio::task::spawn_blocking(move || {
            std::thread::spawn(move || listen_in(&ns, &ports))
                .join()
                .map_err(|_| anyhow!("the thread entering the sandbox's namespace panicked"))?
        })
        .await??;
        let mut relays = Vec::new();
        for (listener, target) in listeners.into_iter().zip(self.reach.iter().copied()) {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            relays.push(tokio::spawn(relay_to(listener, target)));
        }
        self.relays
            .lock()
            .expect("relay table")
            .insert(id.to_string(), relays);
        Ok(())
    }

    /// A protocol session with the sandbox's PID-1 agent.
    pub(crate) async fn session(&self, id: &str) -> anyhow::Result<Session> {
        let handle = self
            .handle(id)
            .ok_or_else(|| anyhow!("sandbox {id} is not running"))?;
        let socket = self
            .provider
            .connect(&handle)
            .await
            .map_err(|e| anyhow!("sandbox {id}: {e}"))?;
        Session::handshake(socket.into_websocket().await)
            .await
            .map_err(|e| anyhow!("sandbox {id}: {e}"))
    }

    /// Starts `argv` with `env` in the background (it outlives the returned handle).
    pub(crate) async fn start(
        &self,
        id: &str,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    ) -> anyhow::Result<Process> {
        let session = self.session(id).await?;
        let mut spec = ExecSpec::argv(argv);
        spec.env = env;
        spec.cwd = cwd.map(Into::into);
        spec.background = true;
        session
            .exec(spec)
            .await
            .context("the agent refused to start the process")
    }

    /// A TCP connection to `port` on the sandbox's loopback, refused (as an edge would) when
    /// nothing listens there.
    pub(crate) async fn dial(&self, id: &str, port: u16) -> Result<RawStream, DialError> {
        let session = self
            .session(id)
            .await
            .map_err(|_| DialError::NoSandbox(id.to_string()))?;
        let not_listening = |reason: String| DialError::NotListening {
            id: id.to_string(),
            port,
            reason,
        };
        let ports = session
            .ports()
            .await
            .map_err(|e| not_listening(e.to_string()))?;
        if !ports.iter().any(|p| p.port == port) {
            return Err(not_listening("no listener".into()));
        }
        session
            .connect_port(port)
            .await
            .map_err(|e| not_listening(e.to_string()))
    }

    /// Freezes every process of sandbox `id` but its PID-1 agent (the fake's own way in),
    /// memory kept, as a paused cloud sandbox's are; already frozen is no error.
    pub(crate) async fn freeze(&self, id: &str) -> Result<(), ProviderError> {
        let handle = self
            .handle(id)
            .ok_or_else(|| ProviderError::Gone(id.to_string()))?;
        match self.provider.pause(&handle).await {
            Ok(()) | Err(ProviderError::Conflict(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Thaws what [`Sandboxes::freeze`] froze; not frozen is no error.
    pub(crate) async fn thaw(&self, id: &str) -> Result<(), ProviderError> {
        let handle = self
            .handle(id)
            .ok_or_else(|| ProviderError::Gone(id.to_string()))?;
        match self.provider.resume(&handle).await {
            Ok(()) | Err(ProviderError::Conflict(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes every sandbox (when the fake stops).
    pub(crate) async fn delete_all(&self) {
        let ids: Vec<String> = self
            .live
            .lock()
            .expect("sandbox table")
            .keys()
            .cloned()
            .collect();
        for id in ids {
            if let Err(e) = self.delete(&id).await {
                tracing::warn!("cannot remove the local sandbox {id}: {e}");
            }
        }
    }

    /// Removes the sandbox and everything in it; an unknown id is already gone.
    pub(crate) async fn delete(&self, id: &str) -> Result<(), ProviderError> {
        for relay in self
            .relays
            .lock()
            .expect("relay table")
            .remove(id)
            .unwrap_or_default()
        {
            relay.abort();
        }
        let handle = self.live.lock().expect("sandbox table").remove(id);
        match handle {
            Some(handle) => self.provider.delete(&handle).await,
            None => Ok(()),
        }
    }

    fn handle(&self, id: &str) -> Option<SandboxHandle> {
        self.live.lock().expect("sandbox table").get(id).cloned()
    }
}

/// Runs on a thread of its own, which ends in the sandbox's namespace `ns` (never reused):
/// listens on 127.0.0.1 at each of `ports` there.
fn listen_in(ns: &std::fs::File, ports: &[u16]) -> anyhow::Result<Vec<std::net::TcpListener>> {
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
        .context("entering the sandbox's network namespace (the fake must run as root)")?;
    ports
        .iter()
        .map(|port| {
            let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, *port))
                .with_context(|| format!("listening on 127.0.0.1:{port} in the sandbox"))?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .collect()
}

/// Relays every connection `listener` (inside a sandbox) accepts to `target` on this host.
async fn relay_to(listener: tokio::net::TcpListener, target: SocketAddr) {
    while let Ok((mut inside, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Ok(mut outside) = tokio::net::TcpStream::connect(target).await {
                let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
            }
        });
    }
}

/// A random version-4 UUID, as Daytona's ids and E2B's build ids are.
pub fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `n` random bytes as lower-case hex.
pub(crate) fn random_hex(n: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..n)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

/// `n` random characters from `alphabet`.
pub(crate) fn random_id(n: usize, alphabet: &[u8]) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..n)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

//! The `local` provider: each sandbox is a set of fresh Linux namespaces (mount, PID, network,
//! UTS, IPC, cgroup and user: root inside is an unprivileged host uid) limited by a cgroup (v2 or v1),
//! with `tether-agent` as its PID 1, on this machine.
//!
//! # Layout
//!
//! - Relay side: [`LocalProvider`] (this file) unpacks an `oci:` image into a root file
//!   system cached by digest ([`tether_oci::unpack`]; the image's environment and static
//!   agent are used), checks a request (`plan`), makes the sandbox's directory (`layout`),
//!   its disk (`disk`: a size-limited ext4 file system on a loop device) and cgroup
//!   (`hierarchy` finds v1 or v2, `cgroup` creates, kills and removes), and starts the
//!   sandbox init (`spawn`), handing it an `InitConfig` (`config`).
//!   It keeps `Meta` (`meta`) in the store, answers `state` from it (`process`), connects
//!   to the agent (`connect`), pauses and resumes every process but the agent (`freeze`),
//!   stops and starts it with its disk kept (`stop`) and removes everything on delete
//!   (`teardown`). At relay start it removes what a crash left: interrupted creates and
//!   orphaned sandboxes (`recovery`).
//! - The relay's binary is pinned by a descriptor when the provider is made (`own_binary`),
//!   so an upgrade in place does not stop creates.
//! - Sandbox side: the relay binary re-executed as `tether __sandbox-init` (`init`) creates
//!   the namespaces (`namespaces`) and forks PID 1, which brings `lo` up (`net`), assembles and
//!   enters its root (`rootfs`, from `mounts`, `etc`, `devfs`, `procfs`), drops capabilities
//!   (`caps`) and execs the agent with its listening socket as fd 3.
//! - `sys` and `loopdev` (the loop-device ioctls) hold the only `unsafe` code, `constants`
//!   every tunable, `error` the error types; `tether-mountinfo` reads the host's mount
//!   table.
//!
//! The relay's `main` must call [`run_if_sandbox_init`] before anything else.

#![warn(missing_docs)]

mod caps;
mod cgroup;
mod config;
mod connect;
mod constants;
mod devfs;
mod disk;
mod error;
mod etc;
mod freeze;
mod hierarchy;
mod init;
mod layout;
mod loopdev;
mod meta;
mod mounts;
mod namespaces;
mod net;
mod own_binary;
mod plan;
mod process;
mod procfs;
mod recovery;
mod rootfs;
mod seccomp;
mod spawn;
mod stage;
mod stop;
mod sys;
mod teardown;
mod trust;
mod userns;

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_trait::async_trait;

pub use init::run_if_sandbox_init;

use self::config::InitConfig;
use self::constants::{IMAGE_CACHE_DIR, IMAGE_CACHE_KEEP_UNUSED, PROVIDER_DIR};
use self::error::LocalError;
use self::hierarchy::Hierarchy;
use self::layout::Layout;
use self::meta::Meta;
use self::own_binary::OwnBinary;
use self::plan::Rootfs;
use self::process::Liveness;
use self::teardown::{CreateGuard, Teardown};
use tether_oci::{self as image, PreparedImage};
use tether_relay_core::egress::explicit_proxy;
use tether_relay_core::provider::{
    AgentSocket, Capabilities, Created, Labelled, NetworkPolicy, Provider, ProviderContext,
    ProviderError, SandboxHandle, SandboxSpec, SandboxState, Unaccounted, Unfinished,
};

/// Runs sandboxes as namespaces and cgroups on this machine.
#[derive(Clone, Debug)]
pub struct LocalProvider {
    ctx: ProviderContext,
}

impl LocalProvider {
    /// Fails unless the sandbox's agent runs: a stopped or dead sandbox can be neither
    /// paused nor resumed.
    fn refuse_unless_running(
        &self,
        sandbox: &SandboxHandle,
        meta: &Meta,
        layout: &Layout,
    ) -> Result<(), ProviderError> {
        if stop::is_stopped(layout) {
            return Err(ProviderError::Conflict(format!(
                "sandbox {} is stopped; `tether start {}` starts it",
                sandbox.id, sandbox.id
            )));
        }
        match meta.process.liveness() {
            Liveness::Alive => Ok(()),
            // The relay asks `state` again, which finds it dead.
            Liveness::Dead(_) => Err(ProviderError::Gone(sandbox.id.clone())),
            Liveness::Unknown(reason) => Err(ProviderError::Unavailable(format!(
                "cannot tell whether sandbox {} runs: {reason}; try again",
                sandbox.id
            ))),
        }
    }

    /// A provider that keeps its files under `ctx.data_dir/local/`. Never fails: what the host
    /// lacks is reported by `create`. Pins the relay's own binary (the first time in this
    /// process), so sandboxes still start after the file is replaced on disk.
    pub fn new(ctx: ProviderContext) -> Self {
        let _ = OwnBinary::get();
        LocalProvider { ctx }
    }

    /// The data directory as an absolute path: the sandbox init runs in `/`.
    fn data_dir(&self) -> PathBuf {
        std::path::absolute(&self.ctx.data_dir).unwrap_or_else(|_| self.ctx.data_dir.clone())
    }

    fn agent_binary(&self) -> Result<PathBuf, LocalError> {
        let path = &self.ctx.agent_binary;
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
                std::fs::canonicalize(path)
                    .map_err(|e| LocalError::io("resolve the agent binary", e))
            }
            _ => Err(LocalError::Unavailable(format!(
                "the agent binary {} is missing or not executable; build tether-agent (a static \
                 Linux executable) and point the relay's agent binary setting at it",
                path.display()
            ))),
        }
    }

    /// Drops unpacked images no sandbox uses beyond the few most recently used, so the cache
    /// does not grow with every image ever run.
    async fn prune_images(&self) {
        let data_dir = self.data_dir();
        let cache = self.data_dir().join(PROVIDER_DIR).join(IMAGE_CACHE_DIR);
        let pruned = tokio::task::spawn_blocking(move || {
            let in_use = layout::images_in_use(&data_dir);
            image::unpack::prune_cache(&cache, &in_use, IMAGE_CACHE_KEEP_UNUSED)
        })
        .await
        .unwrap_or(0);
        if pruned > 0 {
            tracing::debug!("removed {pruned} unused unpacked images");
        }
    }

    /// Unpacks the OCI image `image` (`oci:PATH[:TAG]`) into the provider's image cache, or
    /// finds it there (keyed by manifest digest).
    async fn prepare_image(&self, image: &str) -> Result<PreparedImage, LocalError> {
        let cache = self.data_dir().join(PROVIDER_DIR).join(IMAGE_CACHE_DIR);
        let image = image.to_string();
        tokio::task::spawn_blocking(move || image::prepare_rootfs(&image, &cache))
            .await
            .map_err(|e| LocalError::Unavailable(format!("unpacking the image stopped: {e}")))?
            .map_err(|e| LocalError::BadSpec(e.to_string()))
    }

    async fn try_create(
        &self,
        id: &str,
        agent_token: &str,
        spec: &SandboxSpec,
    ) -> Result<Meta, LocalError> {
        plan::check_id(id)?;
        let prepared = match spec
            .image
            .as_deref()
            .filter(|i| image::unpack::is_oci_ref(i))
        {
            Some(oci) => Some(self.prepare_image(oci).await?),
            None => None,
        };
        let rootfs = match (&prepared, spec.image.as_deref()) {
            (Some(p), Some(oci)) => plan::image_dir(oci, &p.rootfs)?,
            _ => plan::rootfs(spec)?,
        };
        let limits = plan::limits(spec)?;
        let storage = disk::Storage::plan(spec, nix::unistd::geteuid().is_root())?;
        let image_env = prepared.as_ref().map(|p| p.env()).unwrap_or_default();
        let home = match rootfs {
            Rootfs::Host => constants::HOST_ROOTFS_HOME,
            Rootfs::Image(_) => "/root",
        };
        let mut env = plan::environment(id, agent_token, spec, image_env, home)?;
        // A sandbox with secrets trusts its egress CA (the egress service made it just now).
        let egress_ca = match spec.network {
            NetworkPolicy::Allowlist => self.ctx.trust.take(id),
            _ => None,
        };
        if egress_ca.is_some() {
            for (key, value) in trust::environment() {
                env.retain(|e| !e.starts_with(&format!("{key}=")));
                env.push(format!("{key}={value}"));
            }
        }
        // An allowlisted sandbox's HTTP clients ask its explicit proxy, whose refusals say
        // why; variables the spec sets itself are kept.
        if spec.network == NetworkPolicy::Allowlist {
            for (key, value) in explicit_proxy::environment() {
                if !spec.env.contains_key(key) {
                    env.retain(|e| !e.starts_with(&format!("{key}=")));
                    env.push(format!("{key}={value}"));
                }
            }
        }
        // An image built by `tether image build` carries its own static agent.
        let agent_binary = match prepared.as_ref().and_then(|p| p.agent()) {
            Some(agent) => agent,
            None => self.agent_binary()?,
        };
        let program = own_binary::own_program()?;
        let cgroup = Hierarchy::detect()?.sandbox(id);

        let layout = Layout::new(&self.data_dir(), id);
        layout.create()?;
        let guard = CreateGuard::new(Teardown {
            id: id.to_string(),
            layout: layout.clone(),
            cgroup: Some(cgroup.clone()),
            process: None,
        });
        if let Some(p) = &prepared {
            // Marks the cached image as in use while this sandbox exists.
            if let Err(e) = std::fs::write(layout.image_marker(), p.digest.hex()) {
                guard.undo().await;
                return Err(LocalError::io("record the sandbox's image", e));
            }
        }
        if let Some(ca) = &egress_ca {
            if let Err(e) = trust::write(&layout, &rootfs, ca) {
                guard.undo().await;
                return Err(e);
            }
        }
        let users = userns::mapping_for(id);
        if let Err(e) = userns::open_sandbox_dir(&layout, users) {
            guard.undo().await;
            return Err(e);
        }
        // The host ids of the sandbox's root own what it may write.
        let owner = users.root_on_host();
        let made = {
            let (layout, data_dir) = (layout.clone(), self.data_dir());
            let overlay = matches!(rootfs, Rootfs::Image(_));
            tokio::task::spawn_blocking(move || {
                disk::create(&layout, &data_dir, storage, overlay, owner)
            })
            .await
            .unwrap_or_else(|e| {
                Err(LocalError::Unavailable(format!(
                    "making the disk stopped: {e}"
                )))
            })
        };
        if let Err(e) = made {
            guard.undo().await;
            return Err(e);
        }
        let config = InitConfig {
            id: id.to_string(),
            layout: layout.clone(),
            rootfs: rootfs.clone(),
            agent_binary,
            network: spec.network,
            cgroup_procs: cgroup.procs_files(),
            users,
            seccomp_unconfined: spec.seccomp_unconfined,
            env,
            agent_args: prepared
                .as_ref()
                .map(plan::image_agent_args)
                .unwrap_or_default(),
            trust_egress_ca: egress_ca.is_some(),
        };
        let restart = stop::Restart {
            config: config.clone(),
            limits,
        };
        let started = match stop::save(&layout, &restart).and_then(|()| cgroup.create(&limits)) {
            Ok(()) => spawn::start(&program, &config, &layout.log()).await,
            Err(e) => Err(e),
        };
        match started {
            Ok(process) => {
                guard.disarm();
                Ok(Meta {
                    process,
                    sandbox_dir: layout.dir().to_path_buf(),
                    socket: layout.socket(),
                    log: layout.log(),
                    cgroup,
                    network: spec.network,
                    rootfs,
                    user_namespace: true,
                })
            }
            Err(e) => {
                guard.undo().await;
                Err(e)
            }
        }
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    fn runs_here(&self) -> bool {
        true
    }

    async fn create(
        &self,
        id: &str,
        agent_token: &str,
        spec: &SandboxSpec,
    ) -> Result<Created, ProviderError> {
        let begun = Instant::now();
        let meta = self.try_create(id, agent_token, spec).await?;
        tracing::debug!(
            sandbox = id,
            pid = meta.process.pid,
            elapsed_us = begun.elapsed().as_micros() as u64,
            "local sandbox started"
        );
        let meta = serde_json::to_value(&meta).map_err(anyhow::Error::new)?;
        Ok(Created {
            provider_ref: id.to_string(),
            meta,
        })
    }

    async fn state(&self, sandbox: &SandboxHandle) -> Result<SandboxState, ProviderError> {
        let (meta, layout) = Meta::load(sandbox, &self.data_dir())?;
        Ok(match meta.process.liveness() {
            Liveness::Alive if freeze::is_paused(&meta.cgroup) => SandboxState::Paused,
            Liveness::Alive => SandboxState::Running,
            Liveness::Dead(_) if stop::is_stopped(&layout) => SandboxState::Stopped,
            // Its files, disk and cgroup stay until a delete: the sandbox is dead, not gone.
            Liveness::Dead(evidence) => {
                tracing::info!(sandbox = %sandbox.id, "the sandbox's agent ended: {evidence}");
                SandboxState::Dead
            }
            Liveness::Unknown(reason) => {
                tracing::warn!(sandbox = %sandbox.id, "cannot tell whether the sandbox runs: {reason}");
                SandboxState::Unknown
            }
        })
    }

    fn capabilities(&self) -> Capabilities {
        // Read once: the host's cgroup mounts do not change under a running relay.
        static PAUSE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let pause = *PAUSE.get_or_init(|| match Hierarchy::detect() {
            Ok(Hierarchy::V2 { .. }) => true,
            Ok(Hierarchy::V1 { freezer, .. }) => freezer.is_some(),
            Err(_) => false,
        });
        Capabilities { pause, stop: true }
    }

    async fn stop(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        let (meta, layout) = Meta::load(sandbox, &self.data_dir())?;
        if !stop::is_stopped(&layout) {
            self.refuse_unless_running(sandbox, &meta, &layout)?;
        }
        let id = sandbox.id.clone();
        tokio::task::spawn_blocking(move || stop::stop(&id, &meta, &layout))
            .await
            .map_err(|e| anyhow::anyhow!("stopping a sandbox stopped: {e}"))??;
        Ok(())
    }

    async fn start(
        &self,
        sandbox: &SandboxHandle,
    ) -> Result<Option<serde_json::Value>, ProviderError> {
        let (meta, layout) = Meta::load(sandbox, &self.data_dir())?;
        let started = stop::start(&sandbox.id, &meta, &layout).await?;
        let meta = serde_json::to_value(&started)
            .map_err(|e| anyhow::anyhow!("cannot encode the sandbox's metadata: {e}"))?;
        Ok(Some(meta))
    }

    async fn pause(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        let (meta, layout) = Meta::load(sandbox, &self.data_dir())?;
        self.refuse_unless_running(sandbox, &meta, &layout)?;
        let id = sandbox.id.clone();
        tokio::task::spawn_blocking(move || freeze::pause(&id, &meta.cgroup, meta.process.pid))
            .await
            .map_err(|e| anyhow::anyhow!("pausing a sandbox stopped: {e}"))??;
        Ok(())
    }

    async fn resume(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        let (meta, layout) = Meta::load(sandbox, &self.data_dir())?;
        self.refuse_unless_running(sandbox, &meta, &layout)?;
        freeze::resume(&sandbox.id, &meta.cgroup)?;
        Ok(())
    }

    async fn delete(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        let id = sandbox.id.clone();
        let teardown = match Meta::load(sandbox, &self.data_dir()) {
            Ok((meta, layout)) => Teardown {
                id,
                layout,
                cgroup: Some(meta.cgroup),
                process: Some(meta.process),
            },
            // Never created by this provider under this id: nothing of ours to remove.
            Err(_) if plan::check_id(&id).is_err() => return Ok(()),
            Err(e) => {
                // An orphan (an admin's `tether rm` of a sandbox no store row describes)
                // has no metadata at all; a damaged one is worth a word. Either way the
                // sandbox is found by its id, its processes by their working directory.
                if !sandbox.meta.is_null() {
                    tracing::warn!("{e}; removing sandbox {id} by its id instead");
                }
                let data_dir = self.data_dir();
                tokio::task::spawn_blocking(move || recovery::remove(&data_dir, &id))
                    .await
                    .map_err(|e| anyhow::anyhow!("removing a sandbox stopped: {e}"))??;
                self.prune_images().await;
                return Ok(());
            }
        };
        teardown.run_blocking().await?;
        self.prune_images().await;
        Ok(())
    }

    async fn remove_unfinished(
        &self,
        id: &str,
        _provider_ref: Option<&str>,
    ) -> Result<Unfinished, ProviderError> {
        let (data_dir, id) = (self.data_dir(), id.to_string());
        tokio::task::spawn_blocking(move || recovery::remove(&data_dir, &id))
            .await
            .map_err(|e| anyhow::anyhow!("removing an interrupted create stopped: {e}"))??;
        Ok(Unfinished::Removed)
    }

    async fn unaccounted(
        &self,
        accounted: &HashSet<String>,
    ) -> Result<Vec<Unaccounted>, ProviderError> {
        let (data_dir, accounted) = (self.data_dir(), accounted.clone());
        let found = tokio::task::spawn_blocking(move || {
            // Half-formatted templates are the provider's own temporary files, which no
            // sandbox holds: removing them loses nothing.
            match recovery::remove_partial_templates(&data_dir) {
                Ok(0) => {}
                Ok(n) => tracing::info!("removed {n} half-formatted disk templates"),
                Err(e) => tracing::warn!("cannot look for half-formatted disk templates: {e}"),
            }
            recovery::orphans(&data_dir, &accounted)
        })
        .await
        .map_err(|e| anyhow::anyhow!("looking for unaccounted sandboxes stopped: {e}"))??;
        Ok(found
            .into_iter()
            .map(|(id, dir)| Unaccounted {
                id,
                place: format!("the directory {}", dir.display()),
            })
            .collect())
    }

    async fn labelled(&self) -> Result<Option<Vec<Labelled>>, ProviderError> {
        // A local sandbox's directory is its label: every one under this data directory is
        // this relay's, and the store tells which are known.
        let data_dir = self.data_dir();
        let found = tokio::task::spawn_blocking(move || recovery::sandboxes(&data_dir))
            .await
            .map_err(|e| anyhow::anyhow!("listing local sandboxes stopped: {e}"))??;
        Ok(Some(
            found
                .into_iter()
                .map(|(id, _)| Labelled {
                    provider_ref: id.clone(),
                    id,
                })
                .collect(),
        ))
    }

    fn network_namespace(
        &self,
        sandbox: &SandboxHandle,
    ) -> Result<Option<std::fs::File>, ProviderError> {
        let (meta, _) = Meta::load(sandbox, &self.data_dir())?;
        if meta.network == NetworkPolicy::Host {
            return Ok(None);
        }
        let gone = || ProviderError::Gone(sandbox.id.clone());
        if !matches!(meta.process.liveness(), Liveness::Alive) {
            return Err(gone());
        }
        let ns = std::fs::File::open(format!("/proc/{}/ns/net", meta.process.pid))
            .map_err(|_| gone())?;
        // Checked again once open: the pid may have been reused by another process between
        // the two, and the namespace opened would then be someone else's.
        if !matches!(meta.process.liveness(), Liveness::Alive) {
            return Err(gone());
        }
        Ok(Some(ns))
    }

    async fn renew(&self, _sandbox: &SandboxHandle, _ttl: Duration) -> Result<(), ProviderError> {
        // Local sandboxes have no provider-side lifetime; the relay's reaper enforces TTLs.
        Ok(())
    }

    async fn connect(&self, sandbox: &SandboxHandle) -> Result<AgentSocket, ProviderError> {
        let (meta, layout) = Meta::load(sandbox, &self.data_dir())?;
        match meta.process.liveness() {
            Liveness::Dead(_) => return Err(ProviderError::Gone(sandbox.id.clone())),
            // Try anyway: the agent's answer is the better evidence.
            Liveness::Unknown(reason) => {
                tracing::warn!(sandbox = %sandbox.id, "cannot tell whether the sandbox runs: {reason}");
            }
            Liveness::Alive => {}
        }
        match connect::open(&layout.socket(), &sandbox.id, &sandbox.agent_token).await {
            // The socket is missing or refuses: gone only if its first process is proven dead.
            Err(ProviderError::Gone(_)) => match meta.process.liveness() {
                Liveness::Dead(_) => Err(ProviderError::Gone(sandbox.id.clone())),
                other => Err(ProviderError::Unavailable(format!(
                    "the agent of sandbox {} does not accept connections, though its first \
                     process is {other}; try again, and `tether rm {}` if this persists",
                    sandbox.id, sandbox.id
                ))),
            },
            other => other,
        }
    }
}

//! What every handler and background task of one relay shares: the store, the providers,
//! the policy, the open tunnels, its peers and the shutdown signal.

use std::collections::BTreeMap;
use std::fs::File;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::Flock;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use super::activity::Tunnels;
use super::caller::Caller;
use super::error::ApiError;
use super::policy::Policy;
use tether_relay_core::provider::{Provider, ProviderError, SandboxState};
use tether_store::{NodeId, SandboxId, SandboxRecord, Store};

/// One running relay's shared state.
pub(super) struct Relay {
    /// Sandboxes and tokens.
    pub store: Store,
    /// This relay among those sharing its database: its data directory's `node.id`.
    pub node: NodeId,
    /// This relay's view of the relays sharing its database.
    pub cluster: super::cluster::Cluster,
    /// Every configured provider, by name.
    pub providers: BTreeMap<&'static str, Arc<dyn Provider>>,
    /// Open tunnels per sandbox.
    pub tunnels: Arc<Tunnels>,
    /// What each tenant may use.
    pub policy: Policy,
    /// Fires when the relay shuts down; tunnels and the reaper watch it.
    pub shutdown: CancellationToken,
    /// Tunnels and detached provider calls, awaited at shutdown.
    pub tasks: TaskTracker,
    /// Where the admin token is, for error messages.
    pub admin_token_file: PathBuf,
    /// The file descriptor budget: tunnels check it before opening their agent's socket.
    pub fds: Arc<super::fds::FdBudget>,
    /// How long a tunnel's client or agent may be silent (not even answering pings) before it
    /// is taken for dead and the tunnel closed.
    pub peer_timeout: std::time::Duration,
    /// Whether the relay serves HTTPS: its own URLs (previews) say `https` then.
    pub tls: bool,
    /// The domain its previews are also served under by host name (`{port}-{id}.DOMAIN`);
    /// `None`: `*.localhost` only.
    pub preview_domain: Option<super::preview_domain::PreviewDomain>,
    /// The egress proxy of sandboxes with an allowlist.
    pub egress: Arc<tether_egress::Egress>,
    /// Held while anything of this relay runs, so no second relay opens the data directory.
    pub _dir_lock: Flock<File>,
}

impl Relay {
    /// Runs `job` every `interval` until the relay shuts down (a run that overruns delays the
    /// next instead of bunching them; one under way at shutdown is dropped).
    pub(super) async fn every<F, Fut>(&self, interval: Duration, mut job: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.shutdown.cancelled() => return,
            }
            tokio::select! {
                () = job() => {}
                () = self.shutdown.cancelled() => return,
            }
        }
    }

    /// The scheme of the relay's own URLs: `https` when it serves TLS.
    pub(crate) fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }

    /// The provider called `name`; an unknown name is the caller's mistake.
    pub(super) fn provider(&self, name: &str) -> Result<Arc<dyn Provider>, ApiError> {
        self.providers.get(name).cloned().ok_or_else(|| {
            ApiError::Invalid(format!(
                "unknown provider `{name}`; this relay has: {}",
                self.provider_names()
            ))
        })
    }

    /// The provider running `sandbox`; missing means the relay's configuration changed.
    pub(super) fn provider_of(
        &self,
        sandbox: &SandboxRecord,
    ) -> Result<Arc<dyn Provider>, ApiError> {
        self.providers
            .get(sandbox.provider.as_str())
            .cloned()
            .ok_or_else(|| {
                ApiError::Unavailable(format!(
                    "sandbox {} runs on provider `{}`, which this relay does not have configured \
                 (it has: {}); restart the relay with that provider available",
                    sandbox.id,
                    sandbox.provider,
                    self.provider_names()
                ))
            })
    }

    fn provider_names(&self) -> String {
        let names: Vec<&str> = self.providers.keys().copied().collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }

    /// Asks the provider for `sandbox`'s state and records a change. A provider that cannot
    /// answer makes it `unknown` (and is logged): a read should not fail for it, and only the
    /// provider's positive answer makes a sandbox `gone`. A sandbox on another relay's host is
    /// left as its owner last recorded it (the owner watches it): asked from here, its
    /// provider would find nothing of it.
    pub(super) async fn refresh_state(&self, provider: &dyn Provider, sandbox: &mut SandboxRecord) {
        if !self.is_here(sandbox) {
            return;
        }
        let state = match provider.state(&sandbox.handle()).await {
            Ok(state) => state,
            Err(ProviderError::Gone(_)) => SandboxState::Gone,
            Err(e) => {
                warn!("cannot refresh the state of sandbox {}: {e:#}", sandbox.id);
                SandboxState::Unknown
            }
        };
        if state != sandbox.state {
            sandbox.state = state;
            if let Err(e) = self.store.set_state(&sandbox.id, state).await {
                warn!("cannot record the state of sandbox {}: {e}", sandbox.id);
            }
        }
    }

    /// Deletes `sandbox` at its provider (through its owner, if it is on another relay's
    /// host), then forgets it. A provider failure keeps the record, so the delete can be
    /// retried.
    pub(super) async fn destroy(
        &self,
        provider: &dyn Provider,
        sandbox: &SandboxRecord,
    ) -> Result<(), ApiError> {
        match self.delete_at_provider(provider, sandbox).await {
            Ok(()) | Err(ProviderError::Gone(_)) => {}
            Err(e) => return Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e)),
        }
        self.egress.detach(&sandbox.id);
        self.store.remove(&sandbox.id).await?;
        Ok(())
    }

    /// Runs `work` to completion even if the client disconnects: a create or delete cut off
    /// between the provider and the store would leak a sandbox or keep a dead one.
    pub(super) async fn detached<T, F>(&self, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, ApiError>> + Send + 'static,
    {
        self.tasks
            .spawn(work)
            .await
            .map_err(|e| ApiError::Internal(format!("a relay task failed: {e}")))?
    }

    /// Records client activity on sandbox `id` now. Never fails the caller: activity the
    /// store cannot take (its disk full, its database unreachable) is kept in memory, where
    /// the reaper counts it as activity and writes it once it can.
    pub(super) async fn record_activity(&self, id: &SandboxId) {
        if let Err(e) = self.store.touch(vec![id.clone()], now_ms()).await {
            // Said once per sandbox until a record is written again, not on every session.
            if self.tunnels.unrecorded(id.clone()) {
                warn!(
                    "cannot record activity on sandbox {id}: {e}; it counts as active until \
                     the record is written"
                );
            }
        }
    }

    /// A 401 that says what to do.
    pub(super) fn unauthorized(&self, reason: &'static str) -> ApiError {
        ApiError::Unauthorized {
            reason,
            admin_token_file: self.admin_token_file.clone(),
        }
    }
}

/// Now, in milliseconds since the Unix epoch.
pub(super) fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// The caller's sandbox `id`, or a 404 that does not reveal other tenants' sandboxes.
pub(crate) async fn find(
    relay: &Relay,
    caller: &Caller,
    id: String,
) -> Result<SandboxRecord, ApiError> {
    let id = SandboxId::from(id);
    if let Some(sandbox) = relay.store.get(&caller.tenant, &id).await? {
        return Ok(sandbox);
    }
    Err(match relay.store.destroyed(&caller.tenant, &id).await? {
        Some(entry) => ApiError::deleted(&entry),
        None => ApiError::no_sandbox(&id),
    })
}

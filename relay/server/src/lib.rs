//! The relay (`tether serve`): provisions sandboxes through providers, keeps them in
//! the store, and tunnels client sessions to each sandbox's agent.
//!
//! # Layout
//! - this file: [`start`] and shutting down ([`RunningRelay`]);
//! - `state`: what all handlers share; `routes`: the router, health, tokens;
//! - `sandboxes`: the lifecycle routes; `tunnel`: the WebSocket data path (its upgrades,
//!   and frame forwarding where it cannot splice); `splice`: copying a tunnel's bytes
//!   unread;
//! - `secrets`: the tenants' secret store (values sealed by the store); `bound_secrets`:
//!   binding secrets to a sandbox by placeholder at create;
//! - `providers`: the one place that names every provider (the local runtime, and those of
//!   `tether-providers` this build has);
//! - `auth`: API tokens, the admin token file, the caller's tenant and role;
//! - `policy`: what each tenant may use (the policy file, image roots, value ranges);
//! - `reaper`: TTL, idle timeout and reconciliation; `activity`: open tunnels;
//! - `recovery`: at start, what a crash left (interrupted creates this relay journaled are
//!   removed; sandboxes nothing accounts for are reported and kept), once the data directory
//!   is found to belong to the store opened (`tether_store` binds them);
//!   `watch`: marks sandboxes whose agent died `dead`;
//! - `cluster`: relays as replicas over a shared database (node ids, heartbeats, the
//!   relay-to-relay hop to sandboxes on another relay's host);
//! - `fds`: the descriptor limit and budget; `admission`: the accept loop and the 503 it
//!   answers when descriptors run short; `http`: serving connections (header timeout,
//!   connection cap); `tls`: serving HTTPS and WSS;
//! - `error`: the one map from errors to responses;
//! - `constants`: every tunable.

#![warn(missing_docs)]

mod activity;
mod admission;
mod auth;
mod bodies;
mod bound_secrets;
mod caller;
mod cluster;
mod constants;
mod error;
mod fds;
mod hop;
mod http;
mod orphans;
mod policy;
mod power;
mod preview;
mod preview_domain;
mod providers;
mod reaper;
mod recovery;
mod routes;
mod sandboxes;
mod secrets;
mod splice;
mod state;
#[cfg(test)]
mod tests;
mod tls;
mod tunnel;
mod watch;

use std::collections::BTreeMap;
use std::fs::{DirBuilder, File};
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::fcntl::{Flock, FlockArg};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

pub use constants::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_LISTEN, DEFAULT_PEER_TIMEOUT,
    DEFAULT_REAP_INTERVAL,
};
pub use error::ApiError;
pub use http::ConnectionLimits;
pub use policy::PolicyConfig;
pub use preview_domain::PreviewDomain;
pub use tls::{TlsError, TlsFiles};

use constants::{ADMIN_TOKEN_FILE, DB_FILE, LOCK_FILE, SHUTDOWN_GRACE};
use state::Relay;

use tether_egress::Egress;
pub use tether_egress::EgressConfig;
use tether_relay_core::egress::TrustShelf;
use tether_relay_core::provider::{Provider, ProviderContext};
use tether_store::{NodeId, Store};

/// How to run a relay.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// The address to serve on; port 0 picks a free port ([`RunningRelay::addr`] tells which).
    pub listen: SocketAddr,
    /// Where the database, the admin token and the providers' files live.
    pub data_dir: PathBuf,
    /// The `tether-agent` binary the providers run in sandboxes.
    pub agent_binary: PathBuf,
    /// How often the reaper looks for expired and idle sandboxes.
    pub reap_interval: Duration,
    /// What tenants may use.
    pub policy: PolicyConfig,
    /// Serve HTTPS and WSS with this certificate and key (nothing in clear text); `None`
    /// serves plain HTTP.
    pub tls: Option<TlsFiles>,
    /// How the egress proxy of allowlisted sandboxes resolves and trusts upstreams.
    pub egress: EgressConfig,
    /// The Docker engine's socket for the docker provider (`unix:///PATH`); `None`:
    /// `DOCKER_HOST`, else `/var/run/docker.sock`.
    pub docker_host: Option<String>,
    /// Timeouts and caps that keep dead, slow and silent peers from holding the relay.
    pub connections: ConnectionLimits,
    /// Where the store lives: this relay's SQLite file, or a PostgreSQL database shared
    /// with other relays.
    pub database: Database,
    /// The URL other relays of the database reach this one at; `None`: the address it
    /// listens on (which must then not be a wildcard when the database is shared).
    pub advertise: Option<String>,
    /// A domain whose wildcard DNS record points at this relay: previews are then also served
    /// by host name under it (`{port}-{id}.DOMAIN`), and their URLs name it instead of
    /// `localhost`. `None`: `*.localhost` only, which resolves on the relay's own machine.
    pub preview_domain: Option<PreviewDomain>,
}

/// Where a relay keeps its store.
#[derive(Clone, Default)]
pub enum Database {
    /// SQLite in `<data_dir>/relay.db`, the key beside it: one relay.
    #[default]
    Sqlite,
    /// A PostgreSQL database that any number of relays share, as replicas.
    Postgres {
        /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE`.
        url: String,
        /// The key every relay of the database shares; `None`: `<data_dir>/relay.key`.
        key_file: Option<PathBuf>,
    },
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite => f.write_str("Sqlite"),
            // The URL may hold a password.
            Database::Postgres { key_file, .. } => f
                .debug_struct("Postgres")
                .field("url", &"(not shown)")
                .field("key_file", key_file)
                .finish(),
        }
    }
}

/// A relay that is serving. Dropping it starts a shutdown without waiting for it;
/// [`RunningRelay::shutdown`] waits.
pub struct RunningRelay {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The admin token of the `default` tenant.
    pub admin_token: String,
    /// The file holding the admin token.
    pub admin_token_file: PathBuf,
    relay: Arc<Relay>,
    server: Option<JoinHandle<std::io::Result<()>>>,
    reaper: Option<JoinHandle<()>>,
}

/// Starts a relay with every provider this host can run, and returns once it is listening.
pub async fn start(config: RelayConfig) -> anyhow::Result<RunningRelay> {
    let trust = TrustShelf::default();
    let ctx = ProviderContext {
        data_dir: config.data_dir.clone(),
        agent_binary: config.agent_binary.clone(),
        trust: trust.clone(),
        docker_host: config.docker_host.clone(),
    };
    start_serving(config, providers::build(&ctx), trust).await
}

/// Starts a relay with the given providers (tests and embedders bring their own).
#[cfg(test)]
pub(crate) async fn start_with(
    config: RelayConfig,
    providers: BTreeMap<&'static str, Arc<dyn Provider>>,
) -> anyhow::Result<RunningRelay> {
    start_serving(config, providers, TrustShelf::default()).await
}

/// Starts a relay whose local provider takes egress CAs from `trust`.
async fn start_serving(
    config: RelayConfig,
    providers: BTreeMap<&'static str, Arc<dyn Provider>>,
    trust: TrustShelf,
) -> anyhow::Result<RunningRelay> {
    let fd_limit = fds::raise_limit();
    let fds = Arc::new(fds::FdBudget::new(fd_limit));
    let limits = config.connections;
    anyhow::ensure!(
        !limits.peer_timeout.is_zero()
            && !limits.header_timeout.is_zero()
            && !limits.body_timeout.is_zero(),
        "the peer timeout, the header timeout and the body timeout must be longer than zero"
    );
    let max_connections = match limits.max_connections {
        Some(0) => anyhow::bail!("the connection cap must be at least 1"),
        Some(n) => n,
        None => http::default_max_connections(fd_limit),
    };
    let data_dir = config.data_dir.clone();
    let database = config.database.clone();
    let sqlite = matches!(database, Database::Sqlite);
    let (store, node, dir_lock) =
        tokio::task::spawn_blocking(move || open_data_dir(&data_dir, sqlite))
            .await
            .context("the task opening the data directory failed")??;
    let store = match (store, database) {
        (Some(store), _) => store,
        (None, Database::Postgres { url, key_file }) => {
            let key_file = key_file.unwrap_or_else(|| config.data_dir.join(tether_store::KEY_FILE));
            Store::open_postgres_for(&url, &key_file, &config.data_dir).await?
        }
        (None, Database::Sqlite) => anyhow::bail!("the SQLite store was not opened"),
    };
    let shared = !sqlite;
    // Before anything reads or writes what the directory holds: its sandboxes and its admin
    // token are another store's when the two disagree, and nothing of them is touched.
    store.bind_data_dir(&config.data_dir).await?;
    // Under the directory's lock and before any create: a bound secret without its sandbox
    // is left from a create that failed (or a relay that stopped) after binding it.
    let swept = store.sweep_unbound_secrets(&node).await?;
    if swept > 0 {
        info!("forgot {swept} secrets bound to sandboxes that were never created");
    }
    let admin_token_file = config.data_dir.join(ADMIN_TOKEN_FILE);
    let admin_token = auth::ensure_admin_token(&store, &admin_token_file).await?;
    let policy = policy::Policy::new(&config.policy, &config.data_dir, providers.keys().copied())?;
    let tls = config.tls.as_ref().map(tls::load).transpose()?;
    // An https egress listener serves the relay's own certificate, which sandboxes must trust.
    let egress_config = tether_egress::EgressConfig {
        listener_cert: config.tls.as_ref().map(|t| t.cert.clone()),
        ..config.egress.clone()
    };
    let egress = Arc::new(Egress::new(
        &config.data_dir,
        &egress_config,
        store.clone(),
        trust,
    )?);

    let listener = TcpListener::bind(config.listen).await.with_context(|| {
        format!(
            "cannot listen on {}; is another relay running there? choose another address",
            config.listen
        )
    })?;
    let addr = listener.local_addr()?;
    if tls.is_none() && !addr.ip().is_loopback() {
        warn!(
            "listening on {addr} without TLS: API tokens and sandbox traffic cross the network \
             in clear text; serve TLS (--tls-cert and --tls-key), put a TLS-terminating proxy \
             in front, or listen on 127.0.0.1"
        );
    }

    let address = match &config.advertise {
        Some(url) => url.trim_end_matches('/').to_string(),
        None if shared && addr.ip().is_unspecified() => anyhow::bail!(
            "listening on {addr}, which names no address other relays can reach this one at: \
             give --advertise with the URL they should use (e.g. http://10.0.0.5:7420)"
        ),
        None => format!("{}://{addr}", if tls.is_some() { "https" } else { "http" }),
    };
    let grant_key = store.derived_key(cluster::Cluster::grant_key_purpose());
    let cluster = cluster::Cluster::new(node.clone(), address, shared, grant_key)?;
    let relay = Arc::new(Relay {
        store,
        node,
        cluster,
        providers,
        tunnels: Default::default(),
        policy,
        shutdown: CancellationToken::new(),
        tasks: TaskTracker::new(),
        admin_token_file: admin_token_file.clone(),
        fds: fds.clone(),
        tls: tls.is_some(),
        preview_domain: config.preview_domain.clone(),
        peer_timeout: limits.peer_timeout,
        egress,
        _dir_lock: dir_lock,
    });
    // Peers learn where this relay is, and it where they are, before it serves anything.
    hop::refresh(&relay)
        .await
        .context("cannot register this relay in its database")?;
    relay.tasks.spawn(hop::beat(relay.clone()));
    // Before any request is served: no create of this relay runs while recovery reads its
    // journal.
    recovery::run(&relay).await;
    sandboxes::reattach_egress(&relay).await;
    relay
        .egress
        .listen(tls.clone(), relay.shutdown.clone())
        .await?;
    let listener = admission::Admitting::new(listener, fds.clone());
    let app = routes::router(relay.clone(), limits.body_timeout).layer(
        axum::middleware::from_fn_with_state(fds, admission::refuse_when_short),
    );
    let stop = relay.shutdown.clone();
    let header_timeout = limits.header_timeout;
    let server = match tls.clone() {
        Some(tls) => {
            let listener = tls::TlsListener::new(listener, tls, header_timeout);
            let serve = http::serve(listener, app, header_timeout, max_connections, stop);
            tokio::spawn(async move {
                serve.await;
                Ok(())
            })
        }
        None => {
            let serve = http::serve(listener, app, header_timeout, max_connections, stop);
            tokio::spawn(async move {
                serve.await;
                Ok(())
            })
        }
    };
    let reaper = tokio::spawn(reaper::run(relay.clone(), config.reap_interval));
    relay.tasks.spawn(watch::run(relay.clone()));
    info!("relay listening on {}://{addr}", relay.scheme());
    Ok(RunningRelay {
        addr,
        admin_token,
        admin_token_file,
        relay,
        server: Some(server),
        reaper: Some(reaper),
    })
}

impl RunningRelay {
    /// The relay's base URL, e.g. `http://127.0.0.1:7420`, or `https://...` under TLS.
    pub fn url(&self) -> String {
        format!("{}://{}", self.relay.scheme(), self.addr)
    }

    /// Serves until SIGINT or SIGTERM (or until the server fails), then shuts down.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let outcome = match self.server.as_mut() {
            Some(server) => tokio::select! {
                signal = shutdown_signal() => signal,
                ended = server => {
                    self.server = None;
                    match ended {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(anyhow::Error::new(e).context("the relay server failed")),
                        Err(e) => Err(anyhow::Error::new(e).context("the relay server task failed")),
                    }
                }
            },
            None => Ok(()),
        };
        info!("relay shutting down");
        self.shutdown().await;
        outcome
    }

    /// Stops accepting connections, closes every tunnel, stops the reaper, and waits (up to a
    /// grace period) for all of it.
    pub async fn shutdown(mut self) {
        self.relay.shutdown.cancel();
        self.relay.tasks.close();
        let server = self.server.take();
        let reaper = self.reaper.take();
        let tasks = self.relay.tasks.clone();
        let all = async move {
            if let Some(server) = server {
                let _ = server.await;
            }
            if let Some(reaper) = reaper {
                let _ = reaper.await;
            }
            tasks.wait().await;
        };
        if tokio::time::timeout(SHUTDOWN_GRACE, all).await.is_err() {
            warn!(
                "some requests or tunnels did not finish within {SHUTDOWN_GRACE:?}; dropping them"
            );
        }
        // Its peers count its sandboxes unavailable at once, not after its heartbeat ages.
        if let Err(e) = self.relay.store.leave(&self.relay.node).await {
            warn!("cannot record in the database that this relay stopped: {e}");
        }
    }
}

impl Drop for RunningRelay {
    fn drop(&mut self) {
        self.relay.shutdown.cancel();
    }
}

/// Creates the data directory (mode 0700), takes its lock, reads this relay's node id, and
/// opens the SQLite store in it when `sqlite`.
fn open_data_dir(dir: &Path, sqlite: bool) -> anyhow::Result<(Option<Store>, NodeId, Flock<File>)> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    let lock_path = dir.join(LOCK_FILE);
    let file = File::create(&lock_path)
        .with_context(|| format!("cannot create {}", lock_path.display()))?;
    // Two relays on one directory would reap each other's sandboxes and fight over the
    // providers' files. The kernel drops the lock when the process dies, so no stale lock.
    let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        anyhow::anyhow!(
            "another relay is using the data directory {} ({errno}); stop it, or give this \
             one another data directory",
            dir.display()
        )
    })?;
    let node = cluster::node::load_or_create(dir)?;
    let store = match sqlite {
        true => Some(Store::open(&dir.join(DB_FILE))?),
        false => None,
    };
    Ok((store, node, lock))
}

async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    tokio::select! {
        ctrl_c = tokio::signal::ctrl_c() => ctrl_c.context("cannot watch for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}

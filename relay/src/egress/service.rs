//! The relay's egress service: for each local sandbox with an allowlist, the DNS server and
//! the proxies serving its network namespace, started when the sandbox is created (or when the
//! relay restarts) and stopped when it is deleted.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::ca::SandboxCa;
use super::constants::MAX_CONNECTIONS;
use super::dns::Dns;
use super::inject::{self, Injector};
use super::netns::{self, NetnsError};
use super::policy::{Allowlist, BoundSecret};
use super::pool::FakePool;
use super::proxy::Proxy;
use super::resolve::Resolver;
use crate::store::{Registry, RegistryError, SandboxId};

/// The directory under the relay's data directory with each attached sandbox's fake names.
const STATE_DIR: &str = "egress";

/// How the relay's egress proxy resolves and trusts upstreams (`tether serve` flags).
#[derive(Clone, Debug, Default)]
pub struct EgressConfig {
    /// A hosts(5) file the proxy resolves names with before the system's resolver
    /// (`--egress-hosts`).
    pub hosts_file: Option<PathBuf>,
    /// A PEM file of CAs trusted for upstreams besides the system's and webpki's
    /// (`--egress-ca-file`), for intercepted hosts.
    pub ca_file: Option<PathBuf>,
}

/// CA certificates (PEM) to install in sandboxes being created, by sandbox id: the egress
/// service puts one there before the provider creates the sandbox, the local provider takes it.
#[derive(Clone, Debug, Default)]
pub struct TrustShelf(Arc<Mutex<HashMap<String, String>>>);

impl TrustShelf {
    fn put(&self, id: &str, cert_pem: String) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), cert_pem);
    }

    /// The CA certificate sandbox `id` must trust, if it has one; taken off the shelf.
    pub fn take(&self, id: &str) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id)
    }
}

/// Why egress could not be set up for a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The namespace could not be entered or configured.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The registry failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The CA could not be made.
    #[error("cannot make the CA of sandbox {id}: {why}")]
    Ca {
        /// The sandbox.
        id: String,
        /// What failed.
        why: String,
    },
    /// The injector refused its configuration.
    #[error("cannot intercept for sandbox {id}: {why}")]
    Inject {
        /// The sandbox.
        id: String,
        /// What failed.
        why: String,
    },
    /// A sandbox with secrets has no CA in the registry.
    #[error("sandbox {0} has secrets but no CA in the registry; delete it and create it again")]
    NoCa(String),
    /// The relay's state directory could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
}

/// The relay's egress service (see the module docs).
pub struct Egress {
    state_dir: PathBuf,
    resolver: Arc<Resolver>,
    upstream_tls: Arc<tokio_rustls::rustls::ClientConfig>,
    registry: Registry,
    trust: TrustShelf,
    attached: Mutex<HashMap<String, CancellationToken>>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

impl Egress {
    /// The service of a relay with data directory `data_dir`; fails on an unreadable hosts or
    /// CA file (the message says which).
    pub fn new(
        data_dir: &Path,
        config: &EgressConfig,
        registry: Registry,
        trust: TrustShelf,
    ) -> anyhow::Result<Self> {
        let resolver = Resolver::new(config.hosts_file.as_deref()).map_err(anyhow::Error::msg)?;
        let upstream_tls = inject::upstream_tls(config.ca_file.as_deref())?;
        Ok(Egress {
            state_dir: data_dir.join(STATE_DIR),
            resolver: Arc::new(resolver),
            upstream_tls: Arc::new(upstream_tls),
            registry,
            trust,
            attached: Mutex::new(HashMap::new()),
        })
    }

    /// Before sandbox `id` is created: a CA when it has secrets, recorded (key sealed) and put
    /// on the trust shelf for the provider to install.
    pub async fn prepare(
        &self,
        id: &SandboxId,
        secrets: &[BoundSecret],
    ) -> Result<(), EgressError> {
        if secrets.is_empty() {
            return Ok(());
        }
        let ca = SandboxCa::generate(id.as_str()).map_err(|e| EgressError::Ca {
            id: id.to_string(),
            why: e.to_string(),
        })?;
        self.registry.put_egress_ca(id, &ca).await?;
        self.trust.put(id.as_str(), ca.cert_pem);
        Ok(())
    }

    /// Undoes [`Egress::prepare`] for a create that failed.
    pub async fn unprepare(&self, id: &SandboxId) {
        self.trust.take(id.as_str());
        if let Err(e) = self.registry.remove_egress_ca(id).await {
            tracing::warn!(sandbox = %id, "cannot forget the egress CA: {e}");
        }
        self.detach(id);
    }

    /// Serves sandbox `id`'s network namespace `ns`: sets its route and rules and starts its
    /// DNS server and proxies. Replaces an earlier attachment of the same sandbox.
    pub async fn attach(
        &self,
        id: &SandboxId,
        ns: File,
        allowlist: Allowlist,
        secrets: Vec<BoundSecret>,
    ) -> Result<(), EgressError> {
        let injector = if secrets.is_empty() {
            None
        } else {
            let ca = self
                .registry
                .egress_ca(id)
                .await?
                .ok_or_else(|| EgressError::NoCa(id.to_string()))?;
            let injector = Injector::new(
                &ca.cert_pem,
                &ca.key_pem,
                secrets,
                self.upstream_tls.clone(),
            )
            .map_err(|e| EgressError::Inject {
                id: id.to_string(),
                why: e.to_string(),
            })?;
            Some(Arc::new(injector))
        };
        let dir = self.state_dir.join(id.as_str());
        std::fs::create_dir_all(&dir).map_err(|source| EgressError::Io {
            path: dir.clone(),
            source,
        })?;
        let pool = Arc::new(FakePool::open(&dir.join("names")));
        let networks = allowlist.networks.clone();
        let sid = id.to_string();
        let sockets = tokio::task::spawn_blocking(move || netns::attach(&sid, ns, networks))
            .await
            .map_err(|e| EgressError::Io {
                path: dir.clone(),
                source: std::io::Error::other(e.to_string()),
            })??;
        let tokio_err = |source| EgressError::Io {
            path: dir.clone(),
            source,
        };
        let proxy_listener = tokio::net::TcpListener::from_std(sockets.proxy).map_err(tokio_err)?;
        let explicit = sockets
            .explicit
            .map(tokio::net::TcpListener::from_std)
            .transpose()
            .map_err(tokio_err)?;
        let dns_udp = tokio::net::UdpSocket::from_std(sockets.dns_udp).map_err(tokio_err)?;
        let dns_tcp = tokio::net::TcpListener::from_std(sockets.dns_tcp).map_err(tokio_err)?;

        let allowlist = Arc::new(allowlist);
        let dns = Arc::new(Dns {
            id: id.to_string(),
            allowlist: allowlist.clone(),
            pool: pool.clone(),
        });
        let proxy = Arc::new(Proxy {
            id: id.to_string(),
            allowlist,
            pool,
            resolver: self.resolver.clone(),
            injector,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        });
        let stop = CancellationToken::new();
        tokio::spawn(dns.clone().serve_udp(dns_udp, stop.clone()));
        tokio::spawn(dns.serve_tcp(dns_tcp, stop.clone()));
        tokio::spawn(proxy.clone().serve(proxy_listener, true, stop.clone()));
        if let Some(explicit) = explicit {
            tokio::spawn(proxy.serve(explicit, false, stop.clone()));
        }
        let earlier = self
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), stop);
        if let Some(earlier) = earlier {
            earlier.cancel();
        }
        tracing::info!(sandbox = %id, "egress proxy attached");
        Ok(())
    }

    /// Stops serving sandbox `id` and forgets its fake names (nothing if it was not attached).
    pub fn detach(&self, id: &SandboxId) {
        let stop = self
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id.as_str());
        if let Some(stop) = stop {
            stop.cancel();
        }
        let _ = std::fs::remove_dir_all(self.state_dir.join(id.as_str()));
    }

    /// Whether sandbox `id` is being served.
    pub fn is_attached(&self, id: &SandboxId) -> bool {
        self.attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(id.as_str())
    }
}

//! The relay's egress service: for each local sandbox with an allowlist, the DNS server and
//! the proxies (TCP and UDP) serving its network namespace; for each sandbox elsewhere with
//! secrets, its place on the egress listener. Started when the sandbox is created (or when
//! the relay restarts) and stopped when it is deleted.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio::sync::Semaphore;
use tokio_rustls::rustls::ServerConfig;
use tokio_util::sync::CancellationToken;

use super::ca::SandboxCa;
use super::constants::MAX_CONNECTIONS;
use super::dns::Dns;
use super::inject::{self, Injector};
use super::listener::Listener;
use super::netns::{self, NetnsError};
use super::policy::{Allowlist, BoundSecret};
use super::pool::FakePool;
use super::proxy::Proxy;
use super::resolve::Resolver;
use super::route::{self, EgressUrl};
use super::udp::Udp;
use tether_relay_core::egress::TrustShelf;
use tether_store::{SandboxId, Store, StoreError};

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
    /// The address at which sandboxes that do not run on this host reach the relay's egress
    /// listener (`--egress-url`, `http://HOST:PORT` or `https://HOST:PORT`); without it, such
    /// sandboxes cannot have secrets.
    pub url: Option<String>,
    /// Where the egress listener listens (`--egress-listen`); by default every IPv4 address,
    /// on the port of `url`.
    pub listen: Option<SocketAddr>,
    /// The relay's certificate chain (PEM, `--tls-cert`), which serves an `https` egress URL:
    /// set by the relay from its TLS files, not a flag of its own. Its last certificate is
    /// installed in sandboxes elsewhere with their CA, so they trust the listener even when
    /// a private CA signed it.
    pub listener_cert: Option<PathBuf>,
}

/// Why egress could not be set up for a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The namespace could not be entered or configured.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
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
    /// A sandbox with secrets has no CA in the store.
    #[error("sandbox {0} has secrets but no CA in the store; delete it and create it again")]
    NoCa(String),
    /// The CA could not be installed in a sandbox elsewhere.
    #[error("sandbox {id}: {source}")]
    Trust {
        /// The sandbox.
        id: String,
        /// What failed.
        source: super::trust::TrustError,
    },
    /// A sandbox elsewhere has secrets but the relay has no egress listener.
    #[error(
        "sandbox {0} has secrets, which reach it through the relay's egress listener, and this \
         relay has none; restart it with --egress-url"
    )]
    NoListener(String),
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
    store: Store,
    trust: TrustShelf,
    attached: Mutex<HashMap<String, CancellationToken>>,
    url: Option<EgressUrl>,
    listen: Option<SocketAddr>,
    listener: Arc<Listener>,
    /// The certificate sandboxes elsewhere must trust to reach an `https` egress listener
    /// (PEM: the last of the relay's chain), if the URL is `https`.
    listener_anchor: Option<String>,
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
        store: Store,
        trust: TrustShelf,
    ) -> anyhow::Result<Self> {
        let resolver = Resolver::new(config.hosts_file.as_deref()).map_err(anyhow::Error::msg)?;
        let upstream_tls = inject::upstream_tls(config.ca_file.as_deref())?;
        let url = config
            .url
            .as_deref()
            .map(EgressUrl::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            url.is_some() || config.listen.is_none(),
            "--egress-listen needs --egress-url: the address at which sandboxes reach that \
             listener"
        );
        let listener_anchor = match (&url, &config.listener_cert) {
            (Some(url), Some(path)) if url.tls => {
                let chain = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                last_certificate(&chain)
            }
            _ => None,
        };
        Ok(Egress {
            state_dir: data_dir.join(STATE_DIR),
            resolver: Arc::new(resolver),
            upstream_tls: Arc::new(upstream_tls),
            store,
            trust,
            attached: Mutex::new(HashMap::new()),
            url,
            listen: config.listen,
            listener: Arc::new(Listener::default()),
            listener_anchor,
        })
    }

    /// Where sandboxes elsewhere reach the egress listener, if the relay has one.
    pub fn url(&self) -> Option<&EgressUrl> {
        self.url.as_ref()
    }

    /// Starts the egress listener, if the relay has an egress URL: plain, or TLS with `tls`
    /// (the relay's own certificate) for an `https` URL. Returns where it listens.
    pub async fn listen(
        &self,
        tls: Option<Arc<ServerConfig>>,
        stop: CancellationToken,
    ) -> anyhow::Result<Option<SocketAddr>> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let tls = match (url.tls, tls) {
            (true, None) => anyhow::bail!(
                "--egress-url {url} is https, and the relay has no certificate to serve it \
                 with; give --tls-cert and --tls-key (a certificate that names {}), or an \
                 http:// egress URL",
                url.host
            ),
            (true, Some(tls)) => Some(tls),
            (false, _) => None,
        };
        let addr = self
            .listen
            .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::UNSPECIFIED, url.port)));
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!(
                "cannot listen on {addr} for the egress URL {url}; choose another address \
                 with --egress-listen"
            )
        })?;
        let addr = listener.local_addr()?;
        tokio::spawn(self.listener.clone().serve(listener, tls, stop));
        tracing::info!("egress listener on {addr}, reached by sandboxes at {url}");
        Ok(Some(addr))
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
        self.store.put_egress_ca(id, &ca).await?;
        self.trust.put(id.as_str(), ca.cert_pem);
        Ok(())
    }

    /// The CA certificate sandbox `id` must trust, taken off the shelf [`Egress::prepare`] put
    /// it on: for the relay to install through the agent of a sandbox elsewhere.
    pub fn take_trust(&self, id: &SandboxId) -> Option<String> {
        self.trust.take(id.as_str())
    }

    /// Undoes [`Egress::prepare`] for a create that failed.
    pub async fn unprepare(&self, id: &SandboxId) {
        self.trust.take(id.as_str());
        if let Err(e) = self.store.remove_egress_ca(id).await {
            tracing::warn!(sandbox = %id, "cannot forget the egress CA: {e}");
        }
        self.detach(id);
    }

    /// The proxy of sandbox `id`: its allowlist, its fake addresses (local sandboxes), and an
    /// injector with its CA from the store when it has secrets.
    async fn proxy(
        &self,
        id: &SandboxId,
        allowlist: Allowlist,
        pool: Option<Arc<FakePool>>,
        secrets: Vec<BoundSecret>,
    ) -> Result<Arc<Proxy>, EgressError> {
        let injector = if secrets.is_empty() {
            None
        } else {
            let ca = self
                .store
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
        Ok(Arc::new(Proxy {
            id: id.to_string(),
            networks_here: pool.is_some(),
            allowlist: Arc::new(allowlist),
            pool,
            resolver: self.resolver.clone(),
            reach: super::reach::shared(),
            injector,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        }))
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
        let dir = self.state_dir.join(id.as_str());
        std::fs::create_dir_all(&dir).map_err(|source| EgressError::Io {
            path: dir.clone(),
            source,
        })?;
        let pool = Arc::new(FakePool::open(&dir.join("names")));
        let proxy = self
            .proxy(id, allowlist, Some(pool.clone()), secrets)
            .await?;
        let networks = proxy.allowlist.networks.clone();
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
        let udp = match sockets.udp {
            Some((socket, opener)) => {
                let socket = tokio::net::UdpSocket::from_std(socket).map_err(tokio_err)?;
                let udp = Udp::new(id.to_string(), proxy.allowlist.clone(), opener);
                Some((Arc::new(udp), socket))
            }
            None => None,
        };

        let dns = Arc::new(Dns {
            id: id.to_string(),
            allowlist: proxy.allowlist.clone(),
            pool,
        });
        let stop = CancellationToken::new();
        tokio::spawn(dns.clone().serve_udp(dns_udp, stop.clone()));
        tokio::spawn(dns.serve_tcp(dns_tcp, stop.clone()));
        if let Some((udp, socket)) = udp {
            tokio::spawn(udp.serve(socket, stop.clone()));
        }
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

    /// Serves sandbox `id`, which runs elsewhere and whose agent token is `agent_token`, on
    /// the egress listener: requests with its credential go through its proxy (its allowlist,
    /// its secrets). Replaces an earlier attachment of the same sandbox.
    pub async fn attach_remote(
        &self,
        id: &SandboxId,
        agent_token: &str,
        allowlist: Allowlist,
        secrets: Vec<BoundSecret>,
    ) -> Result<(), EgressError> {
        if self.url.is_none() {
            return Err(EgressError::NoListener(id.to_string()));
        }
        let proxy = self.proxy(id, allowlist, None, secrets).await?;
        let credential = route::credential(agent_token, id.as_str());
        self.listener.insert(id.as_str(), credential, proxy);
        tracing::info!(sandbox = %id, "egress listener serves the sandbox");
        Ok(())
    }

    /// Installs sandbox `id`'s CA through the agent of `session` (a sandbox elsewhere), with
    /// the certificate that an `https` egress listener's chain ends in: without it, a listener
    /// whose certificate a private CA signed would be a proxy the sandbox cannot trust.
    pub async fn install_trust(
        &self,
        id: &SandboxId,
        session: &tether_client::Session,
        ca_pem: &str,
    ) -> Result<(), EgressError> {
        let trusted = match &self.listener_anchor {
            Some(anchor) => format!("{}\n{anchor}", ca_pem.trim_end()),
            None => ca_pem.to_string(),
        };
        let replaced = super::trust::install(session, &trusted)
            .await
            .map_err(|source| EgressError::Trust {
                id: id.to_string(),
                source,
            })?;
        tracing::debug!(sandbox = %id, ?replaced, "egress CA installed through the agent");
        Ok(())
    }

    /// Stops serving sandbox `id` and forgets its fake names, or revokes its credential on the
    /// egress listener and ends its connections (nothing if it was not attached).
    pub fn detach(&self, id: &SandboxId) {
        let stop = self
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id.as_str());
        if let Some(stop) = stop {
            stop.cancel();
        }
        self.listener.remove(id.as_str());
        let _ = std::fs::remove_dir_all(self.state_dir.join(id.as_str()));
    }

    /// Whether sandbox `id` is being served.
    pub fn is_attached(&self, id: &SandboxId) -> bool {
        self.listener.contains(id.as_str())
            || self
                .attached
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(id.as_str())
    }

    /// At relay start, before any sandbox is attached: removes the state kept for sandboxes
    /// not in `known` (deleted while the relay was down, or by a create that never finished).
    /// Returns how many were removed. Entries it cannot read are left, and logged.
    pub fn sweep(&self, known: &HashSet<String>) -> usize {
        let entries = match std::fs::read_dir(&self.state_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
            Err(e) => {
                tracing::warn!("cannot list {}: {e}", self.state_dir.display());
                return 0;
            }
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str() else { continue };
            if known.contains(id) {
                continue;
            }
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) => tracing::warn!(
                    "cannot remove the egress state of gone sandbox {id} ({}): {e}",
                    entry.path().display()
                ),
            }
        }
        removed
    }
}

/// The last PEM certificate of `chain` (where a chain file puts its root), if it has one.
fn last_certificate(chain: &str) -> Option<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let start = chain.rfind(BEGIN)?;
    let end = start + chain[start..].find(END)? + END.len();
    Some(format!("{}\n", &chain[start..end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_anchor_is_the_chains_last_certificate() {
        let chain = "-----BEGIN CERTIFICATE-----\nLEAF\n-----END CERTIFICATE-----\n\
                     -----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----\n";
        assert_eq!(
            last_certificate(chain).as_deref(),
            Some("-----BEGIN CERTIFICATE-----\nROOT\n-----END CERTIFICATE-----\n")
        );
        assert_eq!(last_certificate("no pem here"), None);
        assert_eq!(last_certificate("-----BEGIN CERTIFICATE-----\ncut"), None);
    }

    fn egress(data_dir: &Path, url: Option<&str>) -> anyhow::Result<Egress> {
        let config = EgressConfig {
            url: url.map(str::to_string),
            ..EgressConfig::default()
        };
        Egress::new(
            data_dir,
            &config,
            Store::open_in_memory().unwrap(),
            TrustShelf::default(),
        )
    }

    #[test]
    fn state_of_sandboxes_that_no_longer_exist_is_swept() {
        let dir = tempfile::tempdir().unwrap();
        let egress = egress(dir.path(), None).unwrap();
        assert_eq!(egress.sweep(&HashSet::new()), 0, "no state directory yet");
        for id in ["sb-kept", "sb-gone", "sb-gone-too"] {
            let sandbox = dir.path().join(STATE_DIR).join(id);
            std::fs::create_dir_all(&sandbox).unwrap();
            std::fs::write(sandbox.join("names"), "198.18.0.1 api.test\n").unwrap();
        }
        let known: HashSet<String> = ["sb-kept".to_string()].into();
        assert_eq!(egress.sweep(&known), 2);
        let left: Vec<String> = std::fs::read_dir(dir.path().join(STATE_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["sb-kept"]);
        assert!(dir.path().join(STATE_DIR).join("sb-kept/names").exists());
        assert_eq!(egress.sweep(&known), 0);
    }

    #[tokio::test]
    async fn a_bad_egress_url_or_a_listener_without_one_stops_the_relay_from_starting() {
        let dir = tempfile::tempdir().unwrap();
        let err = egress(dir.path(), Some("ftp://relay:21")).unwrap_err();
        assert!(err.to_string().contains("--egress-url"), "{err}");
        let config = EgressConfig {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            ..EgressConfig::default()
        };
        let store = Store::open_in_memory().unwrap();
        let err = Egress::new(dir.path(), &config, store, TrustShelf::default()).unwrap_err();
        assert!(err.to_string().contains("needs --egress-url"), "{err}");
        // An https URL needs the relay's certificate.
        let tls = egress(dir.path(), Some("https://relay.example.com")).unwrap();
        let err = tls
            .listen(None, CancellationToken::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("--tls-cert"), "{err}");
    }

    #[tokio::test]
    async fn a_sandbox_elsewhere_without_a_listener_cannot_be_attached() {
        let dir = tempfile::tempdir().unwrap();
        let egress = egress(dir.path(), None).unwrap();
        let id = SandboxId::from("sb-remote".to_string());
        let err = egress
            .attach_remote(&id, "token", Allowlist::default(), Vec::new())
            .await
            .unwrap_err();
        assert!(matches!(err, EgressError::NoListener(_)), "{err}");
        assert!(!egress.is_attached(&id));
    }
}

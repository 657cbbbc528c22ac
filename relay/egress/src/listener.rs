//! The relay's egress listener for sandboxes that do not run on its host (`tether serve
//! --egress-url`, `--egress-listen`): an HTTP proxy (CONNECT and absolute-form requests),
//! over TLS when the URL says `https`, which anyone who can reach the address can reach. So
//! it authenticates before anything else: the first request's `Proxy-Authorization` must be
//! `Basic` with a sandbox's id and its credential ([`super::route::credential`]), compared in
//! constant time, and every failure gets the same 407, which tells nobody which ids exist.
//! Only then does the request go to that sandbox's [`Proxy`], which applies its allowlist and
//! puts in its secrets exactly as it does for a local sandbox.
//!
//! Bounds: connections at once ([`MAX_CONNECTIONS`]); connections not yet authenticated, in
//! all ([`MAX_UNAUTHENTICATED`]) and per source address ([`MAX_UNAUTHENTICATED_PER_ADDR`]),
//! with a connection past a bound closed at once; the TLS handshake and the request head
//! within `HEAD_TIMEOUT` each; past [`MAX_AUTH_FAILURES`] failed authentications from one
//! source address in a minute, its failures are answered 429 (a valid credential from it is
//! still served: sandboxes behind one NAT share an address); a sandbox's own connection
//! slots. No credential appears in a log line or an answer.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use subtle::ConstantTimeEq;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::constants::HEAD_TIMEOUT;
use super::proxy::{read_head, respond, Io, Proxy};
use super::sniff::Head;
use super::stream::Peeked;

/// Connections the listener serves at once, authenticated or not.
pub(super) const MAX_CONNECTIONS: usize = 4096;
/// Connections not yet authenticated at once (in a TLS handshake, or sending a head).
pub(super) const MAX_UNAUTHENTICATED: usize = 512;
/// Connections not yet authenticated at once from one source address: sandboxes behind one
/// provider's NAT share an address, but each sends its head at once.
pub(super) const MAX_UNAUTHENTICATED_PER_ADDR: usize = 64;
/// Failed authentications one source address may have per [`FAILURE_WINDOW`].
pub(super) const MAX_AUTH_FAILURES: u32 = 30;
/// The window failed authentications are counted in.
pub(super) const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Source addresses whose failures are counted at once; past it, a window's counts are
/// dropped early (a flood from many addresses costs memory, not correctness).
const MAX_TRACKED_ADDRS: usize = 65_536;
/// The realm of the 407's challenge.
const CHALLENGE: (&str, &str) = ("Proxy-Authenticate", "Basic realm=\"tether egress\"");

/// A sandbox the listener serves: its credential and its proxy.
struct Entry {
    credential: String,
    proxy: Arc<Proxy>,
    /// Cancelled when the sandbox is detached: its connections end.
    stop: CancellationToken,
}

/// The sandboxes the listener serves, and its bounds.
pub(super) struct Listener {
    sandboxes: Mutex<HashMap<String, Entry>>,
    connections: Arc<Semaphore>,
    unauthenticated: Arc<Semaphore>,
    per_addr: Mutex<HashMap<IpAddr, usize>>,
    failures: Mutex<Failures>,
}

/// Failed authentications per source address, in the current window.
struct Failures {
    since: Instant,
    counts: HashMap<IpAddr, u32>,
}

impl Default for Listener {
    fn default() -> Self {
        Self {
            sandboxes: Mutex::new(HashMap::new()),
            connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            unauthenticated: Arc::new(Semaphore::new(MAX_UNAUTHENTICATED)),
            per_addr: Mutex::new(HashMap::new()),
            failures: Mutex::new(Failures {
                since: Instant::now(),
                counts: HashMap::new(),
            }),
        }
    }
}

/// Locks `m`, taking over a poisoned lock (a panic elsewhere leaves the maps usable).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A connection's place among the unauthenticated, given back on drop.
struct Pending {
    remote: Arc<Listener>,
    addr: IpAddr,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut per_addr = lock(&self.remote.per_addr);
        if let Some(n) = per_addr.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                per_addr.remove(&self.addr);
            }
        }
    }
}

/// What authenticating a request found.
enum Auth {
    Sandbox(Arc<Proxy>, CancellationToken),
    Refused,
    Limited,
}

impl Listener {
    /// Serves sandbox `id` with `credential` through `proxy`, replacing an earlier entry.
    pub(super) fn insert(&self, id: &str, credential: String, proxy: Arc<Proxy>) {
        let entry = Entry {
            credential,
            proxy,
            stop: CancellationToken::new(),
        };
        if let Some(old) = lock(&self.sandboxes).insert(id.to_string(), entry) {
            old.stop.cancel();
        }
    }

    /// Stops serving sandbox `id`: its credential is refused from now on, and its open
    /// connections end. Whether it was served.
    pub(super) fn remove(&self, id: &str) -> bool {
        match lock(&self.sandboxes).remove(id) {
            Some(entry) => {
                entry.stop.cancel();
                true
            }
            None => false,
        }
    }

    /// Whether sandbox `id` is served.
    pub(super) fn contains(&self, id: &str) -> bool {
        lock(&self.sandboxes).contains_key(id)
    }

    /// Accepts connections on `listener` (TLS with `tls`, if given) until `stop`.
    pub(super) async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<Arc<ServerConfig>>,
        stop: CancellationToken,
    ) {
        let tls = tls.map(TlsAcceptor::from);
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                a = listener.accept() => a,
            };
            let (conn, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, most likely: let some connections finish first.
                    tracing::warn!("egress listener: cannot accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // At a bound, the connection is closed before anything is read from it.
            let Ok(permit) = self.connections.clone().try_acquire_owned() else {
                continue;
            };
            let Some(pending) = self.pend(peer.ip()) else {
                continue;
            };
            let _ = conn.set_nodelay(true);
            let (remote, tls, stop) = (self.clone(), tls.clone(), stop.clone());
            tokio::spawn(async move {
                let _permit = permit;
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = remote.handle(conn, peer, tls, pending) => {}
                }
            });
        }
    }

    /// A place among the unauthenticated for a connection from `addr`, if within the bounds.
    fn pend(self: &Arc<Self>, addr: IpAddr) -> Option<Pending> {
        let permit = self.unauthenticated.clone().try_acquire_owned().ok()?;
        let mut per_addr = lock(&self.per_addr);
        let n = per_addr.entry(addr).or_insert(0);
        if *n >= MAX_UNAUTHENTICATED_PER_ADDR {
            return None;
        }
        *n += 1;
        Some(Pending {
            remote: self.clone(),
            addr,
            _permit: permit,
        })
    }

    async fn handle(
        &self,
        conn: TcpStream,
        peer: SocketAddr,
        tls: Option<TlsAcceptor>,
        pending: Pending,
    ) {
        let io: Box<dyn Io> = match tls {
            None => Box::new(conn),
            Some(acceptor) => match tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(conn)).await
            {
                Ok(Ok(tls)) => Box::new(tls),
                Ok(Err(e)) => {
                    tracing::debug!(%peer, "egress listener: TLS handshake failed: {e}");
                    return;
                }
                Err(_) => return,
            },
        };
        let mut conn = Peeked::new(io);
        let head = match read_head(&mut conn).await {
            Ok(head) => head,
            Err(why) => {
                let _ = respond(&mut conn, 400, &[], &format!("tether egress: {why}\n")).await;
                return;
            }
        };
        let (proxy, stop) = match self.authenticate(peer.ip(), &head) {
            Auth::Sandbox(proxy, stop) => (proxy, stop),
            Auth::Limited => {
                let body = format!(
                    "tether egress: too many failed proxy authentications from {}; wait a \
                     minute\n",
                    peer.ip()
                );
                let _ = respond(&mut conn, 429, &[("Retry-After", "60")], &body).await;
                return;
            }
            Auth::Refused => {
                let _ = respond(
                    &mut conn,
                    407,
                    &[CHALLENGE],
                    "tether egress: proxy authentication required: this proxy serves Tether \
                     sandboxes only, each with the credential in its HTTPS_PROXY\n",
                )
                .await;
                return;
            }
        };
        drop(pending);
        let Ok(_slot) = proxy.slots.clone().try_acquire_owned() else {
            tracing::info!(sandbox = %proxy.id, "egress refused: every connection slot is taken");
            let body = format!(
                "tether egress: sandbox {} has {} connections open through the proxy; close \
                 some and try again\n",
                proxy.id,
                super::constants::MAX_CONNECTIONS
            );
            let _ = respond(&mut conn, 503, &[], &body).await;
            return;
        };
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = proxy.request(conn, head) => {}
        }
    }

    /// Whose request `head` from `addr` is, checking its credential in constant time. A valid
    /// credential is served whatever its address's failures (sandboxes behind one provider's
    /// NAT share an address, and one of them must not lock the others out); past
    /// [`MAX_AUTH_FAILURES`], a failure is answered 429 instead of 407, and not logged.
    fn authenticate(&self, addr: IpAddr, head: &Head) -> Auth {
        let presented = basic_credentials(head);
        let (user, password) = presented
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_slice()))
            .unwrap_or(("", &[]));
        let sandboxes = lock(&self.sandboxes);
        let entry = sandboxes.get(user);
        // An unknown id is compared with a dummy of the same length, so both take as long.
        let dummy = [0u8; 32];
        let expected = entry.map(|e| e.credential.as_bytes()).unwrap_or(&dummy);
        let matches = expected.len() == password.len() && bool::from(expected.ct_eq(password));
        match entry {
            Some(entry) if matches => Auth::Sandbox(entry.proxy.clone(), entry.stop.clone()),
            _ => {
                drop(sandboxes);
                let failures = self.fail(addr);
                if failures > MAX_AUTH_FAILURES {
                    return Auth::Limited;
                }
                if failures == 1 || failures == MAX_AUTH_FAILURES {
                    tracing::info!(
                        peer = %addr,
                        credentials = if presented.is_some() { "wrong" } else { "missing" },
                        failures,
                        "egress listener refused a request: proxy authentication failed"
                    );
                }
                Auth::Refused
            }
        }
    }

    /// Counts a failed authentication of `addr`; returns its count in the window.
    fn fail(&self, addr: IpAddr) -> u32 {
        let mut failures = lock(&self.failures);
        failures.roll();
        if failures.counts.len() >= MAX_TRACKED_ADDRS && !failures.counts.contains_key(&addr) {
            failures.counts.clear();
        }
        let n = failures.counts.entry(addr).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }
}

impl Failures {
    /// Starts a new window once the current one is over.
    fn roll(&mut self) {
        if self.since.elapsed() >= FAILURE_WINDOW {
            self.since = Instant::now();
            self.counts.clear();
        }
    }
}

/// The user and password of a `Proxy-Authorization: Basic` header, if the head has one that
/// decodes.
fn basic_credentials(head: &Head) -> Option<(String, Vec<u8>)> {
    let (_, value) = head
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("proxy-authorization"))?;
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let colon = decoded.iter().position(|b| *b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::Semaphore;

    use super::*;
    use crate::resolve::Resolver;
    use tether_relay_core::egress::policy::{Allowlist, HostPattern};

    /// An upstream on loopback that greets every connection, and a hosts file naming it
    /// `up.test`.
    async fn upstream() -> (SocketAddr, tempfile::NamedTempFile) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let _ = conn.write_all(b"hello from upstream").await;
            }
        });
        let mut hosts = tempfile::NamedTempFile::new().unwrap();
        writeln!(hosts, "127.0.0.1 up.test other.test").unwrap();
        (addr, hosts)
    }

    fn proxy(id: &str, host: &str, hosts: &tempfile::NamedTempFile) -> Arc<Proxy> {
        Arc::new(Proxy {
            id: id.into(),
            allowlist: Arc::new(Allowlist {
                hosts: vec![HostPattern::parse(host).unwrap()],
                networks: vec!["127.0.0.0/8".parse().unwrap()],
            }),
            pool: None,
            resolver: Arc::new(Resolver::new(Some(hosts.path())).unwrap()),
            reach: crate::reach::Reach::for_loopback_upstreams(),
            injector: None,
            slots: Arc::new(Semaphore::new(4)),
            networks_here: false,
        })
    }

    /// A listener serving sandbox `sb-a` (allowed `up.test`) and `sb-b` (allowed
    /// `other.test`) with credentials `cred-a` and `cred-b`.
    async fn listener(hosts: &tempfile::NamedTempFile) -> (Arc<Listener>, SocketAddr) {
        let remote = Arc::new(Listener::default());
        remote.insert("sb-a", "cred-a".into(), proxy("sb-a", "up.test", hosts));
        remote.insert("sb-b", "cred-b".into(), proxy("sb-b", "other.test", hosts));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            remote
                .clone()
                .serve(listener, None, CancellationToken::new()),
        );
        (remote, addr)
    }

    fn basic(user: &str, password: &str) -> String {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Proxy-Authorization: Basic {encoded}\r\n")
    }

    /// Sends `CONNECT target` with `auth` header lines; returns what came back until the
    /// connection closed or 2 s passed.
    async fn connect(proxy: SocketAddr, target: &str, auth: &str) -> String {
        let mut conn = TcpStream::connect(proxy).await.unwrap();
        let head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n");
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), conn.read_to_end(&mut got)).await;
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test]
    async fn only_a_sandboxs_own_credential_opens_its_own_allowlist() {
        let (up, hosts) = upstream().await;
        let (remote, addr) = listener(&hosts).await;
        let target = format!("up.test:{}", up.port());

        let ok = connect(addr, &target, &basic("sb-a", "cred-a")).await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.ends_with("hello from upstream"), "{ok}");

        for (what, auth) in [
            ("missing", String::new()),
            ("wrong", basic("sb-a", "cred-x")),
            ("another sandbox's", basic("sb-a", "cred-b")),
            ("unknown id", basic("sb-z", "cred-a")),
            ("not basic", "Proxy-Authorization: Bearer cred-a\r\n".into()),
            ("no colon", {
                let e = base64::engine::general_purpose::STANDARD.encode("sb-acred-a");
                format!("Proxy-Authorization: Basic {e}\r\n")
            }),
        ] {
            let refused = connect(addr, &target, &auth).await;
            assert!(refused.starts_with("HTTP/1.1 407"), "{what}: {refused}");
            assert!(
                refused.contains("Proxy-Authenticate: Basic realm=\"tether egress\""),
                "{what}: {refused}"
            );
            assert!(!refused.contains("hello"), "{what}: {refused}");
            assert!(!refused.contains("cred-"), "{what}: {refused}");
        }

        // A valid credential reaches its own sandbox's allowlist only.
        let other = connect(addr, &target, &basic("sb-b", "cred-b")).await;
        assert!(other.starts_with("HTTP/1.1 403"), "{other}");
        assert!(other.contains("--allow-host up.test"), "{other}");
        // Addresses are never reached from the relay's network for a sandbox elsewhere.
        let by_addr = connect(addr, &format!("{up}"), &basic("sb-a", "cred-a")).await;
        assert!(by_addr.starts_with("HTTP/1.1 403"), "{by_addr}");
        assert!(by_addr.contains("NO_PROXY"), "{by_addr}");

        // Deleting the sandbox revokes its credential.
        assert!(remote.remove("sb-a"));
        let revoked = connect(addr, &target, &basic("sb-a", "cred-a")).await;
        assert!(revoked.starts_with("HTTP/1.1 407"), "{revoked}");
    }

    #[tokio::test]
    async fn failed_authentications_are_limited_per_address() {
        let (up, hosts) = upstream().await;
        let (_remote, addr) = listener(&hosts).await;
        let target = format!("up.test:{}", up.port());
        for n in 0..MAX_AUTH_FAILURES {
            let refused = connect(addr, &target, &basic("sb-a", "guess")).await;
            assert!(refused.starts_with("HTTP/1.1 407"), "{n}: {refused}");
        }
        // Past the bound, failures are told to wait...
        let limited = connect(addr, &target, &basic("sb-a", "guess")).await;
        assert!(limited.starts_with("HTTP/1.1 429"), "{limited}");
        assert!(limited.contains("Retry-After: 60"), "{limited}");
        // ...and the right credential still works: another sandbox behind the same address
        // must not be locked out by a guesser.
        let ok = connect(addr, &target, &basic("sb-a", "cred-a")).await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    }

    #[tokio::test]
    async fn what_is_not_a_request_is_answered_before_any_check() {
        let (_up, hosts) = upstream().await;
        let (_remote, addr) = listener(&hosts).await;
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"\x16\x03\x01garbage\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        conn.read_to_end(&mut got).await.unwrap();
        assert!(got.starts_with(b"HTTP/1.1 400"), "{got:?}");
    }

    #[tokio::test]
    async fn over_tls_the_listener_authenticates_and_tunnels_the_same() {
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

        let (up, hosts) = upstream().await;
        let remote = Arc::new(Listener::default());
        remote.insert("sb-a", "cred-a".into(), proxy("sb-a", "up.test", &hosts));
        let certified = rcgen::generate_simple_self_signed(vec!["relay.test".into()]).unwrap();
        let cert = CertificateDer::from(certified.cert.der().to_vec());
        let key = PrivateKeyDer::try_from(certified.signing_key.serialize_der()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(remote.serve(listener, Some(Arc::new(server)), stop.clone()));

        let mut roots = RootCertStore::empty();
        roots.add(cert).unwrap();
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        for (auth, want) in [
            (basic("sb-a", "cred-b"), "HTTP/1.1 407"),
            (basic("sb-a", "cred-a"), "HTTP/1.1 200"),
        ] {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = ServerName::try_from("relay.test").unwrap();
            let mut tls = connector.connect(name, tcp).await.unwrap();
            let head = format!("CONNECT up.test:{} HTTP/1.1\r\n{auth}\r\n", up.port());
            tls.write_all(head.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(2), tls.read_to_end(&mut got)).await;
            let got = String::from_utf8_lossy(&got);
            assert!(got.starts_with(want), "{got}");
            assert_eq!(
                got.ends_with("hello from upstream"),
                want.ends_with("200"),
                "{got}"
            );
        }
        // Plain text on the TLS port gets nothing.
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(format!("CONNECT up.test:{} HTTP/1.1\r\n\r\n", up.port()).as_bytes())
            .await
            .unwrap();
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), plain.read_to_end(&mut got)).await;
        assert!(!String::from_utf8_lossy(&got).contains("hello"), "{got:?}");
        stop.cancel();
    }

    #[test]
    fn basic_credentials_are_read_from_proxy_authorization_only() {
        let raw = format!(
            "CONNECT a:443 HTTP/1.1\r\nAuthorization: Basic eDp5\r\n{}\r\n",
            basic("sb-1", "p:w")
        );
        let head = crate::sniff::head(raw.as_bytes()).unwrap().unwrap();
        assert_eq!(
            basic_credentials(&head),
            Some(("sb-1".to_string(), b"p:w".to_vec()))
        );
        let head =
            crate::sniff::head(b"CONNECT a:443 HTTP/1.1\r\nAuthorization: Basic eDp5\r\n\r\n")
                .unwrap()
                .unwrap();
        assert_eq!(basic_credentials(&head), None);
    }
}

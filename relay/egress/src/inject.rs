//! Secrets by placeholder: TLS interception of the connections a sandbox makes to hosts its
//! secrets are bound to, with each placeholder replaced by the secret's value on the way out.
//!
//! The egress proxy hands over a connection it has already allowed, with the host name its
//! policy resolved (from the fake DNS address, never from what the sandbox says later). The
//! injector answers the TLS handshake with a leaf certificate for that name signed by the
//! sandbox's own CA (which the sandbox trusts; its key never enters the sandbox), then serves
//! HTTP: each request goes to the real upstream over TLS verified against the relay's
//! roots, and each response streams back. The sandbox may speak HTTP/1.1 or HTTP/2 (by
//! ALPN); upstreams are spoken to in HTTP/1.1.
//!
//! # What is replaced, and where
//! A placeholder (`tether-secret-` and 32 hex digits, exactly as the sandbox's environment
//! holds it) is replaced by its secret's value, for the secrets bound to the connection's host
//! only:
//! - in every request header value: `Authorization: Bearer …`, `x-api-key`, cookies, any other;
//! - inside `Basic` credentials (`Authorization`, `Proxy-Authorization`): decoded from base64,
//!   replaced, encoded again;
//! - in the request target's path and query, the value percent-encoded.
//!
//! Never in bodies: they stream through untouched, both ways, so a JSON payload that carries a
//! placeholder reaches the upstream with the placeholder; nor in what follows a protocol
//! upgrade (WebSocket messages), only in the handshake's head. Placeholders of secrets bound to other
//! hosts pass unchanged: they are random strings, worth nothing outside the relay.
//!
//! The request's `Host` (or absolute-form authority) must name the connection's host: a
//! request that names another is refused with a 421, so a shared front end (a CDN routing by
//! `Host`) cannot carry a secret to a site it was not bound to.
//!
//! Secret values never appear in a log line, an error or a `Debug` output: [`SecretValue`]
//! redacts itself, headers that carry a value are marked sensitive, and logs name secrets by
//! their name.
//!
//! # Layout
//! - `leaf`: the sandbox's CA as an issuer; a leaf certificate per host, cached.
//! - `rewrite`: the policy above, on a request head.
//! - `forward`: the HTTP exchange: the sandbox's side, the upstream's, and the 502s.
//! - `pool`: upstream connections, kept for the next request.
//! - `idle`: bodies that give up when their source stalls.
//! - `upgrade`: WebSocket (and other) upgrades: the handshake rewritten, then a byte tunnel.
//! - `roots`: whom the relay trusts for real upstreams ([`upstream_tls`]).
//!
//! [`SecretValue`]: tether_client::api::SecretValue

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls::server::Acceptor;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::LazyConfigAcceptor;
use tracing::debug;

use super::policy::BoundSecret;

mod forward;
mod idle;
mod leaf;
mod pool;
mod rewrite;
mod roots;
#[cfg(test)]
mod tests;
mod upgrade;

pub use roots::upstream_tls;

/// Longest the sandbox may take over its TLS handshake.
const CLIENT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a request head may take to arrive once the sandbox's connection is waiting for one:
/// also how long a kept-alive connection from the sandbox may sit idle.
const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of a request head (request line and headers); hyper answers 431 beyond.
const MAX_REQUEST_HEAD: usize = 64 << 10; // 64 KiB
/// Most bytes of a response head from an upstream (servers set large cookies).
const MAX_RESPONSE_HEAD: usize = 256 << 10; // 256 KiB
/// Most header fields in a request or a response.
const MAX_HEADERS: usize = 128;
/// Longest a TCP connect to one upstream address, then the TLS handshake, may take (each).
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest an upstream may take to start its response (language models think for minutes).
const RESPONSE_HEAD_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest a body (either way) may go without a byte moving before the exchange is cut.
const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Shortest secret value looked for in response headers: shorter ones would match ordinary
/// text.
const MIN_SCRUBBED_VALUE: usize = 8;
/// Most hosts with a cached leaf certificate, per sandbox (wildcard bindings admit many).
const MAX_CACHED_LEAVES: usize = 1024;
/// How long a leaf certificate is valid.
const LEAF_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600); // 7 days
/// A cached leaf is replaced once less than this remains of its validity.
const LEAF_RENEW_BEFORE: Duration = Duration::from_secs(24 * 3600); // 1 day
/// A leaf is valid from this long before it was issued, for clocks slightly behind the relay's.
const LEAF_BACKDATE: Duration = Duration::from_secs(3600); // 1 hour
/// HTTP/1.1 by ALPN: offered to the sandbox, and the one spoken to upstreams.
const ALPN_HTTP1: &[u8] = b"http/1.1";
/// HTTP/2 by ALPN: offered to the sandbox (preferred), never to upstreams.
const ALPN_H2: &[u8] = b"h2";
/// Most concurrent HTTP/2 streams on one connection from the sandbox; each takes an upstream
/// connection of its own while it runs.
const MAX_STREAMS: u32 = 32;
/// Most idle upstream connections kept per connection from the sandbox.
const MAX_IDLE_UPSTREAM: usize = 4;
/// How often an HTTP/2 connection from the sandbox is pinged, to find a peer that vanished.
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);

/// Why the injector cannot start, or why one connection from the sandbox ended badly. Failures
/// of the upstream are not errors here: the sandbox gets a 502 that says what failed.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The sandbox's CA certificate or key cannot sign leaf certificates.
    #[error("the sandbox's egress CA cannot issue certificates: {reason}")]
    Ca {
        /// What is wrong with it.
        reason: String,
    },
    /// No leaf certificate could be made for a host.
    #[error("cannot issue a certificate for {host}: {reason}")]
    Leaf {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
    /// The sandbox's TLS handshake failed (it may not trust the sandbox's CA).
    #[error("the sandbox's TLS handshake for {host} failed: {source}")]
    Handshake {
        /// The connection's host.
        host: String,
        /// What rustls said.
        source: std::io::Error,
    },
    /// The sandbox did not finish its TLS handshake in time.
    #[error("the sandbox did not finish its TLS handshake for {host} within {timeout:?}")]
    HandshakeTimeout {
        /// The connection's host.
        host: String,
        /// The bound.
        timeout: Duration,
    },
    /// The sandbox named another host (by SNI) than the one its connection was allowed for.
    #[error("the sandbox asked for {sni} by SNI on a connection allowed for {host}; refused")]
    SniMismatch {
        /// The connection's host.
        host: String,
        /// What the ClientHello named.
        sni: String,
    },
    /// The HTTP connection with the sandbox broke (a malformed request, a timeout, a reset).
    #[error("the HTTP connection from the sandbox to {host} failed: {source}")]
    Client {
        /// The connection's host.
        host: String,
        /// What hyper said.
        source: hyper::Error,
    },
    /// `--egress-ca-file` cannot be read.
    #[error("cannot read the egress CA file {}: {source}; give --egress-ca-file a PEM file of CA certificates", path.display())]
    CaFileUnreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `--egress-ca-file` is not PEM, or a block in it is broken.
    #[error("the egress CA file {} is not valid PEM ({reason}); give --egress-ca-file a PEM file of CA certificates", path.display())]
    CaFilePem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `--egress-ca-file` holds no certificate.
    #[error("the egress CA file {} holds no certificate (no `-----BEGIN CERTIFICATE-----` block); give --egress-ca-file a PEM file of CA certificates", path.display())]
    CaFileEmpty {
        /// The file.
        path: PathBuf,
    },
    /// A certificate in `--egress-ca-file` cannot be a trust anchor.
    #[error("certificate {index} in the egress CA file {} cannot be trusted as a CA: {reason}", path.display())]
    CaFileUnusable {
        /// The file.
        path: PathBuf,
        /// Which certificate, from 1.
        index: usize,
        /// Why.
        reason: String,
    },
}

/// One sandbox's TLS interceptor: its CA, its bound secrets, the leaf certificates issued so
/// far, and the roots the relay trusts for real upstreams.
pub struct Injector {
    leaves: leaf::Leaves,
    secrets: Vec<BoundSecret>,
    upstream_tls: Arc<ClientConfig>,
}

impl std::fmt::Debug for Injector {
    // Names and hosts only: no value, no key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secrets: Vec<String> = self
            .secrets
            .iter()
            .map(|s| {
                let hosts: Vec<String> = s.hosts.iter().map(|h| h.to_string()).collect();
                format!("{}@{}", s.name, hosts.join(","))
            })
            .collect();
        f.debug_struct("Injector")
            .field("secrets", &secrets)
            .finish_non_exhaustive()
    }
}

impl Injector {
    /// The sandbox's CA (PEM cert and PKCS#8 PEM key, made by `egress::ca`), its bound
    /// secrets, and the roots the relay trusts for real upstreams ([`upstream_tls`]). Fails
    /// when the CA cannot sign: its key is not its certificate's, or the certificate is not a
    /// CA's.
    pub fn new(
        ca_cert_pem: &str,
        ca_key_pem: &str,
        secrets: Vec<BoundSecret>,
        upstream_tls: Arc<ClientConfig>,
    ) -> Result<Self, InjectError> {
        let leaves = leaf::Leaves::new(ca_cert_pem, ca_key_pem)?;
        // Whatever the relay's config offers, upstreams are spoken to in HTTP/1.1 (which every
        // HTTPS server speaks, and which keeps one request per upstream connection).
        let mut upstream_tls = (*upstream_tls).clone();
        upstream_tls.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        Ok(Self {
            leaves,
            secrets,
            upstream_tls: Arc::new(upstream_tls),
        })
    }

    /// Whether some secret is bound to `host` (so connections to it must be intercepted).
    pub fn intercepts(&self, host: &str) -> bool {
        self.secrets
            .iter()
            .any(|s| s.hosts.iter().any(|p| p.matches(host)))
    }

    /// Serves one connection from the sandbox to `host:port` (already allowed by the egress
    /// policy): TLS with a leaf certificate for `host` signed by the sandbox's CA, then HTTP
    /// requests forwarded to `upstream` (the addresses the proxy resolved `host` to) over TLS
    /// with `host` as SNI, the placeholders of secrets bound to `host` replaced by their
    /// values. Returns when done (an upgraded connection included).
    ///
    /// `client` is the sandbox's connection from its first byte (bytes the proxy read ahead
    /// included).
    /// A ClientHello naming another host by SNI is refused.
    pub async fn serve<S>(
        &self,
        client: S,
        host: &str,
        port: u16,
        upstream: &[SocketAddr],
    ) -> Result<(), InjectError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let config = self.leaves.server_config(&host)?;
        let handshake = async {
            let start = LazyConfigAcceptor::new(Acceptor::default(), client).await?;
            if let Some(sni) = start.client_hello().server_name() {
                if !sni.trim_end_matches('.').eq_ignore_ascii_case(&host) {
                    return Ok(Err(sni.to_string()));
                }
            }
            start.into_stream(config).await.map(Ok)
        };
        let tls = match tokio::time::timeout(CLIENT_HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(Ok(tls))) => tls,
            Ok(Ok(Err(sni))) => return Err(InjectError::SniMismatch { host, sni }),
            Ok(Err(source)) => return Err(InjectError::Handshake { host, source }),
            Err(_) => {
                return Err(InjectError::HandshakeTimeout {
                    host,
                    timeout: CLIENT_HANDSHAKE_TIMEOUT,
                })
            }
        };
        let secrets = rewrite::Secrets::for_host(&self.secrets, &host);
        debug!(
            "egress: intercepting {host}:{port} ({} secret(s) bound)",
            secrets.len()
        );
        let upstream = forward::Upstream {
            host: host.clone(),
            port,
            addrs: upstream.to_vec(),
            tls: self.upstream_tls.clone(),
        };
        let protocol = match tls.get_ref().1.alpn_protocol() {
            Some(ALPN_H2) => forward::Protocol::Http2,
            _ => forward::Protocol::Http1,
        };
        forward::serve(tls, protocol, upstream, secrets)
            .await
            .map_err(|source| InjectError::Client { host, source })
    }
}

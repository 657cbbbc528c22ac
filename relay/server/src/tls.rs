//! Serving HTTPS and WSS (`tether serve --tls-cert --tls-key`): the certificate chain and key
//! from PEM files, and the listener that runs each TLS handshake in a task of its own, so a
//! slow or silent client holds up nobody but itself: each handshake has the header timeout to
//! finish, and at [`MAX_TLS_HANDSHAKES`] under way the oldest is dropped to make room for a
//! new one, so a flood of stalled handshakes cannot keep a real client waiting. A connection that opens with plain HTTP
//! instead of a handshake is answered with a 400 that says to use `https://`, then closed.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::{AbortHandle, JoinSet};
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use super::admission::Admitting;
use super::constants::{MAX_TLS_HANDSHAKES, PLAINTEXT_HEAD_BYTES};
use tether_client::api::{ErrorBody, ErrorDetail};
use tether_client::tls::pem_reason;

/// The first byte of a TLS record carrying a handshake message (a ClientHello, here).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// The one application protocol served: HTTP/1.1 (WebSocket upgrades included).
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The PEM files of `tether serve --tls-cert` and `--tls-key`.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1; unencrypted).
    pub key: PathBuf,
}

/// Why the relay cannot serve TLS with the files it was given. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read the TLS {what} {}: {source}", path.display())]
    Unreadable {
        /// "certificate" or "key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not PEM, or one of its blocks is broken.
    #[error("the TLS {what} file {} is not valid PEM ({reason}); {hint}", path.display())]
    Pem {
        /// "certificate" or "key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// What the flag wants.
        hint: &'static str,
    },
    /// The certificate file holds no certificate.
    #[error("the TLS certificate file {} holds no certificate (no `-----BEGIN CERTIFICATE-----` block); {CERT_HINT}", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no private key.
    #[error("the TLS key file {} holds no private key (no unencrypted `-----BEGIN PRIVATE KEY-----`, `RSA PRIVATE KEY` or `EC PRIVATE KEY` block); {KEY_HINT}", path.display())]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// The key does not fit the certificate, or is of a kind rustls cannot use.
    #[error("the TLS key in {} cannot be used with the certificate in {}: {reason}; give --tls-key the private key of that certificate", key.display(), cert.display())]
    Unusable {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        reason: String,
    },
}

const CERT_HINT: &str = "give --tls-cert the server's certificate chain in PEM, leaf first";
const KEY_HINT: &str = "give --tls-key the certificate's private key in PEM";

/// Loads the certificate chain and key into a server configuration (ring, TLS 1.2 and 1.3,
/// HTTP/1.1 by ALPN).
pub(super) fn load(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = read_certs(&files.cert)?;
    let key = read_key(&files.key)?;
    let unusable = |e: rustls::Error| TlsError::Unusable {
        cert: files.cert.clone(),
        key: files.key.clone(),
        reason: e.to_string(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth()
        // Checks that the key is the certificate's (rustls compares their public keys).
        .with_single_cert(certs, key)
        .map_err(unusable)?;
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Unreadable {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read("certificate", path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            path: path.to_path_buf(),
            reason: pem_reason(&e),
            hint: CERT_HINT,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read("key", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoKey {
            path: path.to_path_buf(),
        },
        other => TlsError::Pem {
            what: "key",
            path: path.to_path_buf(),
            reason: pem_reason(&other),
            hint: KEY_HINT,
        },
    })
}

/// The relay's listener under TLS: accepts as [`Admitting`] does, and hands on each
/// connection once its handshake is done.
pub(super) struct TlsListener {
    tcp: Admitting,
    acceptor: TlsAcceptor,
    /// How long a handshake may take.
    timeout: Duration,
    handshakes: JoinSet<Option<(TlsStream<TcpStream>, SocketAddr)>>,
    /// The handshakes under way, oldest first (finished ones are dropped lazily).
    order: VecDeque<AbortHandle>,
}

impl TlsListener {
    pub(super) fn new(tcp: Admitting, config: Arc<ServerConfig>, timeout: Duration) -> TlsListener {
        TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(config),
            timeout,
            handshakes: JoinSet::new(),
            order: VecDeque::new(),
        }
    }

    /// At the bound, aborts the oldest handshake still under way; its slot frees at once.
    fn make_room(&mut self) {
        if self.handshakes.len() < MAX_TLS_HANDSHAKES {
            return;
        }
        while let Some(oldest) = self.order.pop_front() {
            if !oldest.is_finished() {
                debug!("{MAX_TLS_HANDSHAKES} TLS handshakes under way: dropping the oldest");
                oldest.abort();
                return;
            }
        }
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    // Cancel-safe, as axum needs (it drops this future at shutdown): a connection accepted
    // here is in `handshakes` before the next await.
    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        loop {
            tokio::select! {
                (tcp, addr) = self.tcp.accept() => {
                    self.make_room();
                    let started = self.handshakes.spawn(handshake(
                        self.acceptor.clone(),
                        tcp,
                        addr,
                        self.timeout,
                    ));
                    if self.order.len() >= MAX_TLS_HANDSHAKES {
                        self.order.retain(|h| !h.is_finished());
                    }
                    self.order.push_back(started);
                }
                Some(done) = self.handshakes.join_next() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// Completes the TLS handshake of one connection, within `timeout`; `None` when it failed
/// (the client's problem: logged at debug level only).
async fn handshake(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    addr: SocketAddr,
    timeout: Duration,
) -> Option<(TlsStream<TcpStream>, SocketAddr)> {
    let attempt = async {
        let mut first = [0u8; 1];
        if tcp.peek(&mut first).await? == 0 {
            return Ok(None);
        }
        if first[0] != TLS_HANDSHAKE_RECORD && first[0].is_ascii_alphabetic() {
            refuse_plaintext(tcp).await?;
            return Ok(None);
        }
        acceptor.accept(tcp).await.map(Some)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(Some(tls))) => Some((tls, addr)),
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            debug!("TLS handshake with {addr} failed: {e}");
            None
        }
        Err(_) => {
            debug!("TLS handshake with {addr} did not finish within {timeout:?}");
            None
        }
    }
}

/// Answers a plain HTTP request with a 400 in the relay's error format, so an `http://`
/// client learns to use `https://` instead of seeing a broken connection.
async fn refuse_plaintext(mut tcp: TcpStream) -> std::io::Result<()> {
    // Read the request's head first: closing a socket with unread bytes sends a reset,
    // which can reach the client before the answer does.
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while head.len() < PLAINTEXT_HEAD_BYTES && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let body = serde_json::to_string(&ErrorBody {
        error: ErrorDetail {
            code: "tls_required".into(),
            message: "this relay serves HTTPS only: use an https:// address for it (and wss:// \
                      for WebSockets)"
                .into(),
        },
    })
    .expect("an error body serializes");
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(answer.as_bytes()).await?;
    tcp.shutdown().await?;
    // Wait for the client to close (bounded by the caller's timeout and by this many bytes),
    // for the same reason.
    let mut drained = 0;
    while drained < PLAINTEXT_HEAD_BYTES {
        match tcp.read(&mut buf).await? {
            0 => break,
            n => drained += n,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(content: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, content).unwrap();
        f
    }

    fn files(cert: &Path, key: &Path) -> TlsFiles {
        TlsFiles {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        }
    }

    #[test]
    fn missing_files_are_named() {
        let key = file(b"");
        let err = load(&files(Path::new("/nonexistent/cert.pem"), key.path())).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("cannot read the TLS certificate /nonexistent/cert.pem:"),
            "{msg}"
        );
    }

    #[test]
    fn a_certificate_file_without_certificates_is_refused() {
        let cert = file(b"not pem at all\n");
        let key = file(b"");
        let msg = load(&files(cert.path(), key.path()))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("holds no certificate"), "{msg}");
        assert!(msg.contains(&cert.path().display().to_string()), "{msg}");
        assert!(msg.contains("--tls-cert"), "{msg}");
    }

    #[test]
    fn broken_pem_is_refused() {
        let cert = file(b"-----BEGIN CERTIFICATE-----\nMIIB\n");
        let key = file(b"");
        let msg = load(&files(cert.path(), key.path()))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("is not valid PEM"), "{msg}");
        assert!(msg.contains("END CERTIFICATE"), "{msg}");
    }
}

//! Whom the client trusts over TLS (`https://` and `wss://` relays): the webpki roots, plus
//! the certificates in the PEM file that `TETHER_CA_CERT` names, for a relay whose
//! certificate comes from a private CA or is self-signed. The REST client and the WebSocket
//! trust exactly the same set. Verification is never turned off: there is no switch for it.
//!
//! And when a TLS handshake fails, a sentence that names the certificate problem and what to
//! do about it (see [`explain`]).

#[cfg(feature = "rustls")]
pub use with_rustls::load_ca_file;
#[cfg(feature = "rustls")]
pub use with_rustls::pem_reason;
#[cfg(feature = "rustls")]
pub(crate) use with_rustls::{explain, trust};

/// The variable naming a PEM file of extra CA certificates to trust.
pub const CA_CERT_VAR: &str = "TETHER_CA_CERT";

/// Why the file in `TETHER_CA_CERT` cannot be used. Each message names the file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CaCertError {
    /// The file cannot be read.
    #[error("cannot read {CA_CERT_VAR}={path}: {reason}; point {CA_CERT_VAR} at a PEM file holding the relay's CA certificate")]
    Unreadable {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The file is not PEM, or a PEM block in it is broken.
    #[error("{CA_CERT_VAR}={path} is not a valid PEM file ({reason}); point {CA_CERT_VAR} at a PEM file holding the relay's CA certificate")]
    Pem {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The file holds no `CERTIFICATE` block (a key alone, or nothing).
    #[error("{CA_CERT_VAR}={path} holds no certificate (no `-----BEGIN CERTIFICATE-----` block); point {CA_CERT_VAR} at a PEM file holding the relay's CA certificate")]
    NoCertificate {
        /// The file.
        path: String,
    },
    /// A certificate in it cannot be a trust anchor (its DER does not parse).
    #[error("certificate {index} in {CA_CERT_VAR}={path} cannot be trusted as a CA: {reason}")]
    Unusable {
        /// The file.
        path: String,
        /// Which certificate, from 1.
        index: usize,
        /// Why.
        reason: String,
    },
}

/// Everything that needs rustls: a client built without TLS (the `rustls` feature off) speaks
/// `http://` and `ws://` only, and has no trust to configure.
#[cfg(feature = "rustls")]
mod with_rustls {
    use std::error::Error as StdError;
    use std::path::Path;
    use std::sync::{Arc, OnceLock};

    use rustls::pki_types::pem::{self, PemObject};
    use rustls::pki_types::CertificateDer;
    use rustls::{CertificateError, ClientConfig, RootCertStore};

    use super::{CaCertError, CA_CERT_VAR};
    use crate::ClientError;

    /// The ALPN protocol of both REST and WebSocket: the relay speaks HTTP/1.1 only.
    const ALPN_HTTP1: &[u8] = b"http/1.1";

    /// What the client trusts: the certificates from `TETHER_CA_CERT` (for reqwest) and the
    /// rustls configuration with them and the webpki roots (for the WebSocket).
    #[derive(Debug)]
    pub(crate) struct Trust {
        /// `TETHER_CA_CERT`'s certificates, none when it is unset.
        pub extra: Vec<CertificateDer<'static>>,
        /// The configuration every `wss://` connection uses.
        pub config: Arc<ClientConfig>,
    }

    /// The process's trust, built on first use from `TETHER_CA_CERT` (read once: the variable is
    /// not expected to change while a client runs). Only TLS connections call this, so a client
    /// of an `http://` relay never reads the file or builds the roots.
    pub(crate) fn trust() -> Result<&'static Trust, ClientError> {
        static TRUST: OnceLock<Result<Trust, CaCertError>> = OnceLock::new();
        TRUST
            .get_or_init(|| {
                let extra = match std::env::var_os(CA_CERT_VAR) {
                    Some(path) if !path.is_empty() => load_ca_file(Path::new(&path))?,
                    _ => Vec::new(),
                };
                let config = client_config(&extra);
                Ok(Trust { extra, config })
            })
            .as_ref()
            .map_err(|e| ClientError::CaCert(e.clone()))
    }

    /// The certificates in the PEM file at `path`, each checked to be usable as a trust anchor.
    pub fn load_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaCertError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| CaCertError::Unreadable {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let mut certs = Vec::new();
        for item in CertificateDer::pem_slice_iter(&bytes) {
            match item {
                Ok(cert) => certs.push(cert),
                Err(e) => {
                    return Err(CaCertError::Pem {
                        path: shown,
                        reason: pem_reason(&e),
                    })
                }
            }
        }
        if certs.is_empty() {
            return Err(CaCertError::NoCertificate { path: shown });
        }
        for (i, cert) in certs.iter().enumerate() {
            webpki_anchor(cert).map_err(|reason| CaCertError::Unusable {
                path: shown.clone(),
                index: i + 1,
                reason,
            })?;
        }
        Ok(certs)
    }

    /// What is wrong with a PEM file, in a sentence (the relay's certificate and key too).
    pub fn pem_reason(e: &pem::Error) -> String {
        match e {
            pem::Error::MissingSectionEnd { end_marker } => {
                let label = String::from_utf8_lossy(end_marker);
                format!("a `-----BEGIN {label}-----` block has no `-----END {label}-----` line")
            }
            pem::Error::IllegalSectionStart { line } => format!(
                "a block's first line `{}` is malformed",
                String::from_utf8_lossy(line)
            ),
            pem::Error::Base64Decode(e) => format!("a block's base64 is invalid: {e}"),
            other => format!("{other:?}"),
        }
    }

    /// Whether `cert` parses as a trust anchor, as the root store will need it to.
    fn webpki_anchor(cert: &CertificateDer<'_>) -> Result<(), String> {
        let mut store = RootCertStore::empty();
        store.add(cert.clone()).map_err(|e| e.to_string())
    }

    /// A rustls configuration trusting the webpki roots and `extra`, with ring as its provider
    /// (named here rather than left to the process default, which a binary that links another
    /// provider as well would leave ambiguous).
    fn client_config(extra: &[CertificateDer<'static>]) -> Arc<ClientConfig> {
        let mut roots = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        // Every certificate was checked in `load_ca_file`.
        let (_added, _ignored) = roots.add_parsable_certificates(extra.iter().cloned());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        Arc::new(config)
    }

    /// The TLS failure in `err`'s chain, as a [`ClientError::Tls`] saying what to do; `None` when
    /// the failure was not TLS's.
    pub(crate) fn explain(url: &str, err: &(dyn StdError + 'static)) -> Option<ClientError> {
        let tls = rustls_cause(err)?;
        let reason = match tls {
            rustls::Error::InvalidCertificate(cert) => match cert {
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    format!(
                        "the relay's certificate is not valid for the host name in the address \
                         ({tls}); connect by a name the certificate names, or issue the relay a \
                         certificate for this name"
                    )
                }
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => format!(
                    "the relay's certificate is outside its validity period ({tls}); renew it, or \
                     check this machine's clock"
                ),
                // webpki's reason comes wrapped in rustls's `OtherError`, by name only.
                CertificateError::Other(other) if other.to_string() == "CaUsedAsEndEntity" => {
                    format!(
                        "the relay's own certificate is a CA certificate ({tls}), which TLS \
                         clients refuse; give the relay a certificate with basicConstraints \
                         CA:FALSE (self-signed is fine)"
                    )
                }
                _ => match std::env::var_os(CA_CERT_VAR).filter(|v| !v.is_empty()) {
                    Some(path) => format!(
                        "the relay's certificate is not trusted ({tls}), and {CA_CERT_VAR}={} \
                         does not hold the CA that issued it; point {CA_CERT_VAR} at that CA's \
                         certificate (a PEM file)",
                        Path::new(&path).display()
                    ),
                    None => format!(
                        "the relay's certificate is not trusted ({tls}); if the relay uses a \
                         private CA or a self-signed certificate, set {CA_CERT_VAR} to that \
                         CA's certificate (a PEM file)"
                    ),
                },
            },
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                format!(
                "the server does not speak TLS ({tls}); if the relay serves plain HTTP, use an \
                 http:// address"
            )
            }
            other => format!("the TLS handshake failed ({other})"),
        };
        Some(ClientError::Tls {
            url: url.to_string(),
            reason,
        })
    }

    /// The rustls error somewhere in `err`'s chain. An `io::Error` hides the error it wraps from
    /// `source()` (that skips to the wrapped error's own source), so each one is opened too.
    fn rustls_cause<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
        let mut next = Some(err);
        // Chains are a handful of links; the bound only guards against a cycle.
        for _ in 0..32 {
            let e = next?;
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            if let Some(inner) = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                if let Some(tls) = rustls_cause(inner) {
                    return Some(tls);
                }
            }
            next = e.source();
        }
        None
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Two self-signed CAs, made with `openssl req -x509 -newkey ec -pkeyopt
        /// ec_paramgen_curve:P-256 -nodes -subj /CN=test-ca-a -days 36500` (and `-b`).
        const TWO_CAS: &str = "-----BEGIN CERTIFICATE-----
MIIBgDCCASWgAwIBAgIURwAytp4iEZk1N1o0p2a2987HdRwwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJdGVzdC1jYS1hMCAXDTI2MTEyNDIwNTYwNVoYDzIxMjYxMDMx
MjA1NjA1WjAUMRIwEAYDVQQDDAl0ZXN0LWNhLWEwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAARKjusBPDQy/5QXSbJh915r5f+QEJK05nqTv0cllmCRwrShM/z7elY5
4/84aQWyv2xmHxL6fMoZ4lVanA0yjKilo1MwUTAdBgNVHQ4EFgQUT8KnHXZJeG2W
7l6cN8tuMagYDgIwHwYDVR0jBBgwFoAUT8KnHXZJeG2W7l6cN8tuMagYDgIwDwYD
VR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNJADBGAiEAznI3m9Wf+M3iAT/5dUcp
dawUZosCWsq/7D09IaP2V1MCIQC4MHVs4LEfscKPDM4GXKbSO57S2txOnVB8/52l
KSiruQ==
-----END CERTIFICATE-----
-----BEGIN CERTIFICATE-----
MIIBfjCCASWgAwIBAgIUcR+OrlZlApYeh3bycyHVQhbuWAIwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJdGVzdC1jYS1iMCAXDTI2MTEyNDIwNTYwNVoYDzIxMjYxMDMx
MjA1NjA1WjAUMRIwEAYDVQQDDAl0ZXN0LWNhLWIwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAAQA5Gr3uXOJxWhDHRMn21Msdu8zj8IF2JIs5pOGaiQfmp6Rnxmd8Cga
A0YQzJau2UoG2ura+ZFOurcagy6bQT8zo1MwUTAdBgNVHQ4EFgQUoknfX7KWdoJg
7REjmwtoKoLL51wwHwYDVR0jBBgwFoAUoknfX7KWdoJg7REjmwtoKoLL51wwDwYD
VR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiAYB/YdNkvA0ldp0vZ1RiK1
WsPOq3lEO9Hcv/Zk3uAtqAIgZALAw4PICJcI217EFN10eRdwCVLLKy91TAIvKJUK
Gv4=
-----END CERTIFICATE-----
";

        fn file(content: &[u8]) -> tempfile::NamedTempFile {
            let mut f = tempfile::NamedTempFile::new().unwrap();
            std::io::Write::write_all(&mut f, content).unwrap();
            f
        }

        #[test]
        fn a_missing_file_is_named() {
            let err = load_ca_file(Path::new("/nonexistent/ca.pem")).unwrap_err();
            assert!(matches!(err, CaCertError::Unreadable { .. }), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains("TETHER_CA_CERT=/nonexistent/ca.pem"), "{msg}");
            assert!(msg.contains("No such file"), "{msg}");
        }

        #[test]
        fn a_file_without_certificates_is_refused() {
            for content in [
                &b""[..],
                b"just some text\n",
                b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIH0=\n-----END PRIVATE KEY-----\n",
            ] {
                let f = file(content);
                let err = load_ca_file(f.path()).unwrap_err();
                assert!(matches!(err, CaCertError::NoCertificate { .. }), "{err:?}");
                assert!(err.to_string().contains("BEGIN CERTIFICATE"), "{err}");
            }
        }

        #[test]
        fn broken_pem_is_refused() {
            let unterminated = file(b"-----BEGIN CERTIFICATE-----\nMIIB\n");
            let err = load_ca_file(unterminated.path()).unwrap_err();
            assert!(matches!(err, CaCertError::Pem { .. }), "{err:?}");
            assert!(err.to_string().contains("not a valid PEM file"), "{err}");

            let bad_base64 =
                file(b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n");
            let err = load_ca_file(bad_base64.path()).unwrap_err();
            assert!(matches!(err, CaCertError::Pem { .. }), "{err:?}");
        }

        #[test]
        fn a_certificate_that_does_not_parse_is_refused_with_its_index() {
            // Valid PEM and base64, but the DER inside is no certificate.
            let junk = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
            let f = file(junk.as_bytes());
            let err = load_ca_file(f.path()).unwrap_err();
            assert!(
                matches!(err, CaCertError::Unusable { index: 1, .. }),
                "{err:?}"
            );
            assert!(
                err.to_string().contains("cannot be trusted as a CA"),
                "{err}"
            );

            // A good certificate first does not make a bad second one pass.
            let mixed = format!("{TWO_CAS}{junk}");
            let f = file(mixed.as_bytes());
            let err = load_ca_file(f.path()).unwrap_err();
            assert!(
                matches!(err, CaCertError::Unusable { index: 3, .. }),
                "{err:?}"
            );
        }

        #[test]
        fn every_certificate_of_a_bundle_is_loaded() {
            let f = file(TWO_CAS.as_bytes());
            let certs = load_ca_file(f.path()).unwrap();
            assert_eq!(certs.len(), 2);
            let config = client_config(&certs);
            assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
        }

        #[test]
        fn an_unrelated_error_is_not_called_tls() {
            let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
            assert!(explain("https://x", &io).is_none());
        }

        #[test]
        fn an_unknown_issuer_points_at_the_variable() {
            let io = std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            );
            let err = explain("https://relay:7420", &io).unwrap();
            let msg = err.to_string();
            assert!(msg.contains("UnknownIssuer"), "{msg}");
            assert!(msg.contains("TETHER_CA_CERT"), "{msg}");
            assert!(msg.contains("https://relay:7420"), "{msg}");
        }
    }
}

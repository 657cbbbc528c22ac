//! Whom the relay trusts when it connects to a real upstream on a sandbox's behalf: the webpki
//! roots, the system's roots, and the operator's own CA file (`tether serve
//! --egress-ca-file`). Verification is never turned off.

use std::path::Path;
use std::sync::Arc;

use tether_client::tls::pem_reason;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tracing::{debug, warn};

use super::InjectError;

/// The client config for real upstreams: webpki roots plus the system's, plus `extra_ca` (PEM
/// file; `tether serve --egress-ca-file`, which tests use for their own upstream's CA).
pub fn upstream_tls(extra_ca: Option<&Path>) -> Result<ClientConfig, InjectError> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let system = rustls_native_certs::load_native_certs();
    for error in &system.errors {
        warn!("egress: some of the system's CA certificates cannot be loaded: {error}");
    }
    let (added, ignored) = roots.add_parsable_certificates(system.certs);
    debug!("egress: trusting {added} system CA certificates ({ignored} unusable ones ignored)");
    if let Some(path) = extra_ca {
        for (index, cert) in read_ca_file(path)?.into_iter().enumerate() {
            roots.add(cert).map_err(|e| InjectError::CaFileUnusable {
                path: path.to_path_buf(),
                index: index + 1,
                reason: e.to_string(),
            })?;
        }
    }
    Ok(
        ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, InjectError> {
    let bytes = std::fs::read(path).map_err(|source| InjectError::CaFileUnreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| InjectError::CaFilePem {
            path: path.to_path_buf(),
            reason: pem_reason(&e),
        })?;
    if certs.is_empty() {
        return Err(InjectError::CaFileEmpty {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

//! The sandbox's CA as an issuer of leaf certificates: one per intercepted host, made on first
//! use, cached with the TLS configuration that presents it, and renewed before it expires.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use tokio_rustls::rustls::client::danger::ServerCertVerifier;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{RootCertStore, ServerConfig};

use super::{
    InjectError, ALPN_H2, ALPN_HTTP1, LEAF_BACKDATE, LEAF_RENEW_BEFORE, LEAF_VALIDITY,
    MAX_CACHED_LEAVES,
};

/// A name no real host has, for the leaf that proves the CA works when the injector starts.
const PROBE_HOST: &str = "ca-check.tether.invalid";

/// Whether a certificate says it is a CA's that may sign certificates. webpki takes trust
/// anchors as they are, but not every client in a sandbox does.
fn check_ca(der: &CertificateDer<'_>) -> Result<(), String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("its certificate is not an X.509 certificate ({e})"))?;
    let constraints = cert
        .basic_constraints()
        .map_err(|e| format!("its certificate's basicConstraints are malformed ({e})"))?;
    if !constraints.is_some_and(|c| c.value.ca) {
        return Err("its certificate is not a CA's (no basicConstraints CA:TRUE)".into());
    }
    let usage = cert
        .key_usage()
        .map_err(|e| format!("its certificate's keyUsage is malformed ({e})"))?;
    if usage.is_some_and(|u| !u.value.key_cert_sign()) {
        return Err(
            "its certificate's keyUsage does not allow signing certificates (keyCertSign)".into(),
        );
    }
    Ok(())
}

/// The CA and the leaves it has issued, by host.
pub(super) struct Leaves {
    issuer: Issuer<'static, KeyPair>,
    provider: Arc<CryptoProvider>,
    cache: Mutex<HashMap<String, Leaf>>,
}

/// A leaf certificate, ready to present.
struct Leaf {
    config: Arc<ServerConfig>,
    renew_at: SystemTime,
}

impl Leaves {
    /// Loads the CA and checks that it can sign: a leaf it issues must verify against its
    /// certificate (which catches a key that is not the certificate's, and a certificate that
    /// is not a CA's or has expired).
    pub(super) fn new(ca_cert_pem: &str, ca_key_pem: &str) -> Result<Self, InjectError> {
        let ca = |reason: String| InjectError::Ca { reason };
        let key = KeyPair::from_pem(ca_key_pem).map_err(|e| {
            ca(format!(
                "its key is not a usable PKCS#8 PEM private key ({e})"
            ))
        })?;
        let ca_der = CertificateDer::from_pem_slice(ca_cert_pem.as_bytes())
            .map_err(|e| ca(format!("its certificate is not PEM ({e})")))?;
        check_ca(&ca_der).map_err(ca)?;
        let issuer = Issuer::from_ca_cert_der(&ca_der, key)
            .map_err(|e| ca(format!("its certificate is not an X.509 certificate ({e})")))?;
        let leaves = Self {
            issuer,
            provider: Arc::new(ring::default_provider()),
            cache: Mutex::new(HashMap::new()),
        };

        let mut roots = RootCertStore::empty();
        roots
            .add(ca_der)
            .map_err(|e| ca(format!("its certificate cannot be a trust anchor ({e})")))?;
        let verifier =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), leaves.provider.clone())
                .build()
                .map_err(|e| ca(e.to_string()))?;
        let (probe, _) = leaves.issue(PROBE_HOST)?;
        let name = ServerName::try_from(PROBE_HOST).expect("the probe host is a DNS name");
        verifier
            .verify_server_cert(&probe, &[], &name, &[], UnixTime::now())
            .map_err(|e| {
                ca(format!(
                    "a certificate it signs does not verify against its certificate ({e}); \
                     the key must be the certificate's, and the certificate a valid CA's"
                ))
            })?;
        Ok(leaves)
    }

    /// The TLS configuration presenting `host`'s leaf (lowercase, no trailing dot), issued now
    /// unless a cached one is still good.
    pub(super) fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, InjectError> {
        let now = SystemTime::now();
        if let Some(leaf) = self.cache().get(host) {
            if now < leaf.renew_at {
                return Ok(leaf.config.clone());
            }
        }
        // Issued outside the lock: two connections racing for a new host each sign one, and
        // the later replaces the earlier in the cache; both are valid.
        let (cert, key) = self.issue(host)?;
        let leaf_error = |reason: String| InjectError::Leaf {
            host: host.to_string(),
            reason,
        };
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| leaf_error(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .map_err(|e| leaf_error(e.to_string()))?;
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
        let config = Arc::new(config);

        let mut cache = self.cache();
        if cache.len() >= MAX_CACHED_LEAVES && !cache.contains_key(host) {
            // Rare (a wildcard binding and a sandbox that visits a thousand names): start over
            // rather than track recency.
            cache.clear();
        }
        cache.insert(
            host.to_string(),
            Leaf {
                config: config.clone(),
                renew_at: now + LEAF_VALIDITY - LEAF_RENEW_BEFORE,
            },
        );
        Ok(config)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Leaf>> {
        // The map stays consistent even if a holder panicked: each insert is one call.
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Signs a new leaf for `host`: its own P-256 key, the name as subject and only SAN, for
    /// server authentication only.
    fn issue(
        &self,
        host: &str,
    ) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), InjectError> {
        let leaf_error = |e: rcgen::Error| InjectError::Leaf {
            host: host.to_string(),
            reason: e.to_string(),
        };
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(leaf_error)?;
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, host);
        params.distinguished_name = subject;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = SystemTime::now();
        params.not_before = (now - LEAF_BACKDATE).into();
        params.not_after = (now + LEAF_VALIDITY).into();
        // 16 random bytes, the top bit clear so the DER integer stays positive.
        let mut serial: [u8; 16] = rand::random();
        serial[0] &= 0x7f;
        params.serial_number = Some(SerialNumber::from_slice(&serial));

        let key = KeyPair::generate().map_err(leaf_error)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(leaf_error)?;
        let key_der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
        Ok((cert.der().clone(), key_der))
    }
}

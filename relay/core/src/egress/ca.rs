//! The per-sandbox CA of a sandbox with secrets: the egress proxy signs a leaf certificate
//! for each intercepted host with it. Its certificate is installed in the sandbox's trust
//! stores (the same paths on every provider, here); its key stays on the relay (sealed in the
//! store).

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// The bundle (the root's system certificates and the egress CA) inside a sandbox.
pub const BUNDLE_PATH: &str = "/etc/tether/ca-bundle.pem";
/// The egress CA alone inside a sandbox.
pub const CA_PATH: &str = "/etc/tether/egress-ca.pem";
/// System bundles, relative to the sandbox's root, replaced by the bundle where they are
/// files: Debian's and Alpine's, then Red Hat's.
pub const SYSTEM_BUNDLES: [&str; 2] = [
    "etc/ssl/certs/ca-certificates.crt",
    "etc/pki/tls/certs/ca-bundle.crt",
];

/// The environment that points TLS clients at the bundle and the CA: OpenSSL (and what uses
/// it: Python's ssl, Ruby, git), Python's requests, curl, and Node (which adds the CA to its
/// own roots).
pub fn environment() -> [(&'static str, &'static str); 4] {
    [
        ("SSL_CERT_FILE", BUNDLE_PATH),
        ("REQUESTS_CA_BUNDLE", BUNDLE_PATH),
        ("CURL_CA_BUNDLE", BUNDLE_PATH),
        ("NODE_EXTRA_CA_CERTS", CA_PATH),
    ]
}

/// The PEM certificate blocks of `text`, nothing else (a bundle may hold keys or junk).
pub fn certificate_blocks(text: &str) -> String {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        out.push_str(&rest[start..start + len + END.len()]);
        out.push('\n');
        rest = &rest[start + len + END.len()..];
    }
    out
}

/// `system` (a bundle's certificates) followed by the CA `ca_pem`.
pub fn bundle(system: &str, ca_pem: &str) -> String {
    let mut bundle = certificate_blocks(system);
    bundle.push_str(ca_pem);
    bundle
}

/// A sandbox's CA, both halves PEM (the key PKCS#8).
#[derive(Clone, PartialEq, Eq)]
pub struct SandboxCa {
    /// The certificate, which the sandbox trusts.
    pub cert_pem: String,
    /// The private key, which never enters the sandbox.
    pub key_pem: String,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl SandboxCa {
    /// A new CA for sandbox `id`, allowed to sign leaf certificates only (path length 0).
    pub fn generate(id: &str) -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, "Tether");
        name.push(DnType::CommonName, format!("Tether egress CA for {id}"));
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        // rcgen's default validity (1975 to 4096) outlives any sandbox, and no clock skew
        // between the relay and the sandbox can make it not yet valid.
        let cert = params.self_signed(&key)?;
        Ok(SandboxCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_certificate_blocks_are_kept_from_a_bundle() {
        let text = "junk\n-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n\
                    -----BEGIN PRIVATE KEY-----\nKKK\n-----END PRIVATE KEY-----\n\
                    -----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----";
        let out = certificate_blocks(text);
        assert_eq!(out.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(!out.contains("KKK") && !out.contains("junk"));
        let both = bundle(
            text,
            "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
        );
        assert_eq!(both.matches("BEGIN CERTIFICATE").count(), 3);
        assert!(both.ends_with("CA\n-----END CERTIFICATE-----\n"));
    }

    #[test]
    fn a_ca_is_pem_and_its_debug_hides_the_key() {
        let ca = SandboxCa::generate("sb-1").unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem.contains("BEGIN PRIVATE KEY"));
        assert!(!format!("{ca:?}").contains("PRIVATE"));
        assert_ne!(SandboxCa::generate("sb-1").unwrap().key_pem, ca.key_pem);
    }
}

//! The per-sandbox CA of a sandbox with secrets: the egress proxy signs a leaf certificate
//! for each intercepted host with it. Its certificate is installed in the sandbox's trust
//! stores; its key stays on the relay (sealed in the registry).

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

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
    fn a_ca_is_pem_and_its_debug_hides_the_key() {
        let ca = SandboxCa::generate("sb-1").unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(ca.key_pem.contains("BEGIN PRIVATE KEY"));
        assert!(!format!("{ca:?}").contains("PRIVATE"));
        assert_ne!(SandboxCa::generate("sb-1").unwrap().key_pem, ca.key_pem);
    }
}

//! The CA of each sandbox with secrets (table `egress_ca`): its certificate, and its key sealed
//! under the relay's key with the sandbox as context. The key never leaves the relay; the row
//! goes with the sandbox's (a trigger), and a restarted relay reads it to intercept again.

use super::{Registry, RegistryError, SandboxId};
use crate::egress::ca::SandboxCa;

/// What a sealed CA key is bound to.
fn context(id: &str) -> String {
    format!("egress-ca:{id}")
}

impl Registry {
    /// Records the CA of sandbox `id`, replacing any.
    pub(crate) async fn put_egress_ca(
        &self,
        id: &SandboxId,
        ca: &SandboxCa,
    ) -> Result<(), RegistryError> {
        let key = self.key.seal(&context(id.as_str()), &ca.key_pem);
        self.backend
            .put_egress_ca(id.to_string(), ca.cert_pem.clone(), key)
            .await
    }

    /// The CA of sandbox `id`, if it has one.
    pub(crate) async fn egress_ca(
        &self,
        id: &SandboxId,
    ) -> Result<Option<SandboxCa>, RegistryError> {
        match self.backend.egress_ca(id.to_string()).await? {
            None => Ok(None),
            Some((cert_pem, sealed)) => Ok(Some(SandboxCa {
                cert_pem,
                key_pem: self.key.open(&context(id.as_str()), &sealed)?,
            })),
        }
    }

    /// Forgets the CA of sandbox `id` (a create that failed before the sandbox was recorded).
    pub(crate) async fn remove_egress_ca(&self, id: &SandboxId) -> Result<(), RegistryError> {
        self.backend.remove_egress_ca(id.to_string()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ca_round_trips_sealed_and_goes_away() {
        let registry = Registry::open_in_memory().unwrap();
        let id = SandboxId::from("sb-ca".to_string());
        let ca = SandboxCa::generate(id.as_str()).unwrap();
        registry.put_egress_ca(&id, &ca).await.unwrap();
        let back = registry.egress_ca(&id).await.unwrap().unwrap();
        assert_eq!(back, ca);
        let (_, stored) = registry
            .backend
            .egress_ca(id.to_string())
            .await
            .unwrap()
            .unwrap();
        assert!(
            !stored.contains("PRIVATE KEY"),
            "the key is stored in the clear"
        );
        registry.remove_egress_ca(&id).await.unwrap();
        assert_eq!(registry.egress_ca(&id).await.unwrap(), None);
    }
}

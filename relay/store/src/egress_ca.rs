//! The CA of each sandbox with secrets (table `egress_ca`): its certificate, and its key sealed
//! under the relay's key with the sandbox as context. The key never leaves the relay; the row
//! goes with the sandbox's (a trigger), and a restarted relay reads it to intercept again.

use super::{SandboxId, Store, StoreError};
use tether_relay_core::egress::ca::SandboxCa;

/// What a sealed CA key is bound to.
fn context(id: &str) -> String {
    format!("egress-ca:{id}")
}

impl Store {
    /// Records the CA of sandbox `id`, replacing any.
    pub async fn put_egress_ca(&self, id: &SandboxId, ca: &SandboxCa) -> Result<(), StoreError> {
        let key = self.key.seal(&context(id.as_str()), &ca.key_pem);
        self.backend
            .put_egress_ca(id.to_string(), ca.cert_pem.clone(), key)
            .await
    }

    /// The CA of sandbox `id`, if it has one.
    pub async fn egress_ca(&self, id: &SandboxId) -> Result<Option<SandboxCa>, StoreError> {
        match self.backend.egress_ca(id.to_string()).await? {
            None => Ok(None),
            Some((cert_pem, sealed)) => Ok(Some(SandboxCa {
                cert_pem,
                key_pem: self.key.open(&context(id.as_str()), &sealed)?,
            })),
        }
    }

    /// Forgets the CA of sandbox `id` (a create that failed before the sandbox was recorded).
    pub async fn remove_egress_ca(&self, id: &SandboxId) -> Result<(), StoreError> {
        self.backend.remove_egress_ca(id.to_string()).await
    }
}

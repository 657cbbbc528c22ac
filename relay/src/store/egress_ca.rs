//! The CA of each sandbox with secrets (table `egress_ca`): its certificate, and its key sealed
//! under the relay's key with the sandbox as context. The key never leaves the relay; the row
//! goes with the sandbox's (a trigger), and a restarted relay reads it to intercept again.

use rusqlite::{params, OptionalExtension};

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
        let (id, cert) = (id.as_str().to_string(), ca.cert_pem.clone());
        self.call(move |db| {
            db.execute(
                "INSERT OR REPLACE INTO egress_ca (sandbox_id, cert_pem, key_pem) VALUES (?1, ?2, ?3)",
                params![id, cert, key],
            )?;
            Ok(())
        })
        .await
    }

    /// The CA of sandbox `id`, if it has one.
    pub(crate) async fn egress_ca(
        &self,
        id: &SandboxId,
    ) -> Result<Option<SandboxCa>, RegistryError> {
        let key = self.key.clone();
        let id = id.as_str().to_string();
        self.call(move |db| {
            let row: Option<(String, String)> = db
                .query_row(
                    "SELECT cert_pem, key_pem FROM egress_ca WHERE sandbox_id = ?1",
                    params![id],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            match row {
                None => Ok(None),
                Some((cert_pem, sealed)) => Ok(Some(SandboxCa {
                    cert_pem,
                    key_pem: key.open(&context(&id), &sealed)?,
                })),
            }
        })
        .await
    }

    /// Forgets the CA of sandbox `id` (a create that failed before the sandbox was recorded).
    pub(crate) async fn remove_egress_ca(&self, id: &SandboxId) -> Result<(), RegistryError> {
        let id = id.as_str().to_string();
        self.call(move |db| {
            db.execute("DELETE FROM egress_ca WHERE sandbox_id = ?1", params![id])?;
            Ok(())
        })
        .await
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
        let stored: String = registry
            .call(|db| Ok(db.query_row("SELECT key_pem FROM egress_ca", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert!(
            !stored.contains("PRIVATE KEY"),
            "the key is stored in the clear"
        );
        registry.remove_egress_ca(&id).await.unwrap();
        assert_eq!(registry.egress_ca(&id).await.unwrap(), None);
    }
}

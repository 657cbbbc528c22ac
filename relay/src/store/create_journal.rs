//! The create journal (table `create_journal`): one row per create in progress, so a relay
//! killed mid-create finds, when it starts again, every sandbox it may have half made.
//!
//! The row is written before the provider is asked to make anything, given the provider's id
//! as soon as the provider answers, and deleted in the same transaction that registers the
//! sandbox ([`Registry::insert`]) or once a failed create has been undone. A row found at
//! start is therefore a create that a crash interrupted: the relay removes whatever it made
//! (`server::recovery`), then [`Registry::finish_create`] forgets it. This is not the destroy
//! journal (`journal`, table `destroyed`), which is a history kept for users; this one is the
//! relay's own to-do list and is empty whenever no create runs.

use std::collections::BTreeMap;

use rusqlite::{params, Transaction};

use super::{Registry, RegistryError, SandboxId, Tenant};

/// A create the relay began and has not finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PendingCreate {
    /// The id the relay gave the sandbox.
    pub id: SandboxId,
    /// Its owner.
    pub tenant: Tenant,
    /// The provider asked to make it.
    pub provider: String,
    /// The provider's id for it, once the provider answered.
    pub provider_ref: Option<String>,
    /// Its labels (cloud providers tag the sandbox with them too).
    pub labels: BTreeMap<String, String>,
    /// When the create began, in milliseconds since the Unix epoch.
    pub started_ms: i64,
}

impl Registry {
    /// Journals a create before anything of it exists. Fails if the id is journaled already.
    pub(crate) async fn begin_create(&self, create: PendingCreate) -> Result<(), RegistryError> {
        let labels = serde_json::to_string(&create.labels)?;
        self.call(move |db| {
            db.execute(
                "INSERT INTO create_journal \
                 (sandbox_id, tenant, provider, provider_ref, labels, started_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    create.id.as_str(),
                    create.tenant.as_str(),
                    create.provider,
                    create.provider_ref,
                    labels,
                    create.started_ms,
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// Records the provider's id for a journaled create, so a crash before the sandbox is
    /// registered still lets the relay delete it at the provider.
    pub(crate) async fn create_made(
        &self,
        id: &SandboxId,
        provider_ref: &str,
    ) -> Result<(), RegistryError> {
        let (id, provider_ref) = (id.clone(), provider_ref.to_string());
        self.call(move |db| {
            db.execute(
                "UPDATE create_journal SET provider_ref = ?2 WHERE sandbox_id = ?1",
                params![id.as_str(), provider_ref],
            )?;
            Ok(())
        })
        .await
    }

    /// Every journaled create, oldest first.
    pub(crate) async fn pending_creates(&self) -> Result<Vec<PendingCreate>, RegistryError> {
        self.call(|db| {
            let mut stmt = db.prepare(
                "SELECT sandbox_id, tenant, provider, provider_ref, labels, started_ms \
                 FROM create_journal ORDER BY started_ms, sandbox_id",
            )?;
            let rows = stmt.query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, i64>(5)?,
                ))
            })?;
            let mut pending = Vec::new();
            for row in rows {
                let (id, tenant, provider, provider_ref, labels, started_ms) = row?;
                pending.push(PendingCreate {
                    id: SandboxId::from(id),
                    tenant: Tenant::from_stored(tenant),
                    provider,
                    provider_ref,
                    labels: serde_json::from_str(&labels)?,
                    started_ms,
                });
            }
            Ok(pending)
        })
        .await
    }

    /// Forgets a journaled create that did not register its sandbox (it failed and was
    /// undone, or the relay removed what a crash left of it), with the secrets and egress CA
    /// bound to it, which no sandbox row will ever take away. A registered sandbox's rows are
    /// never touched: for it, this only drops a stale journal row.
    pub(crate) async fn finish_create(&self, id: &SandboxId) -> Result<(), RegistryError> {
        let id = id.clone();
        self.call(move |db| {
            let tx = db.transaction()?;
            let registered: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE id = ?1)",
                [id.as_str()],
                |row| row.get(0),
            )?;
            if !registered {
                tx.execute(
                    "DELETE FROM sandbox_secrets WHERE sandbox_id = ?1",
                    [id.as_str()],
                )?;
                tx.execute("DELETE FROM egress_ca WHERE sandbox_id = ?1", [id.as_str()])?;
            }
            complete(&tx, &id)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }
}

/// Deletes the journal row of `id`, inside the caller's transaction.
pub(super) fn complete(tx: &Transaction<'_>, id: &SandboxId) -> Result<(), RegistryError> {
    tx.execute(
        "DELETE FROM create_journal WHERE sandbox_id = ?1",
        [id.as_str()],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tether_client::api::SecretValue;

    use super::*;
    use crate::egress::ca::SandboxCa;
    use crate::egress::policy::{BoundSecret, HostPattern};
    use crate::provider::{SandboxSpec, SandboxState};
    use crate::store::SandboxRecord;

    fn pending(id: &SandboxId) -> PendingCreate {
        PendingCreate {
            id: id.clone(),
            tenant: Tenant::parse("team-a").unwrap(),
            provider: "local".into(),
            provider_ref: None,
            labels: [("app".to_string(), "web".to_string())].into(),
            started_ms: 1_000,
        }
    }

    fn record(id: &SandboxId) -> SandboxRecord {
        SandboxRecord {
            id: id.clone(),
            tenant: Tenant::parse("team-a").unwrap(),
            provider: "local".into(),
            provider_ref: id.to_string(),
            labels: BTreeMap::new(),
            spec: SandboxSpec::default(),
            agent_token: "ab".repeat(32),
            meta: serde_json::json!({}),
            created_ms: 2_000,
            last_active_ms: 2_000,
            ttl: Some(Duration::from_secs(60)),
            expires_ms: Some(62_000),
            idle_timeout: None,
            state: SandboxState::Running,
        }
    }

    async fn bind_secret_and_ca(reg: &Registry, id: &SandboxId) {
        let secret = BoundSecret {
            name: "KEY".into(),
            placeholder: format!("tether-secret-{}", "0f".repeat(16)),
            value: SecretValue::new("sk-test"),
            hosts: vec![HostPattern::parse("api.example.com").unwrap()],
        };
        reg.bind_secrets(id, &[secret]).await.unwrap();
        let ca = SandboxCa::generate(id.as_str()).unwrap();
        reg.put_egress_ca(id, &ca).await.unwrap();
    }

    #[tokio::test]
    async fn registering_the_sandbox_completes_its_create() {
        let reg = Registry::open_in_memory().unwrap();
        let id = SandboxId::generate();
        reg.begin_create(pending(&id)).await.unwrap();
        assert_eq!(reg.pending_creates().await.unwrap(), vec![pending(&id)]);
        reg.create_made(&id, "ref-1").await.unwrap();
        let found = reg.pending_creates().await.unwrap();
        assert_eq!(found[0].provider_ref.as_deref(), Some("ref-1"));
        reg.insert(record(&id)).await.unwrap();
        assert_eq!(reg.pending_creates().await.unwrap(), vec![]);
        assert!(reg.get(&found[0].tenant, &id).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn an_id_is_journaled_once() {
        let reg = Registry::open_in_memory().unwrap();
        let id = SandboxId::generate();
        reg.begin_create(pending(&id)).await.unwrap();
        assert!(reg.begin_create(pending(&id)).await.is_err());
        assert_eq!(reg.pending_creates().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_failed_insert_leaves_the_create_journaled() {
        let reg = Registry::open_in_memory().unwrap();
        let id = SandboxId::generate();
        reg.insert(record(&id)).await.unwrap();
        // A second create under the same id fails to register: its journal row must stay, or
        // a crash now would leave what it made unaccounted for.
        reg.begin_create(pending(&id)).await.unwrap();
        assert!(reg.insert(record(&id)).await.is_err());
        assert_eq!(reg.pending_creates().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn finishing_an_unregistered_create_forgets_its_secrets_and_ca() {
        let reg = Registry::open_in_memory().unwrap();
        let id = SandboxId::generate();
        reg.begin_create(pending(&id)).await.unwrap();
        bind_secret_and_ca(&reg, &id).await;
        reg.finish_create(&id).await.unwrap();
        assert_eq!(reg.pending_creates().await.unwrap(), vec![]);
        assert!(reg.bound_secrets(&id).await.unwrap().is_empty());
        assert_eq!(reg.egress_ca(&id).await.unwrap(), None);
        // Finishing twice (a restart during recovery) is harmless.
        reg.finish_create(&id).await.unwrap();
    }

    #[tokio::test]
    async fn finishing_never_takes_a_registered_sandboxs_secrets() {
        let reg = Registry::open_in_memory().unwrap();
        let id = SandboxId::generate();
        reg.insert(record(&id)).await.unwrap();
        bind_secret_and_ca(&reg, &id).await;
        reg.begin_create(pending(&id)).await.unwrap();
        reg.finish_create(&id).await.unwrap();
        assert_eq!(reg.pending_creates().await.unwrap(), vec![]);
        assert_eq!(reg.bound_secrets(&id).await.unwrap().len(), 1);
        assert!(reg.egress_ca(&id).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn the_journal_survives_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db");
        let id = SandboxId::generate();
        {
            let reg = Registry::open(&path).unwrap();
            reg.begin_create(pending(&id)).await.unwrap();
            reg.create_made(&id, "ref-9").await.unwrap();
            // Dropped without finishing, as a killed relay leaves it.
        }
        let reg = Registry::open(&path).unwrap();
        let found = reg.pending_creates().await.unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].id, id);
        assert_eq!(found[0].provider_ref.as_deref(), Some("ref-9"));
    }
}

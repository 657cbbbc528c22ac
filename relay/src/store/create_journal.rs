//! The create journal (table `create_journal`): one row per create in progress, so a relay
//! killed mid-create finds, when it starts again, every sandbox it may have half made.
//!
//! The row is written before the provider is asked to make anything, given the provider's id
//! as soon as the provider answers, and deleted in the same transaction that registers the
//! sandbox ([`Registry::insert`]) or once a failed create has been undone. A row found at
//! start is therefore a create that a crash interrupted: the relay removes whatever it made
//! (`server::recovery`), then [`Registry::finish_create`] forgets it. Each row names the relay
//! running the create, so relays sharing a database each recover only their own. This is not the destroy
//! journal (`journal`, table `destroyed`), which is a history kept for users; this one is the
//! relay's own to-do list and is empty whenever no create runs.

use std::collections::BTreeMap;

use super::{NodeId, Registry, RegistryError, SandboxId, Tenant};

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
    /// The relay running the create: only it may finish it after a crash, since another
    /// relay's journaled creates may be under way (`None`: journaled before relays had ids).
    pub node: Option<NodeId>,
}

impl Registry {
    /// Journals a create before anything of it exists. Fails if the id is journaled already.
    pub(crate) async fn begin_create(&self, create: PendingCreate) -> Result<(), RegistryError> {
        self.backend.begin_create(create).await
    }

    /// Records the provider's id for a journaled create, so a crash before the sandbox is
    /// registered still lets the relay delete it at the provider.
    pub(crate) async fn create_made(
        &self,
        id: &SandboxId,
        provider_ref: &str,
    ) -> Result<(), RegistryError> {
        self.backend
            .create_made(id.to_string(), provider_ref.to_string())
            .await
    }

    /// The creates `node` journaled (with those journaled before relays had ids), oldest
    /// first; every relay's when `node` is `None`.
    pub(crate) async fn pending_creates(
        &self,
        node: Option<&NodeId>,
    ) -> Result<Vec<PendingCreate>, RegistryError> {
        self.backend.pending_creates(node.cloned()).await
    }

    /// Forgets a journaled create that did not register its sandbox (it failed and was
    /// undone, or the relay removed what a crash left of it), with the secrets and egress CA
    /// bound to it, which no sandbox row will ever take away. A registered sandbox's rows are
    /// never touched: for it, this only drops a stale journal row.
    pub(crate) async fn finish_create(&self, id: &SandboxId) -> Result<(), RegistryError> {
        self.backend.finish_create(id.to_string()).await
    }
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
            node: Some(NodeId::parse("node-a").unwrap()),
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
            node: None,
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
        assert_eq!(reg.pending_creates(None).await.unwrap(), vec![pending(&id)]);
        reg.create_made(&id, "ref-1").await.unwrap();
        let found = reg.pending_creates(None).await.unwrap();
        assert_eq!(found[0].provider_ref.as_deref(), Some("ref-1"));
        reg.insert(record(&id)).await.unwrap();
        assert_eq!(reg.pending_creates(None).await.unwrap(), vec![]);
        assert!(reg.get(&found[0].tenant, &id).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn an_id_is_journaled_once() {
        let reg = Registry::open_in_memory().unwrap();
        let id = SandboxId::generate();
        reg.begin_create(pending(&id)).await.unwrap();
        assert!(reg.begin_create(pending(&id)).await.is_err());
        assert_eq!(reg.pending_creates(None).await.unwrap().len(), 1);
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
        assert_eq!(reg.pending_creates(None).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn finishing_an_unregistered_create_forgets_its_secrets_and_ca() {
        let reg = Registry::open_in_memory().unwrap();
        let id = SandboxId::generate();
        reg.begin_create(pending(&id)).await.unwrap();
        bind_secret_and_ca(&reg, &id).await;
        reg.finish_create(&id).await.unwrap();
        assert_eq!(reg.pending_creates(None).await.unwrap(), vec![]);
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
        assert_eq!(reg.pending_creates(None).await.unwrap(), vec![]);
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
        let found = reg.pending_creates(None).await.unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].id, id);
        assert_eq!(found[0].provider_ref.as_deref(), Some("ref-9"));
    }
}

//! The create journal: rows written before a create, completed by the insert that registers
//! the sandbox, found again after a crash, and scoped to the relay that journaled them.

use std::collections::BTreeMap;
use std::time::Duration;

use tether_client::api::SecretValue;

use super::{both, node, Db};
use crate::*;
use tether_relay_core::egress::ca::SandboxCa;
use tether_relay_core::egress::policy::{BoundSecret, HostPattern};
use tether_relay_core::provider::{SandboxSpec, SandboxState};

both!(
    registering_the_sandbox_completes_its_create,
    an_id_is_journaled_once,
    a_failed_insert_leaves_the_create_journaled,
    finishing_an_unregistered_create_forgets_its_secrets_and_ca,
    finishing_never_takes_a_registered_sandboxs_secrets,
    the_journal_survives_a_crash,
    each_relay_recovers_only_its_own_creates,
);

fn pending(id: &SandboxId) -> PendingCreate {
    PendingCreate {
        id: id.clone(),
        tenant: Tenant::parse("team-a").unwrap(),
        provider: "local".into(),
        provider_ref: None,
        labels: [("app".to_string(), "web".to_string())].into(),
        started_ms: 1_000,
        node: Some(node("node-a")),
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

async fn bind_secret_and_ca(reg: &Store, id: &SandboxId) {
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

async fn registering_the_sandbox_completes_its_create(db: Db) {
    let reg = db.reg;
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

async fn an_id_is_journaled_once(db: Db) {
    let reg = db.reg;
    let id = SandboxId::generate();
    reg.begin_create(pending(&id)).await.unwrap();
    assert!(reg.begin_create(pending(&id)).await.is_err());
    assert_eq!(reg.pending_creates(None).await.unwrap().len(), 1);
}

async fn a_failed_insert_leaves_the_create_journaled(db: Db) {
    let reg = db.reg;
    let id = SandboxId::generate();
    reg.insert(record(&id)).await.unwrap();
    // A second create under the same id fails to register: its journal row must stay, or
    // a crash now would leave what it made unaccounted for.
    reg.begin_create(pending(&id)).await.unwrap();
    assert!(reg.insert(record(&id)).await.is_err());
    assert_eq!(reg.pending_creates(None).await.unwrap().len(), 1);
}

async fn finishing_an_unregistered_create_forgets_its_secrets_and_ca(db: Db) {
    let reg = db.reg;
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

async fn finishing_never_takes_a_registered_sandboxs_secrets(db: Db) {
    let reg = db.reg;
    let id = SandboxId::generate();
    reg.insert(record(&id)).await.unwrap();
    bind_secret_and_ca(&reg, &id).await;
    reg.begin_create(pending(&id)).await.unwrap();
    reg.finish_create(&id).await.unwrap();
    assert_eq!(reg.pending_creates(None).await.unwrap(), vec![]);
    assert_eq!(reg.bound_secrets(&id).await.unwrap().len(), 1);
    assert!(reg.egress_ca(&id).await.unwrap().is_some());
}

async fn the_journal_survives_a_crash(db: Db) {
    let id = SandboxId::generate();
    db.reg.begin_create(pending(&id)).await.unwrap();
    db.reg.create_made(&id, "ref-9").await.unwrap();
    // Another store on the database, as a relay restarted after a kill finds it.
    let reg = db.open_again().await.unwrap();
    let found = reg.pending_creates(None).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, id);
    assert_eq!(found[0].provider_ref.as_deref(), Some("ref-9"));
}

async fn each_relay_recovers_only_its_own_creates(db: Db) {
    let reg = db.reg;
    let (mine, theirs, old) = (
        SandboxId::generate(),
        SandboxId::generate(),
        SandboxId::generate(),
    );
    reg.begin_create(pending(&mine)).await.unwrap();
    let mut other = pending(&theirs);
    other.node = Some(node("node-b"));
    reg.begin_create(other).await.unwrap();
    let mut legacy = pending(&old);
    legacy.node = None;
    reg.begin_create(legacy).await.unwrap();
    let ids = |p: Vec<PendingCreate>| {
        let mut ids: Vec<_> = p.into_iter().map(|p| p.id).collect();
        ids.sort();
        ids
    };
    let mut want = vec![mine.clone(), old.clone()];
    want.sort();
    assert_eq!(
        ids(reg.pending_creates(Some(&node("node-a"))).await.unwrap()),
        want
    );
    assert_eq!(reg.pending_creates(None).await.unwrap().len(), 3);
}

//! The secret store's rows: sealed at rest, per tenant, and gone with their sandbox.

use tether_client::api::SecretValue;

use super::{both, contains, node, tenant, Db};
use crate::*;
use tether_relay_core::egress::ca::SandboxCa;
use tether_relay_core::egress::policy::{BoundSecret, HostPattern};

/// A value no other test data contains, so finding it in a file means it leaked.
const VALUE: &str = "sk-live-Zq8vN3rT6yW1uI4oP7aS0dF9";

both!(
    a_tenant_secret_round_trips_and_is_sealed_at_rest,
    a_tenant_sees_and_touches_only_its_own_secrets,
    a_sealed_value_copied_to_another_row_does_not_open,
    bound_secrets_are_sealed_and_go_with_their_sandbox_on_every_delete,
    secrets_bound_to_a_sandbox_never_recorded_are_swept,
    a_bound_value_moved_to_another_sandbox_does_not_open,
    a_full_store_takes_no_new_name_but_replaces_and_leaves_others_alone,
    concurrent_puts_never_overfill_a_store,
    a_ca_round_trips_sealed_and_goes_away,
);

/// Stores a secret in a store with room for 8.
async fn put(reg: &Store, t: &Tenant, name: &str, value: &str, now: i64) -> (StoredSecret, bool) {
    reg.put_secret(t, name, &SecretValue::new(value), now, 8)
        .await
        .unwrap()
        .expect("room in the store")
}

fn bound(name: &str, value: &str, host: &str) -> BoundSecret {
    BoundSecret {
        name: name.into(),
        placeholder: format!("tether-secret-{}", "0f".repeat(16)),
        value: SecretValue::new(value),
        hosts: vec![HostPattern::parse(host).unwrap()],
    }
}

/// A sandbox record of `tenant` with no secrets in its spec.
fn sandbox(tenant_name: &str) -> SandboxRecord {
    let id = SandboxId::generate();
    SandboxRecord {
        provider_ref: id.to_string(),
        id,
        tenant: tenant(tenant_name),
        provider: "local".into(),
        labels: Default::default(),
        spec: Default::default(),
        agent_token: "cd".repeat(32),
        meta: serde_json::json!({}),
        created_ms: 1,
        last_active_ms: 1,
        ttl: None,
        expires_ms: None,
        idle_timeout: None,
        state: tether_relay_core::provider::SandboxState::Running,
        node: None,
    }
}

async fn a_tenant_secret_round_trips_and_is_sealed_at_rest(db: Db) {
    let a = tenant("team-a");
    {
        let reg = &db.reg;
        let (first, created) = put(reg, &a, "OPENAI_API_KEY", "old", 10).await;
        assert!(created);
        assert_eq!((first.created_ms, first.updated_ms), (10, 10));
        let (second, created) = put(reg, &a, "OPENAI_API_KEY", VALUE, 20).await;
        assert!(!created, "a second put replaces");
        assert_eq!((second.created_ms, second.updated_ms), (10, 20));
        put(reg, &a, "ANOTHER", "x", 30).await;
        let names: Vec<String> = reg
            .secrets(&a)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["ANOTHER", "OPENAI_API_KEY"], "by name");
    }
    assert!(
        !contains(&db.raw_bytes().await, VALUE),
        "the {} database holds the value in plain text",
        db.kind()
    );
    let reg = db.open_again().await.unwrap();
    let got = reg.secret_value(&a, "OPENAI_API_KEY").await.unwrap();
    assert_eq!(got.unwrap().expose(), VALUE);

    assert!(reg.remove_secret(&a, "OPENAI_API_KEY").await.unwrap());
    assert!(!reg.remove_secret(&a, "OPENAI_API_KEY").await.unwrap());
    assert_eq!(reg.secret_value(&a, "OPENAI_API_KEY").await.unwrap(), None);
    drop(reg);
    assert!(!contains(&db.raw_bytes().await, VALUE));
}

async fn a_tenant_sees_and_touches_only_its_own_secrets(db: Db) {
    let reg = db.reg;
    let (a, b) = (tenant("a"), tenant("b"));
    put(&reg, &a, "KEY", VALUE, 1).await;
    assert!(reg.secrets(&b).await.unwrap().is_empty());
    assert_eq!(reg.secret_value(&b, "KEY").await.unwrap(), None);
    assert!(!reg.remove_secret(&b, "KEY").await.unwrap());
    let (_, created) = put(&reg, &b, "KEY", "b's own", 2).await;
    assert!(created, "b's KEY is another secret than a's");
    let a_value = reg.secret_value(&a, "KEY").await.unwrap().unwrap();
    assert_eq!(a_value.expose(), VALUE);
    let b_value = reg.secret_value(&b, "KEY").await.unwrap().unwrap();
    assert_eq!(b_value.expose(), "b's own");
}

async fn a_sealed_value_copied_to_another_row_does_not_open(db: Db) {
    let reg = &db.reg;
    let (a, b) = (tenant("a"), tenant("b"));
    put(reg, &a, "KEY", VALUE, 1).await;
    put(reg, &b, "KEY", "b", 1).await;
    put(reg, &a, "OTHER", "o", 1).await;
    // What someone with write access to the file (not the key) could do.
    db.exec(
        "UPDATE secrets SET value = (SELECT value FROM secrets WHERE tenant = 'a' AND \
         name = 'KEY') WHERE (tenant = 'b' AND name = 'KEY') OR name = 'OTHER'",
    )
    .await;
    for (t, name) in [(&b, "KEY"), (&a, "OTHER")] {
        let err = reg.secret_value(t, name).await.unwrap_err().to_string();
        assert!(err.contains("cannot be decrypted"), "{err}");
        assert!(!err.contains(VALUE), "{err}");
    }
    assert_eq!(
        reg.secret_value(&a, "KEY").await.unwrap().unwrap().expose(),
        VALUE
    );
}

async fn bound_secrets_are_sealed_and_go_with_their_sandbox_on_every_delete(db: Db) {
    let reg = &db.reg;
    let (asked, reaped) = (sandbox("a"), sandbox("a"));
    for sb in [&asked, &reaped] {
        reg.insert(sb.clone()).await.unwrap();
        let secrets = [
            bound("KEY", VALUE, "api.example.test"),
            bound("B", "b", "*.x.test"),
        ];
        reg.bind_secrets(&sb.id, &secrets).await.unwrap();
    }
    let got = reg.bound_secrets(&asked.id).await.unwrap();
    assert_eq!(
        got,
        [
            bound("KEY", VALUE, "api.example.test"),
            bound("B", "b", "*.x.test")
        ],
        "in the order bound"
    );
    assert!(!format!("{got:?}").contains(VALUE), "Debug shows no value");
    assert!(!contains(&db.raw_bytes().await, VALUE));

    // A client's delete, and the reaper's journaled one.
    assert!(reg.remove(&asked.id).await.unwrap());
    assert!(reg.bound_secrets(&asked.id).await.unwrap().is_empty());
    let entry = Destroyed::of(&reaped, 2, DestroyReason::Ttl, "test".into());
    assert_eq!(reg.remove_journaled(entry, None).await.unwrap(), Some(true));
    assert!(reg.bound_secrets(&reaped.id).await.unwrap().is_empty());
    assert_eq!(db.count("SELECT count(*) FROM sandbox_secrets").await, 0);
}

async fn secrets_bound_to_a_sandbox_never_recorded_are_swept(db: Db) {
    let reg = db.reg;
    let kept = sandbox("a");
    reg.insert(kept.clone()).await.unwrap();
    let (never, theirs, ours) = (
        SandboxId::generate(),
        SandboxId::generate(),
        SandboxId::generate(),
    );
    // Another relay is creating `theirs` right now; `ours` was this relay's, before a crash.
    for (id, by) in [(&theirs, "node-b"), (&ours, "node-a")] {
        reg.begin_create(PendingCreate {
            id: id.clone(),
            tenant: tenant("a"),
            provider: "local".into(),
            provider_ref: None,
            labels: Default::default(),
            started_ms: 1,
            node: Some(node(by)),
        })
        .await
        .unwrap();
    }
    for id in [&kept.id, &never, &theirs, &ours] {
        reg.bind_secrets(id, &[bound("KEY", VALUE, "a.test")])
            .await
            .unwrap();
    }
    assert_eq!(reg.sweep_unbound_secrets(&node("node-a")).await.unwrap(), 2);
    assert!(reg.bound_secrets(&never).await.unwrap().is_empty());
    assert!(reg.bound_secrets(&ours).await.unwrap().is_empty());
    assert_eq!(reg.bound_secrets(&kept.id).await.unwrap().len(), 1);
    assert_eq!(
        reg.bound_secrets(&theirs).await.unwrap().len(),
        1,
        "another relay's create in flight keeps its secrets"
    );

    reg.unbind_secrets(&kept.id).await.unwrap();
    assert!(reg.bound_secrets(&kept.id).await.unwrap().is_empty());
}

async fn a_bound_value_moved_to_another_sandbox_does_not_open(db: Db) {
    let reg = &db.reg;
    let (one, two) = (SandboxId::generate(), SandboxId::generate());
    reg.bind_secrets(&one, &[bound("KEY", VALUE, "a.test")])
        .await
        .unwrap();
    reg.bind_secrets(&two, &[bound("KEY", "other", "a.test")])
        .await
        .unwrap();
    db.exec(&format!(
        "UPDATE sandbox_secrets SET value = (SELECT value FROM sandbox_secrets \
         WHERE sandbox_id = '{one}') WHERE sandbox_id = '{two}'"
    ))
    .await;
    let err = reg.bound_secrets(&two).await.unwrap_err().to_string();
    assert!(
        err.contains("cannot be decrypted") && !err.contains(VALUE),
        "{err}"
    );
}

async fn a_full_store_takes_no_new_name_but_replaces_and_leaves_others_alone(db: Db) {
    let reg = db.reg;
    let (a, b) = (tenant("a"), tenant("b"));
    let value = SecretValue::new("v");
    for name in ["ONE", "TWO"] {
        assert!(reg
            .put_secret(&a, name, &value, 1, 2)
            .await
            .unwrap()
            .is_some());
    }
    assert_eq!(
        reg.put_secret(&a, "THREE", &value, 1, 2).await.unwrap(),
        None
    );
    let replaced = reg.put_secret(&a, "ONE", &value, 2, 2).await.unwrap();
    assert!(
        matches!(replaced, Some((_, false))),
        "replacing needs no room"
    );
    assert!(reg
        .put_secret(&b, "THREE", &value, 1, 2)
        .await
        .unwrap()
        .is_some());
    assert_eq!(reg.secrets(&a).await.unwrap().len(), 2);
}

async fn concurrent_puts_never_overfill_a_store(db: Db) {
    // Two relays (two stores on one database) race for the last places.
    let other = db.open_again().await.unwrap();
    let a = tenant("a");
    let puts = (0..8).map(|i| {
        let reg = if i % 2 == 0 {
            db.reg.clone()
        } else {
            other.clone()
        };
        let a = a.clone();
        async move {
            reg.put_secret(&a, &format!("K{i}"), &SecretValue::new("v"), 1, 3)
                .await
                .unwrap()
        }
    });
    let stored = futures_util::future::join_all(puts).await;
    assert_eq!(stored.iter().filter(|s| s.is_some()).count(), 3);
    assert_eq!(db.reg.secrets(&a).await.unwrap().len(), 3);
}

async fn a_ca_round_trips_sealed_and_goes_away(db: Db) {
    let store = db.reg;
    let id = SandboxId::from("sb-ca".to_string());
    let ca = SandboxCa::generate(id.as_str()).unwrap();
    store.put_egress_ca(&id, &ca).await.unwrap();
    let back = store.egress_ca(&id).await.unwrap().unwrap();
    assert_eq!(back, ca);
    let (_, stored) = store
        .backend
        .egress_ca(id.to_string())
        .await
        .unwrap()
        .unwrap();
    assert!(
        !stored.contains("PRIVATE KEY"),
        "the key is stored in the clear"
    );
    store.remove_egress_ca(&id).await.unwrap();
    assert_eq!(store.egress_ca(&id).await.unwrap(), None);
}

//! Crash recovery at start: interrupted creates found in the create journal are removed at
//! their provider and forgotten; registered sandboxes are never touched.

use std::sync::atomic::Ordering;

use reqwest::StatusCode;
use serde_json::json;

use super::TestRelay;
use tether_store::{PendingCreate, SandboxId, Store, Tenant};

fn interrupted(id: &str, provider_ref: Option<&str>) -> PendingCreate {
    PendingCreate {
        id: SandboxId::from(id.to_string()),
        tenant: Tenant::parse("b").unwrap(),
        provider: "fake".into(),
        provider_ref: provider_ref.map(str::to_string),
        labels: Default::default(),
        started_ms: 1,
        // As journaled before relays had ids: every relay of the file recovers it.
        node: None,
    }
}

#[tokio::test]
async fn interrupted_creates_are_removed_and_registered_sandboxes_kept() {
    let mut t = TestRelay::start().await;
    let b = t.token_for("b").await;
    let kept = t.create(&b, json!({"provider": "fake"})).await;
    t.relay.take().unwrap().shutdown().await;

    // What a relay killed mid-create leaves: a create the provider answered (it made
    // `sb-made`), one it had not answered yet, and a stale row of a registered sandbox.
    t.provider
        .sandboxes
        .lock()
        .unwrap()
        .insert("sb-made".into(), "token".into());
    let store = Store::open(&t.dir.path().join("data").join("relay.db")).unwrap();
    for create in [
        interrupted("sb-made", Some("fake-sb-made")),
        interrupted("sb-unanswered", None),
        interrupted(&kept.id, Some(&kept.provider_ref)),
    ] {
        store.begin_create(create).await.unwrap();
    }
    let deletes = t.provider.deletes.load(Ordering::SeqCst);

    t.restart().await;
    assert!(!t.provider.has("sb-made"), "the half-made sandbox is left");
    assert_eq!(
        t.provider.deletes.load(Ordering::SeqCst),
        deletes + 1,
        "only the create the provider had answered is deleted there"
    );
    assert!(t.provider.has(&kept.id), "a registered sandbox was removed");
    let (status, got) = t
        .call("GET", &format!("/v1/sandboxes/{}", kept.id), &b, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(store.pending_creates(None).await.unwrap(), vec![]);
}

#[tokio::test]
async fn finished_creates_leave_nothing_journaled() {
    let t = TestRelay::start().await;
    let b = t.token_for("b").await;
    t.create(&b, json!({"provider": "fake"})).await;
    let body = json!({"provider": "fake", "labels": {"a": "b"}, "get_or_create": true});
    let (status, _) = t.call("POST", "/v1/sandboxes", &b, Some(body)).await;
    assert_eq!(status, StatusCode::CREATED);
    let store = Store::open(&t.dir.path().join("data").join("relay.db")).unwrap();
    assert_eq!(store.pending_creates(None).await.unwrap(), vec![]);
}

//! What relays sharing a database rely on: leases held by one relay at a time with epochs
//! that fence a holder that lost its lease, reapers' claims, heartbeats, and get-or-create's
//! lock across relays. Each test plays two relays as two stores on one database.

use std::time::Duration;

use super::{both, node, record, Db};
use crate::*;

both!(
    a_lease_has_one_holder_and_changes_hands_with_a_new_epoch,
    a_reaper_that_lost_its_lease_can_neither_claim_nor_journal,
    a_claim_needs_the_sandbox_still_due_and_blocks_renewal,
    relays_are_alive_while_they_beat,
    the_label_lock_is_exclusive_across_relays,
);

/// Long enough that a lease does not run out during a test step.
const LONG: Duration = Duration::from_secs(60);
/// Short enough that a lease has run out once a test sleeps past it.
const SHORT: Duration = Duration::from_millis(1);

/// Sleeps past a [`SHORT`] lease (the database's clock moves on meanwhile).
async fn let_it_run_out() {
    tokio::time::sleep(Duration::from_millis(30)).await;
}

async fn a_lease_has_one_holder_and_changes_hands_with_a_new_epoch(db: Db) {
    let (a, b) = (node("node-a"), node("node-b"));
    let other = db.open_again().await.unwrap();
    let first = db.reg.acquire_lease("reaper", &a, LONG).await.unwrap();
    let first = first.expect("a free lease is taken");
    assert_eq!((first.holder.clone(), first.epoch), (a.clone(), 1));
    assert_eq!(other.acquire_lease("reaper", &b, LONG).await.unwrap(), None);
    // Renewing keeps the epoch; another lease name is another lease.
    let renewed = db.reg.acquire_lease("reaper", &a, SHORT).await.unwrap();
    assert_eq!(renewed.map(|l| l.epoch), Some(1));
    assert!(other
        .acquire_lease("other", &b, LONG)
        .await
        .unwrap()
        .is_some());
    let_it_run_out().await;
    let taken = other
        .acquire_lease("reaper", &b, LONG)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((taken.holder.clone(), taken.epoch), (b.clone(), 2));
    assert_eq!(
        db.reg.acquire_lease("reaper", &a, LONG).await.unwrap(),
        None
    );
    // Released, it is free at once, and changes hands again.
    other.release_lease(&taken).await.unwrap();
    let back = db
        .reg
        .acquire_lease("reaper", &a, LONG)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back.epoch, 3);
}

async fn a_reaper_that_lost_its_lease_can_neither_claim_nor_journal(db: Db) {
    let (a, b) = (node("node-a"), node("node-b"));
    let other = db.open_again().await.unwrap();
    let mut sb = record("t", 0, &[]);
    sb.expires_ms = Some(10);
    db.reg.insert(sb.clone()).await.unwrap();
    let now = 1_000;
    let old = db
        .reg
        .acquire_lease("reaper", &a, SHORT)
        .await
        .unwrap()
        .unwrap();
    // A claim needs the lease to last at least the margin.
    let margin = Duration::from_secs(5);
    assert!(!db
        .reg
        .claim(&sb.id, &old, margin, Due::Expired(now))
        .await
        .unwrap());
    let old = db
        .reg
        .acquire_lease("reaper", &a, LONG)
        .await
        .unwrap()
        .unwrap();
    assert!(db
        .reg
        .claim(&sb.id, &old, margin, Due::Expired(now))
        .await
        .unwrap());
    // Then the holder stalls (a paused process) past its lease, and another relay takes it.
    db.reg
        .acquire_lease("reaper", &a, SHORT)
        .await
        .unwrap()
        .unwrap();
    let_it_run_out().await;
    let new = other
        .acquire_lease("reaper", &b, LONG)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(new.epoch, old.epoch + 1);
    // The stalled one wakes up: it can claim nothing, and its claim no longer holds.
    assert!(!db
        .reg
        .claim(&sb.id, &old, margin, Due::Expired(now))
        .await
        .unwrap());
    assert!(other
        .claim(&sb.id, &new, margin, Due::Expired(now))
        .await
        .unwrap());
    let entry = |by: &str| Destroyed::of(&sb, now, DestroyReason::Ttl, by.to_string());
    let stale = db
        .reg
        .remove_journaled(entry("old"), Some(&old.claim()))
        .await;
    assert_eq!(stale.unwrap(), None, "a lost claim journals nothing");
    let done = other
        .remove_journaled(entry("new"), Some(&new.claim()))
        .await;
    assert_eq!(done.unwrap(), Some(true));
    let again = other
        .remove_journaled(entry("new"), Some(&new.claim()))
        .await;
    assert_eq!(again.unwrap(), None, "deleted once");
    let journaled = db
        .count(&format!(
            "SELECT count(*) FROM destroyed WHERE sandbox_id = '{}'",
            sb.id
        ))
        .await;
    assert_eq!(journaled, 1, "{}", db.kind());
    let entry = db.reg.destroyed(&sb.tenant, &sb.id).await.unwrap().unwrap();
    assert_eq!(entry.evidence, "new");
}

async fn a_claim_needs_the_sandbox_still_due_and_blocks_renewal(db: Db) {
    let lease = db
        .reg
        .acquire_lease("reaper", &node("node-a"), LONG)
        .await
        .unwrap()
        .unwrap();
    let margin = Duration::from_secs(1);
    let mut sb = record("t", 0, &[]);
    (sb.expires_ms, sb.last_active_ms) = (Some(5_000), 1_000);
    sb.idle_timeout = Some(Duration::from_secs(1));
    db.reg.insert(sb.clone()).await.unwrap();
    // Not expired yet; idle by its timeout but not for the quiet period relays need.
    assert!(!db
        .reg
        .claim(&sb.id, &lease, margin, Due::Expired(4_999))
        .await
        .unwrap());
    let quiet = Due::Idle {
        now_ms: 2_500,
        quiet_ms: 2_000,
    };
    assert!(!db.reg.claim(&sb.id, &lease, margin, quiet).await.unwrap());
    assert!(!db
        .reg
        .claim(&sb.id, &lease, margin, Due::Gone)
        .await
        .unwrap());
    let idle = Due::Idle {
        now_ms: 3_000,
        quiet_ms: 2_000,
    };
    assert!(db.reg.claim(&sb.id, &lease, margin, idle).await.unwrap());
    // Claimed: a renew is refused, and the sandbox stays due until the reaper acts.
    let renewed = db
        .reg
        .set_ttl(&sb.id, Duration::from_secs(60), 99_000)
        .await;
    assert!(!renewed.unwrap());
    assert_eq!(db.reg.due(0).await.unwrap().len(), 1);
    // A client came back meanwhile: the claim no longer holds, and is cleared.
    db.reg.touch(vec![sb.id.clone()], 2_900).await.unwrap();
    assert!(!db.reg.claim(&sb.id, &lease, margin, idle).await.unwrap());
    assert!(db.reg.due(0).await.unwrap().is_empty());
    let renewed = db
        .reg
        .set_ttl(&sb.id, Duration::from_secs(60), 99_000)
        .await;
    assert!(renewed.unwrap());
}

async fn relays_are_alive_while_they_beat(db: Db) {
    let (a, b) = (node("node-a"), node("node-b"));
    db.reg.heartbeat(&a, "http://127.0.0.1:1").await.unwrap();
    db.reg.heartbeat(&b, "http://127.0.0.1:2").await.unwrap();
    db.reg.heartbeat(&b, "http://127.0.0.1:3").await.unwrap();
    let nodes = db.reg.nodes(LONG).await.unwrap();
    let seen: Vec<_> = nodes
        .iter()
        .map(|n| (n.id.as_str(), n.address.as_str(), n.alive))
        .collect();
    assert_eq!(
        seen,
        [
            ("node-a", "http://127.0.0.1:1", true),
            ("node-b", "http://127.0.0.1:3", true)
        ]
    );
    db.reg.leave(&b).await.unwrap();
    let nodes = db.reg.nodes(LONG).await.unwrap();
    assert!(nodes[0].alive && !nodes[1].alive, "{nodes:?}");
    let_it_run_out().await;
    assert!(db.reg.nodes(SHORT).await.unwrap().iter().all(|n| !n.alive));
}

async fn the_label_lock_is_exclusive_across_relays(db: Db) {
    let other = db.open_again().await.unwrap();
    let held = db.reg.lock_labels("t\n{\"a\":\"1\"}").await.unwrap();
    // The same key waits, from this relay and from another (in SQLite, one relay per file:
    // the same store).
    let same_relay = if db.kind() == "SQLite" {
        db.reg.clone()
    } else {
        other.clone()
    };
    let waiting = tokio::spawn(async move {
        same_relay.lock_labels("t\n{\"a\":\"1\"}").await.unwrap();
    });
    let free = other.lock_labels("t\n{\"a\":\"2\"}").await.unwrap();
    drop(free);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the same key must wait");
    drop(held);
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the lock is released when its guard drops")
        .unwrap();
}

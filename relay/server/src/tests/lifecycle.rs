//! Time and restarts: TTLs, idle timeouts, renewals, and a relay restarted on its data
//! directory.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::SinkExt;
use reqwest::StatusCode;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use super::{assert_error, eventually, TestRelay};

#[tokio::test]
async fn ttl_deletes_on_time_and_renew_postpones_it() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let start = Instant::now();
    let short = t
        .create(&admin, json!({"provider": "fake", "ttl": 1}))
        .await;
    let renewed = t
        .create(&admin, json!({"provider": "fake", "ttl": 1}))
        .await;
    assert_eq!(short.expires_ms, Some(short.created_ms + 1000));
    let renew = format!("/v1/sandboxes/{}/renew", renewed.id);
    assert_eq!(
        t.call("POST", &renew, &admin, Some(json!({"ttl_secs": 60})))
            .await
            .0,
        StatusCode::OK
    );

    let path = format!("/v1/sandboxes/{}", short.id);
    eventually("the TTL to delete the sandbox", || async {
        t.call("GET", &path, &admin, None).await.0 == StatusCode::GONE
    })
    .await;
    // The relay says what it did, from its journal.
    let got = t.call("GET", &path, &admin, None).await;
    assert_error(
        &got,
        StatusCode::GONE,
        "deleted",
        &[&short.id, "TTL ran out"],
    );
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "deleted early"
    );
    assert!(!t.provider.has(&short.id), "deleted at the provider too");
    let path = format!("/v1/sandboxes/{}", renewed.id);
    assert_eq!(t.call("GET", &path, &admin, None).await.0, StatusCode::OK);
}

#[tokio::test]
async fn idle_timeout_counts_from_the_last_client() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let sb = t
        .create(&admin, json!({"provider": "fake", "idle_timeout": 1}))
        .await;
    assert_eq!(sb.idle_timeout_secs, Some(1));
    let path = format!("/v1/sandboxes/{}", sb.id);
    let mut ws = t.tunnel(&sb.id, &admin).await.unwrap();

    // Connected for well past the timeout: it stays.
    let connected = Instant::now();
    while connected.elapsed() < Duration::from_millis(2500) {
        assert_eq!(t.call("GET", &path, &admin, None).await.0, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ws.send(Message::Binary(Bytes::from_static(b"x")))
        .await
        .unwrap();
    ws.close(None).await.unwrap();
    drop(ws);
    let closed = Instant::now();

    eventually("the idle sandbox to be deleted", || async {
        t.call("GET", &path, &admin, None).await.0 == StatusCode::GONE
    })
    .await;
    let got = t.call("GET", &path, &admin, None).await;
    assert_error(&got, StatusCode::GONE, "deleted", &["idle timeout"]);
    assert!(
        closed.elapsed() >= Duration::from_millis(900),
        "idled out early"
    );
    assert!(!t.provider.has(&sb.id));
}

#[tokio::test]
async fn a_restarted_relay_keeps_its_sandboxes_and_tokens() {
    let mut t = TestRelay::start().await;
    let admin = t.admin();
    let b = t.token_for("b").await;
    let kept = t
        .create(&b, json!({"provider": "fake", "labels": {"app": "web"}}))
        .await;
    let lost = t.create(&b, json!({"provider": "fake"})).await;

    t.relay.take().unwrap().shutdown().await;
    // While the relay is down, the provider loses one (a host reboot, say).
    t.provider.lose(&lost.id);
    t.restart().await;
    assert_eq!(t.admin(), admin, "the admin token is reused");

    let (status, got) = t
        .call("GET", &format!("/v1/sandboxes/{}", kept.id), &b, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["labels"], json!({"app": "web"}));
    let mut ws = t.tunnel(&kept.id, &b).await.unwrap();
    ws.send(Message::Binary(Bytes::from_static(b"after restart")))
        .await
        .unwrap();
    let echoed = futures_util::StreamExt::next(&mut ws)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        echoed,
        Message::Binary(Bytes::from_static(b"after restart"))
    );

    let path = format!("/v1/sandboxes/{}", lost.id);
    eventually(
        "startup reconciliation to forget the lost sandbox",
        || async { t.call("GET", &path, &b, None).await.0 == StatusCode::GONE },
    )
    .await;
}

#[tokio::test]
async fn a_second_relay_on_the_same_data_dir_is_refused() {
    let t = TestRelay::start().await;
    let err = t.start_relay().await.err().expect("second relay refused");
    assert!(
        err.to_string().contains("another relay is using"),
        "{err:#}"
    );
}

#[tokio::test]
async fn a_provider_that_cannot_answer_makes_a_sandbox_unknown_never_gone() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let sb = t.create(&admin, json!({"provider": "fake"})).await;
    let path = format!("/v1/sandboxes/{}", sb.id);

    t.provider.cannot_answer.store(true, Ordering::SeqCst);
    let (status, got) = t.call("GET", &path, &admin, None).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["state"], "unknown", "{got}");
    // Many reaper ticks (50 ms each) later it is still there, untouched at the provider.
    let asked = Instant::now();
    while asked.elapsed() < Duration::from_secs(1) {
        let (status, got) = t.call("GET", &path, &admin, None).await;
        assert_eq!(status, StatusCode::OK, "{got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(t.provider.deletes.load(Ordering::SeqCst), 0);
    assert!(t.provider.has(&sb.id));

    // The reaper asks again on its own, and the state comes back once the provider answers.
    t.provider.cannot_answer.store(false, Ordering::SeqCst);
    eventually("the reaper to find the sandbox running again", || async {
        let (_, list) = t.call("GET", "/v1/sandboxes", &admin, None).await;
        list.as_array()
            .and_then(|all| all.iter().find(|s| s["id"] == sb.id.as_str()))
            .is_some_and(|s| s["state"] == "running")
    })
    .await;
}

#[tokio::test]
async fn a_sandbox_recorded_gone_is_asked_about_again_before_any_delete() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let sb = t.create(&admin, json!({"provider": "fake"})).await;

    // A connect reports it gone, so the relay records it gone...
    t.provider.connect_says_gone.store(true, Ordering::SeqCst);
    assert!(t.tunnel(&sb.id, &admin).await.is_err());
    t.provider.connect_says_gone.store(false, Ordering::SeqCst);

    // ...but the reaper asks the provider again, which still has it: kept, running again.
    eventually("the reaper to find the sandbox running", || async {
        let (_, list) = t.call("GET", "/v1/sandboxes", &admin, None).await;
        list.as_array()
            .and_then(|all| all.iter().find(|s| s["id"] == sb.id.as_str()))
            .is_some_and(|s| s["state"] == "running")
    })
    .await;
    assert_eq!(t.provider.deletes.load(Ordering::SeqCst), 0);
    assert!(t.provider.has(&sb.id));
    assert!(t.tunnel(&sb.id, &admin).await.is_ok());
}

//! The `daytona` provider end to end: a real relay whose Daytona is `tether-fake daytona`
//! (Daytona's REST API and token-checking preview proxy, with real local sandboxes whose
//! snapshot ENTRYPOINT starts the agent), driven by the `tether` CLI and the client library.

use std::time::{Duration, Instant};

use tether_e2e::cloud::{http, tether, tether_fails, Fake};
use tether_e2e::Relay;

/// The key the fake accepts.
const KEY: &str = "dtn_fake_key";
/// Any named snapshot: the fake starts the agent as its ENTRYPOINT.
const SNAPSHOT: &str = "tether-e2e-snapshot";

fn relay_for(fake: &Fake, key: &str) -> Relay {
    let api = format!("{}/api", fake.url);
    Relay::start_with_env(&[("DAYTONA_API_KEY", key), ("DAYTONA_API_URL", &api)])
}

fn create(relay: &Relay) -> String {
    tether(
        relay,
        &["create", "--provider", "daytona", "--image", SNAPSHOT],
    )
    .trim()
    .to_string()
}

fn provider_ref(relay: &Relay, id: &str) -> String {
    let json = tether(relay, &["ls", "--json"]);
    let all: serde_json::Value = serde_json::from_str(&json).expect("ls --json");
    let found = all
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .expect("listed");
    found["provider_ref"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn daytona_create_exec_cp_shell_forward_restart_and_rm() {
    let fake = Fake::start("daytona", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    let id = create(&relay);
    let daytona_id = provider_ref(&relay, &id);
    let auth = format!("Bearer {KEY}");
    let (code, listed) = http(
        &fake.url,
        "GET",
        "/api/sandbox",
        &[("Authorization", &auth)],
        "",
    );
    assert_eq!(code, 200, "{listed}");
    assert!(
        listed.contains(&format!("\"tether.sandbox\":\"{id}\"")),
        "{listed}"
    );
    // No network: Daytona's networkBlockAll, and the relay says Daytona enforces it.
    let (_, detail) = http(
        &fake.url,
        "GET",
        &format!("/api/sandbox/{daytona_id}"),
        &[("Authorization", &auth)],
        "",
    );
    let detail: serde_json::Value = serde_json::from_str(&detail).expect("detail");
    assert_eq!(detail["networkBlockAll"], true, "{detail}");
    assert_eq!(
        detail["networkAllowList"],
        serde_json::Value::Null,
        "{detail}"
    );
    let network = tether_e2e::cloud::listed(&relay, &id)["network"].clone();
    assert_eq!(network["enforced_by"], "daytona", "{network}");
    assert!(
        network["not_guaranteed"][0]
            .as_str()
            .is_some_and(|n| n.contains("tiers 1 and 2")),
        "{network}"
    );

    tether_e2e::cloud::exercise(&relay, &id).await;

    // A stop at Daytona (auto-stop, or by hand) invalidates the preview token: the next
    // session starts the sandbox again and fetches a fresh token.
    let (code, body) = http(
        &fake.url,
        "POST",
        &format!("/api/sandbox/{daytona_id}/stop"),
        &[("Authorization", &auth)],
        "",
    );
    assert_eq!(code, 200, "{body}");
    let out = tether(&relay, &["exec", &id, "--", "echo", "restarted"]);
    assert_eq!(out, "restarted\n");

    tether(&relay, &["rm", &id]);
    let (_, listed) = http(
        &fake.url,
        "GET",
        "/api/sandbox",
        &[("Authorization", &auth)],
        "",
    );
    assert!(!listed.contains(&id), "{listed}");
}

/// Daytona's proxy tries an `Authorization: Bearer` as a Daytona credential before the preview
/// token, and its failed-auth limiter blocks the caller's IP after repeated refusals: the
/// relay never sends the agent token as a bearer, so many sessions cost it nothing. A client
/// that does send wrong credentials gets the relay blocked, which the relay explains.
#[tokio::test(flavor = "multi_thread")]
async fn daytona_sessions_never_trip_the_failed_auth_limiter() {
    let fake = Fake::start("daytona", &["--api-key", KEY, "--failed-auth-limit", "3"]);
    let relay = relay_for(&fake, KEY);
    let id = create(&relay);
    for n in 0..5 {
        let out = tether(&relay, &["exec", &id, "--", "echo", &n.to_string()]);
        assert_eq!(out, format!("{n}\n"));
    }
    let daytona_id = provider_ref(&relay, &id);
    let auth = format!("Bearer {KEY}");
    let (code, body) = http(
        &fake.url,
        "GET",
        &format!("/api/sandbox/{daytona_id}/ports/7421/preview-url"),
        &[("Authorization", &auth)],
        "",
    );
    assert_eq!(code, 200, "{body}");
    let preview: serde_json::Value = serde_json::from_str(&body).expect("preview");
    let url = preview["url"].as_str().expect("url");
    // Without a preview token the proxy answers 401 (newer Daytona), not a redirect.
    let (code, _) = http(url, "GET", "/", &[], "");
    assert_eq!(code, 401);
    // A wrong bearer, three times from this IP: blocked, on the proxy and the API alike.
    for _ in 0..3 {
        let (code, _) = http(
            url,
            "GET",
            "/",
            &[("Authorization", "Bearer not-a-key")],
            "",
        );
        assert!(code == 401 || code == 429, "{code}");
    }
    let (code, body) = http(
        &fake.url,
        "GET",
        "/api/sandbox",
        &[("Authorization", &auth)],
        "",
    );
    assert_eq!(code, 429, "{body}");
    let err = tether_fails(&relay, &["rm", &id]);
    assert!(err.contains("429"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn daytona_rate_limits_and_busy_answers_are_retried() {
    let fake = Fake::start("daytona", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    // Daytona names its Retry-After per throttler (`Retry-After-sandbox-create`).
    fake.inject(429, 2, Some(1), Some("/api/sandbox"));
    fake.inject(503, 1, None, None);
    let started = Instant::now();
    let id = create(&relay);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(tether(&relay, &["exec", &id, "--", "echo", "ok"]), "ok\n");
    tether(&relay, &["rm", &id]);
}

#[tokio::test(flavor = "multi_thread")]
async fn daytona_permanent_failures_and_wrong_keys_are_explained() {
    let fake = Fake::start("daytona", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    fake.inject(503, 100, Some(0), Some("/api/sandbox"));
    let err = tether_fails(
        &relay,
        &["create", "--provider", "daytona", "--image", SNAPSHOT],
    );
    assert!(
        err.contains("HTTP 503") && err.contains("after 5 tries"),
        "{err}"
    );
    fake.request("DELETE", "/__fake/faults", "");

    let wrong = relay_for(&fake, "dtn_wrong");
    let err = tether_fails(
        &wrong,
        &["create", "--provider", "daytona", "--image", SNAPSHOT],
    );
    assert!(
        err.contains("DAYTONA_API_KEY") && err.contains("401"),
        "{err}"
    );

    // A snapshot that does not start the agent is reported, and the sandbox not left behind.
    let sleepy = Fake::start(
        "daytona",
        &["--api-key", KEY, "--entrypoint", "sleep", "infinity"],
    );
    let relay = relay_for(&sleepy, KEY);
    let err = tether_fails(
        &relay,
        &["create", "--provider", "daytona", "--image", SNAPSHOT],
    );
    assert!(err.contains("ENTRYPOINT"), "{err}");
    let (_, listed) = http(
        &sleepy.url,
        "GET",
        "/api/sandbox",
        &[("Authorization", &format!("Bearer {KEY}"))],
        "",
    );
    assert!(listed.contains("\"items\":[]"), "{listed}");
}

/// A self-hosted Daytona without the TTL route: renew is refused clearly and the sandbox is
/// kept (a 404 from a missing route is no proof the sandbox is gone).
#[tokio::test(flavor = "multi_thread")]
async fn daytona_without_the_ttl_route_refuses_renew_and_keeps_the_sandbox() {
    let fake = Fake::start("daytona", &["--api-key", KEY, "--legacy-routes"]);
    let relay = relay_for(&fake, KEY);
    let id = create(&relay);
    let client = tether_client::RelayClient::new(&relay.url, Some(relay.admin_token.clone()))
        .expect("client");
    let err = client
        .renew(&id, Duration::from_secs(3600))
        .await
        .expect_err("renew without a TTL route");
    let message = err.to_string();
    assert!(
        message.contains("TTL") && message.contains("kept"),
        "{message}"
    );
    assert_eq!(
        tether(&relay, &["exec", &id, "--", "echo", "kept"]),
        "kept\n"
    );
    let ls = tether(&relay, &["ls"]);
    assert!(ls.contains(&id) && ls.contains("running"), "{ls}");
    tether(&relay, &["rm", &id]);
}

/// Daytona's `error` state with `recoverable` is broken, not gone: the next session recovers
/// the sandbox (as the SDK's `recover`) instead of the relay destroying it.
#[tokio::test(flavor = "multi_thread")]
async fn daytona_recoverable_errors_are_recovered_not_destroyed() {
    let fake = Fake::start("daytona", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    let id = create(&relay);
    let daytona_id = provider_ref(&relay, &id);
    let (code, body) = fake.request("POST", &format!("/__fake/error/{daytona_id}"), "");
    assert_eq!(code, 200, "{body}");
    let info: serde_json::Value =
        serde_json::from_str(&tether(&relay, &["info", &id, "--json"])).expect("info --json");
    assert_ne!(info["state"], "gone", "{info}");
    assert_eq!(
        tether(&relay, &["exec", &id, "--", "echo", "recovered"]),
        "recovered\n"
    );
    let auth = format!("Bearer {KEY}");
    let (_, detail) = http(
        &fake.url,
        "GET",
        &format!("/api/sandbox/{daytona_id}"),
        &[("Authorization", &auth)],
        "",
    );
    assert!(detail.contains("\"state\":\"started\""), "{detail}");
    tether(&relay, &["rm", &id]);
}

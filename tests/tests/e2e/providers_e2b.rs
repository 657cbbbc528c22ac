//! The `e2b` provider end to end: a real relay whose E2B is `tether-fake e2b` (E2B's REST
//! API, envd and edge, with real local sandboxes behind them), driven by the `tether` CLI and
//! the client library.

use std::time::{Duration, Instant};

use tether_e2e::cloud::{tether, tether_fails, Fake};
use tether_e2e::Relay;

/// The key the fake accepts.
const KEY: &str = "e2b_fake_key";
/// Any template name: the fake runs every template as a local sandbox with the agent.
const TEMPLATE: &str = "tether-e2e-template";

fn relay_for(fake: &Fake, key: &str) -> Relay {
    Relay::start_with_env(&[
        ("E2B_API_KEY", key),
        ("E2B_API_URL", &fake.url),
        ("E2B_SANDBOX_URL", &fake.url),
    ])
}

/// The E2B id of the relay's sandbox `id`.
fn e2b_id(relay: &Relay, id: &str) -> String {
    tether_e2e::cloud::listed(relay, id)["provider_ref"]
        .as_str()
        .expect("the E2B id")
        .to_string()
}

/// A new sandbox's id.
fn create(relay: &Relay) -> String {
    create_with(relay, &[]).trim().to_string()
}

/// `tether create --provider e2b --image TEMPLATE EXTRA...` through `relay`; its stdout.
fn create_with(relay: &Relay, extra: &[&str]) -> String {
    let mut args = vec!["create", "--provider", "e2b", "--image", TEMPLATE];
    args.extend_from_slice(extra);
    tether(relay, &args)
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_create_exec_cp_shell_forward_and_rm() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    let id = create(&relay);

    // The sandbox is an E2B sandbox, labelled with the relay's id.
    let ls = tether(&relay, &["ls"]);
    assert!(ls.contains(&id) && ls.contains("e2b"), "{ls}");
    let (code, listed) =
        tether_e2e::cloud::http(&fake.url, "GET", "/v2/sandboxes", &[("X-API-Key", KEY)], "");
    assert_eq!(code, 200, "{listed}");
    assert!(
        listed.contains(&format!("\"tether.sandbox\":\"{id}\"")),
        "{listed}"
    );

    // No network: E2B's internet access off, and the relay says E2B enforces it.
    let e2b_id = e2b_id(&relay, &id);
    let (_, detail) = tether_e2e::cloud::http(
        &fake.url,
        "GET",
        &format!("/sandboxes/{e2b_id}"),
        &[("X-API-Key", KEY)],
        "",
    );
    let detail: serde_json::Value = serde_json::from_str(&detail).expect("detail");
    assert_eq!(detail["allowInternetAccess"], false, "{detail}");
    assert_eq!(
        detail["network"]["allowOut"],
        serde_json::json!([]),
        "{detail}"
    );
    let network = tether_e2e::cloud::listed(&relay, &id)["network"].clone();
    assert_eq!(network["mode"], "none", "{network}");
    assert_eq!(network["enforced_by"], "e2b", "{network}");
    assert!(
        network["guarantees"][0]
            .as_str()
            .is_some_and(|g| g.contains("allow_internet_access")),
        "{network}"
    );

    tether_e2e::cloud::exercise(&relay, &id).await;

    // rm removes it at E2B too
    tether(&relay, &["rm", &id]);
    let (_, listed) =
        tether_e2e::cloud::http(&fake.url, "GET", "/v2/sandboxes", &[("X-API-Key", KEY)], "");
    assert!(!listed.contains(&id), "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_paused_sandboxes_are_resumed_by_a_session() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    // With a TTL the provider connects straight to the agent, and resumes only on failure.
    let out = create_with(&relay, &["--ttl", "10m", "--json"]);
    let info: serde_json::Value = serde_json::from_str(&out).expect("create --json");
    let (id, e2b_id) = (
        info["id"].as_str().unwrap(),
        info["provider_ref"].as_str().unwrap(),
    );
    let key = [("X-API-Key", KEY)];
    let (code, body) = tether_e2e::cloud::http(
        &fake.url,
        "POST",
        &format!("/sandboxes/{e2b_id}/pause"),
        &key,
        "{}",
    );
    assert_eq!(code, 204, "{body}");
    assert_eq!(
        tether(&relay, &["exec", id, "--", "echo", "resumed"]),
        "resumed\n"
    );
    let (_, detail) =
        tether_e2e::cloud::http(&fake.url, "GET", &format!("/sandboxes/{e2b_id}"), &key, "");
    assert!(detail.contains("\"state\":\"running\""), "{detail}");
    tether(&relay, &["rm", id]);
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_rate_limits_and_busy_answers_are_retried() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    fake.inject(429, 2, Some(1), Some("/v2/sandboxes"));
    fake.inject(503, 1, None, Some("/v2/sandboxes"));
    let started = Instant::now();
    let id = create(&relay);
    // Two Retry-After: 1 waits, at least.
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let out = tether(&relay, &["exec", &id, "--", "echo", "after retries"]);
    assert_eq!(out, "after retries\n");
    tether(&relay, &["rm", &id]);
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_permanent_failures_and_wrong_keys_are_explained() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    fake.inject(503, 100, Some(0), Some("/v2/sandboxes"));
    let err = tether_fails(
        &relay,
        &["create", "--provider", "e2b", "--image", TEMPLATE],
    );
    assert!(
        err.contains("HTTP 503") && err.contains("after 5 tries"),
        "{err}"
    );
    fake.request("DELETE", "/__fake/faults", "");

    let wrong = relay_for(&fake, "e2b_wrong_key");
    let err = tether_fails(
        &wrong,
        &["create", "--provider", "e2b", "--image", TEMPLATE],
    );
    assert!(err.contains("E2B_API_KEY") && err.contains("401"), "{err}");

    let unset = Relay::start_with_env(&[]);
    let err = tether_fails(
        &unset,
        &["create", "--provider", "e2b", "--image", TEMPLATE],
    );
    assert!(err.contains("set E2B_API_KEY"), "{err}");
    // Listing needs no cloud credentials.
    tether(&unset, &["ls"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_outage_makes_a_sandbox_unknown_never_deleted() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    let out = create_with(&relay, &["--json"]);
    let info: serde_json::Value = serde_json::from_str(&out).expect("create --json");
    let (id, e2b_id) = (
        info["id"].as_str().unwrap().to_string(),
        info["provider_ref"].as_str().unwrap().to_string(),
    );

    // E2B answers 503 to every lookup of this sandbox: that proves nothing either way.
    let lookup = format!("/sandboxes/{e2b_id}");
    fake.inject(503, 100_000, None, Some(&lookup));
    let info: serde_json::Value =
        serde_json::from_str(&tether(&relay, &["info", &id, "--json"])).expect("info --json");
    assert_eq!(info["state"], "unknown", "{info}");
    // Several reaper ticks (1 s each) later it is still there, here and at E2B.
    let asked = Instant::now();
    while asked.elapsed() < Duration::from_secs(3) {
        let ls = tether(&relay, &["ls"]);
        assert!(ls.contains(&id), "{ls}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let key = [("X-API-Key", KEY)];
    let (_, listed) = tether_e2e::cloud::http(&fake.url, "GET", "/v2/sandboxes", &key, "");
    assert!(listed.contains(&id), "deleted at E2B: {listed}");

    // Once E2B answers again, the reaper finds it running.
    let (code, _) = fake.request("DELETE", "/__fake/faults", "");
    assert_eq!(code, 204);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !tether(&relay, &["ls", "--json"]).contains("\"running\"") {
        assert!(Instant::now() < deadline, "the sandbox did not come back");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_allowlists_reach_e2b_and_secrets_are_refused() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    let id = create_with(
        &relay,
        &[
            "--allow-host",
            "api.openai.com",
            "--allow-cidr",
            "10.1.0.0/16",
        ],
    )
    .trim()
    .to_string();

    // The relay's create went through the relay to E2B's own egress controls.
    let e2b_id = e2b_id(&relay, &id);
    let (_, detail) = tether_e2e::cloud::http(
        &fake.url,
        "GET",
        &format!("/sandboxes/{e2b_id}"),
        &[("X-API-Key", KEY)],
        "",
    );
    let detail: serde_json::Value = serde_json::from_str(&detail).expect("detail");
    assert_eq!(
        detail["network"]["allowOut"],
        serde_json::json!(["api.openai.com", "10.1.0.0/16"]),
        "{detail}"
    );
    assert_eq!(
        detail["network"]["denyOut"],
        serde_json::json!(["0.0.0.0/0"]),
        "{detail}"
    );
    let network = tether_e2e::cloud::listed(&relay, &id)["network"].clone();
    assert_eq!(network["mode"], "allowlist", "{network}");
    assert_eq!(network["enforced_by"], "e2b", "{network}");
    tether(&relay, &["rm", &id]);

    // A secret needs the relay's proxy, which an E2B sandbox reaches only through an egress
    // listener this relay lacks: refused, naming the flag, before anything is created and
    // without the value in the message.
    let out = relay
        .tether()
        .env("OPENAI_API_KEY", "sk-e2b-never-sent")
        .args([
            "create",
            "--provider",
            "e2b",
            "--image",
            TEMPLATE,
            "--secret",
            "OPENAI_API_KEY@api.openai.com",
        ])
        .output()
        .expect("run tether");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("gets secrets (OPENAI_API_KEY)") && err.contains("--egress-url"),
        "{err}"
    );
    assert!(!err.contains("sk-e2b-never-sent"), "{err}");
    let (_, listed) =
        tether_e2e::cloud::http(&fake.url, "GET", "/v2/sandboxes", &[("X-API-Key", KEY)], "");
    assert_eq!(listed.trim(), "[]", "{listed}");
}

/// A self-hosted E2B (its public infra: no `POST /v2/sandboxes`, no `connect`, and a 404 for
/// a missing route that reads like one for a missing sandbox): create falls back to v1 with
/// secure envd, sessions keep the sandbox alive with the older calls (`resume`, `timeout`),
/// and no route-level 404 ever makes the relay forget or kill it.
#[tokio::test(flavor = "multi_thread")]
async fn e2b_without_v2_routes_falls_back_and_never_forgets_the_sandbox() {
    let fake = Fake::start("e2b", &["--api-key", KEY, "--legacy-routes"]);
    let relay = relay_for(&fake, KEY);
    let out = create_with(&relay, &["--json"]);
    let info: serde_json::Value = serde_json::from_str(&out).expect("create --json");
    let (id, e2b_id) = (
        info["id"].as_str().unwrap().to_string(),
        info["provider_ref"].as_str().unwrap().to_string(),
    );
    let key = [("X-API-Key", KEY)];
    // Secured as v2 would be: envd demands its token, so the fake reports one.
    let (_, detail) =
        tether_e2e::cloud::http(&fake.url, "GET", &format!("/sandboxes/{e2b_id}"), &key, "");
    let detail: serde_json::Value = serde_json::from_str(&detail).expect("detail");
    assert!(detail["envdAccessToken"].is_string(), "{detail}");

    // Sessions (which extend the timeout of a sandbox without a TTL) work without `connect`.
    assert_eq!(tether(&relay, &["exec", &id, "--", "echo", "one"]), "one\n");
    // Paused behind the relay's back: the next session resumes it with the older call.
    let (code, body) = tether_e2e::cloud::http(
        &fake.url,
        "POST",
        &format!("/sandboxes/{e2b_id}/pause"),
        &key,
        "{}",
    );
    assert_eq!(code, 204, "{body}");
    assert_eq!(tether(&relay, &["exec", &id, "--", "echo", "two"]), "two\n");
    let (_, detail) =
        tether_e2e::cloud::http(&fake.url, "GET", &format!("/sandboxes/{e2b_id}"), &key, "");
    assert!(detail.contains("\"state\":\"running\""), "{detail}");
    let ls = tether(&relay, &["ls"]);
    assert!(ls.contains(&id) && ls.contains("running"), "{ls}");

    // Pause and resume through the relay: without `connect`, resume is the older call, and
    // a running sandbox is still a conflict.
    tether(&relay, &["pause", &id]);
    let (_, detail) =
        tether_e2e::cloud::http(&fake.url, "GET", &format!("/sandboxes/{e2b_id}"), &key, "");
    assert!(detail.contains("\"state\":\"paused\""), "{detail}");
    tether(&relay, &["resume", &id]);
    let err = tether_fails(&relay, &["resume", &id]);
    assert!(err.contains("not paused"), "{err}");
    assert_eq!(
        tether(&relay, &["exec", &id, "--", "echo", "three"]),
        "three\n"
    );

    tether(&relay, &["rm", &id]);
    let (code, _) =
        tether_e2e::cloud::http(&fake.url, "GET", &format!("/sandboxes/{e2b_id}"), &key, "");
    assert_eq!(code, 404);
}

/// E2B kills a sandbox when its timeout passes; without a TTL the relay means it to live while
/// it is used, so an open session keeps pushing the timeout ahead (here 3 s, for a 7 s
/// command): the session outlives several timeouts.
#[tokio::test(flavor = "multi_thread")]
async fn e2b_sessions_longer_than_the_timeout_keep_the_sandbox_alive() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = Relay::start_with_env(&[
        ("E2B_API_KEY", KEY),
        ("E2B_API_URL", &fake.url),
        ("E2B_SANDBOX_URL", &fake.url),
        ("E2B_TIMEOUT", "3"),
    ]);
    let id = create(&relay);
    let out = tether(
        &relay,
        &["exec", &id, "--", "sh", "-c", "sleep 7 && echo still-alive"],
    );
    assert_eq!(out, "still-alive\n");
    // Once no session is open, E2B's timeout applies again.
    let e2b_id = e2b_id(&relay, &id);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, _) = tether_e2e::cloud::http(
            &fake.url,
            "GET",
            &format!("/sandboxes/{e2b_id}"),
            &[("X-API-Key", KEY)],
            "",
        );
        if code == 404 {
            break;
        }
        assert!(Instant::now() < deadline, "E2B never timed the sandbox out");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Pause and resume through the relay, as E2B does them: E2B's own state follows
/// (`GET /sandboxes/{id}`), nothing inside answers while it is paused, and its files and
/// processes come back with it; one paused at E2B behind the relay's back reads as paused.
#[tokio::test(flavor = "multi_thread")]
async fn e2b_pause_and_resume_through_the_relay() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    let id = create(&relay);
    let e2b_id = e2b_id(&relay, &id);
    let key = [("X-API-Key", KEY)];
    let at_e2b = || {
        let (code, detail) =
            tether_e2e::cloud::http(&fake.url, "GET", &format!("/sandboxes/{e2b_id}"), &key, "");
        assert_eq!(code, 200, "{detail}");
        let detail: serde_json::Value = serde_json::from_str(&detail).expect("detail");
        detail["state"].as_str().expect("a state").to_string()
    };
    tether_e2e::cloud::exercise_pause(&relay, &id, at_e2b).await;

    // Paused at E2B itself: envd answers nothing, and the relay reads E2B's `paused`.
    let (code, body) = tether_e2e::cloud::http(
        &fake.url,
        "POST",
        &format!("/sandboxes/{e2b_id}/pause"),
        &key,
        "",
    );
    assert_eq!(code, 204, "{body}");
    let envd = [
        ("E2b-Sandbox-Id", e2b_id.as_str()),
        ("E2b-Sandbox-Port", "49983"),
    ];
    let (code, body) = tether_e2e::cloud::http(&fake.url, "GET", "/health", &envd, "");
    assert_eq!(code, 502, "{body}");
    let info: serde_json::Value =
        serde_json::from_str(&tether(&relay, &["info", &id, "--json"])).expect("info --json");
    assert_eq!(info["state"], "paused", "{info}");
    tether(&relay, &["resume", &id]);
    assert_eq!(at_e2b(), "running");
    assert_eq!(
        tether(&relay, &["exec", &id, "--", "echo", "back"]),
        "back\n"
    );

    // Killed at E2B: pausing it says it is gone (or, when the reaper saw it gone first, that
    // the relay has no such sandbox any more), never that it paused.
    let (code, _) = tether_e2e::cloud::http(
        &fake.url,
        "DELETE",
        &format!("/sandboxes/{e2b_id}"),
        &key,
        "",
    );
    assert_eq!(code, 204);
    let err = tether_fails(&relay, &["pause", &id]);
    assert!(
        ["no longer exists", "was deleted by the relay", "no sandbox"]
            .iter()
            .any(|gone| err.contains(gone)),
        "{err}"
    );
}

/// A sandbox created without auto-resume stays paused at E2B when a session asks for it,
/// and the refusal says how to resume it.
#[tokio::test(flavor = "multi_thread")]
async fn e2b_without_auto_resume_a_session_does_not_wake_the_sandbox() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = relay_for(&fake, KEY);
    let id = create_with(&relay, &["--no-auto-resume"])
        .trim()
        .to_string();
    tether(&relay, &["pause", &id]);
    let err = tether_fails(&relay, &["exec", &id, "--", "true"]);
    assert!(
        err.contains("paused") && err.contains("tether resume"),
        "{err}"
    );
    let e2b_id = e2b_id(&relay, &id);
    let (_, detail) = tether_e2e::cloud::http(
        &fake.url,
        "GET",
        &format!("/sandboxes/{e2b_id}"),
        &[("X-API-Key", KEY)],
        "",
    );
    assert!(detail.contains("\"state\":\"paused\""), "{detail}");
    tether(&relay, &["resume", &id]);
    assert_eq!(tether(&relay, &["exec", &id, "--", "echo", "ok"]), "ok\n");
}

/// A session left open keeps pushing E2B's timeout ahead (every half timeout, here 1.5 s);
/// once the sandbox is paused under it, those keep-alives must not resume it (E2B's connect
/// would), and after a resume they keep it alive again.
#[tokio::test(flavor = "multi_thread")]
async fn e2b_an_open_session_does_not_resume_a_paused_sandbox() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let relay = Relay::start_with_env(&[
        ("E2B_API_KEY", KEY),
        ("E2B_API_URL", &fake.url),
        ("E2B_SANDBOX_URL", &fake.url),
        ("E2B_TIMEOUT", "3"),
    ]);
    let id = create(&relay);
    let e2b_id = e2b_id(&relay, &id);
    let key = [("X-API-Key", KEY)];
    let at_e2b = || {
        let (_, detail) =
            tether_e2e::cloud::http(&fake.url, "GET", &format!("/sandboxes/{e2b_id}"), &key, "");
        detail
    };
    let client = relay.client();
    let _session = client.connect(&id).await.expect("a session");
    client.pause(&id).await.expect("pause");
    // Four keep-alive periods, and longer than E2B's timeout.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(at_e2b().contains("\"state\":\"paused\""), "{}", at_e2b());
    assert_eq!(tether_e2e::cloud::listed(&relay, &id)["state"], "paused");
    client.resume(&id).await.expect("resume");
    // Running again, it outlives its 3 s timeout while the session stays open.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(at_e2b().contains("\"state\":\"running\""), "{}", at_e2b());
}

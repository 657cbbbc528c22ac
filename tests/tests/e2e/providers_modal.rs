//! The `modal` provider end to end: a real relay whose Modal is `tether-fake modal` (Modal's
//! gRPC API and tunnels, with real local sandboxes running the entrypoint the provider asks
//! for), driven by the `tether` CLI and the client library.

use std::time::{Duration, Instant};

use tether_e2e::cloud::{tether, tether_fails, Fake};
use tether_e2e::Relay;

const TOKEN_ID: &str = "ak-e2e";
const TOKEN_SECRET: &str = "as-e2e";
/// Any registry tag: the fake "builds" every image at once.
const IMAGE: &str = "ghcr.io/example/tether-agent:e2e";

fn relay_for(fake: &Fake, secret: &str) -> Relay {
    Relay::start_with_env(&[
        ("MODAL_TOKEN_ID", TOKEN_ID),
        ("MODAL_TOKEN_SECRET", secret),
        ("MODAL_SERVER_URL", &fake.url),
    ])
}

fn fake() -> Fake {
    Fake::start(
        "modal",
        &["--token-id", TOKEN_ID, "--token-secret", TOKEN_SECRET],
    )
}

fn create(relay: &Relay) -> String {
    tether(relay, &["create", "--provider", "modal", "--image", IMAGE])
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn modal_create_exec_cp_shell_forward_and_rm() {
    let fake = fake();
    let relay = relay_for(&fake, TOKEN_SECRET);
    let id = create(&relay);
    let ls = tether(&relay, &["ls"]);
    assert!(ls.contains(&id) && ls.contains("modal"), "{ls}");

    // No network: an empty allowlist (BLOCKED would close the agent's port), as the fake got it.
    let (code, seen) = fake.request("GET", "/__fake/sandboxes", "");
    assert_eq!(code, 200, "{seen}");
    let seen: serde_json::Value = serde_json::from_str(&seen).expect("sandboxes");
    let ours = seen
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == id.as_str())
        .expect("the fake has it");
    assert_eq!(
        ours["network_access"],
        serde_json::json!({
            "network_access_type": "ALLOWLIST",
            "allowed_cidrs": [],
            "allowed_domains": [],
        })
    );
    let network = tether_e2e::cloud::listed(&relay, &id)["network"].clone();
    assert_eq!(network["enforced_by"], "modal", "{network}");
    assert_eq!(network["mode"], "none", "{network}");

    tether_e2e::cloud::exercise(&relay, &id).await;

    tether(&relay, &["rm", &id]);
    let err = tether_fails(&relay, &["exec", &id, "--", "true"]);
    assert!(err.contains("no sandbox"), "{err}");
}

/// The fake honours env only through Secrets, as the SDKs give it: the agent's token and
/// `--env` reach the sandbox, and neither is sent as `environment_variables`.
#[tokio::test(flavor = "multi_thread")]
async fn modal_env_and_the_agent_token_go_in_a_secret() {
    let fake = fake();
    let relay = relay_for(&fake, TOKEN_SECRET);
    let id = tether(
        &relay,
        &[
            "create",
            "--provider",
            "modal",
            "--image",
            IMAGE,
            "--env",
            "GREETING=hello from a secret",
        ],
    )
    .trim()
    .to_string();
    let out = tether(
        &relay,
        &["exec", &id, "--", "sh", "-c", "echo \"$GREETING\""],
    );
    assert_eq!(out, "hello from a secret\n");
    // The agent took its token out of the environment it hands to commands.
    let out = tether(
        &relay,
        &[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo \"[$TETHER_AGENT_TOKEN]\"",
        ],
    );
    assert_eq!(out, "[]\n");
    tether(&relay, &["rm", &id]);
}

#[tokio::test(flavor = "multi_thread")]
async fn modal_busy_answers_are_retried() {
    let fake = fake();
    let relay = relay_for(&fake, TOKEN_SECRET);
    fake.inject(
        503,
        2,
        None,
        Some("/modal.client.ModalClient/SandboxCreate"),
    );
    fake.inject(
        503,
        1,
        None,
        Some("/modal.client.ModalClient/AppGetOrCreate"),
    );
    let started = Instant::now();
    let id = create(&relay);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(tether(&relay, &["exec", &id, "--", "echo", "ok"]), "ok\n");
    tether(&relay, &["rm", &id]);

    // RESOURCE_EXHAUSTED (a limit: a message too large, a quota) is reported at once, as the
    // SDK does, not retried as if Modal were busy.
    fake.inject(
        429,
        1,
        None,
        Some("/modal.client.ModalClient/SandboxCreate"),
    );
    let err = tether_fails(&relay, &["create", "--provider", "modal", "--image", IMAGE]);
    assert!(
        err.contains("ResourceExhausted") && err.contains("not retried") && !err.contains("tries"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn modal_permanent_failures_and_wrong_tokens_are_explained() {
    let fake = fake();
    let relay = relay_for(&fake, TOKEN_SECRET);
    fake.inject(
        503,
        100,
        None,
        Some("/modal.client.ModalClient/SandboxCreate"),
    );
    let err = tether_fails(&relay, &["create", "--provider", "modal", "--image", IMAGE]);
    assert!(
        err.contains("Unavailable") && err.contains("after 5 tries"),
        "{err}"
    );
    fake.request("DELETE", "/__fake/faults", "");

    let wrong = relay_for(&fake, "as-wrong");
    let err = tether_fails(&wrong, &["create", "--provider", "modal", "--image", IMAGE]);
    assert!(err.contains("MODAL_TOKEN_SECRET"), "{err}");
}

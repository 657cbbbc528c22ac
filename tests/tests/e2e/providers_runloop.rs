//! The `runloop` provider end to end: a real relay whose Runloop is `tether-fake runloop`
//! (Runloop's REST API and V2 tunnels, with real local sandboxes whose entrypoint starts the
//! agent), driven by the `tether` CLI and the client library. The fake's own fidelity is
//! checked by Runloop's SDK in `providers_fidelity.rs`.

use std::time::{Duration, Instant};

use serde_json::Value;
use tether_e2e::cloud::{http, tether, tether_fails, Fake};
use tether_e2e::Relay;

use crate::servers;

/// The key the fake accepts.
const KEY: &str = "ak_fake_key";
/// Any blueprint name the fake never built: it runs the host-like root with the agent on
/// `PATH`, as a blueprint from `tether image build --target runloop` has it.
const BLUEPRINT: &str = "tether-e2e-blueprint";

fn relay_with(fake: &Fake, key: &str, extra: &[(&str, &str)]) -> Relay {
    let mut env = vec![
        ("RUNLOOP_API_KEY", key),
        ("RUNLOOP_BASE_URL", fake.url.as_str()),
        ("RUNLOOP_TUNNEL_URL", fake.url.as_str()),
    ];
    env.extend_from_slice(extra);
    Relay::start_with_env(&env)
}

fn relay_for(fake: &Fake) -> Relay {
    relay_with(fake, KEY, &[])
}

fn create(relay: &Relay, extra: &[&str]) -> String {
    let mut args = vec!["create", "--provider", "runloop", "--image", BLUEPRINT];
    args.extend_from_slice(extra);
    tether(relay, &args).trim().to_string()
}

/// `GET path` on the fake's API, as JSON.
fn api(fake: &Fake, path: &str) -> (u16, Value) {
    let auth = format!("Bearer {KEY}");
    let (code, body) = http(&fake.url, "GET", path, &[("Authorization", &auth)], "");
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// `POST path` on the fake's API.
fn api_post(fake: &Fake, path: &str, body: &str) -> (u16, String) {
    let auth = format!("Bearer {KEY}");
    http(&fake.url, "POST", path, &[("Authorization", &auth)], body)
}

fn devbox_of(fake: &Fake, relay: &Relay, id: &str) -> Value {
    let devbox_id = tether_e2e::cloud::listed(relay, id)["provider_ref"]
        .as_str()
        .expect("the devbox id")
        .to_string();
    let (code, devbox) = api(fake, &format!("/v1/devboxes/{devbox_id}"));
    assert_eq!(code, 200, "{devbox}");
    devbox
}

/// Devboxes at the fake that are not shut down.
fn live_devboxes(fake: &Fake) -> Vec<Value> {
    let (code, listed) = api(fake, "/v1/devboxes?limit=5000");
    assert_eq!(code, 200, "{listed}");
    listed["devboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["status"] != "shutdown")
        .cloned()
        .collect()
}

fn policies(fake: &Fake) -> Vec<Value> {
    let (code, listed) = api(fake, "/v1/network-policies?limit=5000");
    assert_eq!(code, 200, "{listed}");
    listed["network_policies"].as_array().unwrap().clone()
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn runloop_create_exec_cp_shell_forward_preview_sync_and_rm() {
    let fake = Fake::start("runloop", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    let id = create(&relay, &[]);
    let ls = tether(&relay, &["ls"]);
    assert!(ls.contains(&id) && ls.contains("runloop"), "{ls}");

    // A devbox labelled with the relay's id, reached through an authenticated tunnel, fenced
    // by a network policy of its own that allows nothing.
    let devbox = devbox_of(&fake, &relay, &id);
    assert_eq!(
        devbox["metadata"]["tether.sandbox"],
        id.as_str(),
        "{devbox}"
    );
    assert_eq!(devbox["name"], id.as_str(), "{devbox}");
    assert_eq!(devbox["tunnel"]["auth_mode"], "authenticated", "{devbox}");
    assert_eq!(devbox["launch_parameters"]["keep_alive_time_seconds"], 3600);
    let policy_id = devbox["launch_parameters"]["network_policy_id"]
        .as_str()
        .expect("a network policy")
        .to_string();
    let (_, policy) = api(&fake, &format!("/v1/network-policies/{policy_id}"));
    assert_eq!(policy["name"], format!("tether-{id}"), "{policy}");
    assert_eq!(policy["egress"]["allow_all"], false, "{policy}");
    assert_eq!(policy["egress"]["allowed_hostnames"], serde_json::json!([]));
    assert_eq!(policy["egress"]["allowed_cidrs"], serde_json::json!([]));
    let network = tether_e2e::cloud::listed(&relay, &id)["network"].clone();
    assert_eq!(network["mode"], "none", "{network}");
    assert_eq!(network["enforced_by"], "runloop", "{network}");

    // The agent took its token out of the environment it hands to commands.
    let env = tether(
        &relay,
        &["exec", &id, "--", "sh", "-c", "cat /proc/self/environ"],
    );
    assert!(!env.contains("TETHER_AGENT_TOKEN"), "{env}");

    tether_e2e::cloud::exercise(&relay, &id).await;

    // A preview: a server inside, reached through the relay with the preview token.
    let client = relay.client();
    let session = client.connect(&id).await.unwrap();
    servers::http_site(&session, 8000, "hello from the devbox").await;
    let preview = client.preview(&id).await.unwrap();
    let addr = relay.url.trim_start_matches("http://").to_string();
    let port = addr.rsplit(':').next().unwrap();
    let page = servers::get(
        &addr,
        &format!("8000-{id}.localhost:{port}"),
        "/index.html",
        &[("X-Tether-Preview-Token", &preview.token)],
    )
    .await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(page.body.contains("hello from the devbox"), "{page:?}");
    drop(session);

    // sync: a local tree lands in the devbox.
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("a.txt"), "first\n").unwrap();
    std::fs::write(tree.join("sub/b.txt"), "second\n").unwrap();
    let out = relay
        .tether()
        .env("TETHER_HOME", work.path().join("home"))
        .args(["sync", "--json"])
        .arg(&tree)
        .arg(format!("{id}:/tmp/synced"))
        .output()
        .expect("run tether sync");
    assert!(
        out.status.success(),
        "tether sync: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        tether(
            &relay,
            &[
                "exec",
                &id,
                "--",
                "cat",
                "/tmp/synced/a.txt",
                "/tmp/synced/sub/b.txt"
            ]
        ),
        "first\nsecond\n"
    );

    // rm shuts the devbox down and deletes its policy: nothing of it is left running.
    tether(&relay, &["rm", &id]);
    let devbox_id = devbox["id"].as_str().unwrap();
    let (_, after) = api(&fake, &format!("/v1/devboxes/{devbox_id}"));
    assert_eq!(after["status"], "shutdown", "{after}");
    assert_eq!(after["shutdown_reason"], "api_shutdown", "{after}");
    assert!(live_devboxes(&fake).is_empty());
    assert!(policies(&fake).is_empty(), "{:?}", policies(&fake));
    assert!(!tether(&relay, &["ls"]).contains(&id));
}

/// A suspended devbox (Runloop's idle policy, or by hand) is resumed by the next session,
/// and its agent, which a resume does not restart, is started again.
#[tokio::test(flavor = "multi_thread")]
async fn runloop_suspended_devboxes_are_resumed_and_the_agent_restarted() {
    let fake = Fake::start("runloop", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    let id = create(&relay, &["--ttl", "10m"]);
    let devbox_id = devbox_of(&fake, &relay, &id)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, body) = api_post(&fake, &format!("/v1/devboxes/{devbox_id}/suspend"), "");
    assert_eq!(code, 200, "{body}");
    wait_for("the suspend", || {
        api(&fake, &format!("/v1/devboxes/{devbox_id}")).1["status"] == "suspended"
    });
    // The state as the relay reads it from Runloop, asked without opening a session: `tether
    // info` also asks the agent, and that session may resume the devbox before the read.
    let info = relay.client().get(&id).await.expect("the sandbox");
    assert_eq!(info.state, "stopped", "{info:?}");
    assert_eq!(
        tether(&relay, &["exec", &id, "--", "echo", "resumed"]),
        "resumed\n"
    );
    let (_, devbox) = api(&fake, &format!("/v1/devboxes/{devbox_id}"));
    assert_eq!(devbox["status"], "running", "{devbox}");
    tether(&relay, &["rm", &id]);
}

/// Without a TTL Runloop's keep-alive time ends an unused devbox; an open session keeps
/// pushing it ahead (here 3 s, for a 7 s command), and once no session is open it runs out.
#[tokio::test(flavor = "multi_thread")]
async fn runloop_sessions_keep_the_devbox_alive_and_unused_ones_end() {
    let fake = Fake::start("runloop", &["--api-key", KEY]);
    let relay = relay_with(&fake, KEY, &[("RUNLOOP_KEEP_ALIVE", "3")]);
    let id = create(&relay, &[]);
    let out = tether(
        &relay,
        &["exec", &id, "--", "sh", "-c", "sleep 7 && echo still-alive"],
    );
    assert_eq!(out, "still-alive\n");
    let devbox_id = devbox_of(&fake, &relay, &id)["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for("Runloop's keep-alive time to run out", || {
        api(&fake, &format!("/v1/devboxes/{devbox_id}")).1["status"] == "shutdown"
    });
    let (_, devbox) = api(&fake, &format!("/v1/devboxes/{devbox_id}"));
    assert_eq!(devbox["shutdown_reason"], "keep_alive_timeout", "{devbox}");
    // The relay learns it is gone from a read of the devbox (and then forgets it).
    let out = relay
        .tether()
        .args(["info", &id, "--json"])
        .output()
        .expect("run tether");
    if out.status.success() {
        let info: Value = serde_json::from_slice(&out.stdout).expect("info --json");
        assert_eq!(info["state"], "gone", "{info}");
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no sandbox"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn runloop_sizes_lifetimes_and_allowlists_reach_runloop() {
    let fake = Fake::start("runloop", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    let id = create(
        &relay,
        &[
            "--cpus",
            "2",
            "--memory",
            "4G",
            "--disk",
            "8G",
            "--idle-timeout",
            "10m",
            "--allow-host",
            "api.openai.com",
            "--allow-cidr",
            "10.1.0.0/16",
        ],
    );
    let devbox = devbox_of(&fake, &relay, &id);
    let launch = &devbox["launch_parameters"];
    assert_eq!(launch["resource_size_request"], "CUSTOM_SIZE", "{launch}");
    assert_eq!(launch["custom_cpu_cores"], 2.0, "{launch}");
    assert_eq!(launch["custom_gb_memory"], 4, "{launch}");
    assert_eq!(launch["custom_disk_size"], 8, "{launch}");
    assert_eq!(
        launch["lifecycle"]["after_idle"],
        serde_json::json!({"idle_time_seconds": 600, "on_idle": "shutdown"}),
        "{launch}"
    );
    let policy_id = launch["network_policy_id"].as_str().unwrap();
    let (_, policy) = api(&fake, &format!("/v1/network-policies/{policy_id}"));
    assert_eq!(
        policy["egress"]["allowed_hostnames"],
        serde_json::json!(["api.openai.com"])
    );
    assert_eq!(
        policy["egress"]["allowed_cidrs"],
        serde_json::json!([{"cidr": "10.1.0.0/16"}])
    );
    let network = tether_e2e::cloud::listed(&relay, &id)["network"].clone();
    assert_eq!(network["mode"], "allowlist", "{network}");
    assert_eq!(network["enforced_by"], "runloop", "{network}");
    assert_eq!(tether(&relay, &["exec", &id, "--", "echo", "ok"]), "ok\n");
    tether(&relay, &["rm", &id]);

    // What Runloop cannot hold is refused before anything is made there, naming what to do.
    for (args, says) in [
        (vec!["--cpus", "3", "--memory", "8G"], "even number of CPUs"),
        (vec!["--cpus", "2"], "together"),
        (vec!["--cpus", "1", "--memory", "16G"], "per CPU"),
        (vec!["--pids", "100"], "--pids"),
        (vec!["--ttl", "49h"], "48"),
        (vec!["--allow-cidr", "2001:db8::/32"], "IPv6"),
    ] {
        let mut full = vec!["create", "--provider", "runloop", "--image", BLUEPRINT];
        full.extend(args.iter().copied());
        let err = tether_fails(&relay, &full);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = relay
        .tether()
        .env("OPENAI_API_KEY", "sk-runloop-never-sent")
        .args([
            "create",
            "--provider",
            "runloop",
            "--image",
            BLUEPRINT,
            "--secret",
            "OPENAI_API_KEY@api.openai.com",
        ])
        .output()
        .expect("run tether");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    // Secrets travel through the relay's egress listener; without one the create is refused
    // naming the flag, before anything is made at Runloop.
    assert!(err.contains("--egress-url"), "{err}");
    assert!(!err.contains("sk-runloop-never-sent"), "{err}");
    assert!(live_devboxes(&fake).is_empty());
    assert!(policies(&fake).is_empty(), "{:?}", policies(&fake));

    // A TTL is Runloop's keep-alive time, which a keep-alive restarts but cannot lengthen.
    let id = create(&relay, &["--ttl", "10m"]);
    let launch = devbox_of(&fake, &relay, &id)["launch_parameters"].clone();
    assert_eq!(launch["keep_alive_time_seconds"], 600, "{launch}");
    let client = relay.client();
    client
        .renew(&id, Duration::from_secs(300))
        .await
        .expect("a shorter TTL");
    let err = client
        .renew(&id, Duration::from_secs(3600))
        .await
        .expect_err("a TTL beyond the keep-alive time");
    assert!(err.to_string().contains("fixed at create"), "{err}");
    tether(&relay, &["rm", &id]);
}

#[tokio::test(flavor = "multi_thread")]
async fn runloop_busy_answers_are_retried_and_refusals_explained() {
    let fake = Fake::start("runloop", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    fake.inject(429, 2, Some(1), Some("/v1/devboxes"));
    fake.inject(503, 1, None, Some("/v1/network-policies"));
    let started = Instant::now();
    let id = create(&relay, &[]);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(tether(&relay, &["exec", &id, "--", "echo", "ok"]), "ok\n");
    tether(&relay, &["rm", &id]);

    // Runloop refuses the create: the policy made for it is deleted again.
    fake.inject(403, 1, None, Some("/v1/devboxes"));
    let err = tether_fails(
        &relay,
        &["create", "--provider", "runloop", "--image", BLUEPRINT],
    );
    assert!(
        err.contains("RUNLOOP_API_KEY") && err.contains("403"),
        "{err}"
    );
    assert!(policies(&fake).is_empty(), "{:?}", policies(&fake));

    fake.inject(503, 100, Some(0), Some("/v1/devboxes"));
    let err = tether_fails(
        &relay,
        &["create", "--provider", "runloop", "--image", BLUEPRINT],
    );
    assert!(
        err.contains("HTTP 503") && err.contains("after 5 tries"),
        "{err}"
    );
    fake.request("DELETE", "/__fake/faults", "");

    let wrong = relay_with(&fake, "ak_wrong", &[]);
    let err = tether_fails(
        &wrong,
        &["create", "--provider", "runloop", "--image", BLUEPRINT],
    );
    assert!(
        err.contains("RUNLOOP_API_KEY") && err.contains("401"),
        "{err}"
    );
    let unset = Relay::start_with_env(&[]);
    let err = tether_fails(
        &unset,
        &["create", "--provider", "runloop", "--image", BLUEPRINT],
    );
    assert!(err.contains("set RUNLOOP_API_KEY"), "{err}");
    let err = tether_fails(&relay, &["create", "--provider", "runloop"]);
    assert!(err.contains("needs a blueprint"), "{err}");
    assert!(live_devboxes(&fake).is_empty());
}

/// Runloop's answers are data: an id that is a path, or a tunnel key that names another
/// host, is refused before the relay sends anything there, and what the create made is
/// removed or, when its id cannot be trusted, left labelled for `tether ls --orphans`.
#[tokio::test(flavor = "multi_thread")]
async fn runloop_hostile_answers_are_refused_and_leave_nothing_unaccounted() {
    let fake = Fake::start("runloop", &["--api-key", KEY]);
    let relay = relay_for(&fake);

    fake.request("POST", "/__fake/hostile", r#"{"lie": "tunnel_key"}"#);
    let err = tether_fails(
        &relay,
        &["create", "--provider", "runloop", "--image", BLUEPRINT],
    );
    assert!(err.contains("tunnel key that is not an id"), "{err}");
    fake.request("POST", "/__fake/hostile", r#"{"lie": "none"}"#);
    assert!(live_devboxes(&fake).is_empty());
    assert!(policies(&fake).is_empty(), "{:?}", policies(&fake));

    fake.request("POST", "/__fake/hostile", r#"{"lie": "devbox_id"}"#);
    let err = tether_fails(
        &relay,
        &["create", "--provider", "runloop", "--image", BLUEPRINT],
    );
    assert!(err.contains("devbox id that is not an id"), "{err}");
    fake.request("POST", "/__fake/hostile", r#"{"lie": "none"}"#);
    // The devbox it made could not be addressed; its label makes it an orphan, removed with
    // the policy made for it.
    assert_eq!(live_devboxes(&fake).len(), 1);
    let orphans: Value =
        serde_json::from_str(&tether(&relay, &["ls", "--orphans", "--json"])).expect("orphans");
    assert_eq!(orphans.as_array().unwrap().len(), 1, "{orphans}");
    assert_eq!(orphans[0]["provider"], "runloop", "{orphans}");
    tether(&relay, &["ls", "--orphans", "--rm", "--quiet"]);
    wait_for("the orphan's removal", || live_devboxes(&fake).is_empty());
    assert!(policies(&fake).is_empty(), "{:?}", policies(&fake));
}

/// A relay that died with its registry leaves devboxes only their label ties to Tether: a new
/// relay lists them as orphans and removes them, its own sandboxes untouched.
#[tokio::test(flavor = "multi_thread")]
async fn runloop_devboxes_of_a_lost_registry_are_orphans() {
    let fake = Fake::start("runloop", &["--api-key", KEY]);
    let mut dead = relay_for(&fake);
    let lost = create(&dead, &[]);
    dead.stop();
    std::fs::remove_dir_all(&dead.data_dir).expect("delete the registry");
    drop(dead);

    let relay = relay_for(&fake);
    let own = create(&relay, &[]);
    let orphans: Value =
        serde_json::from_str(&tether(&relay, &["ls", "--orphans", "--json"])).expect("orphans");
    let ids: Vec<&str> = orphans
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [lost.as_str()], "{orphans}");
    tether(&relay, &["rm", &lost]);
    let live = live_devboxes(&fake);
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0]["metadata"]["tether.sandbox"], own.as_str());
    assert_eq!(
        policies(&fake).len(),
        1,
        "only the live sandbox's policy is left"
    );
    assert_eq!(tether(&relay, &["ls", "--orphans", "--quiet"]).trim(), "");
    tether(&relay, &["rm", &own]);
    assert!(policies(&fake).is_empty());
}

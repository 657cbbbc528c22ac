//! Pause and resume, stop and start of real local sandboxes, through the relay's REST API,
//! the Rust client and the CLI: a paused sandbox's processes stop and keep their state, an
//! attached stream survives the pause with every byte, a stopped sandbox keeps its files and
//! boots with new processes, traffic wakes either (unless it was created without
//! auto-resume), the idle timeout can pause or stop instead of deleting, and another tenant
//! can do none of it.

use std::time::Duration;

use tether_client::{ClientError, ProcessEvent, RelayClient};
use tether_e2e::{eventually, require, Relay};
use tether_proto::op::ExecSpec;

/// How long a check waits for a state the relay reaches on its own (the reaper ticks every
/// second).
const SETTLE: Duration = Duration::from_secs(20);

/// A counter that prints 1, 2, 3... every 20 ms and keeps its last value in a file.
const COUNTER: &str =
    "i=0; while :; do i=$((i+1)); echo $i; echo $i > /workspace/n; sleep 0.02; done";

fn counter() -> ExecSpec {
    ExecSpec::argv(["sh", "-c", COUNTER])
}

/// The HTTP status and wire code of a failed relay call.
fn refusal<T: std::fmt::Debug>(result: Result<T, ClientError>) -> (u16, String, String) {
    match result {
        Err(ClientError::Http {
            status,
            code,
            message,
            ..
        }) => (status, code, message),
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

/// Reads lines from `stdout` bytes as they come; the numbers seen so far.
fn numbers(out: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_keeps_its_processes_and_an_attached_stream_loses_no_byte() {
    require::root("local sandboxes");
    let relay = Relay::start();
    let id = relay.create(&[]);
    let client = relay.client();
    let session = client.connect(&id).await.unwrap();
    let mut process = session.exec(counter()).await.unwrap();

    let mut out = Vec::new();
    // Some output before the pause.
    while numbers(&out).len() < 5 {
        match process.next().await.unwrap().unwrap() {
            ProcessEvent::Stdout(b) => out.extend_from_slice(&b),
            other => panic!("unexpected {other:?}"),
        }
    }
    let paused = client.pause(&id).await.unwrap();
    assert_eq!(paused.state, "paused");
    assert_eq!(client.get(&id).await.unwrap().state, "paused");
    assert_eq!(relay.tether_json(&["ls", "--json"])[0]["state"], "paused");

    // Frozen: the counter's file stops changing. Read over the session opened before the
    // pause (its agent stays awake), which does not resume the sandbox.
    let read = || async {
        let n = session.read_file("/workspace/n").await.unwrap();
        String::from_utf8(n).unwrap()
    };
    let first = read().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(read().await, first, "a paused counter kept counting");
    assert_eq!(client.get(&id).await.unwrap().state, "paused");

    // Pausing again, or resuming what runs, is a conflict that says what to do.
    let (status, code, message) = refusal(client.pause(&id).await);
    assert_eq!((status, code.as_str()), (409, "conflict"), "{message}");
    assert!(message.contains("tether resume"), "{message}");

    client.resume(&id).await.unwrap();
    let (status, code, message) = refusal(client.resume(&id).await);
    assert_eq!((status, code.as_str()), (409, "conflict"), "{message}");
    assert!(message.contains("tether pause"), "{message}");

    // The same stream goes on where it stopped: every number, in order, none missing.
    let target = numbers(&out).last().copied().unwrap() + 20;
    while numbers(&out).last().copied().unwrap_or(0) < target {
        match process.next().await.unwrap().unwrap() {
            ProcessEvent::Stdout(b) => out.extend_from_slice(&b),
            other => panic!("unexpected {other:?}"),
        }
    }
    let seen = numbers(&out);
    let expected: Vec<u64> = (1..=*seen.last().unwrap()).collect();
    assert_eq!(
        seen, expected,
        "the stream lost or reordered output across the pause"
    );
    process.signal("KILL", true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_session_resumes_a_paused_sandbox_unless_auto_resume_is_off() {
    require::root("local sandboxes");
    let relay = Relay::start();
    let id = relay.create(&[]);
    assert!(relay.sh(&id, "echo kept > /workspace/f").status.success());
    relay.tether_ok(&["pause", &id]);
    // `tether info` shows it paused without waking it.
    let info = relay.tether_ok(&["info", &id]);
    assert!(info.contains("paused"), "{info}");
    assert_eq!(relay.tether_json(&["ls", "--json"])[0]["state"], "paused");
    let out = relay.sh(&id, "cat /workspace/f");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n");
    assert_eq!(relay.tether_json(&["ls", "--json"])[0]["state"], "running");

    let fixed = relay.create(&["--no-auto-resume"]);
    relay.tether_ok(&["pause", &fixed]);
    let out = relay.sh(&fixed, "true");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("paused") && err.contains("tether resume"),
        "{err}"
    );
    relay.tether_ok(&["resume", &fixed]);
    assert!(relay.sh(&fixed, "true").status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_idle_timeout_can_pause_instead_of_deleting() {
    require::root("local sandboxes");
    let relay = Relay::start();
    let id = relay.create(&["--idle-timeout", "1s", "--on-idle", "pause"]);
    assert!(relay.sh(&id, "echo kept > /workspace/f").status.success());
    let client = relay.client();
    let paused = eventually(SETTLE, "the idle sandbox to be paused", || {
        let state = relay.tether_json(&["ls", "--json"])[0]["state"].clone();
        (state == "paused").then_some(())
    })
    .await;
    let () = paused;
    // Still there after more idle ticks: paused, never deleted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(client.get(&id).await.unwrap().state, "paused");
    let out = relay.sh(&id, "cat /workspace/f");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n", "{out:?}");

    // Asking to pause on idle without an idle timeout says what is missing.
    let out = relay
        .tether()
        .args(["create", "--on-idle", "pause"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_deletes_cleanly_and_a_dead_one_cannot_pause() {
    require::root("local sandboxes");
    let relay = Relay::start();
    let id = relay.create(&[]);
    let client = relay.client();
    let session = client.connect(&id).await.unwrap();
    let _busy = session.exec(counter()).await.unwrap();
    client.pause(&id).await.unwrap();
    // Frozen processes die with the sandbox: the delete does not wait on them.
    client.delete(&id).await.unwrap();
    let (status, ..) = refusal(client.get(&id).await);
    assert_eq!(status, 404);
    let (status, ..) = refusal(client.pause("sb-nosuchsandbox").await);
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_tenant_can_neither_pause_nor_stop_a_sandbox() {
    require::root("local sandboxes");
    let relay = Relay::start();
    let id = relay.create(&[]);
    let minted = relay.tether_json(&["token", "create", "--tenant", "intruder", "--json"]);
    let token = minted["token"].as_str().unwrap().to_string();
    let intruder = RelayClient::new(&relay.url, Some(token)).unwrap();
    let tries = [
        intruder.pause(&id).await,
        intruder.resume(&id).await,
        intruder.stop(&id).await,
        intruder.start(&id).await,
    ];
    for result in tries {
        let (status, _, message) = refusal(result);
        assert_eq!(status, 404, "{message}");
        assert!(!message.contains("paused"), "{message}");
    }
    assert_eq!(relay.client().get(&id).await.unwrap().state, "running");
    // Nor through the cluster route, which takes a relay's grant, never a token.
    let bearer = format!("Bearer {}", relay.admin_token);
    let path = format!("/v1/cluster/sandboxes/{id}/pause");
    let headers = [("Authorization", bearer.as_str())];
    let (status, _) = tether_e2e::cloud::http(&relay.url, "POST", &path, &headers, "");
    assert_eq!(status, 401);
    assert_eq!(relay.client().get(&id).await.unwrap().state, "running");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_sandbox_keeps_its_files_and_starts_with_new_processes() {
    require::root("local sandboxes");
    let relay = Relay::start();
    let id = relay.create(&[]);
    let setup = "echo kept > /workspace/f; echo tmp > /tmp/t; \
                 sleep 1000 >/dev/null 2>&1 & echo $! > /workspace/pid";
    assert!(relay.sh(&id, setup).status.success());
    let stopped: serde_json::Value =
        serde_json::from_str(&relay.tether_ok(&["stop", "--json", &id])).unwrap();
    assert_eq!(stopped["state"], "stopped");
    let client = relay.client();
    assert_eq!(client.get(&id).await.unwrap().state, "stopped");
    let (status, code, message) = refusal(client.stop(&id).await);
    assert_eq!((status, code.as_str()), (409, "conflict"), "{message}");
    assert!(message.contains("tether start"), "{message}");
    let (status, _, message) = refusal(client.pause(&id).await);
    assert_eq!(
        status, 409,
        "a stopped sandbox has nothing to pause: {message}"
    );
    assert!(message.contains("tether start"), "{message}");
    // Looking at it does not start it.
    let info = relay.tether_ok(&["info", &id]);
    assert!(info.contains("stopped"), "{info}");
    assert_eq!(client.get(&id).await.unwrap().state, "stopped");

    relay.tether_ok(&["start", &id]);
    let (status, code, _) = refusal(client.start(&id).await);
    assert_eq!((status, code.as_str()), (409, "conflict"));
    let out = relay.sh(
        &id,
        "cat /workspace/f /tmp/t; kill -0 $(cat /workspace/pid) || echo ended",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "kept\ntmp\nended\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A new session starts a stopped sandbox; with auto-resume off it is refused instead.
    relay.tether_ok(&["stop", &id]);
    let out = relay.sh(&id, "cat /workspace/f");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n", "{out:?}");
    assert_eq!(client.get(&id).await.unwrap().state, "running");
    let fixed = relay.create(&["--no-auto-resume"]);
    relay.tether_ok(&["stop", &fixed]);
    let out = relay.sh(&fixed, "true");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("tether start"),
        "{err}"
    );

    // A stopped sandbox is removed with everything in it.
    relay.tether_ok(&["rm", &fixed]);
    let dir = relay.data_dir.join("local").join(&fixed);
    assert!(!dir.exists(), "{} is left", dir.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_idle_timeout_can_stop_instead_of_deleting() {
    require::root("local sandboxes");
    let relay = Relay::start();
    let id = relay.create(&["--idle-timeout", "1s", "--on-idle", "stop"]);
    assert!(relay.sh(&id, "echo kept > /workspace/f").status.success());
    eventually(SETTLE, "the idle sandbox to be stopped", || {
        let state = relay.tether_json(&["ls", "--json"])[0]["state"].clone();
        (state == "stopped").then_some(())
    })
    .await;
    let out = relay.sh(&id, "cat /workspace/f");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n", "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shell_forking_without_pause_is_paused_every_time() {
    require::root("local sandboxes");
    let relay = Relay::start();
    let id = relay.create(&[]);
    let client = relay.client();
    let session = client.connect(&id).await.unwrap();
    // dash starts each external command with vfork: a child frozen before its exec leaves
    // its parent unfreezable until it runs on, which a pause must get past.
    let busy = ExecSpec::argv(["sh", "-c", "while :; do /bin/true; done"]);
    let process = session.exec(busy).await.unwrap();
    for _ in 0..30 {
        client.pause(&id).await.unwrap();
        client.resume(&id).await.unwrap();
    }
    process.signal("KILL", true).await.unwrap();
}

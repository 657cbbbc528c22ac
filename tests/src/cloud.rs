//! Support for the cloud-provider tests: a fake provider (`tether-fake e2b|daytona|modal`)
//! on an ephemeral port, failures injected into it, a relay pointed at it, and the checks
//! every provider must pass ([`exercise`], [`exercise_pause`]).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tether_client::files::splice;
use tether_proto::op::{ExecSpec, PtySpec};

use super::{bin, spawn_ready, Relay};

/// A running `tether-fake`, stopped (and its sandboxes removed) on drop.
pub struct Fake {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its data directory.
    pub dir: tempfile::TempDir,
}

/// The `tether-fake` binary: `TETHER_FAKE_BIN`, or beside the test executable's `deps/`
/// directory (cargo builds it for `cargo test --workspace`).
pub(crate) fn fake_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TETHER_FAKE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("tether-fake");
    assert!(
        path.exists(),
        "{} not found: run ./test (or cargo build --workspace), which builds it",
        path.display()
    );
    path
}

impl Fake {
    /// Starts the fake `provider` with extra arguments.
    pub fn start(provider: &str, extra: &[&str]) -> Fake {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cmd = Command::new(fake_bin());
        cmd.args([provider, "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .arg("--agent-bin")
            .arg(bin("tether-agent"))
            .args(extra)
            .env(
                "TETHER_LOG",
                std::env::var("TETHER_LOG").unwrap_or_else(|_| "warn".into()),
            );
        let (child, url) = spawn_ready(cmd, "listening ");
        Fake {
            child: Some(child),
            url,
            dir,
        }
    }

    /// The next `count` API requests under `path` (all, when `None`) answer `status`, with
    /// `Retry-After: retry_after` when given.
    pub fn inject(&self, status: u16, count: u32, retry_after: Option<u64>, path: Option<&str>) {
        let body = serde_json::json!({
            "status": status, "count": count, "retry_after": retry_after, "path": path,
        });
        let (code, text) = self.request("POST", "/__fake/faults", &body.to_string());
        assert_eq!(code, 204, "injecting a fault failed: {text}");
    }

    /// A plain HTTP/1.1 request to the fake; returns the status and body.
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        http(&self.url, method, path, &[], body)
    }
}

/// A minimal blocking HTTP/1.1 client: one request, `Connection: close`.
pub fn http(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let addr = base.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = TcpStream::connect(addr).expect("connect to the fake");
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).expect("send to the fake");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

impl Drop for Fake {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM: the fake removes its sandboxes before exiting.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Relay {
    /// Starts a relay on a fresh data directory with extra environment variables (a cloud
    /// provider's credentials and endpoints).
    pub fn start_with_env(env: &[(&str, &str)]) -> Relay {
        let dir = tempfile::tempdir().expect("temp dir");
        let data_dir = dir.path().to_path_buf();
        let mut relay = relay_on(&data_dir, env);
        relay._owned_dir = Some(dir);
        relay
    }
}

fn relay_on(data_dir: &Path, env: &[(&str, &str)]) -> Relay {
    let mut cmd = Command::new(bin("tether"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .env("TETHER_AGENT_BIN", bin("tether-agent"))
        .env(
            "TETHER_LOG",
            std::env::var("TETHER_LOG").unwrap_or_else(|_| "warn".into()),
        );
    // The relay must see only the credentials a test gives it.
    for (key, _) in std::env::vars() {
        if ["E2B_", "DAYTONA_", "MODAL_", "DOCKER_", "RUNLOOP_"]
            .iter()
            .any(|p| key.starts_with(p))
        {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().copied());
    let (child, url) = spawn_ready(cmd, "listening ");
    let admin_token = std::fs::read_to_string(data_dir.join("admin.token"))
        .expect("relay wrote admin.token")
        .trim()
        .to_string();
    Relay {
        child: Some(child),
        url,
        admin_token,
        data_dir: data_dir.to_path_buf(),
        extra: Vec::new(),
        ca_cert: None,
        _owned_dir: None,
    }
}

/// Runs `tether ARGS` against `relay`; returns stdout, panicking with stderr on failure.
pub fn tether(relay: &Relay, args: &[&str]) -> String {
    let out = relay.tether().args(args).output().expect("run tether");
    assert!(
        out.status.success(),
        "tether {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sandbox `id` as `tether ls --json` lists it (with `provider_ref`, and `network`: its mode,
/// who enforces it and which guarantees hold).
pub fn listed(relay: &Relay, id: &str) -> serde_json::Value {
    let json = tether(relay, &["ls", "--json"]);
    let all: serde_json::Value = serde_json::from_str(&json).expect("ls --json");
    let found = all
        .as_array()
        .expect("a list")
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("{id} is not listed: {json}"));
    found.clone()
}

/// Runs `tether ARGS` expecting failure; returns stderr.
pub fn tether_fails(relay: &Relay, args: &[&str]) -> String {
    let out = relay.tether().args(args).output().expect("run tether");
    assert!(
        !out.status.success(),
        "tether {args:?} succeeded unexpectedly"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What every provider must carry end to end, checked on sandbox `id`: exec (CLI), cp both
/// ways (CLI), a PTY exec (the shell's transport), and reaching a port inside (forwarding).
pub async fn exercise(relay: &Relay, id: &str) {
    // exec
    let out = tether(
        relay,
        &[
            "exec",
            id,
            "--",
            "sh",
            "-c",
            "echo hello from the cloud; echo oops >&2",
        ],
    );
    assert_eq!(out, "hello from the cloud\n");

    // cp both ways
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("in.txt");
    std::fs::write(&src, b"payload \x00\xff bytes").unwrap();
    tether(
        relay,
        &["cp", src.to_str().unwrap(), &format!("{id}:/tmp/in.txt")],
    );
    let back = local.path().join("back.txt");
    tether(
        relay,
        &["cp", &format!("{id}:/tmp/in.txt"), back.to_str().unwrap()],
    );
    assert_eq!(std::fs::read(&back).unwrap(), b"payload \x00\xff bytes");

    let client = relay.client();
    let session = client.connect(id).await.expect("session through the relay");

    // shell: a PTY exec
    let mut spec = ExecSpec::argv(["sh", "-c", "tty; echo cols=$(stty size)"]);
    spec.pty = Some(PtySpec {
        cols: 100,
        rows: 30,
        term: None,
    });
    let out = session.exec(spec).await.unwrap().output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(text.contains("cols=30 100"), "{text}");

    // forward-port reachability: a server inside, reached through a forwarded stream
    let server = ExecSpec::argv([
        "tether-agent",
        "serve",
        "--listen",
        "127.0.0.1:9123",
        "--insecure-no-token",
    ]);
    let server = session
        .exec(ExecSpec {
            background: true,
            ..server
        })
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let ports = session.ports().await.unwrap();
        if ports.iter().any(|p| p.port == 9123) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the server inside never listened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stream = session.connect_port(9123).await.unwrap();
    let (mut near, far) = tokio::io::duplex(1 << 16);
    tokio::spawn(splice(stream, far));
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A WebSocket upgrade: the agent answers nothing else.
    let upgrade = "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                   Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    near.write_all(upgrade.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 12];
    near.read_exact(&mut answer).await.unwrap();
    assert_eq!(
        &answer,
        b"HTTP/1.1 101",
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let _ = server.signal("TERM", true).await;
}

/// Pause and resume as every provider that can pause must carry them, on running sandbox
/// `id`, through the relay's REST API and the CLI; `at_provider` reads the provider's own
/// state of it (`paused` or `running`, in the provider's words mapped to those two):
/// - `capabilities.pause` is advertised;
/// - a pause freezes it at the provider, and the relay lists it paused; a second pause is a
///   409 `conflict` naming `tether resume`;
/// - a resume runs it again, with its files and its processes (a counter still counting);
///   a second resume is a 409 naming `tether pause`;
/// - a session resumes a paused sandbox (auto-resume, the default);
/// - another tenant's pause and resume are 404s that reveal nothing, and change nothing.
pub async fn exercise_pause(relay: &Relay, id: &str, at_provider: impl Fn() -> String) {
    let state = || {
        listed(relay, id)["state"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let info: serde_json::Value =
        serde_json::from_str(&tether(relay, &["info", id, "--json"])).expect("info --json");
    assert_eq!(info["capabilities"]["pause"], true, "{info}");

    tether(
        relay,
        &["exec", id, "--", "sh", "-c", "echo kept > /tmp/kept"],
    );
    let client = relay.client();
    {
        let session = client.connect(id).await.expect("session through the relay");
        let counter = "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done";
        let spec = ExecSpec {
            background: true,
            ..ExecSpec::argv(["sh", "-c", counter])
        };
        session.exec(spec).await.expect("start a counter");
    }
    let count = || {
        tether(relay, &["exec", id, "--", "cat", "/tmp/n"])
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    let started = Instant::now();
    while count() == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "no counter");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = count();

    let paused = client.pause(id).await.expect("pause");
    assert_eq!(paused.state, "paused");
    assert_eq!(at_provider(), "paused");
    assert_eq!(state(), "paused");
    let (status, code, message) = refusal(client.pause(id).await);
    assert_eq!((status, code.as_str()), (409, "conflict"), "{message}");
    assert!(message.contains("tether resume"), "{message}");

    let resumed = client.resume(id).await.expect("resume");
    assert_eq!(resumed.state, "running");
    assert_eq!(at_provider(), "running");
    let (status, code, message) = refusal(client.resume(id).await);
    assert_eq!((status, code.as_str()), (409, "conflict"), "{message}");
    assert!(message.contains("tether pause"), "{message}");
    assert_eq!(
        tether(relay, &["exec", id, "--", "cat", "/tmp/kept"]),
        "kept
"
    );
    // The counter lived through the pause: it counts on from where it was.
    let deadline = Instant::now() + Duration::from_secs(10);
    while count() <= before {
        assert!(Instant::now() < deadline, "the counter died in the pause");
        std::thread::sleep(Duration::from_millis(100));
    }

    // A session resumes a paused sandbox by itself.
    tether(relay, &["pause", id]);
    assert_eq!(at_provider(), "paused");
    assert_eq!(
        tether(relay, &["exec", id, "--", "cat", "/tmp/kept"]),
        "kept
"
    );
    assert_eq!(at_provider(), "running");
    assert_eq!(state(), "running");

    // Another tenant learns nothing, and pauses nothing.
    let minted: serde_json::Value = serde_json::from_str(&tether(
        relay,
        &["token", "create", "--tenant", "intruder", "--json"],
    ))
    .expect("token create --json");
    let token = minted["token"].as_str().expect("a token").to_string();
    let intruder = tether_client::RelayClient::new(&relay.url, Some(token)).expect("a client");
    for result in [intruder.pause(id).await, intruder.resume(id).await] {
        let (status, _, message) = refusal(result);
        assert_eq!(status, 404, "{message}");
        assert!(
            !message.contains("paused") && !message.contains("running"),
            "{message}"
        );
    }
    assert_eq!(at_provider(), "running");
    assert_eq!(state(), "running");
}

/// The HTTP status, wire code and message of a refused relay call.
fn refusal<T: std::fmt::Debug>(
    result: Result<T, tether_client::ClientError>,
) -> (u16, String, String) {
    match result {
        Err(tether_client::ClientError::Http {
            status,
            code,
            message,
            ..
        }) => (status, code, message),
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

impl Relay {
    /// Starts a relay on a fresh data directory whose `config.toml` holds `settings` (a
    /// provider's credentials and endpoints, so a [`Relay::restart`] keeps them), with more
    /// `tether serve` arguments, none of this process's provider variables, and `setup`
    /// applied to its command (its stderr, its log level; not kept by a restart).
    pub fn start_with_settings(
        settings: &str,
        extra: &[&str],
        setup: impl FnOnce(&mut Command),
    ) -> Relay {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("config.toml"), settings).expect("write config.toml");
        let mut relay = Relay::start_from(&bin("tether"), dir.path(), extra, |cmd| {
            for (key, _) in std::env::vars() {
                if ["E2B_", "DAYTONA_", "MODAL_", "DOCKER_"]
                    .iter()
                    .any(|p| key.starts_with(p))
                {
                    cmd.env_remove(key);
                }
            }
            setup(cmd);
        });
        relay._owned_dir = Some(dir);
        relay
    }
}

/// A loopback port nothing listens on now (another process may take it before the caller
/// does, rarely).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("an ephemeral port")
        .port()
}

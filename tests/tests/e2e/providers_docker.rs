//! The `docker` provider end to end against a real engine, no fake: Podman's
//! Docker-compatible service (`podman system service`) on a socket of the test's own, with
//! storage of its own (vfs: no mounts to leak), so everything found in it is what the test
//! and Tether made. The image comes from `tether image build --target docker`; a relay
//! pointed at the socket creates sandboxes from it and runs the same suite as the other
//! providers, then `tether rm` must leave no container, volume or image behind.
//!
//! Needs root and Debian's podman and runc (`./test` installs them).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tether_e2e::cloud::{tether, tether_fails};
use tether_e2e::images::{busybox_rootfs, static_agent, READY_TIMEOUT};
use tether_e2e::Relay;

use crate::servers;

/// The image the tests build and load.
const IMAGE: &str = "localhost/tether-e2e-docker:1";
/// Busybox applets the suite runs beyond the image helper's (`tty`, `stty` for the PTY,
/// `httpd` for the preview).
const APPLETS: [&str; 6] = ["tty", "stty", "httpd", "mkdir", "grep", "head"];
/// The capabilities a sandbox keeps, as the kernel's mask: CHOWN, DAC_OVERRIDE, FOWNER,
/// FSETID, KILL, SETGID, SETUID, NET_BIND_SERVICE.
const CAPABILITY_MASK: &str = "00000000000004fb";

/// A Podman service on a socket in a temporary directory; stopped, and its containers and
/// images removed, on drop.
struct Podman {
    dir: tempfile::TempDir,
    child: Child,
}

impl Podman {
    fn start() -> Podman {
        tether_e2e::require::root("the docker provider's tests (a rootful Podman service)");
        tether_e2e::require::tool("runc");
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Podman::command_in(dir.path());
        cmd.args(["system", "service", "--time=0"])
            .arg(format!(
                "unix://{}",
                dir.path().join("podman.sock").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("service.log")).unwrap(),
            ));
        let child = cmd.spawn().expect("start podman system service");
        let podman = Podman { dir, child };
        let deadline = Instant::now() + READY_TIMEOUT;
        while podman.try_get("/_ping").is_none() {
            assert!(
                Instant::now() < deadline,
                "podman system service did not answer within {READY_TIMEOUT:?}: {}",
                podman.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        podman
    }

    /// `podman` with this service's storage and state, for the CLI and the service alike.
    fn command_in(dir: &Path) -> Command {
        let mut cmd = tether_e2e::require::command("podman");
        cmd.arg("--root")
            .arg(dir.join("root"))
            .arg("--runroot")
            .arg(dir.join("run"))
            .arg("--tmpdir")
            .arg(dir.join("tmp"))
            .args(["--storage-driver", "vfs", "--events-backend", "file"]);
        cmd
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Podman::command_in(self.dir.path())
            .args(args)
            .output()
            .expect("run podman");
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn host(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("podman.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("service.log")).unwrap_or_default()
    }

    /// `GET path` of the Engine API: the status and the body, or `None` if nobody answers.
    fn try_get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = UnixStream::connect(self.socket()).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .ok()?;
        // HTTP/1.0: one answer, not chunked, then the connection closes.
        write!(stream, "GET /v1.41{path} HTTP/1.0\r\nHost: d\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_string()))
    }

    /// `GET path` as JSON, asserting a 200.
    fn get(&self, path: &str) -> Value {
        let (status, body) = self
            .try_get(path)
            .unwrap_or_else(|| panic!("the engine did not answer GET {path}"));
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// Everything the engine holds: container ids, volume names, image ids, sorted.
    fn inventory(&self) -> (Vec<String>, Vec<String>, Vec<String>) {
        let ids = |v: Value, key: &str| {
            let mut out: Vec<String> = v
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x[key].as_str().map(str::to_string))
                .collect();
            out.sort();
            out
        };
        let volumes = self.get("/volumes")["Volumes"].clone();
        (
            ids(self.get("/containers/json?all=true"), "Id"),
            ids(volumes, "Name"),
            ids(self.get("/images/json?all=true"), "Id"),
        )
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // The containers first (their shm mounts), while the service still answers for them.
        let _ = Podman::command_in(self.dir.path())
            .args(["rm", "--all", "--force", "--volumes", "--time", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Podman::command_in(self.dir.path())
            .args(["rmi", "--all", "--force"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A busybox root with the applets the suite needs, built with the static agent and loaded
/// into `podman` as [`IMAGE`].
fn load_image(podman: &Podman, dir: &Path) {
    let root = busybox_rootfs(dir);
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    let out = Command::new(tether_e2e::bin("tether"))
        .args([
            "image", "build", "--target", "docker", "--name", IMAGE, "--json",
        ])
        .arg("--base")
        .arg(&root)
        .arg("--agent")
        .arg(static_agent())
        .env("DOCKER_HOST", podman.host())
        .output()
        .expect("run tether image build");
    assert!(
        out.status.success(),
        "tether image build --target docker: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built: Value = serde_json::from_slice(&out.stdout).expect("build --json");
    assert_eq!(built["provider"], "docker", "{built}");
    assert_eq!(built["name"], IMAGE, "{built}");
    let image = podman.get(&format!("/images/{IMAGE}/json"));
    assert_eq!(image["Id"], built["id"], "{image}");
    // Only NAME: the temporary name the load gave the image is gone.
    assert_eq!(image["RepoTags"], serde_json::json!([IMAGE]), "{image}");
}

fn relay_for(podman: &Podman) -> Relay {
    Relay::start_with_env(&[("DOCKER_HOST", &podman.host())])
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_create_exec_cp_shell_forward_preview_sync_and_rm() {
    let podman = Podman::start();
    let work = tempfile::tempdir().unwrap();
    load_image(&podman, work.path());
    let before = podman.inventory();
    assert!(before.0.is_empty(), "{before:?}");

    let relay = relay_for(&podman);
    let id = tether(
        &relay,
        &[
            "create",
            "--provider",
            "docker",
            "--image",
            IMAGE,
            "--cpus",
            "0.5",
            "--memory",
            "256M",
            "--pids",
            "128",
        ],
    )
    .trim()
    .to_string();
    let ls = tether(&relay, &["ls"]);
    assert!(ls.contains(&id) && ls.contains("docker"), "{ls}");

    // The container: Tether's labels, no privilege, no network, no published port, the limits.
    let container = podman.get(&format!("/containers/tether-{id}/json"));
    let labels = &container["Config"]["Labels"];
    assert_eq!(labels["dev.tether.sandbox"], id.as_str(), "{labels}");
    assert!(labels["dev.tether.relay"].is_string(), "{labels}");
    let host = &container["HostConfig"];
    assert_eq!(host["Privileged"], false, "{host}");
    assert_eq!(host["NetworkMode"], "none", "{host}");
    assert_eq!(host["PidsLimit"], 128, "{host}");
    assert_eq!(host["NanoCpus"], 500_000_000, "{host}");
    assert_eq!(host["Memory"], 256 << 20, "{host}");
    assert!(
        host["SecurityOpt"]
            .to_string()
            .contains("no-new-privileges"),
        "{host}"
    );
    assert!(
        host["PortBindings"]
            .as_object()
            .is_none_or(|p| p.is_empty()),
        "{host}"
    );
    let network = tether_e2e::cloud::listed(&relay, &id)["network"].clone();
    assert_eq!(network["mode"], "none", "{network}");
    assert_eq!(network["enforced_by"], "docker", "{network}");

    // Inside: the bounding set is the agent's few capabilities, no new privileges, and the
    // only network interface is loopback.
    let status = tether(&relay, &["exec", &id, "--", "cat", "/proc/self/status"]);
    assert!(
        status.contains(&format!("CapBnd:\t{CAPABILITY_MASK}")),
        "{status}"
    );
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    let dev = tether(&relay, &["exec", &id, "--", "cat", "/proc/net/dev"]);
    let interfaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(interfaces, ["lo"], "{dev}");
    // The token is not in any sandbox process's environment.
    let env = tether(
        &relay,
        &["exec", &id, "--", "sh", "-c", "cat /proc/self/environ"],
    );
    assert!(!env.contains("TETHER_AGENT_TOKEN"), "{env}");

    // exec, cp both ways, a PTY, a forwarded port.
    tether_e2e::cloud::exercise(&relay, &id).await;

    // A paused container is resumed by the next session.
    podman.cli(&["pause", &format!("tether-{id}")]);
    assert_eq!(
        tether(&relay, &["exec", &id, "--", "echo", "resumed"]),
        "resumed\n"
    );

    // A preview: busybox httpd inside, reached through the relay with the preview token.
    let client = relay.client();
    let session = client.connect(&id).await.unwrap();
    session
        .write_file("/tmp/site/index.html", b"hello from the container")
        .await
        .unwrap();
    servers::start(
        &session,
        &["httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/tmp/site"],
        8000,
    )
    .await;
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
    assert!(page.body.contains("hello from the container"), "{page:?}");
    drop(session);

    // sync: a local tree lands in the sandbox.
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

    // rm leaves the engine as it was before the create: the image, and nothing else.
    tether(&relay, &["rm", &id]);
    assert_eq!(podman.inventory(), before);
    let ls = tether(&relay, &["ls"]);
    assert!(!ls.contains(&id), "{ls}");
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_refuses_what_it_cannot_hold_and_a_hostile_image_leaves_nothing() {
    let podman = Podman::start();
    let work = tempfile::tempdir().unwrap();
    load_image(&podman, work.path());
    let relay = relay_for(&podman);

    // No image, an image the engine lacks, an allowlist: each refused with what to do.
    let err = tether_fails(&relay, &["create", "--provider", "docker"]);
    assert!(err.contains("tether image build --target docker"), "{err}");
    let err = tether_fails(
        &relay,
        &[
            "create",
            "--provider",
            "docker",
            "--image",
            "localhost/absent:1",
        ],
    );
    assert!(
        err.contains("has no image localhost/absent:1") && err.contains("--target docker"),
        "{err}"
    );
    let err = tether_fails(
        &relay,
        &[
            "create",
            "--provider",
            "docker",
            "--image",
            IMAGE,
            "--allow-host",
            "pypi.org",
        ],
    );
    assert!(err.contains("no egress allowlist"), "{err}");

    // An image whose entrypoint is no agent and floods its output: the create fails saying
    // so, quotes a bounded tail of that output, and removes the container.
    let root = busybox_rootfs(work.path().join("hostile").as_path());
    let tarball = work.path().join("hostile.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tarball)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success());
    podman.cli(&[
        "import",
        "--change",
        r#"ENTRYPOINT ["/bin/busybox", "sh", "-c", "busybox yes flood | busybox head -c 8000000 >&2; exit 3"]"#,
        tarball.to_str().unwrap(),
        "localhost/hostile:1",
    ]);
    let before = podman.inventory();
    let err = tether_fails(
        &relay,
        &[
            "create",
            "--provider",
            "docker",
            "--image",
            "localhost/hostile:1",
        ],
    );
    assert!(
        err.contains("stopped") && err.contains("exit code 3"),
        "{err}"
    );
    assert!(err.contains("flood"), "{err}");
    assert!(err.len() < 16 << 10, "{} bytes of error", err.len());
    assert_eq!(podman.inventory(), before);
    let ls = tether(&relay, &["ls", "--json"]);
    assert_eq!(ls.trim(), "[]", "{ls}");
}

/// A relay that loses its registry (killed, its database deleted) finds its containers again
/// as orphans by their labels, and removes them; the engine's other containers are not its.
#[tokio::test(flavor = "multi_thread")]
async fn docker_containers_of_a_lost_registry_are_orphans() {
    let podman = Podman::start();
    let work = tempfile::tempdir().unwrap();
    load_image(&podman, work.path());
    let before = podman.inventory();
    let mut relay = Relay::start_with(&["--docker-host", &podman.host()]);
    let create = ["create", "--provider", "docker", "--image", IMAGE];
    let id = tether(&relay, &create).trim().to_string();
    // Another relay's container on the same engine.
    let other = Relay::start_with(&["--docker-host", &podman.host()]);
    let theirs = tether(&other, &create).trim().to_string();

    relay.kill();
    for file in ["relay.db", "relay.db-wal", "relay.db-shm"] {
        let _ = std::fs::remove_file(relay.data_dir.join(file));
    }
    // The data directory is bound to the store just lost, so a fresh one is refused until the
    // operator, as that refusal says, moves `store.id` aside.
    std::fs::rename(
        relay.data_dir.join("store.id"),
        relay.data_dir.join("store.id.lost"),
    )
    .unwrap();
    relay.restart();
    assert!(!tether(&relay, &["ls"]).contains(&id));
    let orphans: Value =
        serde_json::from_str(&tether(&relay, &["ls", "--orphans", "--json"])).expect("orphans");
    let ids: Vec<&str> = orphans
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()], "{orphans}");
    assert_eq!(orphans[0]["provider"], "docker", "{orphans}");

    tether(&relay, &["ls", "--orphans", "--rm"]);
    let gone = podman.try_get(&format!("/containers/tether-{id}/json"));
    assert_eq!(gone.map(|(code, _)| code), Some(404));
    tether(&other, &["rm", &theirs]);
    assert_eq!(podman.inventory(), before);
}

/// Pause and resume through the relay, as the engine does them (`pause`, `unpause`): the
/// container's own state follows, its processes freeze and come back with their files; one
/// paused with the engine's CLI behind the relay's back reads as paused.
#[tokio::test(flavor = "multi_thread")]
async fn docker_pause_and_resume_through_the_relay() {
    let podman = Podman::start();
    let work = tempfile::tempdir().unwrap();
    load_image(&podman, work.path());
    let relay = relay_for(&podman);
    let id = tether(
        &relay,
        &["create", "--provider", "docker", "--image", IMAGE],
    )
    .trim()
    .to_string();
    let path = format!("/containers/tether-{id}/json");
    let at_engine = || {
        let state = &podman.get(&path)["State"];
        let status = state["Status"].as_str().expect("a status").to_string();
        assert_eq!(state["Paused"], status == "paused", "{state}");
        status
    };
    tether_e2e::cloud::exercise_pause(&relay, &id, at_engine).await;

    podman.cli(&["pause", &format!("tether-{id}")]);
    let info: Value =
        serde_json::from_str(&tether(&relay, &["info", &id, "--json"])).expect("info --json");
    assert_eq!(info["state"], "paused", "{info}");
    tether(&relay, &["resume", &id]);
    assert_eq!(at_engine(), "running");

    // Stopped (not paused): neither pause nor resume applies, and the refusal says so.
    podman.cli(&["stop", "--time", "1", &format!("tether-{id}")]);
    let err = tether_fails(&relay, &["pause", &id]);
    assert!(err.contains("not running"), "{err}");
    tether(&relay, &["rm", &id]);
}

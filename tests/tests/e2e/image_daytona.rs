//! `tether image build --target daytona` end to end: a real registry (docker-registry), the
//! Daytona fake (which really pulls the snapshot's image and runs sandboxes from it), and a
//! relay pointed at the fake. A snapshot built here (`--base --push`) or from a pushed image
//! (`--from`), or built here on a registry image without the agent (`--from --push`), must
//! become a name that `tether create --provider daytona --image NAME` runs, with the image's
//! own files inside; refused references, agent-less images and broken bases must fail before
//! the registry or Daytona hear of them.

use std::path::Path;
use std::process::{Command, Output};

use tether_e2e::cloud::{http, tether, tether_fails, Fake};
use tether_e2e::images::{
    build, busybox_rootfs, image_cmd, run_ok, static_agent, tool, RegistryServer,
};
use tether_e2e::{bin, Relay};

/// The key the fake accepts.
const KEY: &str = "dtn_fake_key";
/// A file only the built images have at their root.
const MARKER: &str = "built-for-daytona";

fn relay_for(fake: &Fake) -> Relay {
    let api = format!("{}/api", fake.url);
    Relay::start_with_env(&[("DAYTONA_API_KEY", KEY), ("DAYTONA_API_URL", &api)])
}

/// `tether image build --target daytona ARGS` with the fake's settings (`key` as the API
/// key, when given) and the relay's data directory as home.
fn image_build(fake: &Fake, relay: &Relay, key: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin("tether"));
    cmd.args(["image", "build", "--target", "daytona"])
        .args(args)
        .args(["--agent", static_agent().to_str().unwrap()])
        .env("TETHER_HOME", &relay.data_dir)
        .env_remove("SOURCE_DATE_EPOCH");
    for (var, _) in std::env::vars() {
        if var.starts_with("DAYTONA_") {
            cmd.env_remove(var);
        }
    }
    cmd.env("DAYTONA_API_URL", format!("{}/api", fake.url));
    if let Some(key) = key {
        cmd.env("DAYTONA_API_KEY", key);
    }
    cmd.output().expect("run tether image build")
}

fn succeeded(out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the build failed:\n{stdout}\n{stderr}"
    );
    (stdout, stderr)
}

fn failed(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "the build succeeded unexpectedly: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// A busybox root file system with [`MARKER`] at its root.
fn marked_rootfs(dir: &Path) -> std::path::PathBuf {
    let root = busybox_rootfs(dir);
    std::fs::write(root.join(MARKER), "yes\n").unwrap();
    root
}

/// The fake's `GET /api/snapshots`, as JSON.
fn snapshots(fake: &Fake) -> serde_json::Value {
    let auth = format!("Bearer {KEY}");
    let (code, body) = http(
        &fake.url,
        "GET",
        "/api/snapshots?limit=100",
        &[("Authorization", &auth)],
        "",
    );
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("a PaginatedSnapshots")
}

/// The registry's repositories (`GET /v2/_catalog`).
fn catalog(registry: &RegistryServer) -> String {
    let (code, body) = http(
        &format!("http://{}", registry.addr),
        "GET",
        "/v2/_catalog",
        &[],
        "",
    );
    assert_eq!(code, 200, "{body}");
    body
}

/// Creates a sandbox from snapshot `name` and proves it runs that image: its root holds the
/// marker, and the agent answering is the image's.
fn run_snapshot(relay: &Relay, name: &str) {
    let id = tether(relay, &["create", "--provider", "daytona", "--image", name])
        .trim()
        .to_string();
    let listing = tether(relay, &["exec", &id, "--", "busybox", "ls", "/"]);
    assert!(listing.lines().any(|l| l == MARKER), "{listing}");
    let agent = tether(
        relay,
        &["exec", &id, "--", "busybox", "ls", "/usr/local/bin"],
    );
    assert!(agent.contains("tether-agent"), "{agent}");
    tether(relay, &["rm", &id]);
}

#[tokio::test(flavor = "multi_thread")]
async fn daytona_builds_a_snapshot_here_pushes_it_and_runs_it() {
    let registry = RegistryServer::start();
    let fake = Fake::start("daytona", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    let dir = tempfile::tempdir().unwrap();
    let root = marked_rootfs(dir.path());
    let push = format!("{}/sandbox:v1", registry.addr);

    let out = image_build(
        &fake,
        &relay,
        Some(KEY),
        &[
            "--name",
            "tether-e2e-built",
            "--base",
            root.to_str().unwrap(),
            "--push",
            &push,
        ],
    );
    let (stdout, stderr) = succeeded(&out);
    assert_eq!(stdout.trim(), "tether-e2e-built", "{stderr}");
    // Daytona's progress for a pulled snapshot: its states, as log lines.
    assert!(
        stderr.contains("Creating snapshot tether-e2e-built (pending)")
            || stderr.contains("Creating snapshot tether-e2e-built (pulling)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Created snapshot tether-e2e-built (active)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("tether create --provider daytona --image tether-e2e-built"),
        "{stderr}"
    );
    assert!(catalog(&registry).contains("sandbox"));

    let listed = snapshots(&fake);
    let snapshot = &listed["items"][0];
    assert_eq!(snapshot["name"], "tether-e2e-built", "{listed}");
    assert_eq!(snapshot["state"], "active", "{listed}");
    assert_eq!(snapshot["imageName"], push.as_str(), "{listed}");
    assert_eq!(
        snapshot["entrypoint"],
        serde_json::json!([
            "/usr/local/bin/tether-agent",
            "serve",
            "--listen",
            "0.0.0.0:7421"
        ]),
        "{listed}"
    );

    run_snapshot(&relay, "tether-e2e-built");

    // The name is taken now: Daytona's 409, explained.
    let out = image_build(
        &fake,
        &relay,
        Some(KEY),
        &["--name", "tether-e2e-built", "--from", &push],
    );
    let err = failed(&out);
    assert!(
        err.contains("already exists") && err.contains("--name"),
        "{err}"
    );

    // A deleted snapshot is gone for new sandboxes, with Daytona's message.
    let id = snapshot["id"].as_str().unwrap();
    let auth = format!("Bearer {KEY}");
    let (code, body) = http(
        &fake.url,
        "DELETE",
        &format!("/api/snapshots/{id}"),
        &[("Authorization", &auth)],
        "",
    );
    assert_eq!(code, 200, "{body}");
    let err = tether_fails(
        &relay,
        &[
            "create",
            "--provider",
            "daytona",
            "--image",
            "tether-e2e-built",
        ],
    );
    assert!(
        err.contains(
            "Snapshot tether-e2e-built not found. Did you add it through the Daytona Dashboard?"
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn daytona_builds_from_a_pushed_image_and_refuses_latest() {
    let registry = RegistryServer::start();
    let fake = Fake::start("daytona", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    let dir = tempfile::tempdir().unwrap();
    let root = marked_rootfs(dir.path());
    let layout = dir.path().join("image");
    build(&root, &layout, &[]);
    let reference = format!("{}/base:v1", registry.addr);
    let out = image_cmd(&["push", layout.to_str().unwrap(), &reference]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    for refused in [
        format!("{}/base:latest", registry.addr),
        format!("{}/base", registry.addr),
    ] {
        let out = image_build(
            &fake,
            &relay,
            Some(KEY),
            &["--name", "tether-e2e-latest", "--from", &refused],
        );
        let err = failed(&out);
        assert!(
            err.contains("Daytona refuses images tagged `latest`") && err.contains(":v1"),
            "{err}"
        );
    }
    assert_eq!(snapshots(&fake)["total"], 0);

    let out = image_build(
        &fake,
        &relay,
        Some(KEY),
        &["--name", "tether-e2e-from", "--from", &reference],
    );
    let (stdout, stderr) = succeeded(&out);
    assert_eq!(stdout.trim(), "tether-e2e-from", "{stderr}");
    assert!(
        stderr.contains("Creating snapshot tether-e2e-from ("),
        "{stderr}"
    );
    run_snapshot(&relay, "tether-e2e-from");

    // An image Daytona cannot pull ends the snapshot in `error`: its reason is shown, and the
    // failed snapshot is deleted so the name can be used again.
    let missing = format!("{}/missing:v1", registry.addr);
    let out = image_build(
        &fake,
        &relay,
        Some(KEY),
        &["--name", "tether-e2e-missing", "--from", &missing],
    );
    let err = failed(&out);
    assert!(
        err.contains("the daytona build of tether-e2e-missing failed")
            && err.contains(&missing)
            && err.contains("name is free again"),
        "{err}"
    );
    let listed = snapshots(&fake);
    assert_eq!(listed["total"], 1, "{listed}");
}

/// Pushes an image of `root` without the agent (made by umoci, pushed by skopeo) as
/// `reference`.
fn push_plain_image(dir: &Path, root: &Path, reference: &str) {
    let layout = dir.join("plain");
    let image = format!("{}:v1", layout.display());
    run_ok(tool("umoci").args(["init", "--layout", layout.to_str().unwrap()]));
    run_ok(tool("umoci").args(["new", "--image", &image]));
    run_ok(tool("umoci").args(["insert", "--image", &image, root.to_str().unwrap(), "/"]));
    run_ok(tool("skopeo").args([
        "copy",
        "--dest-tls-verify=false",
        &format!("oci:{image}"),
        &format!("docker://{reference}"),
    ]));
}

#[tokio::test(flavor = "multi_thread")]
async fn daytona_adds_the_agent_to_a_registry_image_only_when_told_where_to_push() {
    let registry = RegistryServer::start();
    let fake = Fake::start("daytona", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    let dir = tempfile::tempdir().unwrap();
    let root = marked_rootfs(dir.path());
    let plain = format!("{}/plain:v1", registry.addr);
    push_plain_image(dir.path(), &root, &plain);

    // As it is, the image cannot start the agent: refused before Daytona hears of it.
    let out = image_build(
        &fake,
        &relay,
        Some(KEY),
        &["--name", "tether-e2e-plain", "--from", &plain],
    );
    let err = failed(&out);
    assert!(
        err.contains("has no tether-agent") && err.contains("--push"),
        "{err}"
    );
    assert_eq!(snapshots(&fake)["total"], 0);

    // With --push, it is the base of an image built here.
    let push = format!("{}/with-agent:v1", registry.addr);
    let out = image_build(
        &fake,
        &relay,
        Some(KEY),
        &[
            "--name",
            "tether-e2e-based",
            "--from",
            &plain,
            "--push",
            &push,
        ],
    );
    let (stdout, stderr) = succeeded(&out);
    assert_eq!(stdout.trim(), "tether-e2e-based", "{stderr}");
    assert!(catalog(&registry).contains("with-agent"));
    run_snapshot(&relay, "tether-e2e-based");
}

#[tokio::test(flavor = "multi_thread")]
async fn daytona_refuses_a_broken_base_or_a_missing_key_before_anything_is_sent() {
    let registry = RegistryServer::start();
    let fake = Fake::start("daytona", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.tar");
    std::fs::write(&bad, b"this is not a tarball").unwrap();
    let push = format!("{}/broken:v1", registry.addr);

    let out = image_build(
        &fake,
        &relay,
        Some(KEY),
        &[
            "--name",
            "tether-e2e-broken",
            "--base",
            bad.to_str().unwrap(),
            "--push",
            &push,
        ],
    );
    let err = failed(&out);
    assert!(err.contains("bad.tar"), "{err}");

    let root = marked_rootfs(dir.path());
    let out = image_build(
        &fake,
        &relay,
        None,
        &[
            "--name",
            "tether-e2e-nokey",
            "--base",
            root.to_str().unwrap(),
            "--push",
            &push,
        ],
    );
    let err = failed(&out);
    assert!(err.contains("DAYTONA_API_KEY"), "{err}");

    let out = image_build(
        &fake,
        &relay,
        Some(KEY),
        &[
            "--name",
            "tether-e2e-nobase",
            "--base",
            root.to_str().unwrap(),
        ],
    );
    let err = failed(&out);
    assert!(err.contains("--push REGISTRY/NAME:TAG"), "{err}");

    // Nothing reached the registry or Daytona.
    assert!(catalog(&registry).contains("\"repositories\":[]"));
    assert_eq!(snapshots(&fake)["total"], 0);
}

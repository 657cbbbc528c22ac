//! `tether image build --target modal` end to end: a real registry holding a busybox base,
//! `tether-fake modal` building on it (pulling the base, copying the agent in from the
//! build's context mount, streaming its log) and publishing the image under a name, then a
//! relay whose Modal is that fake creating a sandbox from the name and running commands in it.
//!
//! The agent (4.7 MiB) goes up as the SDK sends such a file: through Modal's blob storage,
//! in one PUT or in parts as the fake asks, never inline in a gRPC message, which the fake
//! refuses over gRPC's 4 MiB limit as a gRPC server does.
//!
//! Needs the Debian packages docker-registry and busybox-static (see tether_e2e::images).

use std::path::Path;
use std::process::{Command, Output};

use tether_e2e::cloud::{tether, Fake};
use tether_e2e::images::{build, busybox_rootfs, image_cmd, static_agent, RegistryServer};
use tether_e2e::{bin, Relay};

const TOKEN_ID: &str = "ak-image-e2e";
const TOKEN_SECRET: &str = "as-image-e2e";
/// A file only the base image has.
const MARKER: &str = "marker.txt";
const MARKER_TEXT: &str = "baked for modal\n";

fn fake() -> Fake {
    fake_with(&[])
}

fn fake_with(extra: &[&str]) -> Fake {
    let mut args = vec!["--token-id", TOKEN_ID, "--token-secret", TOKEN_SECRET];
    args.extend_from_slice(extra);
    Fake::start("modal", &args)
}

/// Pushes a busybox root file system with [`MARKER`] to `registry` as `base:v1`; returns
/// its reference.
fn push_base(registry: &RegistryServer) -> String {
    let dir = tempfile::tempdir().unwrap();
    let root = busybox_rootfs(dir.path());
    std::fs::write(root.join(MARKER), MARKER_TEXT).unwrap();
    let layout = dir.path().join("image");
    build(&root, &layout, &[]);
    let reference = format!("{}/base:v1", registry.addr);
    let out = image_cmd(&["push", layout.to_str().unwrap(), &reference]);
    assert!(
        out.status.success(),
        "pushing the base failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    reference
}

/// `tether image build --target modal --agent AGENT ARGS` with no Modal settings but those
/// the caller adds (an empty `TETHER_HOME`: no config file either).
fn build_cmd(home: &Path, agent: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin("tether"));
    cmd.args(["image", "build", "--target", "modal", "--agent"])
        .arg(agent)
        .args(args)
        .env("TETHER_HOME", home);
    for (key, _) in std::env::vars() {
        if key.starts_with("MODAL_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// [`build_cmd`] with the static agent and credentials for the fake Modal at `url`.
fn modal_build(url: &str, args: &[&str]) -> Output {
    modal_build_with(url, static_agent(), args)
}

fn modal_build_with(url: &str, agent: &Path, args: &[&str]) -> Output {
    let home = tempfile::tempdir().unwrap();
    build_cmd(home.path(), agent, args)
        .env("MODAL_TOKEN_ID", TOKEN_ID)
        .env("MODAL_TOKEN_SECRET", TOKEN_SECRET)
        .env("MODAL_SERVER_URL", url)
        .output()
        .expect("run tether image build")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_modal_build_is_published_and_runs_under_its_name() {
    let registry = RegistryServer::start();
    let base = push_base(&registry);
    let fake = fake();

    let out = modal_build(&fake.url, &["--name", "tether-sandbox", "--from", &base]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "the build failed: {stderr}");
    assert_eq!(text(&out.stdout).trim(), "tether-sandbox");
    // The build log, streamed from Modal's ImageJoinStreaming.
    assert!(
        stderr.contains(&format!("=> Step 0: FROM {base}")),
        "{stderr}"
    );
    assert!(
        stderr.contains("COPY --chmod=755 /tether-agent /usr/local/bin/tether-agent"),
        "{stderr}"
    );
    assert!(stderr.contains("ENTRYPOINT []"), "{stderr}");
    assert!(
        stderr.contains("tether create --provider modal --image tether-sandbox"),
        "{stderr}"
    );

    let relay = Relay::start_with_env(&[
        ("MODAL_TOKEN_ID", TOKEN_ID),
        ("MODAL_TOKEN_SECRET", TOKEN_SECRET),
        ("MODAL_SERVER_URL", &fake.url),
    ]);
    let id = tether(
        &relay,
        &["create", "--provider", "modal", "--image", "tether-sandbox"],
    )
    .trim()
    .to_string();
    let root = tether(&relay, &["exec", &id, "--", "busybox", "ls", "/"]);
    assert!(
        root.contains(MARKER),
        "the sandbox is not on the image: {root}"
    );
    let marker = tether(
        &relay,
        &["exec", &id, "--", "busybox", "cat", &format!("/{MARKER}")],
    );
    assert_eq!(marker, MARKER_TEXT);
    let agent = tether(
        &relay,
        &[
            "exec",
            &id,
            "--",
            "busybox",
            "ls",
            "-l",
            "/usr/local/bin/tether-agent",
        ],
    );
    assert!(agent.starts_with("-rwxr-xr-x"), "{agent}");
    tether(&relay, &["rm", &id]);
}

#[test]
fn the_agent_goes_up_in_parts_when_modal_asks_for_a_multipart_upload() {
    let registry = RegistryServer::start();
    let base = push_base(&registry);
    // Blobs over 1 MiB in parts of 1 MiB: the agent in five or more.
    let fake = fake_with(&["--blob-part-bytes", "1048576"]);
    let out = modal_build(&fake.url, &["--name", "in-parts", "--from", &base]);
    assert!(
        out.status.success(),
        "the build failed: {}",
        text(&out.stderr)
    );

    let relay = Relay::start_with_env(&[
        ("MODAL_TOKEN_ID", TOKEN_ID),
        ("MODAL_TOKEN_SECRET", TOKEN_SECRET),
        ("MODAL_SERVER_URL", &fake.url),
    ]);
    let id = tether(
        &relay,
        &["create", "--provider", "modal", "--image", "in-parts"],
    )
    .trim()
    .to_string();
    // The agent serving this exec is the one that went up in parts.
    let marker = tether(
        &relay,
        &["exec", &id, "--", "busybox", "cat", &format!("/{MARKER}")],
    );
    assert_eq!(marker, MARKER_TEXT);
    tether(&relay, &["rm", &id]);
}

#[test]
fn the_same_build_twice_reuses_the_image() {
    let registry = RegistryServer::start();
    let base = push_base(&registry);
    let fake = fake();
    let id_of = |name: &str| {
        let out = modal_build(&fake.url, &["--name", name, "--from", &base, "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let built: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(built["provider"], "modal");
        assert_eq!(built["name"], name);
        built["id"].as_str().unwrap().to_string()
    };
    let first = id_of("again");
    assert!(first.starts_with("im-"), "{first}");
    assert_eq!(id_of("again"), first);
    // Another name for the same definition is the same image.
    assert_eq!(id_of("again-v2:v2"), first);
}

#[test]
fn a_missing_base_fails_before_the_agent_is_sent() {
    let registry = RegistryServer::start();
    let fake = fake();
    let missing = format!("{}/missing:v1", registry.addr);
    let out = modal_build(&fake.url, &["--name", "broken", "--from", &missing]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("the base {missing} does not exist")),
        "{stderr}"
    );
    // Nothing reached Modal's builder: no build log.
    assert!(!stderr.contains("=> Step"), "{stderr}");
}

#[test]
fn a_base_modal_cannot_pull_fails_the_build_with_modals_reason() {
    // `htpasswd -Bbn -C 5 tester s3cret`: a registry that neither this machine nor the fake
    // has credentials for, so only Modal's own pull can tell.
    const USER: &str = "tester:$2y$05$U.BrKwXHqKBKViLiveZaV.mePvM06GS3GNix28R08WvjH6LnPoeki";
    let registry = RegistryServer::start_with(Some(USER));
    let fake = fake();
    let private = format!("{}/private:v1", registry.addr);
    let out = modal_build(&fake.url, &["--name", "locked", "--from", &private]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("note: cannot check {private}")),
        "{stderr}"
    );
    // Modal's build log, then its exception as the reason.
    assert!(
        stderr.contains(&format!("=> Step 0: FROM {private}")),
        "{stderr}"
    );
    assert!(
        stderr.contains("the modal build of locked failed")
            && stderr.contains(&format!("cannot pull the base image {private}")),
        "{stderr}"
    );
}

#[test]
fn bad_requests_fail_before_anything_is_sent() {
    // Nothing listens here: an error about it would mean something was sent.
    let nowhere = "http://127.0.0.1:9";
    let out = modal_build(nowhere, &["--name", "x"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("needs --from"), "{stderr}");

    let out = modal_build(nowhere, &["--name", "im-123", "--from", "alpine"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("not a Modal image name"), "{stderr}");

    // A dynamically linked agent would not start in a busybox image.
    let out = modal_build_with(
        nowhere,
        Path::new("/bin/ls"),
        &["--name", "x", "--from", "alpine"],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("dynamically linked"), "{stderr}");

    // No token: the variables to set.
    let home = tempfile::tempdir().unwrap();
    let out = build_cmd(
        home.path(),
        static_agent(),
        &["--name", "x", "--from", "alpine"],
    )
    .env("MODAL_SERVER_URL", nowhere)
    .output()
    .unwrap();
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("MODAL_TOKEN_ID"), "{stderr}");
}

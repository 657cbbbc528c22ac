//! `tether image build --target e2b` end to end: a real registry holds a busybox base, the
//! build runs through `tether-fake e2b` (E2B's template API: build request, the agent
//! uploaded as a COPY step's files, the build started from the registry image, its status
//! and log polled), and a relay pointed at the same fake creates a sandbox from the built
//! template and runs commands in it. Bad input fails before anything is uploaded.
//!
//! Needs the Debian packages docker-registry and busybox-static, and the static agent.

use std::process::{Command, Output};

use serde_json::Value;
use tether_e2e::cloud::{http, tether, Fake};
use tether_e2e::images::{busybox_image, image_cmd, static_agent, RegistryServer};
use tether_e2e::{bin, Relay};

/// The key the fake accepts.
const KEY: &str = "e2b_fake_key";

/// A registry holding a busybox base at `127.0.0.1:PORT/base:v1`.
fn registry_with_base() -> (RegistryServer, String) {
    let registry = RegistryServer::start();
    let built = busybox_image();
    let base = format!("{}/base:v1", registry.addr);
    let out = image_cmd(&["push", built.layout.to_str().unwrap(), &base]);
    assert!(
        out.status.success(),
        "push: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (registry, base)
}

/// `tether image build --target e2b ARGS` against `fake`, with a settings directory of its
/// own so no config file of this machine leaks in.
fn build_on(fake: &Fake, args: &[&str]) -> Output {
    let home = tempfile::tempdir().unwrap();
    Command::new(bin("tether"))
        .args(["image", "build", "--target", "e2b"])
        .args(args)
        .env("TETHER_HOME", home.path())
        .env("E2B_API_KEY", KEY)
        .env("E2B_API_URL", &fake.url)
        .env_remove("SOURCE_DATE_EPOCH")
        .output()
        .expect("run tether image build")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The fake's templates (`GET /templates`).
fn templates(fake: &Fake) -> Vec<Value> {
    let (code, body) = http(&fake.url, "GET", "/templates", &[("X-API-Key", KEY)], "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("a JSON list")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_built_on_e2b_runs_its_image() {
    let (_registry, base) = registry_with_base();
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let agent = static_agent().to_str().unwrap();

    let out = build_on(
        &fake,
        &[
            "--name",
            "tether-busybox:v1",
            "--from",
            &base,
            "--agent",
            agent,
            "--env",
            "TETHER_MARK=built-on-e2b",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "build failed: {stderr}");
    assert_eq!(stdout.trim(), "tether-busybox:v1");
    // The build log streamed to stderr: the base, the COPY of the agent, the ENV.
    assert!(stderr.contains(&format!("FROM {base}")), "{stderr}");
    assert!(
        stderr.contains("COPY tether-agent /usr/local/bin/tether-agent"),
        "{stderr}"
    );
    assert!(stderr.contains("ENV TETHER_MARK built-on-e2b"), "{stderr}");
    // The ready command ran the baked agent in a sandbox of the new image.
    assert!(
        stderr.contains("Running ready command: /usr/local/bin/tether-agent version"),
        "{stderr}"
    );
    let version = concat!("tether-agent ", env!("CARGO_PKG_VERSION"), " (protocol");
    assert!(stderr.contains(version), "{stderr}");
    assert!(
        stderr.contains("tether create --provider e2b --image tether-busybox:v1"),
        "{stderr}"
    );
    let listed = templates(&fake);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["buildStatus"], "ready", "{listed:?}");
    assert_eq!(listed[0]["names"][0], "tether-busybox", "{listed:?}");

    // A sandbox of the template runs its image: busybox's /bin, the ENV step's variable.
    let relay = Relay::start_with_env(&[
        ("E2B_API_KEY", KEY),
        ("E2B_API_URL", &fake.url),
        ("E2B_SANDBOX_URL", &fake.url),
    ]);
    let id = tether(
        &relay,
        &[
            "create",
            "--provider",
            "e2b",
            "--image",
            "tether-busybox:v1",
        ],
    )
    .trim()
    .to_string();
    let bin_dir = tether(&relay, &["exec", &id, "--", "busybox", "ls", "/bin"]);
    assert!(bin_dir.contains("busybox"), "{bin_dir}");
    assert!(
        !bin_dir.contains("bash"),
        "the host-like default, not the image: {bin_dir}"
    );
    // E2B keeps a template's ENV for its build; the relay gives it to the agent, and so to
    // every process, from the file the build baked.
    let mark = tether(
        &relay,
        &["exec", &id, "--", "sh", "-c", "echo $TETHER_MARK"],
    );
    assert_eq!(mark.trim(), "built-on-e2b");
    // The sandbox's own --env wins over the template's.
    let own = tether(
        &relay,
        &[
            "create",
            "--provider",
            "e2b",
            "--image",
            "tether-busybox:v1",
            "--env",
            "TETHER_MARK=given-at-create",
        ],
    )
    .trim()
    .to_string();
    let mark = tether(
        &relay,
        &["exec", &own, "--", "sh", "-c", "echo $TETHER_MARK"],
    );
    assert_eq!(mark.trim(), "given-at-create");
    tether(&relay, &["rm", &own]);
    let agent_file = tether(
        &relay,
        &["exec", &id, "--", "ls", "-l", "/usr/local/bin/tether-agent"],
    );
    assert!(agent_file.starts_with("-rwxr-xr-x"), "{agent_file}");
    assert_eq!(templates(&fake)[0]["spawnCount"], 2);

    // Built again (same agent), E2B already has the files: a second build of the same name.
    let out = build_on(
        &fake,
        &[
            "--name",
            "tether-busybox:v1",
            "--from",
            &base,
            "--agent",
            agent,
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let built: Value = serde_json::from_str(&text(&out.stdout)).expect("--json output");
    assert_eq!(built["provider"], "e2b");
    assert_eq!(built["name"], "tether-busybox:v1");
    assert_eq!(built["id"], listed[0]["templateID"]);
    assert!(
        built["build_id"].as_str().is_some_and(|b| b.len() == 36),
        "{built}"
    );
    let listed = templates(&fake);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["buildCount"], 2, "{listed:?}");
}

#[test]
fn bad_input_fails_before_any_upload() {
    let (registry, base) = registry_with_base();
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let agent = static_agent().to_str().unwrap();

    // A base its registry does not have.
    let missing = format!("{}/nothing:v1", registry.addr);
    let out = build_on(
        &fake,
        &["--name", "t", "--from", &missing, "--agent", agent],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("the base {missing} does not exist")),
        "{stderr}"
    );

    // An agent that is not static (the host's dynamically linked test binary), or missing.
    let dynamic = std::env::current_exe().unwrap();
    let out = build_on(
        &fake,
        &[
            "--name",
            "t",
            "--from",
            &base,
            "--agent",
            dynamic.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("dynamically linked"),
        "{}",
        text(&out.stderr)
    );
    let out = build_on(
        &fake,
        &["--name", "t", "--from", &base, "--agent", "/nonexistent"],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/nonexistent"),
        "{}",
        text(&out.stderr)
    );

    // A name E2B would refuse, and a wrong key.
    let out = build_on(
        &fake,
        &["--name", "Bad Name", "--from", &base, "--agent", agent],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a valid E2B template name"),
        "{}",
        text(&out.stderr)
    );
    assert!(templates(&fake).is_empty(), "nothing reached E2B");

    let out = Command::new(bin("tether"))
        .args([
            "image", "build", "--target", "e2b", "--name", "t", "--from", &base,
        ])
        .args(["--agent", agent])
        .env("TETHER_HOME", tempfile::tempdir().unwrap().path())
        .env("E2B_API_KEY", "wrong")
        .env("E2B_API_URL", &fake.url)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("E2B_API_KEY"),
        "{}",
        text(&out.stderr)
    );
    assert!(templates(&fake).is_empty(), "nothing reached E2B");
}

#[test]
fn a_base_only_e2b_can_judge_fails_the_build_with_its_reason() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    // Nothing listens on port 1: the check here cannot tell, so the build goes to E2B,
    // whose pull fails.
    let out = build_on(
        &fake,
        &[
            "--name",
            "unpullable",
            "--from",
            "127.0.0.1:1/base:v1",
            "--agent",
            static_agent().to_str().unwrap(),
        ],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(
            "the e2b build of unpullable failed: failed to pull image 127.0.0.1:1/base:v1"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("(step base)"), "{stderr}");
    let listed = templates(&fake);
    assert_eq!(listed[0]["buildStatus"], "error", "{listed:?}");
}

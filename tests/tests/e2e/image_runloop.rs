//! `tether image build --target runloop` end to end: a real registry (docker-registry) holding
//! the base, the Runloop fake (which really pulls `FROM`, unpacks the uploaded build context,
//! applies the Dockerfile and runs devboxes from the result), and a relay pointed at it. A
//! blueprint built from `--from` must become a name that `tether create --provider runloop
//! --image NAME` runs, with the base's own files and the agent inside; a base that does not
//! exist, a missing key and flags Runloop cannot honour must fail before anything is uploaded.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use tether_e2e::cloud::{http, tether, Fake};
use tether_e2e::images::{build, busybox_rootfs, image_cmd, static_agent, RegistryServer};
use tether_e2e::{bin, Relay};

/// The key the fake accepts.
const KEY: &str = "ak_fake_key";
/// A file only the base image has at its root.
const MARKER: &str = "built-for-runloop";

fn relay_for(fake: &Fake) -> Relay {
    Relay::start_with_env(&[
        ("RUNLOOP_API_KEY", KEY),
        ("RUNLOOP_BASE_URL", &fake.url),
        ("RUNLOOP_TUNNEL_URL", &fake.url),
    ])
}

/// `tether image build --target runloop ARGS` with the fake's settings (`key` as the API key,
/// when given) and the relay's data directory as home.
fn image_build(fake: &Fake, relay: &Relay, key: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin("tether"));
    cmd.args(["image", "build", "--target", "runloop"])
        .args(args)
        .args(["--agent", static_agent().to_str().unwrap()])
        .env("TETHER_HOME", &relay.data_dir)
        .env_remove("SOURCE_DATE_EPOCH");
    for (var, _) in std::env::vars() {
        if var.starts_with("RUNLOOP_") {
            cmd.env_remove(var);
        }
    }
    cmd.env("RUNLOOP_BASE_URL", &fake.url);
    if let Some(key) = key {
        cmd.env("RUNLOOP_API_KEY", key);
    }
    cmd.output().expect("run tether image build")
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

fn api(fake: &Fake, path: &str) -> Value {
    let auth = format!("Bearer {KEY}");
    let (code, body) = http(&fake.url, "GET", path, &[("Authorization", &auth)], "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

/// Pushes a busybox base with [`MARKER`] at its root; its reference.
fn push_base(registry: &RegistryServer, dir: &Path) -> String {
    let root = busybox_rootfs(dir);
    std::fs::write(root.join(MARKER), "yes\n").unwrap();
    let layout = dir.join("image");
    build(&root, &layout, &[]);
    let reference = format!("{}/base:v1", registry.addr);
    let out = image_cmd(&["push", layout.to_str().unwrap(), &reference]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    reference
}

#[tokio::test(flavor = "multi_thread")]
async fn runloop_builds_a_blueprint_from_a_pushed_base_and_runs_it() {
    let registry = RegistryServer::start();
    let fake = Fake::start("runloop", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    let dir = tempfile::tempdir().unwrap();
    let base = push_base(&registry, dir.path());

    let out = image_build(
        &fake,
        &relay,
        Some(KEY),
        &[
            "--name",
            "tether-e2e-blueprint",
            "--from",
            &base,
            "--env",
            "GREETING=from the blueprint",
            "--workdir",
            "/tmp",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the build failed:\n{stdout}\n{stderr}"
    );
    assert_eq!(stdout.trim(), "tether-e2e-blueprint", "{stderr}");
    // Runloop's build log streamed, and the way to run it.
    assert!(stderr.contains(&format!("FROM {base}")), "{stderr}");
    assert!(
        stderr.contains("tether create --provider runloop --image tether-e2e-blueprint"),
        "{stderr}"
    );

    let listed = api(&fake, "/v1/blueprints?name=tether-e2e-blueprint");
    let blueprint = &listed["blueprints"][0];
    assert_eq!(blueprint["status"], "build_complete", "{listed}");
    let dockerfile = blueprint["parameters"]["dockerfile"].as_str().unwrap();
    assert!(
        dockerfile.starts_with(&format!(
            "FROM {base}\nCOPY tether-agent /usr/local/bin/tether-agent\n"
        )),
        "{dockerfile}"
    );
    // The build context's object is deleted once the build has ended.
    let context = blueprint["parameters"]["build_context"]["object_id"]
        .as_str()
        .unwrap();
    let auth = format!("Bearer {KEY}");
    let (code, _) = http(
        &fake.url,
        "GET",
        &format!("/v1/objects/{context}"),
        &[("Authorization", &auth)],
        "",
    );
    assert_eq!(code, 404);

    // Devboxes of the blueprint run its image: the base's files, the agent, the overrides.
    let id = tether(
        &relay,
        &[
            "create",
            "--provider",
            "runloop",
            "--image",
            "tether-e2e-blueprint",
        ],
    )
    .trim()
    .to_string();
    let listing = tether(&relay, &["exec", &id, "--", "busybox", "ls", "/"]);
    assert!(listing.lines().any(|l| l == MARKER), "{listing}");
    let agent = tether(
        &relay,
        &["exec", &id, "--", "busybox", "ls", "/usr/local/bin"],
    );
    assert!(agent.contains("tether-agent"), "{agent}");
    let devbox = api(
        &fake,
        &format!(
            "/v1/devboxes/{}",
            tether_e2e::cloud::listed(&relay, &id)["provider_ref"]
                .as_str()
                .unwrap()
        ),
    );
    assert_eq!(devbox["blueprint_id"], blueprint["id"], "{devbox}");
    tether(&relay, &["rm", &id]);
}

#[tokio::test(flavor = "multi_thread")]
async fn runloop_builds_refuse_what_cannot_work_before_uploading_anything() {
    let registry = RegistryServer::start();
    let fake = Fake::start("runloop", &["--api-key", KEY]);
    let relay = relay_for(&fake);
    let dir = tempfile::tempdir().unwrap();
    let base = push_base(&registry, dir.path());

    let err = failed(&image_build(&fake, &relay, Some(KEY), &["--name", "x"]));
    assert!(err.contains("--from REF"), "{err}");
    let err = failed(&image_build(
        &fake,
        &relay,
        Some(KEY),
        &["--name", "x", "--base", dir.path().to_str().unwrap()],
    ));
    assert!(err.contains("--base and --push are not used"), "{err}");
    let err = failed(&image_build(
        &fake,
        &relay,
        Some(KEY),
        &["--name", "bpt_x", "--from", &base],
    ));
    assert!(err.contains("not a usable blueprint name"), "{err}");
    let err = failed(&image_build(
        &fake,
        &relay,
        None,
        &["--name", "x", "--from", &base],
    ));
    assert!(err.contains("RUNLOOP_API_KEY"), "{err}");
    let err = failed(&image_build(
        &fake,
        &relay,
        Some("ak_wrong"),
        &["--name", "x", "--from", &base],
    ));
    assert!(
        err.contains("RUNLOOP_API_KEY") && err.contains("401"),
        "{err}"
    );
    let missing = format!("{}/nothing:v1", registry.addr);
    let err = failed(&image_build(
        &fake,
        &relay,
        Some(KEY),
        &["--name", "x", "--from", &missing],
    ));
    assert!(err.contains("does not exist"), "{err}");
    // None of it reached Runloop: no blueprint, no uploaded context.
    assert_eq!(
        api(&fake, "/v1/blueprints")["blueprints"],
        serde_json::json!([])
    );
}

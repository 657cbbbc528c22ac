//! Each fake checked against its provider's official Python SDK: the SDK's own create, list
//! (over several pages) and kill, env, lifetimes, E2B's pause and resume, traffic to a
//! sandbox's port through the provider's edge, tunnel or preview, and image builds (E2B's
//! `Template`, Daytona's `Image` snapshots, Modal's images with a file through blob
//! storage) must succeed against
//! `tether-fake`, the builds pulling their base from a registry the test starts. The SDKs
//! are pinned in `fakes/fidelity/requirements.txt`, which `./test` installs into the venv
//! `fakes/fidelity/.venv`; these tests fail, saying so, when Python or an SDK is missing.
//! `TETHER_PYTHON` picks the interpreter (default: that venv's, else `python3`).

use std::path::PathBuf;
use std::process::Command;

use tether_e2e::cloud::Fake;
use tether_e2e::images::{build, busybox_rootfs, image_cmd, RegistryServer};

/// Where `./test` puts the SDKs, relative to the workspace.
const VENV_PYTHON: &str = "fakes/fidelity/.venv/bin/python";
/// What sets up that venv by hand.
const INSTALL: &str = "python3 -m venv fakes/fidelity/.venv && fakes/fidelity/.venv/bin/pip \
                       install -r fakes/fidelity/requirements.txt -c fakes/fidelity/constraints.txt";

fn python() -> String {
    if let Ok(python) = std::env::var("TETHER_PYTHON") {
        return python;
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(VENV_PYTHON);
    if venv.exists() {
        return venv.display().to_string();
    }
    "python3".into()
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fakes/fidelity")
        .join(name)
}

/// Runs `script` with `env`; panics with its output unless it succeeds.
fn run_sdk_script(name: &str, module: &str, env: &[(&str, &str)]) {
    let probe = Command::new(python())
        .args(["-c", &format!("import {module}")])
        .output();
    match probe {
        Err(e) => tether_e2e::require::missing(&format!("{} ({e})", python()), INSTALL),
        Ok(out) if !out.status.success() => tether_e2e::require::missing(
            &format!(
                "the {module} SDK for {} ({})",
                python(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            INSTALL,
        ),
        Ok(_) => {}
    }
    let out = Command::new(python())
        .arg(script(name))
        .envs(env.iter().copied())
        .output()
        .expect("run the SDK script");
    assert!(
        out.status.success(),
        "{name} failed against the fake:\n--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn e2b_sdk_creates_lists_runs_and_kills_on_the_fake() {
    let (_registry, base) = registry_with_base();
    let fake = Fake::start(
        "e2b",
        &["--api-key", "e2b_fidelity_key", "--page-size", "2"],
    );
    run_sdk_script(
        "e2b_sdk.py",
        "e2b",
        &[
            ("E2B_API_KEY", "e2b_fidelity_key"),
            ("E2B_API_URL", &fake.url),
            ("E2B_SANDBOX_URL", &fake.url),
            ("FIDELITY_BASE_IMAGE", &base),
        ],
    );
}

#[test]
fn daytona_sdk_creates_lists_stops_starts_and_deletes_on_the_fake() {
    let (_registry, base) = registry_with_base();
    let fake = Fake::start(
        "daytona",
        &["--api-key", "dtn_fidelity_key", "--page-size", "2"],
    );
    let api = format!("{}/api", fake.url);
    run_sdk_script(
        "daytona_sdk.py",
        "daytona",
        &[
            ("DAYTONA_API_KEY", "dtn_fidelity_key"),
            ("DAYTONA_API_URL", &api),
            ("FIDELITY_BASE_IMAGE", &base),
        ],
    );
}

/// A registry on this machine holding a busybox image (with the agent) as `base:v1`; returns
/// it and the image's reference, for image builds to pull. The image's `/bin/bash` runs
/// busybox's `sh`: E2B's SDK runs every command with `/bin/bash -l -c`, and E2B's own bases
/// have bash.
fn registry_with_base() -> (RegistryServer, String) {
    let registry = RegistryServer::start();
    let dir = tempfile::tempdir().unwrap();
    let root = busybox_rootfs(dir.path());
    let bash = root.join("bin/bash");
    std::fs::write(&bash, "#!/bin/sh\nexec /bin/sh \"$@\"\n").unwrap();
    let mut perms = std::fs::metadata(&bash).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&bash, perms).unwrap();
    let layout = dir.path().join("image");
    build(&root, &layout, &[]);
    let base = format!("{}/base:v1", registry.addr);
    let out = image_cmd(&["push", layout.to_str().unwrap(), &base]);
    assert!(
        out.status.success(),
        "push: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (registry, base)
}

/// Blobs over this many bytes go up in parts at the fake Modal of
/// [`modal_sdk_creates_lists_and_terminates_on_the_fake`]: the SDK's 5 MiB image file in one
/// PUT, the blob script's largest in three parts.
const MODAL_PART_BYTES: &str = "6291456"; // 6 MiB

#[test]
fn modal_sdk_creates_lists_and_terminates_on_the_fake() {
    let (_registry, base) = registry_with_base();
    let fake = Fake::start(
        "modal",
        &[
            "--token-id",
            "ak-fidelity",
            "--token-secret",
            "as-fidelity",
            "--blob-part-bytes",
            MODAL_PART_BYTES,
        ],
    );
    // grpclib speaks HTTP/2 without TLS to an http:// server URL: no certificate needed.
    let env = [
        ("MODAL_TOKEN_ID", "ak-fidelity"),
        ("MODAL_TOKEN_SECRET", "as-fidelity"),
        ("MODAL_SERVER_URL", fake.url.as_str()),
        ("FIDELITY_BASE_IMAGE", base.as_str()),
        ("FIDELITY_PART_BYTES", MODAL_PART_BYTES),
    ];
    // The SDK's default "V2" sandbox RPCs, then the V1 ones Tether's provider uses.
    run_sdk_script("modal_sdk.py", "modal", &env);
    let v1: Vec<(&str, &str)> = env
        .iter()
        .copied()
        .chain([("MODAL_SANDBOX_V2", "0")])
        .collect();
    run_sdk_script("modal_sdk.py", "modal", &v1);
    run_sdk_script("modal_blob_sdk.py", "modal", &env);
}

#[test]
fn runloop_sdk_creates_tunnels_suspends_builds_and_shuts_down_on_the_fake() {
    // A base for blueprint builds, in a registry of this machine's own (the fake has no
    // internet).
    let registry = tether_e2e::images::RegistryServer::start();
    let dir = tempfile::tempdir().unwrap();
    let root = tether_e2e::images::busybox_rootfs(dir.path());
    let layout = dir.path().join("image");
    tether_e2e::images::build(&root, &layout, &[]);
    let base = format!("{}/fidelity-base:v1", registry.addr);
    let out = tether_e2e::images::image_cmd(&["push", layout.to_str().unwrap(), &base]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fake = Fake::start("runloop", &["--api-key", "ak_fidelity_key"]);
    run_sdk_script(
        "runloop_sdk.py",
        "runloop_api_client",
        &[
            ("RUNLOOP_API_KEY", "ak_fidelity_key"),
            ("RUNLOOP_BASE_URL", &fake.url),
            ("FIDELITY_BASE_IMAGE", &base),
        ],
    );
}

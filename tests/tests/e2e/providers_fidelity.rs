//! Each fake checked against its provider's official Python SDK: the SDK's own create, list
//! and kill (and more, where the fake serves it) must succeed against `tether-fake`. The SDKs
//! are pinned in `fakes/fidelity/requirements.txt`, which `./test` installs into the venv
//! `fakes/fidelity/.venv`; these tests fail, saying so, when Python or an SDK is missing.
//! `TETHER_PYTHON` picks the interpreter (default: that venv's, else `python3`).

use std::path::PathBuf;
use std::process::Command;

use tether_e2e::cloud::Fake;

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
    let fake = Fake::start("e2b", &["--api-key", "e2b_fidelity_key"]);
    run_sdk_script(
        "e2b_sdk.py",
        "e2b",
        &[
            ("E2B_API_KEY", "e2b_fidelity_key"),
            ("E2B_API_URL", &fake.url),
            ("E2B_SANDBOX_URL", &fake.url),
        ],
    );
}

#[test]
fn daytona_sdk_creates_lists_stops_starts_and_deletes_on_the_fake() {
    let fake = Fake::start("daytona", &["--api-key", "dtn_fidelity_key"]);
    let api = format!("{}/api", fake.url);
    run_sdk_script(
        "daytona_sdk.py",
        "daytona",
        &[
            ("DAYTONA_API_KEY", "dtn_fidelity_key"),
            ("DAYTONA_API_URL", &api),
        ],
    );
}

#[test]
fn modal_sdk_creates_lists_and_terminates_on_the_fake() {
    let fake = Fake::start(
        "modal",
        &["--token-id", "ak-fidelity", "--token-secret", "as-fidelity"],
    );
    // grpclib speaks HTTP/2 without TLS to an http:// server URL: no certificate needed.
    let env = [
        ("MODAL_TOKEN_ID", "ak-fidelity"),
        ("MODAL_TOKEN_SECRET", "as-fidelity"),
        ("MODAL_SERVER_URL", fake.url.as_str()),
    ];
    // The SDK's default "V2" sandbox RPCs, then the V1 ones Tether's provider uses.
    run_sdk_script("modal_sdk.py", "modal", &env);
    let v1: Vec<(&str, &str)> = env
        .iter()
        .copied()
        .chain([("MODAL_SANDBOX_V2", "0")])
        .collect();
    run_sdk_script("modal_sdk.py", "modal", &v1);
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

//! The agent's command line: it refuses unsafe or empty configurations with clear errors.
//! (Also makes `cargo test --workspace` build the binary the end-to-end tests run.)
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

use std::process::Command;

fn agent() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tether-agent"));
    cmd.env_remove("TETHER_AGENT_TOKEN");
    cmd
}

#[test]
fn prints_its_version() {
    let out = agent().arg("version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("tether-agent "), "{text}");
    assert!(text.contains("protocol 1"), "{text}");
}

#[test]
fn refuses_to_serve_without_a_token() {
    let out = agent()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TETHER_AGENT_TOKEN"), "{err}");
}

#[test]
fn refuses_insecure_mode_on_a_public_address() {
    let out = agent()
        .args(["serve", "--listen", "0.0.0.0:0", "--insecure-no-token"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loopback"), "{err}");
}

#[test]
fn refuses_to_serve_nothing() {
    let out = agent().args(["serve", "--token", "t"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen"), "{err}");
}

#[test]
fn names_a_missing_inherited_fd() {
    let out = agent()
        .args(["serve", "--token", "t", "--listen-fd", "57"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("57"), "{err}");
}

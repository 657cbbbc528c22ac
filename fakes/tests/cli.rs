//! The `tether-fake` binary's command line. (Declaring an integration test here also makes
//! `cargo test --workspace` build the binary that the cloud-provider tests in `tests/` start.)
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

use std::process::Command;

fn fake() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tether-fake"))
}

#[test]
fn names_the_three_providers() {
    let out = fake().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for provider in ["e2b", "daytona", "modal"] {
        assert!(text.contains(provider), "{provider} missing:\n{text}");
    }
}

#[test]
fn refuses_to_start_without_a_data_dir() {
    for provider in ["e2b", "daytona", "modal"] {
        let out = fake().arg(provider).output().unwrap();
        assert!(
            !out.status.success(),
            "{provider} started without --data-dir"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--data-dir"), "{provider}: {err}");
    }
}

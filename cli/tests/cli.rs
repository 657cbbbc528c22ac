//! The `tether` binary's own command line, without a relay: version, help, and the error a
//! user gets when no relay is running. (Declaring an integration test here also makes
//! `cargo test --workspace` build the `tether` binary that the end-to-end tests in `tests/` run.)
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

use std::process::Command;

fn tether() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tether"));
    cmd.env_remove("TETHER_RELAY").env_remove("TETHER_TOKEN");
    cmd
}

#[test]
fn prints_its_version() {
    let out = tether().arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("tether "), "{text}");
}

#[test]
fn help_lists_every_command_and_where_to_start() {
    let out = tether().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for cmd in [
        "serve", "create", "ls", "rm", "info", "exec", "shell", "cp", "run", "token", "sync",
        "forward", "dev", "image",
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{cmd} "))),
            "`{cmd}` missing from help:\n{text}"
        );
    }
    assert!(text.contains("tether run"), "{text}");
}

#[test]
fn a_missing_relay_is_named_with_what_to_do() {
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let out = tether()
        .args(["ls", "--relay", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no relay at http://127.0.0.1:1"), "{err}");
    assert!(err.contains("tether serve"), "{err}");
}

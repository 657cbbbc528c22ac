//! The local sandbox really isolates: host files, host loopback services and host processes
//! are out of reach, writes outside /workspace and /tmp fail, a memory hog dies alone, delete
//! leaves nothing behind, and sandboxes survive a relay restart. A relay whose binary is
//! replaced under it keeps creating sandboxes, and signals the relay inherited ignored or
//! blocked do not reach sandboxed processes.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use nix::sys::signal::Signal;
use tether_e2e::signals::{self, NOHUP_SIGNALS};
use tether_e2e::{bin, Relay};

fn create(relay: &Relay, extra: &[&str]) -> String {
    let out = relay.tether().arg("create").args(extra).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn sh(relay: &Relay, id: &str, script: &str) -> Output {
    relay
        .tether()
        .args(["exec", id, "--", "sh", "-c", script])
        .output()
        .unwrap()
}

#[test]
fn host_files_loopback_and_processes_are_out_of_reach() {
    let relay = Relay::start();
    let secret = format!("/root/tether-isolation-{}", std::process::id());
    std::fs::write(&secret, "host secret").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let id = create(&relay, &[]);

    let read = sh(&relay, &id, &format!("cat {secret}"));
    assert!(!read.status.success(), "read a host file from /root");
    assert!(!String::from_utf8_lossy(&read.stdout).contains("host secret"));

    // Python is on the host's /usr, visible read-only inside.
    let connect = sh(
        &relay,
        &id,
        &format!(
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)'"
        ),
    );
    assert!(!connect.status.success(), "reached a host loopback port");

    let ps = sh(&relay, &id, "ls /proc | grep -E '^[0-9]+$' | wc -l");
    let count: usize = String::from_utf8_lossy(&ps.stdout).trim().parse().unwrap();
    assert!(count < 10, "the sandbox sees {count} processes");
    let init = sh(&relay, &id, "cat /proc/1/cmdline | tr '\\0' ' '");
    assert!(
        String::from_utf8_lossy(&init.stdout).contains("tether-agent"),
        "PID 1 is not the agent"
    );

    for path in [
        "/usr/tether-x",
        "/etc/tether-x",
        "/tether-x",
        "/root/tether-x",
    ] {
        let w = sh(&relay, &id, &format!("echo x > {path}"));
        assert!(!w.status.success(), "wrote {path}");
    }
    // The workspace, /tmp and HOME (a directory in the sandbox's /tmp) are writable.
    let ok = sh(
        &relay,
        &id,
        "echo x > /workspace/a && echo y > /tmp/b && echo z > \"$HOME/c\" && \
         cat /workspace/a /tmp/b /tmp/home/c",
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "x\ny\nz\n");

    std::fs::remove_file(&secret).unwrap();
    drop(listener);
}

#[test]
fn a_memory_hog_dies_alone_and_delete_leaves_nothing() {
    let relay = Relay::start();
    let id = create(&relay, &["--memory", "64M"]);
    let hog = sh(
        &relay,
        &id,
        "python3 -c 'x = bytearray(300 * 1024 * 1024); print(len(x))'",
    );
    assert!(
        !hog.status.success(),
        "a 300 MB allocation survived a 64 MB limit"
    );
    // The sandbox (and its agent) still answers.
    let after = sh(&relay, &id, "echo alive");
    assert_eq!(String::from_utf8_lossy(&after.stdout), "alive\n");

    let dir = relay.data_dir.join("local").join(&id);
    assert!(
        dir.exists(),
        "{} missing while the sandbox runs",
        dir.display()
    );
    let rm = relay.tether().args(["rm", &id]).output().unwrap();
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
    for hierarchy in ["memory", "pids", "cpu", "unified", ""] {
        let cg = std::path::Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join("tether")
            .join(&id);
        assert!(!cg.exists(), "cgroup {} left behind", cg.display());
    }
    let ps = std::process::Command::new("pgrep")
        .args(["-f", &id])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ps.stdout).trim().is_empty(),
        "processes of {id} left behind"
    );
}

#[test]
fn sandboxes_survive_a_relay_restart() {
    let mut relay = Relay::start();
    let id = create(&relay, &[]);
    let w = sh(&relay, &id, "echo kept > /workspace/f");
    assert!(w.status.success());
    relay.restart();
    let r = sh(&relay, &id, "cat /workspace/f");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(String::from_utf8_lossy(&r.stdout), "kept\n");
}

/// Copies the `tether` binary to `path`, executable, as an installer would.
fn install_tether(path: &std::path::Path) {
    std::fs::copy(bin("tether"), path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn assert_sandbox_works(relay: &Relay) {
    let id = create(relay, &[]);
    let out = sh(relay, &id, "echo works in $(hostname)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("works in {id}\n")
    );
}

#[test]
fn a_relay_whose_binary_is_replaced_or_deleted_keeps_creating_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("tether");
    install_tether(&installed);
    let log = dir.path().join("relay.log");
    let relay = Relay::start_custom(&installed, |cmd| {
        cmd.stderr(std::fs::File::create(&log).unwrap());
    });
    assert_sandbox_works(&relay);

    // An upgrade: the new binary is written beside the old one and renamed over it.
    let staged = dir.path().join("tether.new");
    install_tether(&staged);
    std::fs::rename(&staged, &installed).unwrap();
    assert_sandbox_works(&relay);

    // An uninstall: the file is gone.
    std::fs::remove_file(&installed).unwrap();
    assert_sandbox_works(&relay);

    let log = std::fs::read_to_string(&log).unwrap();
    let warnings = log
        .matches("changed on disk since the relay started")
        .count();
    assert_eq!(warnings, 1, "the replacement is logged once:\n{log}");
    assert!(log.contains(&installed.display().to_string()), "{log}");
}

#[test]
fn sandboxed_processes_start_with_default_signals_whatever_the_relay_inherited() {
    let relay = Relay::start_custom(&bin("tether"), |cmd| {
        signals::ignore_and_block(cmd, &NOHUP_SIGNALS)
    });
    // The relay itself really runs as `nohup` (and a blocking service manager) leave it.
    let own = std::fs::read_to_string(format!("/proc/{}/status", relay.pid())).unwrap();
    let inherited = signals::status_mask(&NOHUP_SIGNALS);
    // (It handles SIGINT itself, so only HUP and QUIT stay ignored.)
    let hup = signals::status_mask(&[Signal::SIGHUP]);
    for (field, expected) in [("SigIgn", hup), ("SigBlk", inherited)] {
        let mask = signals::status_field(&own, field).unwrap();
        assert_eq!(mask & expected, expected, "the relay's {field}: {own}");
    }

    let id = create(&relay, &[]);
    // A command starts with nothing ignored and nothing blocked, as the operator
    // checks it.
    let out = sh(&relay, &id, "cat /proc/self/status");
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("\nSigIgn:\t0000000000000000\n"), "{status}");
    assert!(status.contains("\nSigBlk:\t0000000000000000\n"), "{status}");
    // So does the agent (PID 1; it ignores only SIGPIPE, as every Rust program does).
    let out = sh(&relay, &id, "cat /proc/1/status");
    let agent = String::from_utf8_lossy(&out.stdout);
    let ignored = signals::status_field(&agent, "SigIgn").unwrap();
    assert_eq!(
        ignored & inherited,
        0,
        "the agent inherited ignored signals:\n{agent}"
    );
    assert_eq!(signals::status_field(&agent, "SigBlk"), Some(0), "{agent}");

    // A hangup ends a sleep: were HUP still ignored, it would sleep its 30 s and exit 0.
    let hup = sh(
        &relay,
        &id,
        "sleep 30 & pid=$!; kill -HUP $pid; wait $pid; echo status=$?",
    );
    assert_eq!(String::from_utf8_lossy(&hup.stdout), "status=129\n");
}

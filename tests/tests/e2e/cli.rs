//! The `tether` command line against a real relay and real local sandboxes: the lifecycle
//! commands and their `--json`, exec's streams and exit statuses, `cp` both ways, `run`
//! with its embedded relay, and `shell` driven through a real terminal (tmux).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::Value;
use tether_e2e::{bin, sha256_hex, signals, Relay};

/// How long a terminal test waits for the screen to show what it expects.
const SCREEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `tether ARGS` against `relay`, feeding `stdin`.
fn tether_with(relay: &Relay, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = relay
        .tether()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tether");
    let mut input = child.stdin.take().expect("piped stdin");
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait for tether");
    feeder.join().expect("stdin feeder");
    out
}

fn tether(relay: &Relay, args: &[&str]) -> Output {
    tether_with(relay, args, b"")
}

/// Runs `tether ARGS`, asserts it succeeded, and returns its stdout.
fn ok(relay: &Relay, args: &[&str]) -> String {
    relay.tether_ok(args)
}

fn json(relay: &Relay, args: &[&str]) -> Value {
    relay.tether_json(args)
}

fn create(relay: &Relay) -> String {
    ok(relay, &["create"]).trim().to_string()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn create_ls_info_rm_with_json() {
    let relay = Relay::start();
    let made = json(
        &relay,
        &["create", "--label", "suite=cli", "--ttl", "30m", "--json"],
    );
    let id = made["id"].as_str().expect("id").to_string();
    assert_eq!(made["labels"]["suite"], "cli");
    assert_eq!(made["state"], "running");
    assert!(made["expires_ms"].as_i64().is_some(), "{made}");

    let again = json(
        &relay,
        &[
            "create",
            "--label",
            "suite=cli",
            "--get-or-create",
            "--json",
        ],
    );
    assert_eq!(
        again["id"],
        id.as_str(),
        "get-or-create found the same sandbox"
    );
    assert_eq!(again["created"], false);

    let other = create(&relay);
    let listed = json(&relay, &["ls", "--label", "suite=cli", "--json"]);
    let ids: Vec<&str> = listed
        .as_array()
        .expect("array")
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [id.as_str()],
        "the label filter keeps only the labelled one"
    );

    let table = ok(&relay, &["ls"]);
    let header = table.lines().next().unwrap();
    let columns: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(columns, ["ID", "PROVIDER", "STATE", "AGE", "LABELS"]);
    let row = table.lines().find(|l| l.starts_with(&id)).expect("row");
    assert!(row.contains("local") && row.contains("running") && row.contains("suite=cli"));

    let info = json(&relay, &["info", &id, "--json"]);
    assert_eq!(info["id"], id.as_str());
    assert!(info["agent"]["agent_version"].is_string(), "{info}");
    assert!(info["agent"]["cpus"].as_u64().unwrap() >= 1);
    assert!(info["agent"]["memory_bytes"].as_u64().unwrap() > 0);
    let text = ok(&relay, &["info", &id]);
    assert!(text.contains("os:") && text.contains("Linux"), "{text}");

    assert_eq!(ok(&relay, &["rm", &id]).trim(), id);
    let removed = json(&relay, &["rm", "--all", "--json"]);
    assert_eq!(removed["deleted"], serde_json::json!([other]));
    assert_eq!(ok(&relay, &["ls", "-q"]), "");

    let gone = tether(&relay, &["info", &id]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        stderr(&gone).contains(&format!("no sandbox {id}")),
        "{}",
        stderr(&gone)
    );
    let gone = tether(&relay, &["rm", &id]);
    assert_eq!(gone.status.code(), Some(1));
}

#[test]
fn errors_say_what_to_do() {
    let relay = Relay::start();
    let out = relay
        .tether()
        .args(["ls"])
        .env("TETHER_RELAY", "http://127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "no relay at http://127.0.0.1:1: start one with `tether serve` (or use `tether run`, \
             which needs none)"
        ),
        "{}",
        stderr(&out)
    );
    // No token: where to get one, without claiming the relay keeps it at this machine's
    // default path.
    let home = tempfile::tempdir().unwrap();
    let out = relay
        .tether()
        .args(["ls"])
        .env_remove("TETHER_TOKEN")
        .env("TETHER_HOME", home.path())
        .output()
        .unwrap();
    let said = stderr(&out);
    assert!(!out.status.success());
    assert!(
        said.contains("set TETHER_TOKEN") && said.contains("--data-dir DIR"),
        "{said}"
    );
    // A malformed address is named as such, not taken for a relay that is down.
    for args in [&["ls"][..], &["exec", "sb-x", "true"]] {
        let out = relay
            .tether()
            .args(args)
            .env("TETHER_RELAY", "http://127.0.0.1:70000")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let said = stderr(&out);
        assert!(
            said.contains("invalid port number") && !said.contains("no relay"),
            "{said}"
        );
    }
    let out = tether(&relay, &["exec", "sb-nosuch", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("tether ls"), "{}", stderr(&out));

    let out = relay
        .tether()
        .args(["ls"])
        .env("TETHER_TOKEN", "tether_wrong")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("TETHER_TOKEN"), "{}", stderr(&out));
    // The relay's own advice is not said twice.
    assert_eq!(
        stderr(&out).matches("tether token create").count(),
        1,
        "{}",
        stderr(&out)
    );
}

/// Something that is not a relay at the relay's address (a web server's error page, one
/// that does not take WebSockets) is named as such, not dumped, and not called "no relay"
/// or "no sandbox".
#[test]
fn a_wrong_relay_address_is_named_not_dumped() {
    let relay = Relay::start();
    let web = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", web.local_addr().unwrap());
    let page = "<!DOCTYPE HTML>\n<html><head><title>Error response</title></head>\n<body>\
                <h1>404 \x1b[31mnot found</h1></body></html>\n";
    // A web server's answer to each connection the commands below open (a few each; the
    // thread is left blocked in accept when the test ends).
    std::thread::spawn(move || {
        for _ in 0..32 {
            let (mut conn, _) = web.accept().unwrap();
            let mut head = Vec::new();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            while !head.ends_with(b"\r\n\r\n") {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                head.extend_from_slice(line.as_bytes());
            }
            let reply = format!(
                "HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{page}",
                page.len()
            );
            conn.write_all(reply.as_bytes()).unwrap();
        }
    });
    for args in [&["ls"][..], &["info", "sb-x"], &["exec", "sb-x", "true"]] {
        let out = relay
            .tether()
            .args(args)
            .env("TETHER_RELAY", &addr)
            .output()
            .unwrap();
        let said = stderr(&out);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            said.contains(&addr) && said.contains("not as a Tether relay"),
            "{args:?}: {said}"
        );
        assert!(
            said.contains("HTML page titled \"Error response\""),
            "{said}"
        );
        assert!(!said.contains("<html") && !said.contains('\x1b'), "{said}");
        assert!(
            !said.contains("no sandbox") && !said.contains("no relay"),
            "{said}"
        );
    }
}

#[test]
fn exec_streams_and_statuses() {
    let relay = Relay::start();
    let id = create(&relay);

    let out = tether(
        &relay,
        &["exec", &id, "-c", "echo out; echo err >&2; exit 3"],
    );
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");

    let out = tether(
        &relay,
        &["exec", &id, "--", "printf", "%s|", "a b", "$HOME", "*"],
    );
    assert_eq!(
        out.stdout, b"a b|$HOME|*|",
        "argv words reach the command untouched"
    );

    // Binary stdin with -i, end-of-file passed on; without -i the command reads nothing.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let out = tether_with(&relay, &["exec", "-i", &id, "--", "cat"], &data);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(sha256_hex(&out.stdout), sha256_hex(&data));
    let out = tether_with(&relay, &["exec", &id, "--", "cat"], b"ignored");
    assert!(out.status.success());
    assert!(out.stdout.is_empty());

    let out = tether(&relay, &["exec", &id, "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15));
    let out = tether(&relay, &["exec", &id, "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(128 + 9));

    let start = Instant::now();
    let out = tether(
        &relay,
        &["exec", "--timeout", "1s", &id, "--", "sleep", "60"],
    );
    assert_eq!(out.status.code(), Some(124));
    assert!(start.elapsed() < Duration::from_secs(20));

    let out = tether(&relay, &["exec", &id, "--", "no-such-command-xyz"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        stderr(&out).contains("command not found"),
        "{}",
        stderr(&out)
    );

    let out = tether(
        &relay,
        &[
            "exec",
            "-e",
            "GREETING=hi there",
            "-w",
            "/tmp",
            &id,
            "-c",
            "echo \"$GREETING\" $(pwd)",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi there /tmp\n");
}

#[test]
fn exec_forwards_local_interrupts() {
    let relay = Relay::start();
    let id = create(&relay);
    let mut child = relay
        .tether()
        .args(["exec", &id, "-c", "echo ready; exec sleep 100"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "exec did not end after SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(128 + 2), "the remote sleep died of SIGINT");
}

/// A remote script that answers `signal` by printing `got-NAME` and exiting `code`, and
/// otherwise waits 30 s (what bounds a test whose signal never arrives).
fn trap_script(signal: &str, code: i32) -> String {
    let name = signal.to_lowercase();
    format!(
        "trap 'echo got-{name}; exit {code}' {signal}; echo ready; \
         sleep 30 >/dev/null 2>&1 & wait"
    )
}

/// Runs `tether ARGS`, whose remote command prints `ready` once it can take signals, sends
/// `signal` to the local `tether` process then, and returns its exit code and what it
/// printed after `ready`.
fn signalled_when_ready(relay: &Relay, args: &[&str], signal: Signal) -> (Option<i32>, String) {
    let mut child = relay
        .tether()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // A terminal ends lines with \r\n.
            if lines.send(line.trim_end().to_string()).is_err() {
                break;
            }
        }
    });
    let ready = received.recv_timeout(SCREEN_TIMEOUT);
    assert_eq!(ready.as_deref(), Ok("ready"), "tether {args:?}");
    nix::sys::signal::kill(Pid::from_raw(child.id() as i32), signal).unwrap();
    // The remote sleep ends the command within 30 s even if the signal went nowhere.
    let mut after = Vec::new();
    loop {
        match received.recv_timeout(SCREEN_TIMEOUT) {
            Ok(line) => after.push(line),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => panic!("tether {args:?} did not end: {after:?}"),
        }
    }
    (child.wait().unwrap().code(), after.join("\n"))
}

#[test]
fn exec_shell_and_run_forward_hangup_quit_and_user_signals() {
    // Under `nohup`, as operators start it: the remote script must still see HUP.
    let relay = Relay::start_custom(&bin("tether"), |cmd| {
        signals::ignore_and_block(cmd, &signals::NOHUP_SIGNALS)
    });
    let id = create(&relay);
    let cases = [
        (Signal::SIGHUP, "HUP", 3),
        (Signal::SIGUSR1, "USR1", 4),
        (Signal::SIGUSR2, "USR2", 5),
        (Signal::SIGQUIT, "QUIT", 6),
    ];
    for (signal, name, code) in cases {
        let script = trap_script(name, code);
        let (status, output) = signalled_when_ready(&relay, &["exec", &id, "-c", &script], signal);
        assert_eq!(status, Some(code), "exec, {name}: {output}");
        assert_eq!(output, format!("got-{}", name.to_lowercase()));
    }

    // Under a terminal a hangup reaches the remote side too, and the session ends with it.
    let script = trap_script("HUP", 3);
    let (status, output) =
        signalled_when_ready(&relay, &["exec", "-t", &id, "-c", &script], Signal::SIGHUP);
    assert_eq!(status, Some(3), "exec -t, HUP: {output}");
    assert!(output.contains("got-hup"), "{output}");
    // One that ignores the hangup is given up on after a grace period, well before its sleep
    // would end.
    let begun = Instant::now();
    let (status, _) = signalled_when_ready(
        &relay,
        &[
            "exec",
            "-t",
            &id,
            "-c",
            "trap '' HUP; echo ready; exec sleep 30",
        ],
        Signal::SIGHUP,
    );
    assert_eq!(status, Some(128 + 1));
    assert!(
        begun.elapsed() < Duration::from_secs(20),
        "{:?}",
        begun.elapsed()
    );
    let (status, output) = signalled_when_ready(
        &relay,
        &["shell", &id, "--", "sh", "-c", &trap_script("USR1", 4)],
        Signal::SIGUSR1,
    );
    assert_eq!(status, Some(4), "shell, USR1: {output}");

    // `run` forwards them as well, and still deletes its sandbox.
    let (status, output) = signalled_when_ready(
        &relay,
        &["run", "--", "sh", "-c", &trap_script("USR2", 5)],
        Signal::SIGUSR2,
    );
    assert_eq!(status, Some(5), "run, USR2: {output}");
    assert_eq!(ok(&relay, &["ls", "-q"]).trim(), id, "run left its sandbox");

    // A remote command that does not trap the signal dies of it, and so do we: 128 + 10.
    let (status, _) = signalled_when_ready(
        &relay,
        &["exec", &id, "-c", "echo ready; exec sleep 30"],
        Signal::SIGUSR1,
    );
    assert_eq!(status, Some(128 + 10));
}

#[test]
fn cp_files_both_ways() {
    let relay = Relay::start();
    let id = create(&relay);
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("data.bin");
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o751)).unwrap();

    ok(&relay, &["exec", &id, "--", "mkdir", "-p", "/tmp/in"]);
    ok(
        &relay,
        &["cp", src.to_str().unwrap(), &format!("{id}:/tmp/in")],
    );
    let remote = ok(
        &relay,
        &[
            "exec",
            &id,
            "-c",
            "stat -c %a /tmp/in/data.bin; sha256sum < /tmp/in/data.bin",
        ],
    );
    assert_eq!(remote, format!("751\n{}  -\n", sha256_hex(&data)));

    let back = local.path().join("back.bin");
    ok(
        &relay,
        &[
            "cp",
            &format!("{id}:/tmp/in/data.bin"),
            back.to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::read(&back).unwrap(), data);
    let mode = std::fs::metadata(&back).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o751);
    let leftovers: Vec<_> = std::fs::read_dir(local.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with(".tether-cp-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // Into an existing local directory: the file keeps its name.
    ok(
        &relay,
        &[
            "cp",
            &format!("{id}:/tmp/in/data.bin"),
            local.path().to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::read(local.path().join("data.bin")).unwrap(), data);

    let out = tether(
        &relay,
        &[
            "cp",
            &format!("{id}:/no/such/file"),
            local.path().to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("/no/such/file"), "{}", stderr(&out));
}

#[test]
fn cp_errors_say_what_was_read_and_what_to_do() {
    let relay = Relay::start();
    let id = create(&relay);
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("f");
    std::fs::write(&src, b"data").unwrap();

    // Into a directory the sandbox lacks, written with a trailing slash: not "Not a
    // directory", but which directory is missing and the command that creates it.
    let out = tether(
        &relay,
        &[
            "cp",
            src.to_str().unwrap(),
            &format!("{id}:/workspace/nonexistent/"),
        ],
    );
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("/workspace/nonexistent: no such directory")
            && said.contains(&format!(
                "tether exec {id} -- mkdir -p /workspace/nonexistent"
            ))
            && !said.contains("Not a directory"),
        "{said}"
    );
    // Nothing was written in its place.
    let listed = tether(&relay, &["exec", &id, "--", "ls", "/workspace/nonexistent"]);
    assert!(!listed.status.success());

    // A local file whose name has a colon: read as sandbox `a`, and the error says so and
    // how to write the local name, whether the other side is local or in a sandbox.
    std::fs::write(local.path().join("a:b"), b"x").unwrap();
    for dst in ["copied".to_string(), format!("{id}:/tmp/")] {
        let out = relay
            .tether()
            .current_dir(local.path())
            .args(["cp", "a:b", &dst])
            .output()
            .unwrap();
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(
            said.contains("sandbox `a`") && said.contains("`./a:b`"),
            "to {dst}: {said}"
        );
    }
    // Written so, it copies.
    let out = relay
        .tether()
        .current_dir(local.path())
        .args(["cp", "./a:b", &format!("{id}:/tmp/")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(ok(&relay, &["exec", &id, "--", "cat", "/tmp/a:b"]), "x");
}

fn tree(root: &Path) {
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::write(root.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(root.join("sub/secret"), "s3cret").unwrap();
    std::fs::set_permissions(
        root.join("sub/secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::write(root.join("sub/deeper/empty"), "").unwrap();
    std::fs::create_dir(root.join("void")).unwrap();
    std::os::unix::fs::symlink("sub/secret", root.join("link")).unwrap();
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn cp_directories_both_ways_keeping_modes_and_symlinks() {
    let relay = Relay::start();
    let id = create(&relay);
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("proj");
    tree(&src);

    // Into an existing remote directory: it lands under its own name.
    ok(
        &relay,
        &["cp", src.to_str().unwrap(), &format!("{id}:/tmp")],
    );
    let listing = ok(
        &relay,
        &[
            "exec",
            &id,
            "-c",
            "cd /tmp/proj && stat -c '%n %a' run.sh sub/secret && readlink link && cat link && echo \
             && test -d void && test -f sub/deeper/empty && ./run.sh",
        ],
    );
    assert_eq!(
        listing,
        "run.sh 755\nsub/secret 600\nsub/secret\ns3cret\nhi\n"
    );

    // Back into an existing local directory, and to a new path.
    let into = local.path().join("into");
    std::fs::create_dir(&into).unwrap();
    ok(
        &relay,
        &["cp", &format!("{id}:/tmp/proj"), into.to_str().unwrap()],
    );
    let fresh = local.path().join("fresh");
    ok(
        &relay,
        &["cp", &format!("{id}:/tmp/proj"), fresh.to_str().unwrap()],
    );
    for copy in [into.join("proj"), fresh] {
        assert_eq!(mode(&copy.join("run.sh")), 0o755);
        assert_eq!(mode(&copy.join("sub/secret")), 0o600);
        assert_eq!(
            std::fs::read_link(copy.join("link")).unwrap(),
            Path::new("sub/secret")
        );
        assert_eq!(
            std::fs::read_to_string(copy.join("link")).unwrap(),
            "s3cret"
        );
        assert!(copy.join("void").is_dir());
        assert!(copy.join("sub/deeper/empty").is_file());
    }
}

/// A `tether` command with no relay configured, its data and temporary directories in
/// `home`: the embedded relay is the only one it can use.
fn isolated_tether(home: &Path) -> Command {
    let mut cmd = Command::new(bin("tether"));
    cmd.env_remove("TETHER_RELAY")
        .env_remove("TETHER_TOKEN")
        .env("HOME", home)
        .env("TETHER_HOME", home.join("data"))
        .env("TMPDIR", home.join("tmp"))
        .env("TETHER_AGENT_BIN", bin("tether-agent"));
    cmd
}

#[test]
fn run_works_with_no_relay() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join("tmp")).unwrap();
    let out = isolated_tether(home.path())
        .args([
            "run",
            "--embedded",
            "--",
            "sh",
            "-c",
            "uname -s; echo oops >&2; exit 4",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(out.stdout, b"Linux\n");
    assert_eq!(out.stderr, b"oops\n");

    let mut child = isolated_tether(home.path())
        .args(["run", "--embedded", "--", "sha256sum"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"piped through")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}  -\n", sha256_hex(b"piped through"))
    );

    // The embedded relay cleaned up after itself.
    let left: Vec<_> = std::fs::read_dir(home.path().join("tmp"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "the embedded relay left {left:?}");
}

#[test]
fn run_deletes_its_sandbox_on_a_configured_relay() {
    let relay = Relay::start();
    let out = tether(
        &relay,
        &["run", "--label", "by=run", "--", "sh", "-c", "exit 9"],
    );
    assert_eq!(out.status.code(), Some(9), "{}", stderr(&out));
    let out = tether(&relay, &["run", "--", "no-such-command-xyz"]);
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(ok(&relay, &["ls", "-q"]), "", "run left no sandbox behind");
}

#[test]
fn tokens_are_minted_per_tenant() {
    let relay = Relay::start();
    let id = create(&relay);
    let minted = json(&relay, &["token", "create", "--tenant", "team-b", "--json"]);
    assert_eq!(minted["tenant"], "team-b");
    let token = minted["token"].as_str().unwrap();
    let theirs = relay
        .tether()
        .env("TETHER_TOKEN", token)
        .args(["ls", "-q"])
        .output()
        .unwrap();
    assert!(theirs.status.success(), "{}", stderr(&theirs));
    assert!(
        theirs.stdout.is_empty(),
        "another tenant's sandbox {id} is hidden"
    );
    let plain = ok(&relay, &["token", "create", "--tenant", "team-c"]);
    assert!(plain.trim().starts_with("tether_"), "{plain}");
}

/// A tmux server of its own, killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(relay: &Relay, cols: u16, rows: u16) -> Tmux {
        tether_e2e::require::tool("tmux");
        let tmux = Tmux {
            socket: format!("tether-cli-test-{}", std::process::id()),
        };
        let status = Command::new("tmux")
            .args(["-L", &tmux.socket, "-f", "/dev/null", "new-session", "-d"])
            .args(["-x", &cols.to_string(), "-y", &rows.to_string()])
            .args(["-e", &format!("TETHER_RELAY={}", relay.url)])
            .args(["-e", &format!("TETHER_TOKEN={}", relay.admin_token)])
            .args(["-e", "PS1=outer$ "])
            .args(["bash", "--norc", "--noprofile"])
            .status()
            .expect("run tmux");
        assert!(status.success(), "tmux new-session failed");
        tmux
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux");
        assert!(out.status.success(), "tmux {args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn type_line(&self, line: &str) {
        self.tmux(&["send-keys", "-l", line]);
        self.tmux(&["send-keys", "Enter"]);
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p"])
    }

    /// Polls the screen until `check` accepts it.
    fn wait_for(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + SCREEN_TIMEOUT;
        loop {
            let screen = self.screen();
            if check(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_for_line(&self, line: &str) -> String {
        self.wait_for(line, |s| s.lines().any(|l| l.trim_end() == line))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

#[test]
fn shell_is_a_real_terminal() {
    let relay = Relay::start();
    let id = create(&relay);
    let tmux = Tmux::start(&relay, 120, 40);
    tmux.wait_for("the outer prompt", |s| s.contains("outer$"));

    tmux.type_line(&format!("{} shell {id}", bin("tether").display()));
    // The sandbox's hostname is its id: this line can only come from inside it.
    tmux.type_line("echo \"$(hostname)-$((6*7))\"");
    let screen = tmux.wait_for_line(&format!("{id}-42"));
    let prompt = screen.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    assert!(
        !prompt.starts_with("outer$"),
        "a remote prompt follows: {screen}"
    );

    tmux.type_line("stty size");
    tmux.wait_for_line("40 120");
    tmux.tmux(&["resize-window", "-x", "100", "-y", "30"]);
    tmux.wait_for("the pane to shrink", |s| s.lines().count() <= 30);
    // SIGWINCH reaches tether asynchronously: ask until the remote size follows.
    let deadline = Instant::now() + SCREEN_TIMEOUT;
    for probe in 0.. {
        tmux.type_line(&format!("echo \"probe{probe}-$(stty size | tr ' ' x)\""));
        let prefix = format!("probe{probe}-");
        let screen = tmux.wait_for("stty's answer", |s| {
            s.lines().any(|l| l.starts_with(&prefix))
        });
        if screen
            .lines()
            .any(|l| l.trim_end() == format!("{prefix}30x100"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the remote size never followed:\n{screen}"
        );
    }

    tmux.type_line("sleep 100");
    // Ctrl-C once the sleep runs in the sandbox (the shell's children share its namespace).
    let deadline = Instant::now() + SCREEN_TIMEOUT;
    while !tether(&relay, &["exec", &id, "--", "pgrep", "-x", "sleep"])
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "sleep never started: {}",
            tmux.screen()
        );
    }
    tmux.tmux(&["send-keys", "C-c"]);
    tmux.type_line("echo after-$((1+1))");
    let screen = tmux.wait_for_line("after-2");
    assert!(
        screen.contains("^C"),
        "Ctrl-C reached the remote terminal: {screen}"
    );

    tmux.type_line("exit 5");
    tmux.wait_for("the outer prompt again", |s| {
        s.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.starts_with("outer$"))
    });
    tmux.type_line("echo status=$?");
    tmux.wait_for_line("status=5");
    // The local terminal is back in cooked mode: canonical input and echo.
    tmux.type_line("stty -a | tr ' ;' '\\n\\n' | grep -x -e -icanon -e icanon -e -echo -e echo | tr '\\n' ,; echo");
    tmux.wait_for_line("icanon,echo,");
}

/// Runs `tether ARGS` with `token` instead of the admin token.
fn tether_as(relay: &Relay, token: &str, args: &[&str]) -> Output {
    relay
        .tether()
        .env("TETHER_TOKEN", token)
        .args(args)
        .output()
        .expect("run tether")
}

/// Runs `tether ARGS` with `token`, asserts it failed, and returns its stderr.
fn fails_as(relay: &Relay, token: &str, args: &[&str]) -> String {
    let out = tether_as(relay, token, args);
    assert!(
        !out.status.success(),
        "tether {args:?} should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr(&out)
}

fn mint(relay: &Relay, by: &str, tenant: &str, admin: bool) -> Output {
    let mut args = vec!["token", "create", "--tenant", tenant];
    if admin {
        args.push("--admin");
    }
    tether_as(relay, by, &args)
}

fn minted(out: Output) -> String {
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Copies the shared libraries the (debug, dynamically linked) agent needs into `rootfs`, at
/// the paths the dynamic linker looks for them.
fn add_agent_libraries(rootfs: &Path) {
    let out = Command::new("ldd")
        .arg(bin("tether-agent"))
        .output()
        .expect("run ldd");
    assert!(out.status.success(), "ldd: {}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let libraries = text
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(Path::new);
    for library in libraries {
        let inside = rootfs.join(library.strip_prefix("/").unwrap());
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        std::fs::copy(library, &inside).unwrap();
    }
}

#[test]
fn host_directories_are_images_only_for_admins_under_an_image_root() {
    let images = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(images.path()).unwrap();
    let rootfs = tether_e2e::images::busybox_rootfs(&root);
    add_agent_libraries(&rootfs);
    let relay = Relay::start_with(&["--image-root", root.to_str().unwrap()]);
    let victim = create(&relay);
    let member = minted(mint(&relay, &relay.admin_token, "team-a", false));
    let workspace = relay
        .data_dir
        .join("local")
        .join(&victim)
        .join("disk/workspace");
    assert!(workspace.is_dir(), "{}", workspace.display());

    let data_dir = relay.data_dir.to_str().unwrap();
    for image in [
        "/etc",
        data_dir,
        workspace.to_str().unwrap(),
        rootfs.to_str().unwrap(),
    ] {
        let err = fails_as(&relay, &member, &["create", "--image", image]);
        assert!(err.contains("only admin tokens"), "{image}: {err}");
    }
    let admin = &relay.admin_token;
    for (image, why) in [
        ("/etc", "not under an image root"),
        (data_dir, "data directory"),
        (workspace.to_str().unwrap(), "data directory"),
        ("/", "data directory"),
    ] {
        let err = fails_as(&relay, admin, &["create", "--image", image]);
        assert!(err.contains(why), "{image}: {err}");
    }
    let id = ok(&relay, &["create", "--image", rootfs.to_str().unwrap()]);
    let out = ok(
        &relay,
        &["exec", id.trim(), "--", "busybox", "echo", "on the image"],
    );
    assert_eq!(out, "on the image\n");

    // With no --image-root, no host directory at all.
    let closed = Relay::start();
    let err = fails_as(
        &closed,
        &closed.admin_token,
        &["create", "--image", rootfs.to_str().unwrap()],
    );
    assert!(err.contains("--image-root"), "{err}");
}

#[test]
fn the_policy_sets_defaults_maxima_and_who_gets_the_host_network() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("policy.toml");
    std::fs::write(
        &config,
        "[defaults]\nmemory = \"256M\"\nmax_memory = \"512M\"\npids = 300\nttl = \"2h\"\n\
         [tenants.team-b]\nmax_sandboxes = 1\n",
    )
    .unwrap();
    let relay = Relay::start_with(&["--config", config.to_str().unwrap()]);
    let member = minted(mint(&relay, &relay.admin_token, "team-a", false));

    // Defaults land in the sandbox's cgroup.
    let made = tether_as(&relay, &member, &["create", "--json"]);
    assert!(made.status.success(), "{}", stderr(&made));
    let made: Value = serde_json::from_slice(&made.stdout).unwrap();
    let id = made["id"].as_str().unwrap();
    let expires = made["expires_ms"].as_i64().unwrap() - made["created_ms"].as_i64().unwrap();
    assert_eq!(expires, 2 * 3600 * 1000);
    let cgroup = Path::new("/sys/fs/cgroup/tether").join(id);
    if cgroup.join("memory.max").exists() {
        let read = |f: &str| std::fs::read_to_string(cgroup.join(f)).unwrap();
        assert_eq!(read("memory.max").trim(), (256u64 << 20).to_string());
        assert_eq!(read("pids.max").trim(), "300");
        assert_eq!(read("cpu.max").trim(), "100000 100000");
    }

    let err = fails_as(&relay, &member, &["create", "--memory", "1G"]);
    assert!(
        err.contains("max_memory") && err.contains("512 MiB"),
        "{err}"
    );
    let err = fails_as(&relay, &member, &["create", "--network", "host"]);
    assert!(
        err.contains("--network host") && err.contains("admin"),
        "{err}"
    );
    let err = fails_as(&relay, &member, &["create", "--pids", "99999999"]);
    assert!(err.contains("`pids`") && err.contains("4194304"), "{err}");

    let b = minted(mint(&relay, &relay.admin_token, "team-b", false));
    minted(tether_as(&relay, &b, &["create"]));
    let err = fails_as(&relay, &b, &["create"]);
    assert!(err.contains("max_sandboxes"), "{err}");

    // A typo in the policy file stops the relay from starting, naming the key.
    std::fs::write(&config, "[defaults]\nmax_memroy = \"1G\"\n").unwrap();
    let out = Command::new(bin("tether"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("max_memroy"), "{}", stderr(&out));
}

#[test]
fn tenant_admins_mint_only_member_tokens_of_their_own_tenant() {
    let relay = Relay::start();
    let a_admin = minted(mint(&relay, &relay.admin_token, "team-a", true));
    let err = stderr(&mint(&relay, &a_admin, "team-b", false));
    assert!(err.contains("for tenant team-a only"), "{err}");
    let err = stderr(&mint(&relay, &a_admin, "team-a", true));
    assert!(err.contains("relay's own admin token"), "{err}");
    let a_member = minted(mint(&relay, &a_admin, "team-a", false));
    let err = stderr(&mint(&relay, &a_member, "team-a", false));
    assert!(err.contains("only admin tokens"), "{err}");
    minted(tether_as(&relay, &a_member, &["create"]));
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn relay_db_holds_no_token_in_plain_text() {
    let mut relay = Relay::start();
    let member = minted(mint(&relay, &relay.admin_token, "team-a", false));
    let id = minted(tether_as(&relay, &member, &["create"]));
    let gone = create(&relay);
    ok(&relay, &["rm", &gone]);

    // What the agent's environment shows of its token, seen from the host.
    let hostname = format!("HOSTNAME={id}");
    let from_environ = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("environ")).ok())
        .filter(|env| contains(env, &hostname))
        .find_map(|env| {
            env.split(|b| *b == 0)
                .find_map(|kv| kv.strip_prefix(b"TETHER_AGENT_TOKEN="))
                .map(|t| String::from_utf8_lossy(t).into_owned())
        });
    relay.stop();
    let mut bytes = Vec::new();
    for file in ["relay.db", "relay.db-wal"] {
        bytes.extend(std::fs::read(relay.data_dir.join(file)).unwrap_or_default());
    }
    assert!(bytes.len() > 4096, "relay.db was read");
    assert!(
        !contains(&bytes, &relay.admin_token),
        "relay.db holds the admin token"
    );
    assert!(!contains(&bytes, &member), "relay.db holds an API token");

    // The relay, with its key, still knows the token; the file does not show it.
    let registry = tether_store::Store::open(&relay.data_dir.join("relay.db")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let records = rt.block_on(registry.all()).unwrap();
    let record = records
        .iter()
        .find(|r| r.id.as_str() == id)
        .expect("the sandbox");
    assert_eq!(record.agent_token.len(), 64);
    assert!(
        !contains(&bytes, &record.agent_token),
        "relay.db holds the agent token"
    );
    // The agent zeroed its token where /proc/PID/environ shows it; the exec after the restart
    // below proves the stored token is the agent's.
    if let Some(token) = from_environ {
        assert!(
            token.is_empty(),
            "the agent's environment still shows its token"
        );
    }
    drop(registry);

    // The sealed token still reaches the agent after a restart.
    relay.restart();
    let out = tether_as(&relay, &member, &["exec", &id, "--", "echo", "hi"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hi\n",
        "{}",
        stderr(&out)
    );
    let _ = tether_as(&relay, &member, &["rm", &id]);
}

/// Tunnels opened at once against a relay limited to [`TIGHT_NOFILE`] descriptors: more than
/// it can hold (each costs it two), fewer than this test process may open.
const TUNNELS: usize = 200;
/// The relay's descriptor limit, soft and hard, in the out-of-descriptors test.
const TIGHT_NOFILE: u64 = 256;

/// The state `tether ls` shows for `id`, or `None` when the relay refused the request.
fn listed_state(relay: &Relay, id: &str) -> Option<String> {
    let out = tether(relay, &["ls", "--json"]);
    if !out.status.success() {
        let err = stderr(&out);
        assert!(
            err.contains("file descriptors"),
            "ls failed otherwise: {err}"
        );
        return None;
    }
    let all: Value = serde_json::from_slice(&out.stdout).expect("ls --json");
    let found = all
        .as_array()
        .and_then(|all| all.iter().find(|s| s["id"] == id));
    let state = found.unwrap_or_else(|| panic!("{id} is no longer listed: {all}"));
    Some(state["state"].as_str().unwrap_or_default().to_string())
}

#[test]
fn a_relay_out_of_descriptors_refuses_tunnels_and_never_deletes_the_sandbox() {
    use tether_client::ClientError;

    let relay = Relay::start_with_nofile(TIGHT_NOFILE);
    let id = create(&relay);
    ok(
        &relay,
        &[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo precious > /workspace/keep",
        ],
    );

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let client = relay.client();
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..TUNNELS {
        match rt.block_on(client.connect(&id)) {
            Ok(session) => open.push(session),
            Err(ClientError::Http {
                status: 503,
                message,
                ..
            }) => {
                assert!(message.contains("file descriptors"), "{message}");
                refused += 1;
            }
            Err(e) => panic!("a tunnel failed otherwise than with 503: {e}"),
        }
    }
    assert!(
        refused > 0,
        "all {TUNNELS} tunnels fit under {TIGHT_NOFILE} descriptors"
    );
    assert!(
        open.len() >= 20,
        "only {} tunnels were admitted",
        open.len()
    );

    // Held full across several reaper ticks (1 s each): never gone, at worst refused.
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(4) {
        if let Some(state) = listed_state(&relay, &id) {
            assert_ne!(state, "gone", "the sandbox was declared gone");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    rt.block_on(async {
        // The admitted tunnels still work.
        let out = open[0]
            .exec(tether_proto::op::ExecSpec::argv(["cat", "/workspace/keep"]))
            .await
            .expect("exec on an admitted tunnel")
            .output()
            .await
            .expect("output");
        assert_eq!(out.stdout, b"precious\n");
    });
    drop(open);

    // Once the tunnels close, everything works again, and the files are intact.
    let deadline = Instant::now() + Duration::from_secs(30);
    while listed_state(&relay, &id).as_deref() != Some("running") {
        assert!(Instant::now() < deadline, "the relay did not recover");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = ok(&relay, &["exec", &id, "--", "cat", "/workspace/keep"]);
    assert_eq!(out, "precious\n");
    drop(rt);
}

/// The host pid of a local sandbox's PID 1 (its agent): the process in the sandbox's cgroup
/// whose pid in its own namespace is 1.
fn sandbox_init_pid(id: &str) -> i32 {
    for entry in std::fs::read_dir("/proc").expect("/proc") {
        let name = entry.expect("/proc entry").file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let init = status
            .lines()
            .find(|l| l.starts_with("NSpid:"))
            .is_some_and(|l| l.split_whitespace().last() == Some("1"));
        if cgroup.contains(id) && init {
            return pid;
        }
    }
    panic!("no PID 1 found for sandbox {id}");
}

#[test]
fn rm_of_a_dead_or_reaped_sandbox_succeeds() {
    let relay = Relay::start();

    // Its TTL ran out and the reaper deleted it: rm says so and exits 0.
    let reaped = ok(&relay, &["create", "--ttl", "1s"]).trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let all = json(&relay, &["ls", "--json"]);
        if !all
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == reaped.as_str())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reaper did not delete {reaped}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = tether(&relay, &["rm", &reaped]);
    assert!(
        out.status.success(),
        "rm of a reaped sandbox: {}",
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(
        err.contains("deleted by the relay") && err.contains("TTL"),
        "{err}"
    );
    let report = json(&relay, &["rm", &reaped, "--json"]);
    assert_eq!(
        report["already_deleted"][0]["id"],
        reaped.as_str(),
        "{report}"
    );
    // A typo is still an error.
    assert!(!tether(&relay, &["rm", "sb-nosuchsandbox"]).status.success());

    // Its agent died: rm cleans it up.
    let dead = create(&relay);
    let pid = sandbox_init_pid(&dead);
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let dir = relay.data_dir.join("local").join(&dead);
    assert!(dir.exists());
    assert_eq!(ok(&relay, &["rm", &dead]).trim(), dead);
    assert!(!dir.exists(), "rm left {}", dir.display());
}

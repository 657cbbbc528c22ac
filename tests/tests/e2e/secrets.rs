//! `tether secret` against a real relay: set from stdin, list, rm, tenants kept apart, and no
//! trace of a value in any answer, in the relay's log (at debug level) or in its database.

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::Value;
use tether_e2e::cloud::http;
use tether_e2e::{bin, Relay};

/// A value nothing else contains, so finding it anywhere means it leaked.
const VALUE: &str = "sk-e2e-Vb6nM9qW2eR5tY8uI1oP";

/// Runs `tether ARGS` against `relay` with `token`, feeding `stdin`.
fn tether(relay: &Relay, token: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = relay
        .tether()
        .env("TETHER_TOKEN", token)
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

/// Everything a command showed: its stdout and stderr.
fn shown(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs a command that must succeed; returns its stdout. Everything it showed goes to `seen`.
fn ok(relay: &Relay, token: &str, args: &[&str], stdin: &[u8], seen: &mut String) -> String {
    let out = tether(relay, token, args, stdin);
    seen.push_str(&shown(&out));
    assert!(out.status.success(), "tether {args:?}: {}", shown(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that must fail; returns what it showed, also appended to `seen`.
fn fails(relay: &Relay, token: &str, args: &[&str], stdin: &[u8], seen: &mut String) -> String {
    let out = tether(relay, token, args, stdin);
    let text = shown(&out);
    seen.push_str(&text);
    assert!(!out.status.success(), "tether {args:?} succeeded: {text}");
    text
}

fn names(list: &str) -> Vec<String> {
    let list: Value = serde_json::from_str(list).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

fn contains(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A relay logging at debug level to `log`.
fn relay_logging_to(log: &Path) -> Relay {
    let file = std::fs::File::create(log).unwrap();
    Relay::start_custom(&bin("tether"), |cmd| {
        cmd.env("RUST_LOG", "debug").stderr(file);
    })
}

#[test]
fn secrets_are_set_from_stdin_listed_by_name_and_removed() {
    let relay = Relay::start();
    let admin = relay.admin_token.clone();
    let mut seen = String::new();

    let out = ok(
        &relay,
        &admin,
        &["secret", "set", "OPENAI_API_KEY"],
        format!("{VALUE}\n").as_bytes(),
        &mut seen,
    );
    assert!(out.is_empty(), "set prints nothing on stdout: {out}");
    assert!(seen.contains("OPENAI_API_KEY"), "{seen}");

    let table = ok(&relay, &admin, &["secret", "list"], b"", &mut seen);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "CREATED", "UPDATED"]);
    assert!(
        table.lines().any(|l| l.starts_with("OPENAI_API_KEY ")),
        "{table}"
    );
    let json = ok(
        &relay,
        &admin,
        &["secret", "list", "--json"],
        b"",
        &mut seen,
    );
    assert_eq!(names(&json), ["OPENAI_API_KEY"]);
    let listed: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(listed[0]["tenant"], "default");

    // Replacing keeps one secret; refusals say what to do.
    ok(
        &relay,
        &admin,
        &["secret", "set", "OPENAI_API_KEY"],
        VALUE.as_bytes(),
        &mut seen,
    );
    let json = ok(
        &relay,
        &admin,
        &["secret", "list", "--json"],
        b"",
        &mut seen,
    );
    assert_eq!(names(&json), ["OPENAI_API_KEY"]);
    let empty = fails(
        &relay,
        &admin,
        &["secret", "set", "EMPTY"],
        b"\n",
        &mut seen,
    );
    assert!(
        empty.contains("empty") && empty.contains("printf"),
        "{empty}"
    );
    let bad = fails(
        &relay,
        &admin,
        &["secret", "set", "9LIVES"],
        VALUE.as_bytes(),
        &mut seen,
    );
    assert!(bad.contains("environment variable"), "{bad}");

    ok(
        &relay,
        &admin,
        &["secret", "rm", "OPENAI_API_KEY"],
        b"",
        &mut seen,
    );
    let again = fails(
        &relay,
        &admin,
        &["secret", "rm", "OPENAI_API_KEY"],
        b"",
        &mut seen,
    );
    assert!(again.contains("no secret OPENAI_API_KEY"), "{again}");
    let json = ok(
        &relay,
        &admin,
        &["secret", "list", "--json"],
        b"",
        &mut seen,
    );
    assert!(names(&json).is_empty());
    assert!(!seen.contains(VALUE), "a command showed the value: {seen}");
}

#[test]
fn tenants_see_only_their_own_secrets_and_the_relay_admin_names_any() {
    let relay = Relay::start();
    let admin = relay.admin_token.clone();
    let mut seen = String::new();
    let mint = |tenant: &str, admin_flag: bool, seen: &mut String| {
        let mut args = vec!["token", "create", "--tenant", tenant];
        if admin_flag {
            args.push("--admin");
        }
        ok(&relay, &relay.admin_token, &args, b"", seen)
            .trim()
            .to_string()
    };
    let a = mint("team-a", false, &mut seen);
    let b = mint("team-b", false, &mut seen);
    let b_admin = mint("team-b", true, &mut seen);

    ok(
        &relay,
        &a,
        &["secret", "set", "KEY"],
        VALUE.as_bytes(),
        &mut seen,
    );
    let b_list = ok(&relay, &b, &["secret", "list", "--json"], b"", &mut seen);
    assert!(names(&b_list).is_empty(), "b sees none of a's");
    let b_rm = fails(&relay, &b, &["secret", "rm", "KEY"], b"", &mut seen);
    assert!(b_rm.contains("team-b has no secret KEY"), "{b_rm}");
    for token in [&b, &b_admin] {
        let list = fails(
            &relay,
            token,
            &["secret", "list", "--tenant", "team-a"],
            b"",
            &mut seen,
        );
        assert!(list.contains("relay's admin token"), "{list}");
        let set = fails(
            &relay,
            token,
            &["secret", "set", "KEY", "--tenant", "team-a"],
            b"overwritten",
            &mut seen,
        );
        assert!(set.contains("relay's admin token"), "{set}");
        let rm = fails(
            &relay,
            token,
            &["secret", "rm", "KEY", "--tenant", "team-a"],
            b"",
            &mut seen,
        );
        assert!(rm.contains("relay's admin token"), "{rm}");
    }
    let a_list = ok(&relay, &a, &["secret", "list", "--json"], b"", &mut seen);
    assert_eq!(names(&a_list), ["KEY"], "a's secret is still there");

    // The relay's admin token manages any tenant's store.
    ok(
        &relay,
        &admin,
        &["secret", "set", "FOR_B", "--tenant", "team-b"],
        b"b-value",
        &mut seen,
    );
    let b_list = ok(&relay, &b, &["secret", "list", "--json"], b"", &mut seen);
    assert_eq!(names(&b_list), ["FOR_B"]);
    let admin_list = ok(
        &relay,
        &admin,
        &["secret", "list", "--json", "--tenant", "team-a"],
        b"",
        &mut seen,
    );
    assert_eq!(names(&admin_list), ["KEY"]);
    ok(
        &relay,
        &admin,
        &["secret", "rm", "KEY", "--tenant", "team-a"],
        b"",
        &mut seen,
    );
    let a_list = ok(&relay, &a, &["secret", "list", "--json"], b"", &mut seen);
    assert!(names(&a_list).is_empty());
    assert!(!seen.contains(VALUE), "a command showed the value: {seen}");
}

#[test]
fn no_value_in_any_answer_the_relay_log_or_its_database() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("relay.log");
    let mut relay = relay_logging_to(&log);
    let admin = relay.admin_token.clone();
    let mut seen = String::new();

    ok(
        &relay,
        &admin,
        &["secret", "set", "LEAK_CHECK"],
        VALUE.as_bytes(),
        &mut seen,
    );
    ok(
        &relay,
        &admin,
        &["secret", "set", "LEAK_CHECK"],
        VALUE.as_bytes(),
        &mut seen,
    );
    ok(&relay, &admin, &["secret", "list"], b"", &mut seen);
    ok(
        &relay,
        &admin,
        &["secret", "list", "--json"],
        b"",
        &mut seen,
    );
    ok(&relay, &admin, &["ls", "--json"], b"", &mut seen);
    fails(
        &relay,
        &admin,
        &["secret", "set", "BAD-NAME"],
        VALUE.as_bytes(),
        &mut seen,
    );

    // Straight at the API: a good body, then bodies the relay must describe without quoting.
    let auth = format!("Bearer {admin}");
    let headers = [("Authorization", auth.as_str())];
    let bodies = [
        format!("{{\"value\": \"{VALUE}\"}}"),
        format!("{{\"value\": \"{VALUE}\""),
        format!("\"{VALUE}\""),
        format!("{{\"value\": [\"{VALUE}\"]}}"),
        format!("{{\"value\": \"x\", \"{VALUE}\": 1}}"),
        format!("{{\"value\": \"{VALUE}\\u0000\"}}"),
    ];
    for (path, body) in bodies
        .iter()
        .map(|b| ("/v1/secrets/LEAK_CHECK", b.as_str()))
        .chain([
            ("/v1/secrets/BAD-NAME", bodies[0].as_str()),
            (
                "/v1/secrets/LEAK_CHECK?tenant=no%20such",
                bodies[0].as_str(),
            ),
            ("/v1/secrets/LEAK_CHECK?other=1", bodies[0].as_str()),
        ])
    {
        let (status, answer) = http(&relay.url, "PUT", path, &headers, body);
        assert!(status == 200 || status == 400, "{path}: {status} {answer}");
        seen.push_str(&answer);
    }
    for (method, path) in [
        ("GET", "/v1/secrets"),
        ("GET", "/v1/sandboxes"),
        ("DELETE", "/v1/secrets/LEAK_CHECK"),
        ("DELETE", "/v1/secrets/LEAK_CHECK"),
    ] {
        let (_, answer) = http(&relay.url, method, path, &headers, "");
        seen.push_str(&answer);
    }
    assert!(!seen.contains(VALUE), "an answer showed the value: {seen}");

    relay.stop();
    let logged = std::fs::read(&log).unwrap();
    let text = String::from_utf8_lossy(&logged);
    assert!(
        text.contains("LEAK_CHECK"),
        "the relay logged no secret operation, so this test checks nothing: {text}"
    );
    assert!(
        !contains(&logged, VALUE),
        "the relay logged the value: {text}"
    );
    for file in ["relay.db", "relay.db-wal"] {
        let bytes = std::fs::read(relay.data_dir.join(file)).unwrap_or_default();
        assert!(
            !contains(&bytes, VALUE),
            "{file} holds the value in plain text"
        );
    }
}

/// Runs `tmux -L SOCKET ARGS`; its stdout.
fn tmux(socket: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("tmux")
        .args(["-L", socket])
        .args(args)
        .output()
        .expect("run tmux");
    assert!(out.status.success(), "tmux {args:?}: {}", shown(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls the pane until `check` accepts it.
fn wait_for_screen(socket: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let screen = tmux(socket, &["capture-pane", "-p"]);
        if check(&screen) {
            return screen;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}; screen:\n{screen}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Kills its tmux server on drop.
struct TmuxServer(String);

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .output();
    }
}

#[test]
fn a_value_typed_at_a_terminal_is_not_echoed_and_the_terminal_is_restored() {
    tether_e2e::require::tool("tmux");
    let relay = Relay::start();
    let socket = format!("tether-secret-test-{}", std::process::id());
    let _server = TmuxServer(socket.clone());
    let status = std::process::Command::new("tmux")
        .args(["-L", &socket, "-f", "/dev/null", "new-session", "-d"])
        .args(["-x", "150", "-y", "40"])
        .args(["-e", &format!("TETHER_RELAY={}", relay.url)])
        .args(["-e", &format!("TETHER_TOKEN={}", relay.admin_token)])
        .args(["-e", "PS1=outer$ "])
        .args(["bash", "--norc", "--noprofile"])
        .status()
        .expect("run tmux");
    assert!(status.success(), "tmux new-session failed");
    let type_line = |line: &str| {
        tmux(&socket, &["send-keys", "-l", line]);
        tmux(&socket, &["send-keys", "Enter"]);
    };
    // Prints `echo` or `-echo`: the terminal's echo setting as the next command finds it.
    let echo_setting = "stty -a | tr ' ;' '\\n\\n' | grep -x -e echo -e -echo | sed 's/^/tty:/'";
    wait_for_screen(&socket, "the prompt", |s| s.contains("outer$"));
    let tether = bin("tether");

    type_line(&format!(
        "{} secret set TYPED_KEY; echo \"first=$?\"",
        tether.display()
    ));
    wait_for_screen(&socket, "the prompt for the value", |s| {
        s.contains("not shown")
    });
    type_line(VALUE);
    let screen = wait_for_screen(&socket, "set to finish", |s| s.contains("first=0"));
    assert!(!screen.contains(VALUE), "the value was echoed:\n{screen}");
    type_line(echo_setting);
    wait_for_screen(&socket, "echo back on", |s| s.contains("tty:echo"));

    // Ctrl-C at the prompt stores nothing and leaves the terminal as it was.
    type_line(&format!(
        "{} secret set NEVER_SET; echo \"second=$?\"",
        tether.display()
    ));
    wait_for_screen(&socket, "the second prompt", |s| {
        s.matches("not shown").count() == 2
    });
    tmux(&socket, &["send-keys", "-l", "half-typed"]);
    tmux(&socket, &["send-keys", "C-c"]);
    let screen = wait_for_screen(&socket, "the interrupt", |s| s.contains("second=1"));
    assert!(screen.contains("interrupted"), "{screen}");
    type_line(&echo_setting.replace("tty:", "again:"));
    let screen = wait_for_screen(&socket, "echo back on", |s| {
        s.contains("again:echo") || s.contains("again:-echo")
    });
    assert!(screen.contains("again:echo"), "echo left off:\n{screen}");

    let mut seen = String::new();
    let json = ok(
        &relay,
        &relay.admin_token,
        &["secret", "list", "--json"],
        b"",
        &mut seen,
    );
    assert_eq!(names(&json), ["TYPED_KEY"]);
}

//! The hostile sandbox: code inside a local sandbox tries to get out through the kernel or
//! to take over its agent, and fails. Each test is one claim of the security model (docs/security.md):
//! root inside is an unprivileged uid outside, the seccomp filter and `no_new_privs` hold,
//! raw sockets are gone, the agent's memory, environment, descriptors and token are out of
//! reach, and per-user kernel limits are counted per sandbox.

#![cfg(target_arch = "x86_64")] // The probes name x86-64 system call numbers.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tether_e2e::Relay;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A field of a `/proc/<pid>/status` text, e.g. `Uid`.
fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in {status}"))
        .trim()
}

/// Starts `tether exec ID -- python3 -c SCRIPT` in the background and waits for its first
/// line, which the script prints once it is ready; the process runs until the child is killed.
fn python_in_background(relay: &Relay, id: &str, script: &str) -> (Child, String) {
    let mut child = relay
        .tether()
        .args(["exec", id, "--", "python3", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().to_string())
}

/// The host pid of the process whose command line is exactly `argv`, waiting up to 10 s.
fn host_pid_of(argv: &[&str]) -> u32 {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if std::fs::read(format!("/proc/{pid}/cmdline"))
                .ok()
                .as_deref()
                == Some(&want[..])
            {
                return pid;
            }
        }
        assert!(Instant::now() < deadline, "no process {argv:?} on the host");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn root_inside_is_an_unprivileged_uid_outside() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    let inside = relay.sh(
        &id,
        "id -u; cat /proc/self/uid_map; echo x > /workspace/mine",
    );
    assert!(
        inside.status.success(),
        "{}",
        String::from_utf8_lossy(&inside.stderr)
    );
    let text = stdout(&inside);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("0"), "not root inside");
    let map: Vec<u64> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(map[0], 0);
    let host_uid = map[1];
    assert_ne!(host_uid, 0, "uid 0 inside is root on the host");

    // Seen from the host, as `ps` would: the sandbox's processes run as that uid.
    let marker = "4242.25";
    let mut sleeper = relay
        .tether()
        .args(["exec", &id, "--", "sleep", marker])
        .spawn()
        .unwrap();
    let pid = host_pid_of(&["sleep", marker]);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids: Vec<u64> = status_field(&status, "Uid")
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(uids.iter().all(|&u| u == host_uid), "host uids {uids:?}");
    // So do its files.
    let file = relay
        .data_dir
        .join("local")
        .join(&id)
        .join("disk/workspace/mine");
    assert_eq!(u64::from(std::fs::metadata(&file).unwrap().uid()), host_uid);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn the_filter_no_new_privs_and_capabilities_hold() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    let status = stdout(&relay.sh(&id, "cat /proc/self/status"));
    assert_eq!(status_field(&status, "Seccomp"), "2");
    assert_eq!(status_field(&status, "NoNewPrivs"), "1");
    let effective = u64::from_str_radix(status_field(&status, "CapEff"), 16).unwrap();
    let bounding = u64::from_str_radix(status_field(&status, "CapBnd"), 16).unwrap();
    // NET_RAW, SYS_PTRACE, SYS_ADMIN, SYS_RESOURCE, SYS_MODULE, NET_ADMIN.
    for cap in [13, 19, 21, 24, 16, 12] {
        assert_eq!(effective & (1 << cap), 0, "capability {cap} is effective");
        assert_eq!(
            bounding & (1 << cap),
            0,
            "capability {cap} is in the bounding set"
        );
    }

    // Each call from the issue, made for real; each must fail with the errno named.
    let probe = r#"
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    args = [ctypes.c_long(a) for a in args]
    r = libc.syscall(ctypes.c_long(nr), *args)
    return 0 if r >= 0 else ctypes.get_errno()
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x20000, 0x40000000
buf = ctypes.create_string_buffer(256)
calls = {
    "keyctl": call(250, 0, -3, 0, 0),          # KEYCTL_GET_KEYRING_ID, user session
    "add_key": call(248, ctypes.addressof(buf), ctypes.addressof(buf), 0, 0, -4),
    "request_key": call(249, ctypes.addressof(buf), ctypes.addressof(buf), 0, 0),
    "io_uring_setup": call(425, 8, ctypes.addressof(buf)),
    "perf_event_open": call(298, ctypes.addressof(buf), 0, -1, -1, 0),
    "userfaultfd": call(323, 0),
    "bpf": call(321, 0, ctypes.addressof(buf), 48),
    "kexec_load": call(246, 0, 0, 0, 0),
    "init_module": call(175, 0, 0, 0),
    "finit_module": call(313, 0, 0, 0),
    "mount": call(165, 0, 0, 0, 0, 0),
    "pivot_root": call(155, 0, 0),
    "open_tree": call(428, -100, 0, 0),
    "unshare_user": call(272, CLONE_NEWUSER),
    "unshare_net": call(272, CLONE_NEWNET),
    "setns": call(308, 0, 0),
    "clone_newuser": call(56, CLONE_NEWUSER | 17, 0, 0, 0, 0),
    "clone3": call(435, 0, 0),
    "personality_rie": call(135, 0x0400000),
    "open_by_handle_at": call(304, 0, 0, 0),
}
for domain, kind in [("packet", (socket.AF_PACKET, socket.SOCK_RAW)),
                     ("raw_icmp", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))]:
    try:
        socket.socket(*kind).close(); calls[domain] = 0
    except OSError as e:
        calls[domain] = e.errno
for name, err in calls.items():
    print(name, errno.errorcode.get(err, err))
"#;
    let out = relay.sh(&id, &format!("python3 -c '{probe}'"));
    let text = stdout(&out);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in text.lines() {
        let (name, err) = line.split_once(' ').unwrap();
        let want = if name == "clone3" { "ENOSYS" } else { "EPERM" };
        assert_eq!(err, want, "{name} answered {err}, not {want}; all: {text}");
    }
    assert!(text.lines().count() >= 20, "{text}");

    // The tools a sandbox would reach for fail the same way.
    let tools = relay.sh(&id, "unshare -U -r true && echo escaped");
    assert!(!stdout(&tools).contains("escaped"));
}

#[test]
fn sandbox_code_cannot_reach_the_agent() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    let attempts = relay.sh(
        &id,
        "for what in 'cat /proc/1/environ' 'cat /proc/1/mem' 'head -c1 /proc/1/fd/1' \
                    'ls -l /proc/1/fd/1' 'cat /proc/1/maps'; do \
           if sh -c \"$what\" >/dev/null 2>&1; then echo \"OPEN $what\"; fi; \
         done; \
         echo tamper > /proc/1/fd/1 2>/dev/null && echo 'OPEN write /proc/1/fd/1'; \
         python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); \
                     print(\"ptrace\", l.ptrace(16, 1, 0, 0), ctypes.get_errno())'; \
         kill -9 1; echo alive",
    );
    let text = stdout(&attempts);
    assert!(!text.contains("OPEN"), "the agent is reachable: {text}");
    assert!(
        text.contains("ptrace -1 1\n"),
        "PTRACE_ATTACH to the agent: {text}"
    );
    // Still serving after all of that.
    assert_eq!(stdout(&relay.sh(&id, "echo still")), "still\n");

    // Seen from the host, the agent's environment no longer holds its token: the bytes are
    // zeroed, not merely unlinked from `environ`.
    let marker = "4242.5";
    let mut sleeper = relay
        .tether()
        .args(["exec", &id, "--", "sleep", marker])
        .spawn()
        .unwrap();
    let sleep_pid = host_pid_of(&["sleep", marker]);
    let status = std::fs::read_to_string(format!("/proc/{sleep_pid}/status")).unwrap();
    let agent = status_field(&status, "PPid");
    let environ = std::fs::read(format!("/proc/{agent}/environ")).unwrap();
    let cmdline = std::fs::read(format!("/proc/{agent}/cmdline")).unwrap();
    assert!(
        cmdline.starts_with(b"tether-agent"),
        "{}",
        String::from_utf8_lossy(&cmdline)
    );
    let key = b"TETHER_AGENT_TOKEN=";
    for entry in environ.split(|b| *b == 0) {
        assert!(
            !entry.starts_with(key) || entry.len() == key.len(),
            "the agent's token is still in its environment"
        );
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn one_sandbox_cannot_use_up_inotify_for_others_or_the_host() {
    let relay = Relay::start();
    let hog = relay.create(&[]);
    let other = relay.create(&[]);
    // Hold as many inotify instances as the kernel gives, and more than the host's default
    // per-user limit of 128.
    let (mut holder, held) = python_in_background(
        &relay,
        &hog,
        "import ctypes, sys, time\n\
         l = ctypes.CDLL(None)\n\
         fds = [fd for fd in (l.inotify_init1(0) for _ in range(200)) if fd >= 0]\n\
         print(len(fds), flush=True)\n\
         time.sleep(60)",
    );
    let held: usize = held.parse().unwrap();
    assert!(held > 0, "the hog got no inotify instance at all");

    let probe = "python3 -c 'import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)'";
    assert_eq!(
        stdout(&relay.sh(&other, probe)),
        "True\n",
        "another sandbox lost inotify"
    );
    // So does the agent's own `watch` there, which the sync and SDK clients use.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let session = relay.client().connect(&other).await.unwrap();
        session
            .watch("/workspace", true)
            .await
            .expect("another sandbox's watch failed");
    });
    // And the host (this test runs as the relay's user) keeps its own.
    let host = Command::new("python3")
        .args([
            "-c",
            "import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)",
        ])
        .output()
        .unwrap();
    assert_eq!(stdout(&host), "True\n", "the host lost inotify");
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn only_admins_may_lift_the_filter() {
    let relay = Relay::start();
    let member = relay
        .tether()
        .args(["token", "create", "--tenant", "team-a"])
        .output()
        .unwrap();
    let member = String::from_utf8(member.stdout).unwrap().trim().to_string();
    let refused = relay
        .tether()
        .env("TETHER_TOKEN", &member)
        .args(["create", "--no-seccomp"])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a member lifted the filter");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("seccomp"), "{err}");

    let id = relay.create(&["--no-seccomp"]);
    let status = stdout(&relay.sh(&id, "cat /proc/self/status"));
    assert_eq!(status_field(&status, "Seccomp"), "0");
    // Everything else still holds.
    assert_eq!(status_field(&status, "NoNewPrivs"), "1");
    let uid_map = stdout(&relay.sh(&id, "cat /proc/self/uid_map"));
    assert_ne!(uid_map.split_whitespace().nth(1), Some("0"), "{uid_map}");
}

//! Faults of the lifecycle, with real binaries and real local sandboxes: the relay killed
//! (`SIGKILL`) during concurrent creates and while sandboxes run, and a sandbox's agent
//! killed. Each test asserts what the host is left with, one resource at a time: sandbox
//! directories, cgroups, processes, mounts and loop devices.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tether_e2e::Relay;

/// How long a test waits for a state it expects before failing.
const DEADLINE: Duration = Duration::from_secs(60);
/// How soon a dead agent must show as `dead` (the relay checks every second).
const DEAD_WITHIN: Duration = Duration::from_secs(5);
/// Creates in flight when the relay is killed.
const CONCURRENT_CREATES: usize = 20;
/// Sandbox directories that must exist (creates under way) before the relay is killed.
const KILL_AFTER_DIRS: usize = 8;

/// Polls `check` (a state of the host or the relay, never a timer) until it holds.
fn wait_for<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `<data_dir>/local`, where the local provider keeps its sandboxes.
fn local_dir(relay: &Relay) -> PathBuf {
    std::fs::canonicalize(&relay.data_dir)
        .unwrap()
        .join("local")
}

/// The ids of the sandbox directories under the relay's data directory.
fn sandbox_dirs(relay: &Relay) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(local_dir(relay)) else {
        return BTreeSet::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("sb-"))
        .collect()
}

/// The registry's sandbox ids, read from its file as an operator's `sqlite3` would.
fn registered(relay: &Relay) -> BTreeSet<String> {
    let db = rusqlite::Connection::open(relay.data_dir.join("relay.db")).unwrap();
    let mut stmt = db.prepare("SELECT id FROM sandboxes").unwrap();
    let ids = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    ids
}

/// Everything sandbox `id` still has on this host, in words; empty when nothing is left.
fn leftovers(relay: &Relay, id: &str) -> Vec<String> {
    let dir = local_dir(relay).join(id);
    let mut left = Vec::new();
    if dir.exists() {
        left.push(format!("its directory {}", dir.display()));
    }
    // v1 hierarchies each have a `tether` parent; a v2-only host has one at the root.
    let roots = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .chain([PathBuf::from("/sys/fs/cgroup")]);
    for root in roots {
        let cgroup = root.join("tether").join(id);
        if cgroup.exists() {
            left.push(format!("its cgroup {}", cgroup.display()));
        }
    }
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        if let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) {
            if cwd.starts_with(&dir) {
                left.push(format!(
                    "process {} in {}",
                    entry.path().display(),
                    cwd.display()
                ));
            }
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mountinfo.lines() {
        if let Some(point) = line.split(' ').nth(4) {
            if Path::new(point).starts_with(&dir) {
                left.push(format!("a mount on {point}"));
            }
        }
    }
    let image = dir.join("disk.img").to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/sys/block")
        .unwrap()
        .filter_map(Result::ok)
    {
        let backing = std::fs::read_to_string(entry.path().join("loop/backing_file"));
        if backing.is_ok_and(|b| b.starts_with(&image)) {
            left.push(format!(
                "loop device {}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    left
}

/// `tether ARGS --json` as the admin, parsed; panics if it fails.
fn json(relay: &Relay, args: &[&str]) -> Value {
    let out = relay.tether().args(args).arg("--json").output().unwrap();
    assert!(
        out.status.success(),
        "tether {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The state the relay reports for sandbox `id`.
fn state(relay: &Relay, id: &str) -> String {
    json(relay, &["info", id])["state"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The host pid of sandbox `id`'s agent (its PID 1), from what the relay stored.
fn agent_pid(relay: &Relay, id: &str) -> i32 {
    let db = relay.data_dir.join("relay.db");
    let id = id.to_string();
    // The stored metadata is sealed: read it through the relay's own registry.
    std::thread::spawn(move || {
        let registry = tether_store::Store::open(&db).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let all = rt.block_on(registry.all()).unwrap();
        let record = all.into_iter().find(|r| r.id.as_str() == id).unwrap();
        record.meta["process"]["pid"].as_i64().unwrap() as i32
    })
    .join()
    .unwrap()
}

fn exec_ok(relay: &Relay, id: &str, script: &str) -> String {
    let out = relay.sh(id, script);
    assert!(
        out.status.success(),
        "exec in {id} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_relay_killed_during_concurrent_creates_leaves_no_orphans_after_restart() {
    killed_during_creates(false);
}

/// The same crash with the create journal lost (a relay from before it, an operator's edit):
/// nothing proves what the creates left is this relay's to remove, so it is kept, listed for
/// the admin (`tether ls --orphans`), and removed when the admin asks.
#[test]
fn orphans_nobody_journaled_are_kept_listed_and_removed_when_the_admin_asks() {
    killed_during_creates(true);
}

/// Kills the relay while [`CONCURRENT_CREATES`] creates run, restarts it (after emptying the
/// create journal if `forget_journal`), and checks that only registered sandboxes remain,
/// all of them working (with the journal lost, once the admin removed the orphans).
fn killed_during_creates(forget_journal: bool) {
    let mut relay = Relay::start();
    let creates: Vec<Child> = (0..CONCURRENT_CREATES)
        .map(|_| {
            relay
                .tether()
                .args(["create", "--disk", "64M"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    wait_for(DEADLINE, "creates to be under way", || {
        (sandbox_dirs(&relay).len() >= KILL_AFTER_DIRS).then_some(())
    });
    relay.kill();
    for mut create in creates {
        let _ = create.wait();
    }
    let seen = sandbox_dirs(&relay);
    let kept = registered(&relay);
    let half_made: Vec<&String> = seen.iter().filter(|id| !kept.contains(*id)).collect();
    assert!(
        !half_made.is_empty(),
        "every create finished before the kill ({} registered): the test proves nothing",
        kept.len()
    );
    if forget_journal {
        let db = rusqlite::Connection::open(relay.data_dir.join("relay.db")).unwrap();
        db.execute("DELETE FROM create_journal", []).unwrap();
    }

    relay.restart();
    if forget_journal {
        // Kept, every one, and listed for the admin, who removes them.
        for id in &half_made {
            assert!(
                local_dir(&relay).join(id).exists(),
                "orphan {id} was removed"
            );
        }
        let listed = json(&relay, &["ls", "--orphans"]);
        let listed: BTreeSet<String> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["id"].as_str().unwrap().to_string())
            .collect();
        let expected: BTreeSet<String> = half_made.iter().map(|id| id.to_string()).collect();
        assert_eq!(listed, expected);
        let out = relay
            .tether()
            .args(["ls", "--orphans", "--rm", "--quiet"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // Recovery runs before the relay listens: by now it is done.
    for id in &half_made {
        let left = leftovers(&relay, id);
        assert!(left.is_empty(), "half-made sandbox {id} left: {left:?}");
    }
    assert_eq!(
        sandbox_dirs(&relay),
        kept,
        "the sandbox directories are exactly the registered sandboxes"
    );
    for id in &kept {
        assert_eq!(exec_ok(&relay, id, "echo alive"), "alive\n", "sandbox {id}");
    }
    // The registry's own view agrees: no create is left journaled.
    let db = rusqlite::Connection::open(relay.data_dir.join("relay.db")).unwrap();
    let journaled: i64 = db
        .query_row("SELECT count(*) FROM create_journal", [], |r| r.get(0))
        .unwrap();
    assert_eq!(journaled, 0);
}

#[test]
fn a_restarted_relay_keeps_every_running_sandbox_even_when_journaled() {
    let mut relay = Relay::start();
    let ids: Vec<String> = (0..3).map(|_| relay.create(&[])).collect();
    let mut workers = Vec::new();
    for id in &ids {
        exec_ok(&relay, id, "echo kept > /workspace/file");
        // A process that outlives the relay: its pid must be the same one after the restart.
        let pid = exec_ok(
            &relay,
            id,
            "setsid sleep 600 >/dev/null 2>&1 </dev/null & echo $!",
        );
        workers.push(pid.trim().to_string());
    }
    relay.kill();
    // The attack: the journal claims every registered sandbox is an interrupted create, and
    // names one more that never got anywhere. Recovery must trust the registry over it.
    let db = rusqlite::Connection::open(relay.data_dir.join("relay.db")).unwrap();
    for id in ids.iter().map(String::as_str).chain(["sb-neverstarted"]) {
        db.execute(
            "INSERT INTO create_journal (sandbox_id, tenant, provider, provider_ref, labels, \
             started_ms) VALUES (?1, 'default', 'local', NULL, '{}', 0)",
            [id],
        )
        .unwrap();
    }
    drop(db);

    relay.restart();
    for (id, worker) in ids.iter().zip(&workers) {
        assert_eq!(state(&relay, id), "running", "sandbox {id}");
        let seen = exec_ok(
            &relay,
            id,
            &format!("cat /workspace/file; kill -0 {worker} && echo worker"),
        );
        assert_eq!(
            seen, "kept\nworker\n",
            "sandbox {id} lost its files or processes"
        );
    }
    assert_eq!(
        sandbox_dirs(&relay),
        ids.iter().cloned().collect::<BTreeSet<_>>()
    );
}

#[test]
fn a_killed_agent_makes_its_sandbox_dead_and_rm_leaves_nothing() {
    let relay = Relay::start();
    let id = relay.create(&["--disk", "64M"]);
    exec_ok(&relay, &id, "true");
    let pid = agent_pid(&relay, &id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed = Instant::now();
    wait_for(DEADLINE, "the sandbox to show as dead", || {
        // `ls` reads the registry only: the relay noticed on its own.
        let listed = json(&relay, &["ls"]);
        let mine = listed.as_array().unwrap().iter().find(|s| s["id"] == id)?;
        (mine["state"] == "dead").then_some(())
    });
    assert!(
        killed.elapsed() < DEAD_WITHIN,
        "the dead agent was noticed only after {:?}",
        killed.elapsed()
    );
    // `info` still describes it, and says why its agent cannot answer.
    let info = relay
        .tether()
        .args(["info", &id, "--json"])
        .output()
        .unwrap();
    let described: Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(described["state"], "dead");
    assert!(String::from_utf8_lossy(&info.stderr).contains("dead"));
    let refused = relay.sh(&id, "true");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("dead") && stderr.contains(&format!("tether rm {id}")),
        "{stderr}"
    );

    let rm = relay.tether().args(["rm", &id]).output().unwrap();
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    let left = leftovers(&relay, &id);
    assert!(left.is_empty(), "the removed dead sandbox left: {left:?}");
    let listed = json(&relay, &["ls"]);
    assert!(listed.as_array().unwrap().iter().all(|s| s["id"] != id));
}

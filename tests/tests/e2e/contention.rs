//! Many local creates at once, each with its own disk on a loop device, all succeed: they
//! contend for the same free loop devices with each other and with another process on the
//! host that holds the next free device open exclusively (as a program probing or formatting
//! it does), and a create that loses a device takes another instead of failing. Deleting them
//! all leaves no loop device attached to their disks and nothing mounted. Root-only (loop
//! devices and mounts); skipped otherwise.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tether_e2e::{wait_within, Relay};

/// How long one `tether create` or `tether rm` may take under the whole burst before the
/// test fails instead of hanging (a create takes a fraction of a second alone; hundreds
/// share two cores here).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);
/// Each sandbox's disk and memory: the smallest the relay accepts for a disk, and a memory
/// limit the agent starts under, so hundreds fit on a small machine.
const SANDBOX_ARGS: [&str; 4] = ["--disk", "16M", "--memory", "64M"];

/// Runs `cmd` with its output captured; kills it and fails the test past [`COMMAND_TIMEOUT`].
fn run_within(mut cmd: Command, what: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_within(&mut child, COMMAND_TIMEOUT, &format!("`{what}`"));
    child.wait_with_output().unwrap()
}

/// Runs `count` commands made by `make` at once, one thread each; their outputs in order.
fn all_at_once(count: usize, what: &str, make: impl Fn(usize) -> Command + Sync) -> Vec<Output> {
    std::thread::scope(|scope| {
        let running: Vec<_> = (0..count)
            .map(|i| {
                let make = &make;
                scope.spawn(move || run_within(make(i), what))
            })
            .collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// The loop devices whose backing file is under `dir`, from sysfs (`/dev/loopN: FILE`).
fn loop_devices_under(dir: &Path) -> Vec<String> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|e| {
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            Path::new(backing.trim_end()).starts_with(&dir).then(|| {
                format!(
                    "{}: {}",
                    e.file_name().to_string_lossy(),
                    backing.trim_end()
                )
            })
        })
        .collect()
}

/// Opens the loop device the kernel hands out next exclusively, as another program on the
/// host would: the kernel keeps calling it free, but nothing else can bind it while it is held.
/// Other tests' creates bind devices meanwhile, so the one named free can be taken before it
/// is opened (EBUSY): then the next one is asked for, a bounded number of times.
fn hold_the_next_free_loop_device() -> File {
    let mut last = None;
    for _ in 0..100 {
        let free = Command::new("losetup").arg("-f").output().unwrap();
        let free = String::from_utf8(free.stdout).unwrap();
        match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_EXCL)
            .open(free.trim())
        {
            Ok(held) => return held,
            Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => last = Some(e),
            Err(e) => panic!("open {}: {e}", free.trim()),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no free loop device could be held in 100 tries: {last:?}");
}

/// Creates `count` sandboxes at once through one relay, asserts every create succeeded, then
/// deletes them all at once and asserts no loop device or mount of theirs is left.
fn creates_at_once(count: usize) {
    if !nix::unistd::geteuid().is_root() {
        return eprintln!("skipped: loop devices need root");
    }
    // One burst at a time: the device one burst holds stays "free" to the kernel, so a second
    // burst's holder would be handed it and refused for as long as the first one runs.
    static ONE_BURST: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _burst = ONE_BURST.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("policy.toml");
    std::fs::write(&config, format!("[defaults]\nmax_sandboxes = {count}\n")).unwrap();
    let relay = Relay::start_with(&["--config", config.to_str().unwrap()]);

    let held = hold_the_next_free_loop_device();
    let start = Instant::now();
    let made = all_at_once(count, "tether create", |_| {
        let mut cmd = relay.tether();
        cmd.arg("create").args(SANDBOX_ARGS);
        cmd
    });
    let created = start.elapsed();
    drop(held);
    let ids: Vec<String> = made
        .iter()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .collect();
    let failures: Vec<String> = made
        .iter()
        .filter(|o| !o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .collect();

    // Deleted before asserting, so a failure leaves nothing behind either.
    let start = Instant::now();
    let removed = all_at_once(ids.len(), "tether rm", |i| {
        let mut cmd = relay.tether();
        cmd.args(["rm", &ids[i]]);
        cmd
    });
    eprintln!(
        "{count} concurrent creates: {} failed, {created:?}; {} deletes: {:?}",
        failures.len(),
        ids.len(),
        start.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {count} concurrent creates failed; the first said: {}",
        failures.len(),
        failures[0]
    );
    for (id, out) in ids.iter().zip(&removed) {
        assert!(
            out.status.success(),
            "rm {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let local = relay.data_dir.join("local");
    let attached = loop_devices_under(&relay.data_dir);
    assert!(
        attached.is_empty(),
        "loop devices left attached: {attached:?}"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let local = std::fs::canonicalize(&local).unwrap_or(local);
    assert!(
        !mounts.contains(&*local.to_string_lossy()),
        "a mount under {} is left",
        local.display()
    );
    for id in &ids {
        assert!(!local.join(id).exists(), "{id}'s directory is left");
    }
}

#[test]
fn fifty_concurrent_creates_all_succeed_and_their_deletes_leave_no_loop_device() {
    creates_at_once(50);
}

// Run alone (`cargo test -p tether-e2e --test e2e -- --ignored contention::`): 200 full
// sandboxes at once pass on this 2-core machine by themselves (0 of 200 failed, 24 s), but
// beside the rest of the suite some pass the relay's own limits for a start (10 s) or a kill
// (5 s), which is load, not the loop-device contention this tests. CI runs 200 concurrent
// attaches through the same code in `provider::local::disk`'s unit test, and 50 creates here.
#[test]
#[ignore = "200 sandboxes at once beside the whole suite overload a 2-core machine; run alone"]
fn two_hundred_concurrent_creates_all_succeed_and_their_deletes_leave_no_loop_device() {
    creates_at_once(200);
}

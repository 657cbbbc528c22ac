//! The local sandbox really isolates: host files, host loopback services and host processes
//! are out of reach, writes outside /workspace and /tmp fail, a memory hog and a full /tmp die
//! alone, a full disk (bytes or inodes) gives ENOSPC and spares the host, delete leaves
//! nothing behind, and sandboxes survive a relay restart. A relay whose binary is replaced
//! under it keeps creating sandboxes, and signals the relay inherited ignored or blocked do
//! not reach sandboxed processes.

use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tether_e2e::signals::{self, NOHUP_SIGNALS};
use tether_e2e::{bin, wait_within, Relay};

/// How long a command may take in a sandbox that should still answer (a hung agent fails the
/// test instead of hanging it).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// Like [`sh`], but fails the test if the command has not finished within [`ANSWER_TIMEOUT`].
fn sh_answers(relay: &Relay, id: &str, script: &str) -> Output {
    let mut child = relay
        .tether()
        .args(["exec", id, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_within(
        &mut child,
        ANSWER_TIMEOUT,
        &format!("sandbox {id} answering `{script}`"),
    );
    child.wait_with_output().unwrap()
}

/// Whether this process holds CAP_SYS_RESOURCE, which lowering an OOM score takes.
fn may_lower_oom_scores() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    effective & (1 << CAP_SYS_RESOURCE) != 0
}

/// Bytes in use on the file system holding `path`, from df(1).
fn host_used_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=used"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().last().unwrap().trim().parse().unwrap()
}

/// Asserts that nothing of sandbox `id` is left: its directory, its cgroups, its processes,
/// its loop device and its mounts.
fn assert_nothing_left(relay: &Relay, id: &str) {
    let dir = relay.data_dir.join("local").join(id);
    assert!(!dir.exists(), "{} left behind", dir.display());
    for hierarchy in ["memory", "pids", "cpu", "unified", ""] {
        let cg = Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join("tether")
            .join(id);
        assert!(!cg.exists(), "cgroup {} left behind", cg.display());
    }
    let ps = std::process::Command::new("pgrep")
        .args(["-f", id])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ps.stdout).trim().is_empty(),
        "processes of {id} left behind"
    );
    assert_no_loop_device_or_mount_under(&dir);
}

fn rm(relay: &Relay, id: &str) {
    let rm = relay.tether().args(["rm", id]).output().unwrap();
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
}

#[test]
fn host_files_loopback_and_processes_are_out_of_reach() {
    let relay = Relay::start();
    let secret = format!("/root/tether-isolation-{}", std::process::id());
    std::fs::write(&secret, "host secret").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let id = relay.create(&[]);

    let read = relay.sh(&id, &format!("cat {secret}"));
    assert!(!read.status.success(), "read a host file from /root");
    assert!(!String::from_utf8_lossy(&read.stdout).contains("host secret"));

    // Python is on the host's /usr, visible read-only inside.
    let connect = relay.sh(&id,
        &format!(
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)'"
        ),
    );
    assert!(!connect.status.success(), "reached a host loopback port");

    let ps = relay.sh(&id, "ls /proc | grep -E '^[0-9]+$' | wc -l");
    let count: usize = String::from_utf8_lossy(&ps.stdout).trim().parse().unwrap();
    assert!(count < 10, "the sandbox sees {count} processes");
    let init = relay.sh(&id, "cat /proc/1/cmdline | tr '\\0' ' '");
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
        let w = relay.sh(&id, &format!("echo x > {path}"));
        assert!(!w.status.success(), "wrote {path}");
    }
    // The workspace, /tmp and HOME (a directory in the sandbox's /tmp) are writable.
    let ok = relay.sh(
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
fn a_memory_hog_and_a_full_tmp_die_alone_and_delete_leaves_nothing() {
    let relay = Relay::start();
    let id = relay.create(&["--memory", "64M"]);
    // Where the relay may lower OOM scores (CAP_SYS_RESOURCE), the agent is shielded and its
    // commands are not; elsewhere (some CI containers) only the agent's size protects it.
    if may_lower_oom_scores() {
        let scores = sh_answers(
            &relay,
            &id,
            "cat /proc/1/oom_score_adj /proc/self/oom_score_adj",
        );
        let scores = String::from_utf8_lossy(&scores.stdout).to_string();
        let scores: Vec<i32> = scores.lines().map(|l| l.trim().parse().unwrap()).collect();
        assert!(scores[0] <= -999, "the agent's OOM score is {}", scores[0]);
        assert_eq!(scores[1], 0, "a command's OOM score");
    }
    let hog = relay.sh(
        &id,
        "python3 -c 'x = bytearray(300 * 1024 * 1024); print(len(x))'",
    );
    assert!(
        !hog.status.success(),
        "a 300 MB allocation survived a 64 MB limit"
    );
    // The sandbox (and its agent) still answers.
    let after = sh_answers(&relay, &id, "echo alive");
    assert_eq!(String::from_utf8_lossy(&after.stdout), "alive\n");

    // /tmp is on the sandbox's disk, not in its memory: twice the memory limit fits, and
    // the agent lives on (on a tmpfs /tmp the OOM killer took the agent).
    let fill = sh_answers(
        &relay,
        &id,
        "dd if=/dev/zero of=/tmp/fill bs=1M count=128 2>&1 && stat -c %s /tmp/fill",
    );
    let after = sh_answers(&relay, &id, "echo alive");
    assert_eq!(
        String::from_utf8_lossy(&after.stdout),
        "alive\n",
        "the agent died with a full /tmp: {}",
        String::from_utf8_lossy(&after.stderr)
    );
    let fill_out = String::from_utf8_lossy(&fill.stdout);
    assert!(fill.status.success(), "{fill_out}");
    assert!(
        fill_out.ends_with(&format!("{}\n", 128 << 20)),
        "{fill_out}"
    );

    let dir = relay.data_dir.join("local").join(&id);
    assert!(
        dir.exists(),
        "{} missing while the sandbox runs",
        dir.display()
    );
    rm(&relay, &id);
    assert_nothing_left(&relay, &id);
}

#[test]
fn a_full_disk_gives_enospc_and_spares_the_host() {
    let relay = Relay::start();
    let id = relay.create(&["--disk", "64M"]);
    let image = relay.data_dir.join("local").join(&id).join("disk.img");
    let host_before = host_used_bytes(&relay.data_dir);

    // /workspace and /tmp share the disk: a GiB fits in neither.
    for dir in ["/workspace", "/tmp"] {
        let dd = sh_answers(
            &relay,
            &id,
            &format!("dd if=/dev/zero of={dir}/fill bs=1M count=1024"),
        );
        let err = String::from_utf8_lossy(&dd.stderr);
        assert!(!dd.status.success(), "1 GiB landed in {dir}: {err}");
        assert!(err.contains("No space left on device"), "{dir}: {err}");
        let size = sh_answers(
            &relay,
            &id,
            &format!("stat -c %s {dir}/fill; rm {dir}/fill"),
        );
        let size: u64 = String::from_utf8_lossy(&size.stdout)
            .trim()
            .parse()
            .unwrap();
        assert!(size <= 64 << 20, "{size} bytes in {dir}");
    }
    // What the sandbox wrote took at most its quota from the host (the image is sparse), and
    // the host's file system did not take the GiB (other writers share it: a wide margin).
    let allocated = std::fs::metadata(&image).unwrap().blocks() * 512;
    assert!(
        allocated <= 68 << 20,
        "the disk image holds {allocated} bytes"
    );
    let grown = host_used_bytes(&relay.data_dir).saturating_sub(host_before);
    assert!(
        grown < 512 << 20,
        "the host's file system grew by {grown} bytes"
    );

    // The agent lives off that disk and keeps answering; the space comes back.
    let after = sh_answers(
        &relay,
        &id,
        "echo alive > /workspace/ok && cat /workspace/ok",
    );
    assert_eq!(String::from_utf8_lossy(&after.stdout), "alive\n");
    let df = sh_answers(&relay, &id, "df -k /workspace /tmp | tail -n +2");
    let df = String::from_utf8_lossy(&df.stdout).to_string();
    for line in df.lines() {
        let size_kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(size_kib <= 64 << 10, "{df}");
    }

    rm(&relay, &id);
    assert_nothing_left(&relay, &id);
    assert!(!image.exists());
}

#[test]
fn many_small_files_hit_the_inode_quota() {
    let relay = Relay::start();
    // 64 MiB holds 4096 files.
    let id = relay.create(&["--disk", "64M"]);
    let fill = sh_answers(
        &relay,
        &id,
        "cd /workspace && i=0; while [ $i -lt 10000 ]; do printf '' > f$i || exit 3; i=$((i+1)); done",
    );
    let err = String::from_utf8_lossy(&fill.stderr);
    assert_eq!(fill.status.code(), Some(3), "10,000 files fit: {err}");
    assert!(err.contains("No space left on device"), "{err}");
    // Inodes ran out, not bytes.
    let state = sh_answers(
        &relay,
        &id,
        "ls /workspace | wc -l; df -k --output=avail /workspace | tail -1",
    );
    let state = String::from_utf8_lossy(&state.stdout).to_string();
    let mut numbers = state.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    let (files, free_kib) = (numbers.next().unwrap(), numbers.next().unwrap());
    assert!(files < 4096 && files > 3000, "{files} files");
    assert!(free_kib > 32 << 10, "only {free_kib} KiB free: {state}");
    // Deleting gives the inodes back.
    let again = sh_answers(&relay, &id, "rm -f /workspace/f* && : > /workspace/again");
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    rm(&relay, &id);
    assert_nothing_left(&relay, &id);
}

#[test]
fn a_failed_create_leaves_no_disk_behind() {
    // An image whose /workspace is a file: the sandbox init fails after the disk is mounted.
    // Host directories are images only under an image root (and for admins).
    let images = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(images.path()).unwrap();
    let image = root.join("broken");
    std::fs::create_dir(&image).unwrap();
    std::fs::write(image.join("workspace"), "not a directory").unwrap();
    let relay = Relay::start_with(&["--image-root", root.to_str().unwrap()]);
    let out = relay
        .tether()
        .args(["create", "--disk", "32M", "--image"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a broken image started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("image root"),
        "refused before the disk was made: {err}"
    );

    let local = relay.data_dir.join("local");
    let left: Vec<String> = std::fs::read_dir(&local)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "disks")
        .collect();
    assert!(left.is_empty(), "left in {}: {left:?}", local.display());
    assert_no_loop_device_or_mount_under(&local);
}

/// No loop device is backed by a file under `dir`, and nothing is mounted under it.
fn assert_no_loop_device_or_mount_under(dir: &Path) {
    let losetup = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .unwrap();
    let loops = String::from_utf8_lossy(&losetup.stdout);
    assert!(
        !loops.contains(&*dir.to_string_lossy()),
        "a loop device under {} is left: {loops}",
        dir.display()
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*dir.to_string_lossy()),
        "a mount under {} is left",
        dir.display()
    );
}

#[test]
fn sandboxes_survive_a_relay_restart() {
    let mut relay = Relay::start();
    let id = relay.create(&[]);
    let w = relay.sh(&id, "echo kept > /workspace/f");
    assert!(w.status.success());
    relay.restart();
    let r = relay.sh(&id, "cat /workspace/f");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(String::from_utf8_lossy(&r.stdout), "kept\n");
}

/// Copies the `tether` binary to `path`, executable, as an installer would.
fn install_tether(path: &std::path::Path) {
    std::fs::copy(bin("tether"), path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn assert_sandbox_works(relay: &Relay) {
    let id = relay.create(&[]);
    let out = relay.sh(&id, "echo works in $(hostname)");
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

    let id = relay.create(&[]);
    // A command starts with nothing ignored and nothing blocked, as the operator
    // checks it.
    let out = relay.sh(&id, "cat /proc/self/status");
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("\nSigIgn:\t0000000000000000\n"), "{status}");
    assert!(status.contains("\nSigBlk:\t0000000000000000\n"), "{status}");
    // So does the agent (PID 1; it ignores only SIGPIPE, as every Rust program does).
    let out = relay.sh(&id, "cat /proc/1/status");
    let agent = String::from_utf8_lossy(&out.stdout);
    let ignored = signals::status_field(&agent, "SigIgn").unwrap();
    assert_eq!(
        ignored & inherited,
        0,
        "the agent inherited ignored signals:\n{agent}"
    );
    assert_eq!(signals::status_field(&agent, "SigBlk"), Some(0), "{agent}");

    // A hangup ends a sleep: were HUP still ignored, it would sleep its 30 s and exit 0.
    let hup = relay.sh(
        &id,
        "sleep 30 & pid=$!; kill -HUP $pid; wait $pid; echo status=$?",
    );
    assert_eq!(String::from_utf8_lossy(&hup.stdout), "status=129\n");
}

#[test]
fn a_deleted_sandboxs_disk_is_not_held_by_sandboxes_made_after_it() {
    let relay = Relay::start();
    let first = relay.create(&["--disk", "32M"]);
    // Made while the first one's disk is mounted: nothing of it may hold that disk.
    let second = relay.create(&["--disk", "32M"]);
    rm(&relay, &first);
    let image = relay.data_dir.join("local").join(&first).join("disk.img");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let losetup = std::process::Command::new("losetup")
            .arg("-a")
            .output()
            .unwrap();
        let loops = String::from_utf8_lossy(&losetup.stdout).into_owned();
        if !loops.contains(&*image.to_string_lossy()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the deleted sandbox's loop device is still attached: {loops}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        String::from_utf8_lossy(&relay.sh(&second, "echo alive").stdout),
        "alive\n"
    );
}

/// A write the sandbox's read-only root refuses is `permission_denied` (not an internal
/// error), naming the path and where the sandbox can write instead.
#[tokio::test]
async fn a_write_to_a_read_only_path_says_where_the_sandbox_can_write() {
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let session = client.connect(&id).await.unwrap();
    for path in ["/usr/tether-x", "/home/user/input/data.csv"] {
        let err = session.write_file(path, b"x").await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(tether_proto::ErrorCode::PermissionDenied),
            "{path}: {err}"
        );
        let said = err.to_string();
        assert!(said.contains("read-only file system"), "{said}");
        assert!(
            said.contains("/workspace") && said.contains("/tmp"),
            "{said}"
        );
    }
    session.write_file("/workspace/ok", b"x").await.unwrap();
}

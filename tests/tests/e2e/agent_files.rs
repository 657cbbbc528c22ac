//! File operations end to end: the real agent binary, driven through the client library.
//!
//! Every file operation and the error codes each can produce; atomic writes under a
//! concurrent reader, a cancel and a lost connection; batches; a tar round trip; watch
//! events. The agent runs on this machine, so tests check its work directly on disk.
//! The tests run as root, for whom mode bits grant everything; `permission_denied` is
//! provoked with what root may not do either: unlink a procfs entry, touch a `chattr +i` file.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tether_client::{ClientError, Event, RawStream, Session};
use tether_e2e::{eventually, Agent};
use tether_proto::op::{BatchFile, FileKind, GrepSpec, IfExists, Op, Reply, WatchEvent, WriteSpec};
use tether_proto::{Channel, ErrorCode, WirePath};

const WAIT: Duration = Duration::from_secs(10);

/// The wire code of a failed call.
fn code<T: std::fmt::Debug>(result: Result<T, ClientError>) -> ErrorCode {
    match result {
        Err(e) => e
            .code()
            .unwrap_or_else(|| panic!("expected an agent error, got {e:?}")),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn message<T: std::fmt::Debug>(result: Result<T, ClientError>) -> String {
    result.expect_err("expected an error").to_string()
}

/// Everything a stream delivered until `closed`.
#[derive(Debug, Default)]
struct Drained {
    replies: Vec<Reply>,
    out: Vec<u8>,
    eof: bool,
    error: Option<ClientError>,
}

async fn drain(stream: &mut RawStream) -> Drained {
    let mut d = Drained::default();
    loop {
        let event = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("stream ended in time");
        match event {
            Some(Event::Reply(r)) => d.replies.push(r),
            Some(Event::Data(Channel::Out, bytes)) => d.out.extend_from_slice(&bytes),
            Some(Event::Eof(Channel::Out)) => d.eof = true,
            Some(Event::Error(e)) => d.error = Some(e),
            Some(Event::Closed) | None => return d,
            Some(_) => {}
        }
    }
}

async fn upload(session: &Session, op: Op, data: &[u8]) -> Result<Reply, ClientError> {
    session.upload(op, data, |_| {}).await
}

async fn download(session: &Session, op: Op) -> Result<Vec<u8>, ClientError> {
    let mut out = Vec::new();
    session.download(op, &mut out, |_| {}).await?;
    Ok(out)
}

fn write_op(path: &str, mode: Option<u32>, create_parents: bool, if_exists: IfExists) -> Op {
    Op::Write(WriteSpec {
        path: path.into(),
        mode,
        create_parents,
        if_exists,
    })
}

fn s(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn w(path: &Path) -> WirePath {
    WirePath::from(path)
}

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// Names of the temp files a write leaves in `dir` while it runs.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".tether-"))
        .collect()
}

#[tokio::test]
async fn write_then_read_back_with_ranges() {
    let agent = Agent::start();
    let session = agent.session().await;
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();

    // Relative paths resolve against the agent's working directory.
    assert_eq!(
        session.write_file("sub/dir/data.bin", &data).await.unwrap(),
        data.len() as u64
    );
    let on_disk = agent.dir.path().join("sub/dir/data.bin");
    assert_eq!(fs::read(&on_disk).unwrap(), data);
    assert_eq!(mode_of(&on_disk), 0o644);
    assert_eq!(session.read_file("sub/dir/data.bin").await.unwrap(), data);

    // `stat` comes first, then the range, then eof.
    let op = Op::Read {
        path: w(&on_disk),
        offset: 10,
        len: Some(100),
    };
    let d = drain(&mut session.open(op).await.unwrap()).await;
    match &d.replies[..] {
        [Reply::Stat(st)] => {
            assert_eq!(st.size, data.len() as u64);
            assert_eq!(st.kind, FileKind::File);
        }
        other => panic!("expected one stat reply, got {other:?}"),
    }
    assert_eq!(d.out, &data[10..110]);
    assert!(d.eof && d.error.is_none());

    let past_end = Op::Read {
        path: w(&on_disk),
        offset: 1 << 40,
        len: None,
    };
    assert!(download(&session, past_end).await.unwrap().is_empty());

    session.write_file("empty", b"").await.unwrap();
    assert!(session.read_file("empty").await.unwrap().is_empty());

    assert_eq!(
        code(session.read_file("missing").await),
        ErrorCode::NotFound
    );
    let msg = message(session.read_file("missing").await);
    assert!(
        msg.contains(&s(&agent.dir.path().join("missing"))) && msg.contains("No such file"),
        "{msg}"
    );
    assert_eq!(code(session.read_file("sub").await), ErrorCode::IsDirectory);
    assert_eq!(code(session.read_file("").await), ErrorCode::InvalidPath);
    assert_eq!(code(session.stat("a\0b").await), ErrorCode::InvalidPath);
}

#[tokio::test]
async fn write_modes_conflicts_and_appends() {
    let agent = Agent::start();
    let session = agent.session().await;
    let dir = agent.dir.path();

    let op = write_op("new.sh", Some(0o751), false, IfExists::Overwrite);
    upload(&session, op, b"#!/bin/sh\n").await.unwrap();
    assert_eq!(mode_of(&dir.join("new.sh")), 0o751);
    // A replaced file keeps its mode.
    fs::set_permissions(dir.join("new.sh"), fs::Permissions::from_mode(0o700)).unwrap();
    session.write_file("new.sh", b"echo hi\n").await.unwrap();
    assert_eq!(mode_of(&dir.join("new.sh")), 0o700);

    let op = write_op("new.sh", None, false, IfExists::Fail);
    assert_eq!(
        code(upload(&session, op, b"clobber").await),
        ErrorCode::AlreadyExists
    );
    assert_eq!(fs::read(dir.join("new.sh")).unwrap(), b"echo hi\n");
    let op = write_op("fresh", None, false, IfExists::Fail);
    upload(&session, op, b"first").await.unwrap();

    fs::write(dir.join("log"), "hello").unwrap();
    let op = write_op("log", None, false, IfExists::Append);
    match upload(&session, op, b" world").await.unwrap() {
        Reply::Written { bytes } => assert_eq!(bytes, 6),
        other => panic!("{other:?}"),
    }
    assert_eq!(fs::read(dir.join("log")).unwrap(), b"hello world");
    let op = write_op("new-log", Some(0o600), false, IfExists::Append);
    upload(&session, op, b"x").await.unwrap();
    assert_eq!(mode_of(&dir.join("new-log")), 0o600);

    let op = write_op("no/such/dir/f", None, false, IfExists::Overwrite);
    let err = upload(&session, op, b"x").await;
    let msg = format!("{err:?}");
    assert_eq!(code(err), ErrorCode::NotFound);
    assert!(
        msg.contains("no/such/dir") && msg.contains("create_parents"),
        "{msg}"
    );

    fs::create_dir(dir.join("adir")).unwrap();
    let op = write_op("adir", None, false, IfExists::Overwrite);
    assert_eq!(
        code(upload(&session, op, b"x").await),
        ErrorCode::IsDirectory
    );
    let op = write_op("log/child", None, true, IfExists::Overwrite);
    assert_eq!(
        code(upload(&session, op, b"x").await),
        ErrorCode::NotADirectory
    );
    let op = write_op("", None, false, IfExists::Overwrite);
    assert_eq!(
        code(upload(&session, op, b"x").await),
        ErrorCode::InvalidPath
    );
    assert!(temp_files(dir).is_empty());
}

#[tokio::test]
async fn a_concurrent_reader_never_sees_a_partial_write() {
    const SIZE: usize = 8 << 20;
    let agent = Agent::start();
    let session = agent.session().await;
    let target = agent.dir.path().join("atomic.bin");
    fs::write(&target, vec![b'a'; SIZE]).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, reads, target) = (stop.clone(), reads.clone(), target.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let data = fs::read(&target).unwrap();
                assert_eq!(data.len(), SIZE, "a reader saw a partial file");
                let first = data[0];
                assert!(
                    data.iter().all(|&b| b == first),
                    "a reader saw mixed content"
                );
                reads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let op = write_op(&s(&target), None, false, IfExists::Overwrite);
    let mut stream = session.open(op).await.unwrap();
    let new = vec![b'b'; SIZE];
    stream.send(&new[..SIZE / 2]).await.unwrap();
    // Half the bytes are in the temp file, and the target is still the old file.
    eventually(WAIT, "half the upload in the temp file", || {
        temp_files(agent.dir.path())
            .iter()
            .any(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0) >= (SIZE / 2) as u64)
            .then_some(())
    })
    .await;
    assert!(fs::read(&target).unwrap().iter().all(|&b| b == b'a'));
    stream.send(&new[SIZE / 2..]).await.unwrap();
    stream.eof().await.unwrap();
    let d = drain(&mut stream).await;
    assert!(d.error.is_none(), "{:?}", d.error);
    assert_eq!(d.replies, [Reply::Written { bytes: SIZE as u64 }]);

    stop.store(true, Ordering::Relaxed);
    reader.join().expect("the reader saw only whole files");
    assert!(reads.load(Ordering::Relaxed) > 0);
    assert!(fs::read(&target).unwrap().iter().all(|&b| b == b'b'));
    assert!(temp_files(agent.dir.path()).is_empty());
}

#[tokio::test]
async fn a_cancelled_or_abandoned_write_leaves_the_target_untouched() {
    let agent = Agent::start();
    let dir = agent.dir.path();
    let target = dir.join("keep.txt");
    fs::write(&target, "original").unwrap();
    let chunk = vec![b'x'; 1 << 20];

    let session = agent.session().await;
    let mut stream = session
        .open(write_op(&s(&target), None, false, IfExists::Overwrite))
        .await
        .unwrap();
    stream.send(&chunk).await.unwrap();
    eventually(WAIT, "the temp file", || {
        (!temp_files(dir).is_empty()).then_some(())
    })
    .await;
    stream.cancel().await.unwrap();
    let d = drain(&mut stream).await;
    assert!(d.replies.is_empty() && d.error.is_none(), "{d:?}");
    // `closed` comes after the cleanup.
    assert!(temp_files(dir).is_empty());
    assert_eq!(fs::read(&target).unwrap(), b"original");

    // The connection goes away mid-upload.
    let session = agent.session().await;
    let stream = session
        .open(write_op(&s(&target), None, false, IfExists::Overwrite))
        .await
        .unwrap();
    stream.send(&chunk).await.unwrap();
    eventually(WAIT, "the temp file", || {
        (!temp_files(dir).is_empty()).then_some(())
    })
    .await;
    drop(stream);
    drop(session);
    eventually(WAIT, "the temp file's removal", || {
        temp_files(dir).is_empty().then_some(())
    })
    .await;
    assert_eq!(fs::read(&target).unwrap(), b"original");
}

#[tokio::test]
async fn stat_list_mkdir_remove_rename_chmod() {
    let agent = Agent::start();
    let session = agent.session().await;
    let dir = agent.dir.path();

    session.mkdir("a/b/c").await.unwrap();
    session.mkdir("a/b/c").await.unwrap();
    let op = Op::Mkdir {
        path: "private".into(),
        mode: Some(0o700),
    };
    session.request(op).await.unwrap();
    assert_eq!(mode_of(&dir.join("private")), 0o700);
    fs::write(dir.join("a/file"), "12345").unwrap();
    std::os::unix::fs::symlink("a/file", dir.join("link")).unwrap();
    assert_eq!(
        code(session.mkdir("a/file").await),
        ErrorCode::AlreadyExists
    );
    assert_eq!(
        code(session.mkdir("a/file/sub").await),
        ErrorCode::AlreadyExists
    );

    let st = session.stat("link").await.unwrap();
    assert_eq!(
        (st.kind, st.target.as_ref().map(|t| t.to_string())),
        (FileKind::Symlink, Some("a/file".to_string()))
    );
    assert_eq!(st.path, "link");
    let st = session.stat(&s(&dir.join("a/file"))).await.unwrap();
    assert_eq!((st.kind, st.size, st.mode), (FileKind::File, 5, 0o644));
    assert_eq!(code(session.stat("nope").await), ErrorCode::NotFound);

    let names = |entries: Vec<tether_proto::op::FileStat>| -> Vec<String> {
        let mut v: Vec<String> = entries.into_iter().map(|e| e.path.to_string()).collect();
        v.sort();
        v
    };
    let root = s(dir);
    assert_eq!(
        names(session.list(&root, 1).await.unwrap()),
        ["a", "link", "private"]
    );
    assert_eq!(
        names(session.list(&root, 0).await.unwrap()),
        ["a", "link", "private"]
    );
    assert_eq!(
        names(session.list("a", 5).await.unwrap()),
        ["b", "b/c", "file"]
    );
    assert_eq!(
        code(session.list("a/file", 1).await),
        ErrorCode::NotADirectory
    );
    assert_eq!(code(session.list("nope", 1).await), ErrorCode::NotFound);

    session.chmod("a/file", 0o600).await.unwrap();
    assert_eq!(mode_of(&dir.join("a/file")), 0o600);
    assert_eq!(
        code(session.chmod("nope", 0o600).await),
        ErrorCode::NotFound
    );

    fs::write(dir.join("other"), "other").unwrap();
    assert_eq!(
        code(session.rename("a/file", "other", false).await),
        ErrorCode::AlreadyExists
    );
    session.rename("a/file", "other", true).await.unwrap();
    assert_eq!(fs::read(dir.join("other")).unwrap(), b"12345");
    session.rename("other", "moved", false).await.unwrap();
    assert_eq!(
        code(session.rename("nope", "x", false).await),
        ErrorCode::NotFound
    );
    fs::write(dir.join("a/b/c/f"), "x").unwrap();
    assert_eq!(
        code(session.rename("private", "a/b", true).await),
        ErrorCode::AlreadyExists
    );
    assert_eq!(
        code(session.rename("moved", "a", true).await),
        ErrorCode::IsDirectory
    );
    assert_eq!(
        code(session.rename("a", "moved", true).await),
        ErrorCode::NotADirectory
    );

    // A recursive remove deletes symlinks, not what they point to.
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("precious"), "keep").unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.join("a/b/out")).unwrap();
    assert_eq!(
        code(session.remove("a", false).await),
        ErrorCode::AlreadyExists
    );
    session.remove("a", true).await.unwrap();
    assert!(!dir.join("a").exists());
    assert!(outside.path().join("precious").exists());
    session.remove("link", false).await.unwrap();
    session.remove("private", false).await.unwrap();
    assert_eq!(
        code(session.remove("nope", false).await),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(session.remove("", false).await),
        ErrorCode::InvalidPath
    );
}

/// Runs `chattr -i` on drop, so the temp dir can be removed even if the test fails.
struct Immutable(PathBuf);

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

#[tokio::test]
async fn permission_denied_where_even_root_is_refused() {
    let agent = Agent::start();
    let session = agent.session().await;
    assert_eq!(
        code(session.remove("/proc/version", false).await),
        ErrorCode::PermissionDenied
    );

    let locked = agent.dir.path().join("locked");
    fs::write(&locked, "frozen").unwrap();
    let chattr = tether_e2e::require::command("chattr")
        .arg("+i")
        .arg(&locked)
        .output()
        .expect("run chattr");
    let _guard = Immutable(locked.clone());
    assert!(
        chattr.status.success(),
        "chattr +i {} failed (it needs root, and a temporary directory on a file system with \
         immutable files, such as ext4: set TMPDIR to one): {}",
        locked.display(),
        String::from_utf8_lossy(&chattr.stderr).trim()
    );
    let path = s(&locked);
    assert_eq!(
        code(session.write_file(&path, b"thaw").await),
        ErrorCode::PermissionDenied
    );
    let append = write_op(&path, None, false, IfExists::Append);
    assert_eq!(
        code(upload(&session, append, b"more").await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(session.remove(&path, false).await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(session.chmod(&path, 0o600).await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(
        code(session.edit(&path, "frozen", "thawed", false).await),
        ErrorCode::PermissionDenied
    );
    assert_eq!(fs::read(&locked).unwrap(), b"frozen");
    assert!(temp_files(agent.dir.path()).is_empty());
}

#[tokio::test]
async fn a_listing_larger_than_one_reply_is_too_large() {
    let agent = Agent::start();
    let session = agent.session().await;
    let big = agent.dir.path().join("big");
    fs::create_dir(&big).unwrap();
    for i in 0..12_000 {
        fs::write(
            big.join(format!("a-rather-long-file-name-to-fill-the-reply-{i:06}")),
            "",
        )
        .unwrap();
    }
    let err = session.list("big", 1).await;
    let msg = format!("{err:?}");
    assert_eq!(code(err), ErrorCode::TooLarge);
    assert!(msg.contains("depth"), "{msg}");
}

#[tokio::test]
async fn glob_grep_and_edit() {
    let agent = Agent::start();
    let session = agent.session().await;
    let dir = agent.dir.path();
    fs::create_dir_all(dir.join("src/app")).unwrap();
    fs::write(dir.join("src/main.rs"), "fn main() {\n    hello();\n}\n").unwrap();
    fs::write(dir.join("src/app/lib.rs"), "// Hello\npub fn hello() {}\n").unwrap();
    fs::write(dir.join("notes.md"), "hello there\n").unwrap();
    fs::write(dir.join("blob"), b"hello\0\xff").unwrap();

    let (paths, truncated) = session.glob(&s(dir), "src/**/*.rs").await.unwrap();
    assert_eq!(paths, ["src/app/lib.rs", "src/main.rs"]);
    assert!(!truncated);
    let limited = Op::Glob {
        root: w(dir),
        pattern: "**".into(),
        limit: Some(2),
    };
    match session.request(limited).await.unwrap() {
        Reply::Paths { paths, truncated } => assert!(paths.len() == 2 && truncated),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        code(session.glob(&s(dir), "src/[").await),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(session.glob("notes.md", "*").await),
        ErrorCode::NotADirectory
    );
    assert_eq!(code(session.glob("nope", "*").await), ErrorCode::NotFound);

    let grep = |pattern: &str| GrepSpec {
        path: w(dir),
        pattern: pattern.into(),
        regex: false,
        ignore_case: false,
        glob: None,
        limit: None,
    };
    let (matches, _) = session.grep(grep("hello")).await.unwrap();
    let found: Vec<String> = matches
        .iter()
        .map(|m| format!("{}:{}", m.path, m.line))
        .collect();
    assert_eq!(found, ["notes.md:1", "src/app/lib.rs:2", "src/main.rs:2"]);
    assert_eq!(matches[2].text, "    hello();");
    let spec = GrepSpec {
        regex: true,
        ignore_case: true,
        glob: Some("*.rs".into()),
        ..grep(r"^//\s+hello$")
    };
    let (matches, _) = session.grep(spec).await.unwrap();
    assert_eq!(matches.len(), 1);
    assert_eq!(
        (matches[0].path.to_string().as_str(), matches[0].line),
        ("src/app/lib.rs", 1)
    );
    let spec = GrepSpec {
        limit: Some(1),
        ..grep("hello")
    };
    let (matches, truncated) = session.grep(spec).await.unwrap();
    assert!(matches.len() == 1 && truncated);
    let bad = GrepSpec {
        regex: true,
        ..grep("(unclosed")
    };
    assert_eq!(code(session.grep(bad).await), ErrorCode::InvalidArgument);
    let missing = GrepSpec {
        path: "nope".into(),
        ..grep("x")
    };
    assert_eq!(code(session.grep(missing).await), ErrorCode::NotFound);

    let main = s(&dir.join("src/main.rs"));
    fs::set_permissions(dir.join("src/main.rs"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(
        session
            .edit(&main, "hello();", "world();", false)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        fs::read_to_string(dir.join("src/main.rs")).unwrap(),
        "fn main() {\n    world();\n}\n"
    );
    assert_eq!(mode_of(&dir.join("src/main.rs")), 0o755);
    fs::write(dir.join("twice"), "x x").unwrap();
    let err = session.edit("twice", "x", "y", false).await;
    let msg = format!("{err:?}");
    assert_eq!(code(err), ErrorCode::InvalidArgument);
    assert!(msg.contains('2'), "{msg}");
    assert_eq!(session.edit("twice", "x", "y", true).await.unwrap(), 2);
    assert_eq!(
        code(session.edit("twice", "zzz", "y", false).await),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(session.edit("twice", "", "y", false).await),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(session.edit("blob", "hello", "y", false).await),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(session.edit("nope", "a", "b", false).await),
        ErrorCode::NotFound
    );
    assert_eq!(
        code(session.edit("src", "a", "b", false).await),
        ErrorCode::IsDirectory
    );
    assert!(temp_files(dir).is_empty());
}

fn batch_file(path: &str, size: usize, mode: Option<u32>) -> BatchFile {
    BatchFile {
        path: path.into(),
        size: size as u64,
        mode,
    }
}

#[tokio::test]
async fn write_batch_and_read_batch_with_partial_success() {
    let agent = Agent::start();
    let session = agent.session().await;
    let dir = agent.dir.path();
    fs::write(dir.join("plain"), "i am a file").unwrap();

    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 7) as u8).collect();
    let files = vec![
        batch_file("one/a.txt", 5, None),
        batch_file("plain/child", 3, None),
        batch_file("big.bin", big.len(), Some(0o600)),
        batch_file("", 2, None),
        batch_file("empty", 0, None),
    ];
    let mut data = b"helloxyz".to_vec();
    data.extend_from_slice(&big);
    data.extend_from_slice(b"zz");
    let results = match upload(&session, Op::WriteBatch { files }, &data)
        .await
        .unwrap()
    {
        Reply::Batch { results } => results,
        other => panic!("{other:?}"),
    };
    let summary: Vec<(Option<u64>, Option<ErrorCode>)> =
        results.iter().map(|r| (r.size, r.error)).collect();
    assert_eq!(
        summary,
        [
            (Some(5), None),
            (None, Some(ErrorCode::NotADirectory)),
            (Some(big.len() as u64), None),
            (None, Some(ErrorCode::InvalidPath)),
            (Some(0), None),
        ]
    );
    assert_eq!(fs::read(dir.join("one/a.txt")).unwrap(), b"hello");
    assert_eq!(fs::read(dir.join("big.bin")).unwrap(), big);
    assert_eq!(mode_of(&dir.join("big.bin")), 0o600);
    assert!(dir.join("empty").exists());

    // An upload that ends early fails the files it did not complete, and only them.
    let files = vec![
        batch_file("short/ok", 2, None),
        batch_file("short/cut", 10, None),
    ];
    let results = match upload(&session, Op::WriteBatch { files }, b"okcut")
        .await
        .unwrap()
    {
        Reply::Batch { results } => results,
        other => panic!("{other:?}"),
    };
    assert_eq!(results[0].size, Some(2));
    assert_eq!(results[1].error, Some(ErrorCode::InvalidArgument));
    assert!(!dir.join("short/cut").exists());
    // More bytes than declared is a broken upload.
    let files = vec![batch_file("extra", 1, None)];
    assert_eq!(
        code(upload(&session, Op::WriteBatch { files }, b"abc").await),
        ErrorCode::InvalidArgument
    );
    assert!(temp_files(dir).is_empty() && temp_files(&dir.join("short")).is_empty());

    let paths = ["one/a.txt", "missing", "one", "big.bin"]
        .map(WirePath::from)
        .to_vec();
    let mut stream = session.open(Op::ReadBatch { paths }).await.unwrap();
    let d = drain(&mut stream).await;
    let results = match &d.replies[..] {
        [Reply::Batch { results }] => results,
        other => panic!("{other:?}"),
    };
    let summary: Vec<(Option<u64>, Option<ErrorCode>)> =
        results.iter().map(|r| (r.size, r.error)).collect();
    assert_eq!(
        summary,
        [
            (Some(5), None),
            (None, Some(ErrorCode::NotFound)),
            (None, Some(ErrorCode::IsDirectory)),
            (Some(big.len() as u64), None),
        ]
    );
    let mut expected = b"hello".to_vec();
    expected.extend_from_slice(&big);
    assert_eq!(d.out, expected);
    assert!(d.eof && d.error.is_none());
}

#[tokio::test]
async fn read_batch_fails_when_a_file_shrinks_before_it_is_sent() {
    let agent = Agent::start();
    let session = agent.session().await;
    let dir = agent.dir.path();
    fs::write(dir.join("first"), vec![1u8; 4 << 20]).unwrap();
    fs::write(dir.join("second"), vec![2u8; 1000]).unwrap();
    // A small window holds the agent back inside the first file until the second shrinks.
    let paths = vec![WirePath::from("first"), WirePath::from("second")];
    let mut stream = session
        .open_with_window(Op::ReadBatch { paths }, 64 << 10)
        .await
        .unwrap();
    match stream.next().await {
        Some(Event::Reply(Reply::Batch { results })) => assert_eq!(results[1].size, Some(1000)),
        other => panic!("{other:?}"),
    }
    fs::write(dir.join("second"), b"short").unwrap();
    let d = drain(&mut stream).await;
    let err = d
        .error
        .expect("the stream fails instead of sending a misaligned download");
    assert_eq!(err.code(), Some(ErrorCode::Internal));
    assert!(err.to_string().contains("changed size"), "{err}");
    assert!(!d.eof);
}

/// A ustar header and data for one entry, to craft archives the agent must treat with care.
fn tar_entry(name: &str, kind: u8, link: &str, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

/// Every entry under `root`: relative path, kind, mode, mtime, and content or link target.
fn snapshot(root: &Path) -> Vec<(String, String, u32, i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let rel = s(path.strip_prefix(root).unwrap());
            let (kind, body) = if meta.file_type().is_symlink() {
                ("link", s(&fs::read_link(&path).unwrap()).into_bytes())
            } else if meta.is_dir() {
                stack.push(path.clone());
                ("dir", Vec::new())
            } else {
                ("file", fs::read(&path).unwrap())
            };
            let mtime = if kind == "link" { 0 } else { meta.mtime() };
            out.push((rel, kind.to_string(), meta.mode() & 0o7777, mtime, body));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn tar_round_trip_keeps_symlinks_modes_empty_dirs_and_mtimes() {
    let agent = Agent::start();
    let session = agent.session().await;
    let src = agent.dir.path().join("src");
    fs::create_dir_all(src.join("empty")).unwrap();
    fs::create_dir_all(src.join("nested/deeper")).unwrap();
    fs::create_dir_all(src.join("skipme/inner")).unwrap();
    fs::write(src.join("nested/deeper/data.bin"), vec![7u8; 700_000]).unwrap();
    fs::write(src.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::write(src.join("secret"), "s").unwrap();
    fs::write(src.join("nested/debug.log"), "noise").unwrap();
    fs::write(src.join("skipme/inner/f"), "x").unwrap();
    fs::set_permissions(src.join("run.sh"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::set_permissions(src.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(src.join("nested/deeper"), fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink("run.sh", src.join("relative-link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", src.join("absolute-link")).unwrap();
    std::os::unix::fs::symlink("nowhere", src.join("dangling")).unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let file = fs::File::options()
        .write(true)
        .open(src.join("secret"))
        .unwrap();
    file.set_modified(old).unwrap();
    drop(file);

    let archive = download(
        &session,
        Op::TarRead {
            path: w(&src),
            exclude: vec!["skipme".into(), "*.log".into()],
        },
    )
    .await
    .unwrap();
    let dst = agent.dir.path().join("dst");
    let op = Op::TarWrite {
        path: w(&dst),
        gzip: false,
    };
    assert_eq!(upload(&session, op, &archive).await.unwrap(), Reply::Ok);

    let mut expected = snapshot(&src);
    expected.retain(|(rel, ..)| !rel.starts_with("skipme") && !rel.ends_with(".log"));
    assert_eq!(snapshot(&dst), expected);
    assert!(expected.iter().any(|(rel, ..)| rel == "empty"));
    assert_eq!(
        fs::metadata(dst.join("secret")).unwrap().mtime(),
        1_000_000_000
    );

    // The same archive, gzip-compressed, unpacks the same.
    let gz_path = agent.dir.path().join("a.tar.gz");
    fs::write(agent.dir.path().join("a.tar"), &archive).unwrap();
    let gz = Command::new("gzip")
        .arg("-c")
        .arg(agent.dir.path().join("a.tar"))
        .output()
        .unwrap();
    fs::write(&gz_path, &gz.stdout).unwrap();
    let dst_gz = agent.dir.path().join("dst-gz");
    let op = Op::TarWrite {
        path: w(&dst_gz),
        gzip: true,
    };
    assert_eq!(upload(&session, op, &gz.stdout).await.unwrap(), Reply::Ok);
    assert_eq!(snapshot(&dst_gz), expected);

    // A single file archives under its name.
    let one = download(
        &session,
        Op::TarRead {
            path: w(&src.join("run.sh")),
            exclude: vec![],
        },
    )
    .await
    .unwrap();
    let op = Op::TarWrite {
        path: w(&agent.dir.path().join("single")),
        gzip: false,
    };
    upload(&session, op, &one).await.unwrap();
    assert_eq!(mode_of(&agent.dir.path().join("single/run.sh")), 0o751);

    let missing = Op::TarRead {
        path: "nope".into(),
        exclude: vec![],
    };
    assert_eq!(code(download(&session, missing).await), ErrorCode::NotFound);
}

#[tokio::test]
async fn tar_write_refuses_garbage_and_stays_inside_its_destination() {
    let agent = Agent::start();
    let session = agent.session().await;
    let root = agent.dir.path();
    let dst = root.join("dst");

    let op = |gzip| Op::TarWrite {
        path: w(&dst),
        gzip,
    };
    let garbage = vec![0x55u8; 4096];
    assert_eq!(
        code(upload(&session, op(false), &garbage).await),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(upload(&session, op(true), &garbage).await),
        ErrorCode::InvalidArgument
    );
    fs::write(root.join("a-file"), "x").unwrap();
    let onto_file = Op::TarWrite {
        path: w(&root.join("a-file")),
        gzip: false,
    };
    assert_eq!(
        code(upload(&session, onto_file, &[0u8; 1024]).await),
        ErrorCode::NotADirectory
    );

    // `..` entries are skipped and a leading `/` is stripped.
    let mut archive = tar_entry("../escaped", b'0', "", b"evil");
    archive.extend(tar_entry("/rooted", b'0', "", b"fine"));
    archive.extend([0u8; 1024]);
    assert_eq!(
        upload(&session, op(false), &archive).await.unwrap(),
        Reply::Ok
    );
    assert!(!root.join("escaped").exists());
    assert_eq!(fs::read(dst.join("rooted")).unwrap(), b"fine");

    // No writing through a symlink that leads outside.
    let outside = tempfile::tempdir().unwrap();
    let mut archive = tar_entry("link", b'2', &s(outside.path()), b"");
    archive.extend(tar_entry("link/pwned", b'0', "", b"evil"));
    archive.extend([0u8; 1024]);
    assert_eq!(
        code(upload(&session, op(false), &archive).await),
        ErrorCode::InvalidArgument
    );
    assert!(!outside.path().join("pwned").exists());
}

/// Opens a watch and waits for its `ok`: changes after that are reported.
async fn armed_watch(session: &Session, path: &Path, recursive: bool) -> RawStream {
    let op = Op::Watch {
        path: w(path),
        recursive,
    };
    let mut stream = session.open(op).await.unwrap();
    match tokio::time::timeout(WAIT, stream.next()).await.unwrap() {
        Some(Event::Reply(Reply::Ok)) => stream,
        other => panic!("expected the watch's ok, got {other:?}"),
    }
}

/// Reads events until `done` says the list is complete.
async fn events_until(
    stream: &mut RawStream,
    done: impl Fn(&[WatchEvent]) -> bool,
) -> Vec<WatchEvent> {
    let mut seen = Vec::new();
    while !done(&seen) {
        match tokio::time::timeout(WAIT, stream.next()).await {
            Ok(Some(Event::Watch(e))) => seen.push(e),
            Ok(other) => panic!("unexpected {other:?} after {seen:?}"),
            Err(_) => panic!("timed out; events so far: {seen:?}"),
        }
    }
    seen
}

#[tokio::test]
async fn watch_reports_create_modify_rename_and_remove() {
    let agent = Agent::start();
    let session = agent.session().await;
    let root = agent.dir.path().join("watched");
    fs::create_dir(&root).unwrap();
    let mut stream = armed_watch(&session, &root, true).await;

    fs::write(root.join("a.txt"), "one").unwrap();
    let create = WatchEvent::Create {
        path: "a.txt".into(),
        dir: false,
    };
    let modify = WatchEvent::Modify {
        path: "a.txt".into(),
    };
    let seen = events_until(&mut stream, |s| s.contains(&modify)).await;
    assert_eq!(seen[0], create);

    fs::rename(root.join("a.txt"), root.join("b.txt")).unwrap();
    let rename = WatchEvent::Rename {
        from: "a.txt".into(),
        to: "b.txt".into(),
    };
    events_until(&mut stream, |s| s.contains(&rename)).await;

    // A new directory is watched, and what lands in it is reported.
    fs::create_dir(root.join("sub")).unwrap();
    events_until(&mut stream, |s| {
        s.contains(&WatchEvent::Create {
            path: "sub".into(),
            dir: true,
        })
    })
    .await;
    fs::write(root.join("sub/inner"), "x").unwrap();
    events_until(&mut stream, |s| {
        s.contains(&WatchEvent::Modify {
            path: "sub/inner".into(),
        })
    })
    .await;

    fs::remove_file(root.join("b.txt")).unwrap();
    fs::remove_dir_all(root.join("sub")).unwrap();
    let seen = events_until(&mut stream, |s| {
        s.contains(&WatchEvent::Remove {
            path: "sub".into(),
            dir: true,
        })
    })
    .await;
    assert!(seen.contains(&WatchEvent::Remove {
        path: "b.txt".into(),
        dir: false
    }));

    // Moving out of the tree is a remove; into it, a create.
    let elsewhere = agent.dir.path().join("elsewhere");
    fs::write(root.join("leaving"), "x").unwrap();
    fs::rename(root.join("leaving"), &elsewhere).unwrap();
    fs::rename(&elsewhere, root.join("back")).unwrap();
    events_until(&mut stream, |s| {
        s.contains(&WatchEvent::Remove {
            path: "leaving".into(),
            dir: false,
        }) && s.contains(&WatchEvent::Create {
            path: "back".into(),
            dir: false,
        })
    })
    .await;

    stream.cancel().await.unwrap();
    let d = drain(&mut stream).await;
    assert!(d.error.is_none(), "{:?}", d.error);

    // Removing the watched directory ends the watch with not_found.
    let mut stream = armed_watch(&session, &root, false).await;
    fs::remove_dir_all(&root).unwrap();
    let d = drain(&mut stream).await;
    assert_eq!(d.error.and_then(|e| e.code()), Some(ErrorCode::NotFound));

    let op = Op::Watch {
        path: "nope".into(),
        recursive: true,
    };
    assert_eq!(code(session.request(op).await), ErrorCode::NotFound);
    fs::write(agent.dir.path().join("file"), "").unwrap();
    let op = Op::Watch {
        path: "file".into(),
        recursive: true,
    };
    assert_eq!(code(session.request(op).await), ErrorCode::NotADirectory);
}

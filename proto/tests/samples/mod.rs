//! One realistic sample of every message the protocol has, shared by the test files.
//!
//! Each enum has an exhaustive `*_name` function (no `_` arm), so adding a variant stops the
//! build here until it gets a name and a sample; `codec.rs` then checks that the samples cover
//! exactly the variants serde knows, so a name without a sample fails a test.
#![allow(dead_code, reason = "each test file uses a different part")]

use std::collections::BTreeMap;

use tether_proto::control::{Control, ExitStatus};
use tether_proto::op::{
    AgentInfo, BatchFile, BatchResult, Command, ExecSpec, FileKind, FileStat, GrepMatch, GrepSpec,
    IfExists, ListeningPort, Op, ProcessInfo, PtySpec, Reply, WatchEvent, WriteSpec,
};
use tether_proto::{Channel, ErrorCode, ProcessId, StreamId, WirePath};

/// The wire name (`"type"`) of a control message.
pub(crate) fn control_name(c: &Control) -> &'static str {
    match c {
        Control::Hello { .. } => "hello",
        Control::Welcome { .. } => "welcome",
        Control::Open { .. } => "open",
        Control::Eof { .. } => "eof",
        Control::Resize { .. } => "resize",
        Control::Signal { .. } => "signal",
        Control::Cancel { .. } => "cancel",
        Control::Started { .. } => "started",
        Control::Dropped { .. } => "dropped",
        Control::Exit { .. } => "exit",
        Control::Reply { .. } => "reply",
        Control::Event { .. } => "event",
        Control::Error { .. } => "error",
        Control::Closed { .. } => "closed",
    }
}

/// The wire name (`"op"`) of an operation.
pub(crate) fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Exec(_) => "exec",
        Op::Attach { .. } => "attach",
        Op::Wait { .. } => "wait",
        Op::Kill { .. } => "kill",
        Op::Processes => "processes",
        Op::Read { .. } => "read",
        Op::Write(_) => "write",
        Op::Stat { .. } => "stat",
        Op::List { .. } => "list",
        Op::Mkdir { .. } => "mkdir",
        Op::Remove { .. } => "remove",
        Op::Rename { .. } => "rename",
        Op::Chmod { .. } => "chmod",
        Op::Glob { .. } => "glob",
        Op::Grep(_) => "grep",
        Op::Edit { .. } => "edit",
        Op::WriteBatch { .. } => "write_batch",
        Op::ReadBatch { .. } => "read_batch",
        Op::TarRead { .. } => "tar_read",
        Op::TarWrite { .. } => "tar_write",
        Op::Watch { .. } => "watch",
        Op::Connect { .. } => "connect",
        Op::Ports => "ports",
        Op::Info => "info",
    }
}

/// The wire name (`"reply"`) of a reply.
pub(crate) fn reply_name(r: &Reply) -> &'static str {
    match r {
        Reply::Ok => "ok",
        Reply::Stat(_) => "stat",
        Reply::Entries { .. } => "entries",
        Reply::Paths { .. } => "paths",
        Reply::Matches { .. } => "matches",
        Reply::Edited { .. } => "edited",
        Reply::Written { .. } => "written",
        Reply::Batch { .. } => "batch",
        Reply::Processes { .. } => "processes",
        Reply::Ports { .. } => "ports",
        Reply::Info(_) => "info",
    }
}

/// The wire name (`"kind"`) of a watch event.
pub(crate) fn event_name(e: &WatchEvent) -> &'static str {
    match e {
        WatchEvent::Create { .. } => "create",
        WatchEvent::Modify { .. } => "modify",
        WatchEvent::Remove { .. } => "remove",
        WatchEvent::Rename { .. } => "rename",
        WatchEvent::Overflow => "overflow",
    }
}

/// The wire name of an error code, written out independently of `ErrorCode::as_str`.
pub(crate) fn code_name(c: ErrorCode) -> &'static str {
    match c {
        ErrorCode::NotFound => "not_found",
        ErrorCode::PermissionDenied => "permission_denied",
        ErrorCode::IsDirectory => "is_directory",
        ErrorCode::NotADirectory => "not_a_directory",
        ErrorCode::AlreadyExists => "already_exists",
        ErrorCode::InvalidPath => "invalid_path",
        ErrorCode::InvalidArgument => "invalid_argument",
        ErrorCode::Timeout => "timeout",
        ErrorCode::TooLarge => "too_large",
        ErrorCode::Unauthorized => "unauthorized",
        ErrorCode::Unsupported => "unsupported",
        ErrorCode::Internal => "internal",
    }
}

/// Every error code.
pub(crate) fn codes() -> Vec<ErrorCode> {
    vec![
        ErrorCode::NotFound,
        ErrorCode::PermissionDenied,
        ErrorCode::IsDirectory,
        ErrorCode::NotADirectory,
        ErrorCode::AlreadyExists,
        ErrorCode::InvalidPath,
        ErrorCode::InvalidArgument,
        ErrorCode::Timeout,
        ErrorCode::TooLarge,
        ErrorCode::Unauthorized,
        ErrorCode::Unsupported,
        ErrorCode::Internal,
    ]
}

fn s(v: &str) -> String {
    v.to_string()
}

fn p(v: &str) -> WirePath {
    WirePath::from(v)
}

/// Every operation, with the options that matter set, plus variants of the nested enums
/// (`command`, `if_exists`).
pub(crate) fn ops() -> Vec<Op> {
    let mut env = BTreeMap::new();
    env.insert(s("RUST_LOG"), s("debug"));
    vec![
        Op::Exec(Box::new(ExecSpec::argv(["cargo", "test"]))),
        Op::Exec(Box::new(ExecSpec {
            env,
            cwd: Some(p("/work")),
            user: Some(s("dev")),
            stdin: true,
            merge_stderr: true,
            timeout_ms: Some(60_000),
            output_limit: Some(1 << 20),
            background: true,
            tag: Some(s("build")),
            ring_bytes: Some(4 << 20),
            ..ExecSpec::shell("make -j8 2>&1 | tail")
        })),
        Op::Exec(Box::new(ExecSpec {
            stdin: true,
            pty: Some(PtySpec {
                cols: 120,
                rows: 40,
                term: Some(s("xterm-256color")),
            }),
            ..ExecSpec::argv(["bash", "-l"])
        })),
        Op::Exec(Box::new(ExecSpec {
            env_bytes: vec![(
                WirePath::from(&b"LANG_RAW"[..]),
                WirePath::from(&b"caf\xe9"[..]),
            )],
            cwd: Some(WirePath::from(&b"/work/d\xfe"[..])),
            ..ExecSpec::argv([&b"printf"[..], b"%s", b"\xff\xfe"])
        })),
        Op::Attach {
            process: ProcessId(7),
            out_offset: 1024,
            err_offset: 0,
            stdin: false,
        },
        Op::Wait {
            process: ProcessId(7),
        },
        Op::Kill {
            process: ProcessId(7),
            signal: Some(s("TERM")),
            group: true,
        },
        Op::Processes,
        Op::Read {
            path: p("/etc/hostname"),
            offset: 0,
            len: None,
        },
        Op::Write(WriteSpec {
            path: p("src/main.rs"),
            mode: Some(0o644),
            create_parents: true,
            if_exists: IfExists::Overwrite,
        }),
        Op::Write(WriteSpec {
            path: p("new.txt"),
            mode: None,
            create_parents: false,
            if_exists: IfExists::Fail,
        }),
        Op::Write(WriteSpec {
            path: p("log.txt"),
            mode: None,
            create_parents: false,
            if_exists: IfExists::Append,
        }),
        Op::Stat {
            path: p("Cargo.toml"),
        },
        Op::List {
            path: p("/work"),
            depth: 2,
        },
        Op::Mkdir {
            path: p("/work/target/tmp"),
            mode: Some(0o700),
        },
        Op::Remove {
            path: p("/work/target"),
            recursive: true,
        },
        Op::Rename {
            from: p("a.txt"),
            to: p("b.txt"),
            overwrite: false,
        },
        Op::Chmod {
            path: p("run.sh"),
            mode: 0o755,
        },
        Op::Glob {
            root: p("/work"),
            pattern: s("src/**/*.rs"),
            limit: Some(100),
        },
        Op::Grep(GrepSpec {
            path: p("/work/src"),
            pattern: s("fn \\w+_test"),
            regex: true,
            ignore_case: false,
            glob: Some(s("*.rs")),
            limit: Some(50),
        }),
        Op::Edit {
            path: p("src/lib.rs"),
            old: s("let x = 1;"),
            new: s("let x = 2;"),
            replace_all: false,
        },
        Op::WriteBatch {
            files: vec![
                BatchFile {
                    path: p("a.txt"),
                    size: 5,
                    mode: None,
                },
                BatchFile {
                    path: p("bin/run"),
                    size: 12,
                    mode: Some(0o755),
                },
            ],
        },
        Op::ReadBatch {
            paths: vec![p("a.txt"), p("missing.txt")],
        },
        Op::TarRead {
            path: p("/work"),
            exclude: vec![s("target"), s("**/*.o")],
        },
        Op::TarWrite {
            path: p("/work"),
            gzip: true,
        },
        Op::Watch {
            path: p("/work/src"),
            recursive: true,
        },
        Op::Connect {
            port: 8080,
            host: None,
        },
        Op::Ports,
        Op::Info,
    ]
}

fn stat(path: &str, kind: FileKind, size: u64, mode: u32, target: Option<&str>) -> FileStat {
    FileStat {
        path: p(path),
        kind,
        size,
        mode,
        mtime_ms: 1_767_225_600_000,
        target: target.map(p),
        file_id: None,
        allocated: None,
    }
}

/// Every reply, covering every file kind.
pub(crate) fn replies() -> Vec<Reply> {
    vec![
        Reply::Ok,
        Reply::Stat(stat("Cargo.toml", FileKind::File, 1234, 0o644, None)),
        Reply::Entries {
            entries: vec![
                stat("src", FileKind::Dir, 4096, 0o755, None),
                stat("src/main.rs", FileKind::File, 812, 0o644, None),
                stat("latest", FileKind::Symlink, 6, 0o777, Some("v1.2.3")),
                stat("run.sock", FileKind::Other, 0, 0o600, None),
                FileStat {
                    target: Some(WirePath::from(b"v\xff".to_vec())),
                    path: WirePath::from(b"bad\xfe".to_vec()),
                    ..stat("", FileKind::Symlink, 2, 0o777, None)
                },
            ],
        },
        Reply::Paths {
            paths: vec![p("src/lib.rs"), p("src/main.rs")],
            truncated: false,
        },
        Reply::Matches {
            matches: vec![GrepMatch {
                path: p("lib.rs"),
                line: 42,
                text: s("fn parse_test() {"),
            }],
            truncated: true,
        },
        Reply::Edited { replacements: 1 },
        Reply::Written { bytes: 812 },
        Reply::Batch {
            results: vec![
                BatchResult {
                    path: p("a.txt"),
                    size: Some(5),
                    error: None,
                    message: None,
                },
                BatchResult {
                    path: p("missing.txt"),
                    size: None,
                    error: Some(ErrorCode::NotFound),
                    message: Some(s("missing.txt: no such file or directory")),
                },
            ],
        },
        Reply::Processes {
            processes: vec![ProcessInfo {
                process: ProcessId(7),
                pid: 4242,
                tag: Some(s("build")),
                command: s("make -j8"),
                pty: false,
                exit: Some(ExitStatus {
                    code: Some(0),
                    ..ExitStatus::default()
                }),
                offsets: [52_311, 140],
                started_ms: 1_767_225_600_000,
            }],
        },
        Reply::Ports {
            ports: vec![ListeningPort {
                port: 8080,
                address: s("0.0.0.0"),
            }],
        },
        Reply::Info(AgentInfo {
            agent_version: s("0.1.0"),
            os: s("Linux 6.1.0"),
            arch: s("x86_64"),
            user: s("root"),
            home: s("/root"),
            cwd: s("/work"),
            hostname: s("sb-12"),
            cpus: 4,
            memory_bytes: 8 << 30,
            pid: 1,
        }),
    ]
}

/// Every watch event.
pub(crate) fn events() -> Vec<WatchEvent> {
    vec![
        WatchEvent::Create {
            path: p("src/new.rs"),
            dir: false,
        },
        WatchEvent::Modify {
            path: p("src/lib.rs"),
        },
        WatchEvent::Remove {
            path: p("build"),
            dir: true,
        },
        WatchEvent::Rename {
            from: p("a.rs"),
            to: p("b.rs"),
        },
        WatchEvent::Overflow,
    ]
}

/// Every control message: each op inside an `open`, each reply inside a `reply`, each event
/// inside an `event`, each error code inside an `error`, every channel inside an `eof`.
pub(crate) fn controls() -> Vec<Control> {
    let st = StreamId(1);
    let mut all = vec![
        Control::Hello {
            protocol: 1,
            token: None,
            client: s("tether-cli/0.1.0"),
        },
        Control::Hello {
            protocol: 1,
            token: Some(s("tok_3f9a")),
            client: s("my-client/2.0"),
        },
        Control::Welcome {
            protocol: 1,
            agent_version: s("0.1.0"),
            capabilities: [
                "exec",
                "pty",
                "background",
                "replay",
                "files",
                "tar",
                "batch",
                "watch",
                "forward",
                "ports",
                "info",
            ]
            .map(s)
            .to_vec(),
        },
        Control::Resize {
            stream: st,
            cols: 100,
            rows: 30,
        },
        Control::Signal {
            stream: st,
            signal: s("INT"),
            group: true,
        },
        Control::Cancel { stream: st },
        Control::Started {
            stream: st,
            process: ProcessId(7),
            pid: 4242,
            offsets: [0, 0],
        },
        Control::Dropped {
            stream: st,
            channel: Channel::Out,
            from: 1024,
            to: 1_049_600,
        },
        Control::Exit {
            stream: st,
            status: ExitStatus {
                code: Some(0),
                ..ExitStatus::default()
            },
        },
        Control::Exit {
            stream: st,
            status: ExitStatus {
                code: None,
                signal: Some(9),
                timed_out: true,
                truncated: true,
            },
        },
        Control::Error {
            stream: None,
            code: ErrorCode::InvalidArgument,
            message: s("data frame for stream 9, which is not open"),
        },
        Control::Closed { stream: st },
    ];
    all.extend(
        [Channel::In, Channel::Out, Channel::Err].map(|channel| Control::Eof {
            stream: st,
            channel,
        }),
    );
    all.extend(ops().into_iter().enumerate().map(|(i, op)| Control::Open {
        stream: StreamId(i as u32 + 1),
        window: (i % 2 == 0).then_some(1 << 20),
        op,
    }));
    all.extend(
        replies()
            .into_iter()
            .map(|reply| Control::Reply { stream: st, reply }),
    );
    all.extend(
        events()
            .into_iter()
            .map(|event| Control::Event { stream: st, event }),
    );
    all.extend(codes().into_iter().map(|code| Control::Error {
        stream: Some(st),
        code,
        message: format!("sample {code} error"),
    }));
    all
}

/// The variant names serde accepts for a tag, read from its "unknown variant" error, so a
/// test can compare them with the samples. `json` must name an unknown variant.
pub(crate) fn serde_variants<T: serde::de::DeserializeOwned + std::fmt::Debug>(
    json: &str,
) -> Vec<String> {
    let err = serde_json::from_str::<T>(json).expect_err("the variant must be unknown");
    let msg = err.to_string();
    let (_, expected) = msg
        .split_once("expected ")
        .unwrap_or_else(|| panic!("not an unknown-variant error: {msg}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Exhaustive over the nested enums, so a new command form, write mode, file kind or channel
/// is noticed here.
pub(crate) fn nested_names(c: &Control) -> Vec<&'static str> {
    let mut names = Vec::new();
    match c {
        Control::Open {
            op: Op::Exec(spec), ..
        } => names.push(match spec.command {
            Command::Argv(_) => "command:argv",
            Command::Shell(_) => "command:shell",
        }),
        Control::Open {
            op: Op::Write(spec),
            ..
        } => names.push(match spec.if_exists {
            IfExists::Overwrite => "if_exists:overwrite",
            IfExists::Fail => "if_exists:fail",
            IfExists::Append => "if_exists:append",
        }),
        Control::Reply {
            reply: Reply::Entries { entries },
            ..
        } => names.extend(entries.iter().map(|e| match e.kind {
            FileKind::File => "kind:file",
            FileKind::Dir => "kind:dir",
            FileKind::Symlink => "kind:symlink",
            FileKind::Other => "kind:other",
        })),
        Control::Eof { channel, .. } => names.push(match channel {
            Channel::In => "channel:in",
            Channel::Out => "channel:out",
            Channel::Err => "channel:err",
        }),
        _ => {}
    }
    names
}

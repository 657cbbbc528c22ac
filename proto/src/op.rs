//! The operations a stream carries, and what the agent replies.
//!
//! An [`Op`] is flattened into [`crate::Control::Open`]: its `"op"` field names the variant.
//! Streaming operations move bytes in data frames; request/response operations end with one
//! [`crate::Control::Reply`] (or an error) followed by `closed`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::ids::{ByteOffset, ProcessId};
use crate::path::{WireBytes, WirePath};

/// What a new stream does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Start a process. Output streams back on `out`/`err`; stdin flows on `in`.
    Exec(Box<ExecSpec>),
    /// Attach to a running or finished background process from the given offsets.
    Attach {
        /// The process.
        process: ProcessId,
        /// First stdout (or PTY output) byte wanted.
        #[serde(default)]
        out_offset: ByteOffset,
        /// First stderr byte wanted.
        #[serde(default)]
        err_offset: ByteOffset,
        /// Also forward this stream's `in` channel to the process's stdin.
        #[serde(default)]
        stdin: bool,
    },
    /// Wait for a process to end; replies with `exit`.
    Wait {
        /// The process.
        process: ProcessId,
    },
    /// Send a signal to a process (or its group); replies `ok`.
    Kill {
        /// The process.
        process: ProcessId,
        /// Signal name or number; default `KILL`.
        #[serde(default)]
        signal: Option<String>,
        /// Signal the whole process group.
        #[serde(default)]
        group: bool,
    },
    /// List the agent's processes (running and uncollected); replies `processes`.
    Processes,
    /// Stream a file (or a byte range of it) on `out`, then eof; replies `stat` first.
    Read {
        /// Absolute path, or relative to the agent's working directory.
        path: WirePath,
        /// First byte to read.
        #[serde(default)]
        offset: u64,
        /// Bytes to read at most; the rest of the file when absent.
        #[serde(default)]
        len: Option<u64>,
    },
    /// Receive a file on `in` until eof, then write it atomically (temp file and rename,
    /// or append); replies `written`.
    Write(WriteSpec),
    /// Replies `stat`.
    Stat {
        /// The path; a symlink is not followed.
        path: WirePath,
    },
    /// Replies `entries`.
    List {
        /// The directory.
        path: WirePath,
        /// 1 lists the directory itself; each level more descends once. 0 is treated as 1.
        #[serde(default = "one")]
        depth: u32,
    },
    /// Create a directory and its parents; replies `ok`.
    Mkdir {
        /// The directory.
        path: WirePath,
        /// Permission bits for created directories; default 0o755.
        #[serde(default)]
        mode: Option<u32>,
    },
    /// Remove a file, or a directory (which must be empty unless `recursive`); replies `ok`.
    Remove {
        /// The path.
        path: WirePath,
        /// Remove a directory and everything under it.
        #[serde(default)]
        recursive: bool,
    },
    /// Rename `from` to `to`; replies `ok`.
    Rename {
        /// The source.
        from: WirePath,
        /// The destination.
        to: WirePath,
        /// Replace an existing destination; otherwise `already_exists`.
        #[serde(default)]
        overwrite: bool,
    },
    /// Change permission bits; replies `ok`.
    Chmod {
        /// The path.
        path: WirePath,
        /// Permission bits, e.g. 0o644.
        mode: u32,
    },
    /// Paths under `root` matching a glob such as `src/**/*.rs`; replies `paths`.
    Glob {
        /// The directory the pattern is relative to.
        root: WirePath,
        /// The pattern.
        pattern: String,
        /// Most paths to return; default 10,000.
        #[serde(default)]
        limit: Option<u32>,
    },
    /// Lines matching a literal or regular expression; replies `matches`.
    Grep(GrepSpec),
    /// Replace a string in a text file; replies `edited`.
    Edit {
        /// The file.
        path: WirePath,
        /// The text to find; must occur exactly once unless `replace_all`.
        old: String,
        /// Its replacement.
        new: String,
        /// Replace every occurrence.
        #[serde(default)]
        replace_all: bool,
    },
    /// Write many files from one `in` byte stream: the files' bytes concatenated in the
    /// order listed. Replies `batch` with a result per file (partial success).
    WriteBatch {
        /// The files, with their sizes in bytes.
        files: Vec<BatchFile>,
    },
    /// Read many files: replies `batch` (sizes or errors), then streams the readable files'
    /// bytes on `out` concatenated in the order listed, then eof.
    ReadBatch {
        /// The paths.
        paths: Vec<WirePath>,
    },
    /// Stream the directory (or file) as an uncompressed tar archive on `out`, then eof.
    /// Symlinks, modes and empty directories are kept.
    TarRead {
        /// What to archive; entries are named relative to it.
        path: WirePath,
        /// Entries whose relative path matches one of these globs are skipped.
        #[serde(default)]
        exclude: Vec<String>,
    },
    /// Receive a tar archive on `in` (optionally gzip-compressed) and unpack it into `path`,
    /// creating it; replies `ok`.
    TarWrite {
        /// The destination directory.
        path: WirePath,
        /// The archive is gzip-compressed.
        #[serde(default)]
        gzip: bool,
    },
    /// Report changes under a directory as `event` messages until cancelled.
    Watch {
        /// The directory.
        path: WirePath,
        /// Include subdirectories (new ones too).
        #[serde(default = "yes")]
        recursive: bool,
    },
    /// Open a TCP connection to a port inside the sandbox and carry its bytes: `in` to the
    /// port, `out` back; eof on either side half-closes.
    Connect {
        /// The port.
        port: u16,
        /// The host to dial inside the sandbox; default 127.0.0.1.
        #[serde(default)]
        host: Option<String>,
    },
    /// The TCP ports listening inside the sandbox; replies `ports`.
    Ports,
    /// Facts about the agent and its machine; replies `info`.
    Info,
}

impl Op {
    /// Whether the operation names a path that is not UTF-8, which only an agent with the
    /// `byte_paths` capability understands.
    pub fn needs_byte_paths(&self) -> bool {
        let odd = |p: &WirePath| p.to_str().is_none();
        match self {
            Op::Read { path, .. }
            | Op::Stat { path }
            | Op::List { path, .. }
            | Op::Mkdir { path, .. }
            | Op::Remove { path, .. }
            | Op::Chmod { path, .. }
            | Op::Edit { path, .. }
            | Op::TarRead { path, .. }
            | Op::TarWrite { path, .. }
            | Op::Watch { path, .. }
            | Op::Write(WriteSpec { path, .. })
            | Op::Grep(GrepSpec { path, .. })
            | Op::Glob { root: path, .. } => odd(path),
            Op::Rename { from, to, .. } => odd(from) || odd(to),
            Op::WriteBatch { files } => files.iter().any(|f| odd(&f.path)),
            Op::ReadBatch { paths } => paths.iter().any(odd),
            Op::Exec(spec) => spec.cwd.as_ref().is_some_and(odd),
            Op::Attach { .. }
            | Op::Wait { .. }
            | Op::Kill { .. }
            | Op::Processes
            | Op::Connect { .. }
            | Op::Ports
            | Op::Info => false,
        }
    }
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// The command of an exec.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Run the program `argv[0]` (searched in `PATH`) with these arguments, each exactly its
    /// bytes (`{"b64": ...}` for one that is not UTF-8).
    Argv(Vec<WireBytes>),
    /// Run this script with `/bin/sh -c`.
    Shell(WireBytes),
}

/// How to start a process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// What to run.
    pub command: Command,
    /// Variables added to (or overriding) the agent's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables whose name or value is not UTF-8, as `[name, value]` pairs of bytes; set
    /// after `env`. Only for an agent with the `byte_args` capability.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_bytes: Vec<(WireBytes, WireBytes)>,
    /// Working directory; the agent's when absent.
    #[serde(default)]
    pub cwd: Option<WirePath>,
    /// Run as this user (name or uid); only when the agent runs as root.
    #[serde(default)]
    pub user: Option<String>,
    /// The client will send stdin on `in`; otherwise stdin is /dev/null.
    #[serde(default)]
    pub stdin: bool,
    /// Send stderr on `out` with stdout, in the order written.
    #[serde(default)]
    pub merge_stderr: bool,
    /// Run under a pseudo-terminal of this size; output is on `out` only.
    #[serde(default)]
    pub pty: Option<PtySpec>,
    /// Kill the process group after this many milliseconds and report `timed_out`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Stop delivering output after this many bytes (all channels together) and report
    /// `truncated`; the process keeps running until it exits.
    #[serde(default)]
    pub output_limit: Option<u64>,
    /// Keep the process when this stream or connection ends; it can be re-attached.
    #[serde(default)]
    pub background: bool,
    /// A label for `processes`.
    #[serde(default)]
    pub tag: Option<String>,
    /// Replay ring capacity per output channel, in bytes; default 1 MiB.
    #[serde(default)]
    pub ring_bytes: Option<u64>,
}

impl ExecSpec {
    /// A foreground exec of `argv` with no stdin.
    pub fn argv<I: IntoIterator<Item = S>, S: Into<WireBytes>>(argv: I) -> ExecSpec {
        ExecSpec {
            command: Command::Argv(argv.into_iter().map(Into::into).collect()),
            env: BTreeMap::new(),
            env_bytes: Vec::new(),
            cwd: None,
            user: None,
            stdin: false,
            merge_stderr: false,
            pty: None,
            timeout_ms: None,
            output_limit: None,
            background: false,
            tag: None,
            ring_bytes: None,
        }
    }

    /// A foreground exec of a `sh -c` string with no stdin.
    pub fn shell(script: impl Into<WireBytes>) -> ExecSpec {
        ExecSpec {
            command: Command::Shell(script.into()),
            ..ExecSpec::argv(Vec::<String>::new())
        }
    }

    /// Sets the variable `name` to `value`: in `env` when both are UTF-8, else in
    /// `env_bytes` (replacing an earlier setting of the same name in either).
    pub fn set_env(&mut self, name: impl Into<WireBytes>, value: impl Into<WireBytes>) {
        let (name, value) = (name.into(), value.into());
        self.env_bytes.retain(|(n, _)| *n != name);
        match (name.to_str(), value.to_str()) {
            (Some(n), Some(v)) => {
                self.env.insert(n.to_string(), v.to_string());
            }
            _ => {
                if let Some(n) = name.to_str() {
                    self.env.remove(n);
                }
                self.env_bytes.push((name, value));
            }
        }
    }

    /// Whether the spec holds an argument, script or variable that is not UTF-8, which only
    /// an agent with the `byte_args` capability understands.
    pub fn needs_byte_args(&self) -> bool {
        let odd = |b: &WireBytes| b.to_str().is_none();
        !self.env_bytes.is_empty()
            || match &self.command {
                Command::Argv(argv) => argv.iter().any(odd),
                Command::Shell(script) => odd(script),
            }
    }
}

/// A pseudo-terminal's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySpec {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
    /// `TERM`; default `xterm-256color`.
    #[serde(default)]
    pub term: Option<String>,
}

/// How to write a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteSpec {
    /// The file.
    pub path: WirePath,
    /// Permission bits of a new file; default 0o644 (an existing file keeps its own).
    #[serde(default)]
    pub mode: Option<u32>,
    /// Create missing parent directories.
    #[serde(default)]
    pub create_parents: bool,
    /// What to do when the file exists.
    #[serde(default)]
    pub if_exists: IfExists,
}

/// What a write does to an existing file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IfExists {
    /// Replace it atomically.
    #[default]
    Overwrite,
    /// Fail with `already_exists`.
    Fail,
    /// Append to it (not atomic: appends are visible as they land).
    Append,
}

/// One file of a `write_batch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchFile {
    /// The path.
    pub path: WirePath,
    /// Its size in bytes: how much of the `in` stream belongs to it.
    pub size: u64,
    /// Permission bits; default 0o644.
    #[serde(default)]
    pub mode: Option<u32>,
}

/// A search of file contents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepSpec {
    /// File or directory to search (recursively).
    pub path: WirePath,
    /// What to find.
    pub pattern: String,
    /// `pattern` is a regular expression rather than a literal string.
    #[serde(default)]
    pub regex: bool,
    /// Ignore case.
    #[serde(default)]
    pub ignore_case: bool,
    /// Only search files whose path relative to `path` matches this glob.
    #[serde(default)]
    pub glob: Option<String>,
    /// Most matches to return; default 1,000. The reply says when it was reached.
    #[serde(default)]
    pub limit: Option<u32>,
}

/// The result of a request/response operation, flattened into [`crate::Control::Reply`]:
/// its `"reply"` field names the variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The operation succeeded and has nothing to say.
    Ok,
    /// A file's metadata.
    Stat(FileStat),
    /// A directory listing.
    Entries {
        /// The entries, paths relative to the listed directory.
        entries: Vec<FileStat>,
    },
    /// Paths from a glob.
    Paths {
        /// Matching paths, relative to the root.
        paths: Vec<WirePath>,
        /// The limit was reached; there may be more.
        truncated: bool,
    },
    /// Lines from a grep.
    Matches {
        /// The matches.
        matches: Vec<GrepMatch>,
        /// The limit was reached; there may be more.
        truncated: bool,
    },
    /// The outcome of an edit.
    Edited {
        /// How many occurrences were replaced.
        replacements: u64,
    },
    /// A file was written.
    Written {
        /// Bytes written.
        bytes: u64,
    },
    /// Per-file outcomes of a batch.
    Batch {
        /// One per file, in request order.
        results: Vec<BatchResult>,
    },
    /// The agent's processes.
    Processes {
        /// The processes.
        processes: Vec<ProcessInfo>,
    },
    /// Listening TCP ports.
    Ports {
        /// The ports.
        ports: Vec<ListeningPort>,
    },
    /// Facts about the agent.
    Info(AgentInfo),
}

/// What kind of file a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else (socket, fifo, device).
    Other,
}

/// A file's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// The path as asked for, or relative to the listed directory in `entries`.
    pub path: WirePath,
    /// The kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
    /// A symlink's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<WirePath>,
    /// A regular file's identity and links: with `links` above 1, two entries with the same
    /// `file_id` are names of one file (hard links). Absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_id: Option<FileId>,
    /// Bytes the file takes on disk (`st_blocks` × 512); less than `size` for a file with
    /// holes. Absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<u64>,
}

/// Which file a name belongs to, on the agent's machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileId {
    /// The filesystem (`st_dev`).
    pub device: u64,
    /// The file on it (`st_ino`).
    pub inode: u64,
    /// How many names it has (`st_nlink`).
    pub links: u64,
}

/// One matching line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepMatch {
    /// The file, relative to the searched path (its name when a file was searched).
    pub path: WirePath,
    /// 1-based line number.
    pub line: u64,
    /// The line's text, lossily decoded, without its newline.
    pub text: String,
}

/// The outcome for one file of a batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResult {
    /// The path.
    pub path: WirePath,
    /// Bytes written or to be streamed, when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::error::ErrorCode>,
    /// The failure in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A process the agent started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// The agent's id for it.
    pub process: ProcessId,
    /// Its pid.
    pub pid: u32,
    /// Its tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The command line, for display.
    pub command: String,
    /// Whether it runs under a PTY.
    pub pty: bool,
    /// Its exit status, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<crate::exit::ExitStatus>,
    /// Output bytes produced so far, per channel (`out`, `err`).
    pub offsets: [ByteOffset; 2],
    /// Start time, milliseconds since the Unix epoch.
    pub started_ms: i64,
}

/// A TCP port listening inside the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListeningPort {
    /// The port.
    pub port: u16,
    /// The address it is bound to.
    pub address: String,
}

/// Facts about the agent and its machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// The agent's release version.
    pub agent_version: String,
    /// Operating system and kernel, e.g. `Linux 6.1.0`.
    pub os: String,
    /// CPU architecture.
    pub arch: String,
    /// The user the agent runs as.
    pub user: String,
    /// That user's home directory.
    pub home: String,
    /// The agent's working directory (the default `cwd`).
    pub cwd: String,
    /// Hostname.
    pub hostname: String,
    /// CPUs available.
    pub cpus: u32,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// The agent's own pid (1 in a container).
    pub pid: u32,
}

/// A change under a watched directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WatchEvent {
    /// A file or directory appeared.
    Create {
        /// Its path relative to the watched directory.
        path: WirePath,
        /// It is a directory.
        dir: bool,
    },
    /// A file's content or metadata changed.
    Modify {
        /// Its path.
        path: WirePath,
    },
    /// A file or directory went away.
    Remove {
        /// Its path.
        path: WirePath,
        /// It was a directory.
        dir: bool,
    },
    /// A path was renamed within the watched tree. A rename into or out of the tree is
    /// reported as `create` or `remove`.
    Rename {
        /// The old path.
        from: WirePath,
        /// The new path.
        to: WirePath,
    },
    /// Events were lost (the kernel queue overflowed); rescan to converge.
    Overflow,
}

//! File operations: everything a client does to the sandbox's filesystem.
//!
//! [`run`] validates every client path in one place ([`target`]) and routes each file op to
//! the module that owns it: `meta` (stat, list, mkdir, remove, rename, chmod), `transfer`
//! (read, write), `batch` (read_batch, write_batch), `archive` (tar_read, tar_write), `search`
//! (glob, grep), `edit` and `watch`. Two pieces sit under them: `atomic`, the only way a file's
//! content is replaced (temp file, then rename), and `pump`, the bridge between a stream and
//! the blocking thread that reads or writes the bytes.
//!
//! Filesystem calls never run on the connection's async runtime (single-threaded by default):
//! they go to tokio's blocking pool, so a slow disk stalls one operation, not the connection.
//! Every reply must fit in one control frame ([`MAX_PAYLOAD`]), so operations that can return
//! many items bound them by [`REPLY_BUDGET`] as well as by count.

mod archive;
mod atomic;
mod batch;
mod edit;
mod meta;
mod pump;
mod search;
mod transfer;
mod watch;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tether_proto::limits::MAX_PAYLOAD;
use tether_proto::op::{Op, Reply};
use tether_proto::{ErrorCode, WirePath};

use crate::agent::Agent;
use crate::stream::{OpError, OpResult, StreamCtx};

/// Bytes read from a file per chunk when streaming it out: 256 KiB.
const READ_CHUNK: usize = 256 << 10;

/// Chunks a blocking reader may have ready ahead of the network: 4 (1 MiB of read-ahead).
const READ_AHEAD: usize = 4;

/// Largest encoded reply an operation builds: the frame limit less room for the envelope.
const REPLY_BUDGET: usize = MAX_PAYLOAD - (4 << 10);

/// Permission bits of a new file when the client names none: 0o644.
const DEFAULT_FILE_MODE: u32 = 0o644;

/// Permission bits of a new directory when the client names none: 0o755.
const DEFAULT_DIR_MODE: u32 = 0o755;

/// Entries a `list` walks at most before it fails with `too_large`: 100,000.
const MAX_LIST_ENTRIES: usize = 100_000;

/// Paths a `glob` returns unless the request says otherwise: 10,000.
const DEFAULT_GLOB_LIMIT: u32 = 10_000;

/// Directory entries a `glob` or `grep` examines before it stops and reports `truncated`:
/// 1,000,000. Bounds the work of a pattern over a huge tree.
const MAX_VISITED: usize = 1_000_000;

/// Matches a `grep` returns unless the request says otherwise: 1,000.
const DEFAULT_GREP_LIMIT: u32 = 1_000;

/// Bytes of a matching line's text a `grep` returns (longer lines are cut): 1,000.
const MAX_MATCH_TEXT: usize = 1_000;

/// Leading bytes of a file in which a NUL marks it binary and unsearchable: 8 KiB.
const BINARY_PROBE: usize = 8 << 10;

/// Largest file `grep` reads whole (larger ones are read line by line): 32 MiB.
const GREP_WHOLE_FILE: u64 = 32 << 20;

/// Largest file `edit` rewrites: 64 MiB. Edits are for text files; this bounds memory.
const MAX_EDIT_BYTES: u64 = 64 << 20;

/// Files one `read_batch` may name: 1,024. Every file is held open until it is streamed.
const MAX_READ_BATCH: usize = 1_024;

/// How long `watch` gathers events before sending them, coalescing repeated modifies: 50 ms.
const WATCH_BATCH: Duration = Duration::from_millis(50);

/// Events `watch` gathers at most before sending them early: 1,024.
const WATCH_BATCH_EVENTS: usize = 1_024;

/// Bytes of the buffer `watch` reads kernel events into: 64 KiB.
const WATCH_BUFFER: usize = 64 << 10;

/// Runs a file operation on its stream until it is finished.
pub(crate) async fn run(ctx: StreamCtx, op: Op, agent: Arc<Agent>) -> OpResult {
    let at = |path: &WirePath| target(&agent, path);
    match op {
        Op::Read { path, offset, len } => {
            let file = at(&path)?;
            transfer::read(ctx, path, file, offset, len).await
        }
        Op::Write(spec) => transfer::write(ctx, at(&spec.path)?, spec).await,
        Op::Stat { path } => {
            let file = at(&path)?;
            meta::stat(ctx, path, file).await
        }
        Op::List { path, depth } => meta::list(ctx, at(&path)?, depth.max(1)).await,
        Op::Mkdir { path, mode } => meta::mkdir(ctx, at(&path)?, mode).await,
        Op::Remove { path, recursive } => meta::remove(ctx, at(&path)?, recursive).await,
        Op::Rename {
            from,
            to,
            overwrite,
        } => meta::rename(ctx, at(&from)?, at(&to)?, overwrite).await,
        Op::Chmod { path, mode } => meta::chmod(ctx, at(&path)?, mode).await,
        Op::Glob {
            root,
            pattern,
            limit,
        } => search::glob(ctx, at(&root)?, pattern, limit).await,
        Op::Grep(spec) => search::grep(ctx, at(&spec.path)?, spec).await,
        Op::Edit {
            path,
            old,
            new,
            replace_all,
        } => edit::edit(ctx, at(&path)?, old, new, replace_all).await,
        Op::WriteBatch { files } => {
            // A bad path fails its own file, not the batch.
            let files = files
                .into_iter()
                .map(|f| {
                    let path = at(&f.path);
                    (f, path)
                })
                .collect();
            batch::write_batch(ctx, files).await
        }
        Op::ReadBatch { paths } => {
            let paths = paths
                .into_iter()
                .map(|p| {
                    let path = at(&p);
                    (p, path)
                })
                .collect();
            batch::read_batch(ctx, paths).await
        }
        Op::TarRead { path, exclude } => archive::tar_read(ctx, at(&path)?, exclude).await,
        Op::TarWrite { path, gzip } => archive::tar_write(ctx, at(&path)?, gzip).await,
        Op::Watch { path, recursive } => watch::watch(ctx, at(&path)?, recursive).await,
        other => Err(OpError::new(
            ErrorCode::Unsupported,
            format!("{other:?} is not a file operation"),
        )),
    }
}

/// Validates a client path and resolves it: absolute as is, relative against the agent's
/// working directory. The one place paths are checked.
fn target(agent: &Agent, path: &WirePath) -> Result<PathBuf, OpError> {
    validate(path)?;
    Ok(agent.resolve(path.as_path()))
}

/// Rejects paths no file can have: empty, or containing a NUL byte.
fn validate(path: &WirePath) -> Result<(), OpError> {
    if path.is_empty() {
        return Err(OpError::new(
            ErrorCode::InvalidPath,
            "the path is empty; name a file or directory",
        ));
    }
    if path.contains(0) {
        return Err(OpError::new(
            ErrorCode::InvalidPath,
            format!("the path {path:?} contains a NUL byte"),
        ));
    }
    Ok(())
}

/// Maps an OS error on `path` to a wire error that names the path, as in
/// "/x/y: No such file or directory".
fn fail(path: &Path) -> impl Fn(io::Error) -> OpError + '_ {
    move |err| OpError::io(&path.display().to_string(), &err)
}

/// An error about `path` with `code`, worded like the OS's own ("/x: Is a directory").
fn refuse(code: ErrorCode, path: &Path, why: &str) -> OpError {
    OpError::new(code, format!("{}: {why}", path.display()))
}

/// Runs blocking filesystem work on tokio's blocking pool.
async fn blocking<T, F>(work: F) -> Result<T, OpError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, OpError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(worker_failed)?
}

/// Runs a request/response operation's blocking work and sends its reply. If the client
/// cancels first, the stream closes at once and the reply is dropped (the work, already
/// running, may still finish, as the protocol allows).
async fn respond<F>(mut ctx: StreamCtx, work: F) -> OpResult
where
    F: FnOnce() -> Result<Reply, OpError> + Send + 'static,
{
    tokio::select! {
        reply = blocking(work) => ctx.out.reply(reply?).await,
        () = pump::cancelled(&mut ctx.input) => Ok(()),
    }
}

/// A blocking worker panicked or was lost: a bug, reported rather than hidden.
fn worker_failed(err: tokio::task::JoinError) -> OpError {
    OpError::new(
        ErrorCode::Internal,
        format!("the file worker failed: {err}"),
    )
}

/// `path` relative to `root`, with `/` separators, as its exact bytes: the form every reply
/// uses.
fn relative(root: &Path, path: &Path) -> WirePath {
    WirePath::from(path.strip_prefix(root).unwrap_or(path))
}

/// Bytes `value` takes as JSON, to keep replies within [`REPLY_BUDGET`].
fn encoded_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_validated() {
        assert_eq!(
            validate(&"".into()).unwrap_err().code,
            ErrorCode::InvalidPath
        );
        assert_eq!(
            validate(&"a\0b".into()).unwrap_err().code,
            ErrorCode::InvalidPath
        );
        assert!(validate(&"src/x".into()).is_ok());
    }

    #[test]
    fn relative_paths_use_slashes() {
        assert_eq!(relative(Path::new("/a"), Path::new("/a/b/c")), "b/c");
        assert_eq!(encoded_len("ab"), 4);
    }
}

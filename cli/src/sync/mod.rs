//! The sync engine behind `tether sync` and `tether dev`: a local directory mirrored into a
//! sandbox, once or continuously, and one-shot pulls back.
//!
//! # Layout
//! - `tree`: paths and entries, the vocabulary of both sides; `rules`: `.gitignore`,
//!   `--exclude` and the built-in excludes, applied to both sides alike;
//! - `scan`: walking the local tree; `remote`: listing the sandbox's tree;
//! - `baseline`: what the last sync left in the sandbox, saved between runs;
//! - `plan`: what has to move, and the conflict policy (read it there);
//! - `push`: carrying a plan out (tar streams, deletions, conflict copies); `pack`:
//!   packing local files into a tar stream;
//! - `engine`: full convergence and per-batch updates; `watch`: local notifications,
//!   debounced into batches; `live`: the watch loop, with reconnection;
//! - [`pull`]: the other direction; `report`: status lines, JSON lines, progress;
//! - `constants`: every tunable; `error`: [`SyncError`].
//!
//! Only what differs moves: files are compared by size, mtime (whole seconds) and mode,
//! the quick check rsync makes; against the baseline, remote files are also compared by the
//! sub-second part of their mtime, so a remote edit within the same second is seen. Metadata of the whole tree is held in memory (about 150
//! bytes a path); file contents never are.

pub(crate) mod baseline;
pub(crate) mod constants;
pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod live;
pub(crate) mod pack;
pub(crate) mod plan;
pub(crate) mod pull;
pub(crate) mod push;
pub(crate) mod remote;
pub(crate) mod report;
pub(crate) mod rules;
pub(crate) mod scan;
pub(crate) mod tree;
pub(crate) mod watch;

use std::path::PathBuf;

pub use error::SyncError;
pub(crate) use live::{watch, Connect};
pub use pull::pull;
pub use report::{Format, Phase, Reporter, Stats};

use tether_client::Session;

/// One sync pair.
#[derive(Clone, Debug)]
pub struct SyncSpec {
    /// The sandbox's id (it keys the saved baseline).
    pub sandbox: String,
    /// The local directory.
    pub local: PathBuf,
    /// The directory in the sandbox (absolute).
    pub remote: String,
    /// Extra excludes, gitignore syntax.
    pub excludes: Vec<String>,
    /// Gzip pushes (worth it on a slow link, not on loopback).
    pub gzip: bool,
    /// What a pull does with the setuid, setgid and sticky bits of files from the sandbox.
    pub modes: tether_client::hostfs::ModePolicy,
}

/// Pushes `spec.local` to the sandbox once: afterwards the sandbox holds the local tree
/// (see [`plan`] for what is kept on conflicts).
pub(crate) async fn push(
    session: &Session,
    spec: &SyncSpec,
    reporter: &Reporter,
) -> Result<Stats, SyncError> {
    let mut engine = engine::Engine::new(spec, reporter.clone())?;
    let stats = engine.converge(session, Phase::Initial).await?;
    engine.save();
    Ok(stats)
}

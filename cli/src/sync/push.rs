//! Carrying out a [`Plan`] in the sandbox: conflict copies set aside, deletions, then tar
//! streams (gzip-compressed unless the link is local; see [`pack`]) of everything to send,
//! several side by side for a large upload, then directories pruned.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::stream::{self, StreamExt};
use indicatif::ProgressBar;
use tether_proto::op::Op;
use tether_proto::ErrorCode;

use super::constants::{
    CONFLICT_MARKER, PUSH_STREAMS, REMOTE_CONCURRENCY, SHARD_FILE_WEIGHT, SHARD_MIN_BYTES,
};
use super::error::SyncError;
use super::pack::{self, PackError, Packed};
use super::plan::Plan;
use super::remote::{absolute, timed};
use super::tree::{local_path, Entry, Tree};
use tether_client::Session;

/// Where a push goes.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// The local root.
    pub local: PathBuf,
    /// The remote root (absolute).
    pub remote: String,
    /// Gzip the archive.
    pub gzip: bool,
}

/// What a push did.
#[derive(Debug, Default)]
pub(crate) struct Pushed {
    /// Entries sent, as they were when read (what the remote side now holds).
    pub sent: Tree,
    /// Planned uploads that had vanished locally, or could not be read, when their turn
    /// came: the remote side still holds what it held.
    pub skipped: Vec<String>,
    /// Why paths could not be read, in words.
    pub problems: Vec<String>,
    /// Conflict copies made: (path, name it was kept as).
    pub conflicts: Vec<(String, String)>,
    /// Remote deletions done (a whole directory counts once).
    pub deleted: u64,
    /// Bytes of file content sent.
    pub bytes: u64,
    /// Bytes on the wire.
    pub wire_bytes: u64,
}

/// Runs `plan` against the sandbox; `local` holds the local entries it names.
pub(crate) async fn push(
    session: &Session,
    target: &Target,
    plan: &Plan,
    local: &Tree,
    progress: &ProgressBar,
) -> Result<Pushed, SyncError> {
    let mut done = Pushed::default();
    let stamp = conflict_stamp(SystemTime::now());
    let root = target.remote.as_str();

    // Owned paths: futures borrowing from a closure's argument are not provably `Send`.
    let asides: Vec<String> = plan.set_aside.clone();
    let asides = asides.into_iter().map(|rel| {
        let stamp = stamp.clone();
        async move { set_aside(session, root, &rel, &stamp).await }
    });
    let mut asides = stream::iter(asides).buffer_unordered(REMOTE_CONCURRENCY);
    while let Some(result) = asides.next().await {
        if let Some(pair) = result? {
            done.conflicts.push(pair);
        }
    }
    drop(asides);

    let mut removals: Vec<(String, bool)> =
        plan.remove.iter().map(|rel| (rel.clone(), false)).collect();
    removals.extend(plan.remove_trees.iter().map(|rel| (rel.clone(), true)));
    let removals = removals.into_iter().map(|(rel, tree)| async move {
        let path = absolute(root, &rel);
        match timed(&path, session.remove(&path, tree)).await {
            Err(SyncError::Remote { source, .. }) if source.code() == Some(ErrorCode::NotFound) => {
                Ok(())
            }
            other => other,
        }
    });
    let mut removing = stream::iter(removals).buffer_unordered(REMOTE_CONCURRENCY);
    while let Some(result) = removing.next().await {
        result?;
        done.deleted += 1;
    }
    drop(removing);

    if !plan.upload.is_empty() {
        upload(session, target, &plan.upload, local, progress, &mut done).await?;
    }

    // Deepest first, one at a time; a directory still holding kept things stays.
    for rel in &plan.prune {
        let path = absolute(root, rel);
        match timed(&path, session.remove(&path, false)).await {
            Ok(()) => done.deleted += 1,
            Err(e) if e.is_disconnect() => return Err(e),
            Err(_) => {}
        }
    }
    Ok(done)
}

/// Renames the remote `rel` to a free conflict name; `None` if it was already gone.
async fn set_aside(
    session: &Session,
    root: &str,
    rel: &str,
    stamp: &str,
) -> Result<Option<(String, String)>, SyncError> {
    let from = absolute(root, rel);
    for attempt in 1.. {
        let kept = match attempt {
            1 => format!("{rel}{CONFLICT_MARKER}{stamp}"),
            n => format!("{rel}{CONFLICT_MARKER}{stamp}-{n}"),
        };
        let to = absolute(root, &kept);
        match timed(&from, session.rename(&from, &to, false)).await {
            Ok(()) => return Ok(Some((rel.to_string(), kept))),
            Err(SyncError::Remote { source, .. }) if source.code() == Some(ErrorCode::NotFound) => {
                return Ok(None)
            }
            Err(SyncError::Remote { source, .. })
                if source.code() == Some(ErrorCode::AlreadyExists) =>
            {
                continue
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the attempts never end")
}

/// Sends `paths` (relative to the local root) as tar streams: one for a small upload; for
/// a large one, [`PUSH_STREAMS`] streams of files and symlinks side by side (packing and
/// unpacking are each single-threaded, so one stream leaves cores idle), then one of the
/// directories, so their modes and mtimes land after everything inside them.
async fn upload(
    session: &Session,
    target: &Target,
    paths: &[String],
    local: &Tree,
    progress: &ProgressBar,
    done: &mut Pushed,
) -> Result<(), SyncError> {
    let content = Arc::new(AtomicU64::new(0));
    let mut packed = Packed::default();
    let mut wire = 0;
    let mut merge = |(p, w): (Packed, u64)| {
        packed.sent.extend(p.sent);
        packed.skipped.extend(p.skipped);
        packed.problems.extend(p.problems);
        wire += w;
    };
    let (mut shards, mut dirs) = shard(paths, local, PUSH_STREAMS);
    // Streams land side by side, so a second name of a file goes in the last stream, as a
    // hard link to the first name another stream has landed by then.
    let mut firsts = HashMap::new();
    if shards.len() > 1 {
        for shard in &mut shards {
            shard.retain(|rel| {
                let Ok(meta) = std::fs::symlink_metadata(target.local.join(local_path(rel))) else {
                    return true;
                };
                if !meta.is_file() || meta.nlink() < 2 {
                    return true;
                }
                match firsts.entry((meta.dev(), meta.ino())) {
                    std::collections::hash_map::Entry::Occupied(_) => {
                        dirs.push(rel.clone());
                        false
                    }
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        slot.insert(local_path(rel));
                        true
                    }
                }
            });
        }
    }
    let sending = shards.into_iter().map(|shard| {
        upload_one(
            session,
            target,
            shard,
            HashMap::new(),
            content.clone(),
            progress,
        )
    });
    for result in futures_util::future::try_join_all(sending).await? {
        merge(result);
    }
    if !dirs.is_empty() {
        merge(upload_one(session, target, dirs, firsts, content.clone(), progress).await?);
    }
    done.sent = packed.sent;
    done.skipped = packed.skipped;
    done.problems = packed.problems;
    done.bytes = content.load(Ordering::Relaxed);
    done.wire_bytes = wire;
    Ok(())
}

/// Splits an upload into streams: `(shards, directories)`. Below [`SHARD_MIN_BYTES`] it is
/// one stream, directories in order. Otherwise the files and symlinks go into at most
/// `streams` contiguous runs of the sorted paths (a directory's files stay together) of
/// about equal weight, each file weighing its size plus [`SHARD_FILE_WEIGHT`] for its
/// creation; the directories go into a last stream of their own.
fn shard(paths: &[String], local: &Tree, streams: usize) -> (Vec<Vec<String>>, Vec<String>) {
    let weight = |p: &String| local.get(p).map_or(0, |e| e.size) + SHARD_FILE_WEIGHT;
    let total: u64 = paths.iter().map(weight).sum();
    if streams <= 1 || total < SHARD_MIN_BYTES {
        return (vec![paths.to_vec()], Vec::new());
    }
    let (dirs, leaves): (Vec<String>, Vec<String>) = paths
        .iter()
        .cloned()
        .partition(|p| local.get(p).is_some_and(Entry::is_dir));
    let share = total.div_ceil(streams as u64);
    let mut shards = vec![Vec::new()];
    let mut filled = 0;
    for path in leaves {
        let w = weight(&path);
        if filled + w > share && filled > 0 && shards.len() < streams {
            shards.push(Vec::new());
            filled = 0;
        }
        filled += w;
        shards.last_mut().expect("never empty").push(path);
    }
    shards.retain(|s| !s.is_empty());
    (shards, dirs)
}

/// Sends one tar stream of `paths`; returns what went in and the bytes on the wire.
async fn upload_one(
    session: &Session,
    target: &Target,
    paths: Vec<String>,
    linked: HashMap<(u64, u64), PathBuf>,
    content: Arc<AtomicU64>,
    progress: &ProgressBar,
) -> Result<(Packed, u64), SyncError> {
    let (reader, packer) = pack::start(
        target.local.clone(),
        paths,
        linked,
        target.gzip,
        content,
        progress.clone(),
    );
    let op = Op::TarWrite {
        path: target.remote.as_str().into(),
        gzip: target.gzip,
    };
    let mut wire = 0;
    let sent = session.upload(op, reader, |n| wire = n).await;
    let packed = packer.await.map_err(|e| SyncError::Worker(e.to_string()))?;
    match (packed, sent) {
        (Ok(packed), Ok(_)) => Ok((packed, wire)),
        // The agent's message names the directory and the file.
        (_, Err(e)) => Err(SyncError::remote("in the sandbox")(e)),
        (Err(PackError::Pipe(source)), Ok(_)) => Err(SyncError::Local {
            path: target.local.clone(),
            source,
        }),
    }
}
/// `20250102T030405Z`: a UTC time that sorts, and is safe in a file name.
pub(crate) fn conflict_stamp(now: SystemTime) -> String {
    humantime::format_rfc3339_seconds(now)
        .to_string()
        .replace(['-', ':'], "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::tree::Kind;
    use std::time::{Duration, UNIX_EPOCH};

    fn entry(kind: Kind, size: u64) -> Entry {
        Entry {
            kind,
            size,
            mtime_s: 1,
            mtime_ns: 0,
            remote_ns: 0,
            mode: 0o644,
            target: None,
        }
    }

    #[test]
    fn large_uploads_are_sharded_by_weight_with_directories_last() {
        let mut local = Tree::new();
        let mut paths = Vec::new();
        for d in 0..4 {
            local.insert(format!("d{d}"), entry(Kind::Dir, 0));
            paths.push(format!("d{d}"));
            for f in 0..10 {
                let p = format!("d{d}/f{f}");
                local.insert(p.clone(), entry(Kind::File, 1 << 20));
                paths.push(p);
            }
        }
        let (shards, dirs) = shard(&paths, &local, 4);
        assert_eq!(dirs, ["d0", "d1", "d2", "d3"]);
        assert_eq!(shards.len(), 4);
        assert!(shards.iter().all(|s| s.len() == 10), "{shards:?}");
        assert_eq!(shards[1][0], "d1/f0", "contiguous runs");
        // A small upload is one stream, in order.
        let few: Vec<String> = paths[..3].to_vec();
        let (shards, dirs) = shard(&few, &local, 4);
        assert_eq!((shards, dirs.len()), (vec![few.clone()], 0));
    }

    #[test]
    fn stamps_sort_and_fit_in_names() {
        let t = UNIX_EPOCH + Duration::from_secs(1_735_787_045);
        assert_eq!(conflict_stamp(t), "20250102T030405Z");
    }
}

//! `tether sync ID:/path LOCAL`: a one-shot copy from the sandbox, moving only what differs.
//!
//! The sandbox wins for every path it holds; a local file in the way that differs from
//! what the last sync left (edited here since) is first renamed to
//! `NAME.tether-conflict-<UTC time>`, and a local directory in the way of a file is renamed
//! likewise. A pull never deletes a local path the sandbox lacks. Files arrive through
//! `read_batch` streams, are written to a temporary file beside their destination on a
//! blocking thread, and are renamed into place with the sandbox's mode and mtime.

use std::fs::{self, File, FileTimes, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tether_proto::op::{Op, Reply};
use tether_proto::Channel;
use tokio::sync::mpsc;

use super::baseline::Baseline;
use super::constants::{CONFLICT_MARKER, READ_BATCH_BYTES, READ_BATCH_FILES};
use super::error::SyncError;
use super::push::conflict_stamp;
use super::remote::{self, absolute};
use super::report::{Phase, Reporter, Stats};
use super::rules::Rules;
use super::scan;
use super::tree::{recorded, Entry, Kind, Tree};
use super::SyncSpec;
use crate::client::{ClientError, Event, Session};

/// Pulls `spec.remote` into `spec.local` (created if missing).
pub async fn pull(
    session: &Session,
    spec: &SyncSpec,
    reporter: &Reporter,
) -> Result<Stats, SyncError> {
    let started = Instant::now();
    fs::create_dir_all(&spec.local).map_err(SyncError::local(&spec.local))?;
    let root = spec
        .local
        .canonicalize()
        .map_err(SyncError::local(&spec.local))?;
    let rules = std::sync::Arc::new(Rules::new(&root, &spec.excludes)?);
    let mut baseline = Baseline::load(&spec.sandbox, &spec.remote, &root);
    let listing = remote::list(session, &spec.remote, "", &rules).await?;
    for p in &listing.problems {
        reporter.problem(p);
    }
    let local = {
        let (root, rules) = (root.clone(), rules.clone());
        tokio::task::spawn_blocking(move || scan::scan(&root, "", &rules, |_| {}))
            .await
            .map_err(|e| SyncError::Worker(e.to_string()))?
    };
    for p in &local.problems {
        reporter.problem(p);
    }

    let stamp = conflict_stamp(SystemTime::now());
    let mut stats = Stats {
        checked: listing.tree.len() as u64,
        ..Stats::default()
    };
    let mut fetch: Vec<(String, Entry)> = Vec::new();
    for (rel, r) in &listing.tree {
        let path = root.join(rel);
        match local.tree.get(rel) {
            Some(l) if l.same(r) => continue,
            Some(l) if l.is_dir() && r.is_dir() => {}
            Some(l)
                if !l.is_dir() && baseline.tree.get(rel).is_some_and(|k| l.unchanged_since(k)) =>
            {
                fs::remove_file(&path).map_err(SyncError::local(&path))?;
            }
            Some(_) => {
                let kept = format!("{rel}{CONFLICT_MARKER}{stamp}");
                fs::rename(&path, root.join(&kept)).map_err(SyncError::local(&path))?;
                reporter.conflict(rel, &kept);
                stats.conflicts += 1;
            }
            None => {}
        }
        match r.kind {
            Kind::Dir => {
                fs::create_dir_all(&path).map_err(SyncError::local(&path))?;
                stats.dirs += 1;
            }
            Kind::Symlink => {
                let target = r.target.clone().unwrap_or_default();
                std::os::unix::fs::symlink(&target, &path).map_err(SyncError::local(&path))?;
                stats.files += 1;
            }
            Kind::File => fetch.push((rel.clone(), r.clone())),
        }
    }

    let progress = reporter.progress(fetch.iter().map(|(_, e)| e.size).sum());
    for chunk in batches(&fetch) {
        let (files, bytes) = read_batch(session, &spec.remote, &root, chunk, &progress).await?;
        stats.files += files;
        stats.bytes += bytes;
        stats.wire_bytes += bytes;
    }
    progress.finish_and_clear();

    // Directory modes last, deepest first: a read-only directory must not block its contents.
    for (rel, r) in listing.tree.iter().rev().filter(|(_, r)| r.is_dir()) {
        let path = root.join(rel);
        let _ = fs::set_permissions(&path, Permissions::from_mode(r.mode));
    }
    let now: Tree = listing
        .tree
        .iter()
        .filter_map(|(rel, r)| scan::stat(&root, rel).map(|e| (rel.clone(), recorded(&e, Some(r)))))
        .collect();
    baseline.replace("", now);
    baseline.save()?;
    stats.ms = started.elapsed().as_millis() as u64;
    reporter.synced(Phase::Pull, &stats);
    Ok(stats)
}

/// Splits the files to fetch into `read_batch`-sized groups.
fn batches(files: &[(String, Entry)]) -> Vec<&[(String, Entry)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (_, e)) in files.iter().enumerate() {
        if i > start && (i - start == READ_BATCH_FILES || bytes + e.size > READ_BATCH_BYTES) {
            out.push(&files[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += e.size;
    }
    if start < files.len() {
        out.push(&files[start..]);
    }
    out
}

/// What the writer thread is told.
enum ToWriter {
    Begin {
        path: PathBuf,
        size: u64,
        mode: u32,
        mtime_s: i64,
    },
    Data(Bytes),
}

/// Fetches one group of files; returns the files and bytes written.
async fn read_batch(
    session: &Session,
    remote_root: &str,
    root: &Path,
    files: &[(String, Entry)],
    progress: &indicatif::ProgressBar,
) -> Result<(u64, u64), SyncError> {
    let paths: Vec<String> = files
        .iter()
        .map(|(rel, _)| absolute(remote_root, rel))
        .collect();
    let mut stream = session
        .open(Op::ReadBatch { paths })
        .await
        .map_err(SyncError::remote("reading files from the sandbox"))?;
    let (tx, rx) = mpsc::channel::<ToWriter>(64);
    let writer = tokio::task::spawn_blocking(move || write_files(rx));
    let mut queue = std::collections::VecDeque::new();
    let mut left = 0u64;
    let mut bytes = 0u64;
    let lost = |_| SyncError::Worker("the file writer stopped".into());
    loop {
        // Zero-length files (and any file whose bytes are all in) need no data to begin.
        while left == 0 {
            let Some((rel, size, e)) = queue.pop_front() else {
                break;
            };
            let e: &Entry = e;
            tx.send(ToWriter::Begin {
                path: root.join(rel),
                size,
                mode: e.mode,
                mtime_s: e.mtime_s,
            })
            .await
            .map_err(lost)?;
            left = size;
        }
        match stream.next().await {
            Some(Event::Reply(Reply::Batch { results })) => {
                for ((rel, e), result) in files.iter().zip(results) {
                    if let Some(size) = result.size {
                        queue.push_back((rel, size, e));
                    }
                }
            }
            Some(Event::Data(Channel::Out, mut data)) => {
                bytes += data.len() as u64;
                progress.inc(data.len() as u64);
                while !data.is_empty() {
                    let take = (left as usize).min(data.len());
                    if take == 0 {
                        // More bytes than announced: a protocol error.
                        return Err(SyncError::remote("reading files from the sandbox")(
                            ClientError::Protocol(
                                "read_batch sent more bytes than its sizes announced".into(),
                            ),
                        ));
                    }
                    tx.send(ToWriter::Data(data.split_to(take)))
                        .await
                        .map_err(lost)?;
                    left -= take as u64;
                    while left == 0 {
                        let Some((rel, size, e)) = queue.pop_front() else {
                            break;
                        };
                        tx.send(ToWriter::Begin {
                            path: root.join(rel),
                            size,
                            mode: e.mode,
                            mtime_s: e.mtime_s,
                        })
                        .await
                        .map_err(lost)?;
                        left = size;
                    }
                }
            }
            Some(Event::Error(e)) => {
                return Err(SyncError::remote("reading files from the sandbox")(e))
            }
            Some(Event::Closed) | None => break,
            Some(_) => {}
        }
    }
    drop(tx);
    let files = writer
        .await
        .map_err(|e| SyncError::Worker(e.to_string()))??;
    Ok((files, bytes))
}

/// A file being written under a temporary name beside its destination; removed on drop
/// unless it was renamed into place, so a failed or cut pull leaves the old file (or none),
/// never a partial one.
struct Landing {
    file: File,
    tmp: PathBuf,
    path: PathBuf,
    left: u64,
    mode: u32,
    mtime_s: i64,
    landed: bool,
}

impl Landing {
    fn start(path: PathBuf, size: u64, mode: u32, mtime_s: i64) -> Result<Landing, SyncError> {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(SyncError::local(parent))?;
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tether-tmp-{}", std::process::id()));
        let file = File::create(&tmp).map_err(SyncError::local(&tmp))?;
        Ok(Landing {
            file,
            tmp,
            path,
            left: size,
            mode,
            mtime_s,
            landed: false,
        })
    }

    /// Gives the file its mode and mtime and renames it into place.
    fn land(mut self) -> Result<(), SyncError> {
        let mtime = UNIX_EPOCH + Duration::from_secs(self.mtime_s.max(0) as u64);
        let done = (|| -> io::Result<()> {
            self.file
                .set_permissions(Permissions::from_mode(self.mode))?;
            self.file
                .set_times(FileTimes::new().set_modified(mtime).set_accessed(mtime))?;
            fs::rename(&self.tmp, &self.path)
        })();
        done.map_err(SyncError::local(&self.path))?;
        self.landed = true;
        Ok(())
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        if !self.landed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Writes the files announced on `rx`, each landing only once whole; returns how many were
/// written.
fn write_files(mut rx: mpsc::Receiver<ToWriter>) -> Result<u64, SyncError> {
    let mut current: Option<Landing> = None;
    let mut written = 0;
    while let Some(msg) = rx.blocking_recv() {
        match msg {
            ToWriter::Begin {
                path,
                size,
                mode,
                mtime_s,
            } => {
                if let Some(open) = current.take() {
                    if open.left == 0 {
                        open.land()?;
                        written += 1;
                    }
                }
                current = Some(Landing::start(path, size, mode, mtime_s)?);
            }
            ToWriter::Data(bytes) => {
                let Some(open) = current.as_mut() else {
                    continue;
                };
                open.file
                    .write_all(&bytes)
                    .map_err(SyncError::local(&open.tmp))?;
                open.left = open.left.saturating_sub(bytes.len() as u64);
            }
        }
    }
    // The last file lands only if all of it came; a cut stream leaves it out.
    if let Some(open) = current.take() {
        if open.left == 0 {
            open.land()?;
            written += 1;
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_land_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, "old").unwrap();
        let send = |msgs: Vec<ToWriter>| {
            let (tx, rx) = mpsc::channel(8);
            for m in msgs {
                tx.blocking_send(m).unwrap();
            }
            drop(tx);
            write_files(rx).unwrap()
        };
        let begin = |size| ToWriter::Begin {
            path: path.clone(),
            size,
            mode: 0o600,
            mtime_s: 5,
        };
        // Cut after 3 of 10 bytes: the old file stays, and no temporary file is left.
        let cut = send(vec![begin(10), ToWriter::Data(Bytes::from_static(b"new"))]);
        assert_eq!(cut, 0);
        assert_eq!(fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        let whole = send(vec![begin(3), ToWriter::Data(Bytes::from_static(b"new"))]);
        assert_eq!(whole, 1);
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn batches_respect_both_limits() {
        let file = |size| Entry {
            kind: Kind::File,
            size,
            mtime_s: 1,
            mtime_ns: 0,
            remote_ns: 0,
            mode: 0o644,
            target: None,
        };
        let files: Vec<(String, Entry)> = (0..READ_BATCH_FILES + 3)
            .map(|i| (i.to_string(), file(1)))
            .collect();
        let sizes: Vec<usize> = batches(&files).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [READ_BATCH_FILES, 3]);
        let big = vec![
            ("a".to_string(), file(READ_BATCH_BYTES)),
            ("b".to_string(), file(1)),
        ];
        assert_eq!(batches(&big).len(), 2);
        assert!(batches(&[]).is_empty());
    }
}

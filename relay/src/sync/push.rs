//! Carrying out a [`Plan`] in the sandbox: conflict copies set aside, deletions, then one
//! tar stream (gzip-compressed unless the link is local) of everything to send, then
//! directories pruned.
//!
//! The archive is packed on a blocking thread straight from the files into a pipe that the
//! upload drains, so nothing is ever whole in memory and a multi-GB file simply streams.
//! Each file's header is made from the open file's own metadata, and that is what the
//! baseline records: a file edited after the scan is sent as it is now, and a later change
//! still looks like one.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use flate2::write::GzEncoder;
use futures_util::stream::{self, StreamExt};
use indicatif::ProgressBar;
use tar::{Builder, EntryType, Header, HeaderMode};
use tether_proto::op::Op;
use tether_proto::ErrorCode;
use tokio_util::io::SyncIoBridge;

use super::constants::{CONFLICT_MARKER, PACK_BUFFER, PIPE_BYTES, REMOTE_CONCURRENCY};
use super::error::SyncError;
use super::plan::Plan;
use super::remote::{absolute, timed};
use super::tree::{Entry, Tree};
use crate::client::Session;

/// Where a push goes.
#[derive(Clone, Debug)]
pub struct Target {
    /// The local root.
    pub local: PathBuf,
    /// The remote root (absolute).
    pub remote: String,
    /// Gzip the archive.
    pub gzip: bool,
}

/// What a push did.
#[derive(Debug, Default)]
pub struct Pushed {
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

/// Runs `plan` against the sandbox.
pub async fn push(
    session: &Session,
    target: &Target,
    plan: &Plan,
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
        upload(session, target, &plan.upload, progress, &mut done).await?;
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

/// Sends `paths` (relative to the local root) as one tar stream.
async fn upload(
    session: &Session,
    target: &Target,
    paths: &[String],
    progress: &ProgressBar,
    done: &mut Pushed,
) -> Result<(), SyncError> {
    let (reader, writer) = tokio::io::simplex(PIPE_BYTES);
    let content = Arc::new(AtomicU64::new(0));
    let packer = {
        let (local, paths, gzip) = (target.local.clone(), paths.to_vec(), target.gzip);
        let (content, progress) = (content.clone(), progress.clone());
        tokio::task::spawn_blocking(move || {
            // Batches the tar builder's small writes into pipe-sized ones.
            let sink = BufWriter::with_capacity(PACK_BUFFER, SyncIoBridge::new(writer));
            // The reader sees the end only when the pipe is shut down, not merely dropped.
            let close = |sink: BufWriter<SyncIoBridge<_>>| -> io::Result<()> {
                sink.into_inner().map_err(|e| e.into_error())?.shutdown()
            };
            if gzip {
                let gz = GzEncoder::new(sink, flate2::Compression::fast());
                let counted = Counting {
                    inner: gz,
                    content,
                    progress,
                };
                pack(&local, &paths, counted, |c| close(c.inner.finish()?))
            } else {
                let counted = Counting {
                    inner: sink,
                    content,
                    progress,
                };
                pack(&local, &paths, counted, |c| close(c.inner))
            }
        })
    };
    let op = Op::TarWrite {
        path: target.remote.clone(),
        gzip: target.gzip,
    };
    let mut wire = 0;
    let sent = session.upload(op, reader, |n| wire = n).await;
    let packed = packer.await.map_err(|e| SyncError::Worker(e.to_string()))?;
    let packed = match (packed, sent) {
        (Ok(packed), Ok(_)) => packed,
        (_, Err(e)) => {
            return Err(SyncError::remote(format!(
                "unpacking into {} in the sandbox",
                target.remote
            ))(e))
        }
        (Err(PackError::Pipe(source)), Ok(_)) => {
            return Err(SyncError::Local {
                path: target.local.clone(),
                source,
            })
        }
    };
    done.sent = packed.sent;
    done.skipped = packed.skipped;
    done.problems = packed.problems;
    done.bytes = content.load(Ordering::Relaxed);
    done.wire_bytes = wire;
    Ok(())
}

/// Why packing stopped: the pipe to the network closed (the upload failed, and its error
/// tells why) or the compressor failed.
#[derive(Debug)]
enum PackError {
    Pipe(io::Error),
}

/// What went into an archive.
struct Packed {
    sent: Tree,
    skipped: Vec<String>,
    problems: Vec<String>,
}

/// Writes the archive of `paths` to `out`, then `finish`es it.
fn pack<W: Write>(
    root: &Path,
    paths: &[String],
    out: W,
    finish: impl FnOnce(W) -> io::Result<()>,
) -> Result<Packed, PackError> {
    let mut tar = Builder::new(out);
    tar.mode(HeaderMode::Complete);
    let mut packed = Packed {
        sent: Tree::new(),
        skipped: Vec::new(),
        problems: Vec::new(),
    };
    for rel in paths {
        let path = root.join(rel);
        match append(&mut tar, &path, rel) {
            Ok(Some(entry)) => {
                packed.sent.insert(rel.clone(), entry);
            }
            Ok(None) => packed.skipped.push(rel.clone()),
            // Nothing of this entry was written yet: skip it, send the rest.
            Err(Appending::Read(e)) => {
                packed
                    .problems
                    .push(format!("{}: {e}; not sent", path.display()));
                packed.skipped.push(rel.clone());
            }
            Err(Appending::Write(e)) => return Err(PackError::Pipe(e)),
        }
    }
    let out = tar.into_inner().map_err(PackError::Pipe)?;
    finish(out).map_err(PackError::Pipe)?;
    Ok(packed)
}

enum Appending {
    Read(io::Error),
    Write(io::Error),
}

/// Appends one path; `None` when it is gone or no longer something the sync carries.
fn append<W: Write>(
    tar: &mut Builder<W>,
    path: &Path,
    rel: &str,
) -> Result<Option<Entry>, Appending> {
    let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(Appending::Read(e)),
    };
    let mut header = Header::new_gnu();
    let kind = meta.file_type();
    if kind.is_file() {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(Appending::Read(e)),
        };
        // The open file's metadata: what is actually sent.
        let meta = file.metadata().map_err(Appending::Read)?;
        header.set_metadata_in_mode(&meta, HeaderMode::Complete);
        let entry = Entry::from_metadata(&meta, None);
        let body = Exactly {
            file,
            left: meta.len(),
        };
        tar.append_data(&mut header, rel, body)
            .map_err(Appending::Write)?;
        return Ok(entry);
    }
    header.set_metadata_in_mode(&meta, HeaderMode::Complete);
    if kind.is_dir() {
        header.set_entry_type(EntryType::Directory);
        header.set_size(0);
        tar.append_data(&mut header, rel, io::empty())
            .map_err(Appending::Write)?;
        return Ok(Entry::from_metadata(&meta, None));
    }
    if kind.is_symlink() {
        let target = match fs::read_link(path) {
            Ok(t) => t,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(Appending::Read(e)),
        };
        header.set_entry_type(EntryType::Symlink);
        header.set_size(0);
        tar.append_link(&mut header, rel, &target)
            .map_err(Appending::Write)?;
        return Ok(Entry::from_metadata(
            &meta,
            Some(target.to_string_lossy().into_owned()),
        ));
    }
    Ok(None)
}

/// A file's first `left` bytes, the size its header announced; if it shrinks while being
/// read, zeros make up the rest (as GNU tar does) and the next change notification sends
/// it again.
struct Exactly {
    file: File,
    left: u64,
}

impl Read for Exactly {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (buf.len() as u64).min(self.left) as usize;
        if want == 0 {
            return Ok(0);
        }
        let mut n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            buf[..want].fill(0);
            n = want;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Counts the archive bytes (before compression: about the content size) and moves the
/// progress bar.
struct Counting<W> {
    inner: W,
    content: Arc<AtomicU64>,
    progress: ProgressBar,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.content.fetch_add(n as u64, Ordering::Relaxed);
        self.progress.inc(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// `20250102T030405Z`: a UTC time that sorts, and is safe in a file name.
pub fn conflict_stamp(now: SystemTime) -> String {
    humantime::format_rfc3339_seconds(now)
        .to_string()
        .replace(['-', ':'], "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::tree::Kind;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn stamps_sort_and_fit_in_names() {
        let t = UNIX_EPOCH + Duration::from_secs(1_735_787_045);
        assert_eq!(conflict_stamp(t), "20250102T030405Z");
    }

    #[test]
    fn packs_files_dirs_and_links_with_what_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir(root.join("d")).unwrap();
        fs::write(root.join("d/f"), "hello").unwrap();
        std::os::unix::fs::symlink("d/f", root.join("l")).unwrap();
        let paths: Vec<String> = ["d", "d/f", "l", "gone"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut bytes = Vec::new();
        let Packed { sent, skipped, .. } = pack(root, &paths, &mut bytes, |_| Ok(())).unwrap();
        assert_eq!(skipped, ["gone"]);
        assert_eq!(sent["d/f"].size, 5);
        assert_eq!(sent["l"].kind, Kind::Symlink);

        let out = tempfile::tempdir().unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        archive.set_preserve_mtime(true);
        archive.unpack(out.path()).unwrap();
        assert_eq!(fs::read_to_string(out.path().join("d/f")).unwrap(), "hello");
        assert_eq!(
            fs::read_link(out.path().join("l")).unwrap(),
            Path::new("d/f")
        );
        let copy = crate::sync::scan::stat(out.path(), "d/f").unwrap();
        assert!(
            copy.same(&sent["d/f"]),
            "the unpacked copy passes the quick check"
        );
    }
}

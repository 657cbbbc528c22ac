//! Packing local paths into a tar stream on a blocking thread, straight from the files into
//! a pipe the upload drains, so nothing is ever whole in memory and a multi-GB file simply
//! streams. Each file's header is made from the open file's own metadata, and that is what
//! the baseline records: a file edited after the scan is sent as it is now, and a later
//! change still looks like one.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use flate2::write::GzEncoder;
use indicatif::ProgressBar;
use tar::{Builder, EntryType, Header, HeaderMode};
use tokio::io::DuplexStream;
use tokio::task::JoinHandle;
use tokio_util::io::SyncIoBridge;

use super::constants::{PACK_BUFFER, PIPE_BYTES};
use super::tree::{key, local_path, Entry, Tree};
use tether_client::escape::escape_os;
use tether_client::hostfs::pack::{data_extents, Exactly};
use tether_proto::sparse::append_sparse;

/// Starts packing `paths` (relative to `local`) on a blocking thread; returns the archive's
/// bytes to upload and the packer, whose result says what went in. `content` and
/// `progress` count the archive bytes (before compression: about the content size).
pub(crate) fn start(
    local: PathBuf,
    paths: Vec<String>,
    linked: HashMap<(u64, u64), PathBuf>,
    gzip: bool,
    content: Arc<AtomicU64>,
    progress: ProgressBar,
) -> (DuplexStream, JoinHandle<Result<Packed, PackError>>) {
    // A duplex pipe, not a simplex one: when the upload fails and drops its end, the
    // packer's next write fails at once ("broken pipe") instead of waiting forever for room.
    let (reader, writer) = tokio::io::duplex(PIPE_BYTES);
    let packer = tokio::task::spawn_blocking(move || {
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
            pack(&local, &paths, linked, counted, |c| {
                close(c.inner.finish()?)
            })
        } else {
            let counted = Counting {
                inner: sink,
                content,
                progress,
            };
            pack(&local, &paths, linked, counted, |c| close(c.inner))
        }
    });
    (reader, packer)
}

/// Why packing stopped: the pipe to the network closed (the upload failed, and its error
/// tells why) or the compressor failed.
#[derive(Debug)]
pub(crate) enum PackError {
    /// The pipe or the compressor failed.
    Pipe(io::Error),
}

/// What went into an archive.
#[derive(Debug, Default)]
pub(crate) struct Packed {
    /// Entries sent, as they were when read.
    pub sent: Tree,
    /// Paths gone or unreadable when their turn came.
    pub skipped: Vec<String>,
    /// Why paths could not be read, in words.
    pub problems: Vec<String>,
}

/// Writes the archive of `paths` to `out`, then `finish`es it.
fn pack<W: Write>(
    root: &Path,
    paths: &[String],
    mut linked: HashMap<(u64, u64), PathBuf>,
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
        let path = root.join(local_path(rel));
        match append(&mut tar, &path, &local_path(rel), &mut linked) {
            Ok(Some(entry)) => {
                packed.sent.insert(rel.clone(), entry);
            }
            Ok(None) => packed.skipped.push(rel.clone()),
            // Nothing of this entry was written yet: skip it, send the rest.
            Err(Appending::Read(e)) => {
                packed
                    .problems
                    .push(format!("{}: {e}; not sent", escape_os(path.as_os_str())));
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
    rel: &Path,
    linked: &mut HashMap<(u64, u64), PathBuf>,
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
        // A second name of a file this archive holds goes as a hard link to the first.
        if meta.nlink() > 1 {
            if let Some(first) = linked.get(&(meta.dev(), meta.ino())) {
                header.set_entry_type(EntryType::Link);
                header.set_size(0);
                tar.append_link(&mut header, rel, first)
                    .map_err(Appending::Write)?;
                return Ok(entry);
            }
            linked.insert((meta.dev(), meta.ino()), rel.to_path_buf());
        }
        // If it shrinks while read, zeros make up the rest and the next change notification
        // sends it again.
        match data_extents(&file, meta.len()).map_err(Appending::Read)? {
            Some(extents) => append_sparse(tar, &mut header, rel, file, meta.len(), extents),
            None => tar.append_data(&mut header, rel, Exactly::new(file, meta.len())),
        }
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
            Some(key(target.as_os_str().as_bytes())),
        ));
    }
    Ok(None)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::tree::Kind;

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
        let Packed { sent, skipped, .. } =
            pack(root, &paths, HashMap::new(), &mut bytes, |_| Ok(())).unwrap();
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

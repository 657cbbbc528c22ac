//! Trees as tar streams: `tar_read` archives a directory (or file) onto `out`, `tar_write`
//! unpacks an archive (optionally gzip-compressed) arriving on `in`.
//!
//! Both stream through [`super::pump`]: the tar builder or parser runs on a blocking thread
//! and the archive is never whole in memory. Symlinks stay symlinks; modes, mtimes and empty
//! directories are kept; owners are recorded but not restored; a file's second name is
//! archived as a hard link to its first; a file with holes goes as a GNU sparse entry
//! ([`sparse`]); FIFOs and devices go as their header alone, so the receiver can name what
//! it did not make; sockets are left out. Unpacking ([`unpack`]) lands each file
//! atomically, sparse ones with their holes, and writes nothing outside the destination.

use std::collections::hash_map::{Entry, HashMap};
use std::error::Error;
use std::fs::{self, File, Metadata};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use tar::{Archive, Builder, EntryType, Header, HeaderMode};
use tether_proto::op::Reply;
use tether_proto::{Channel, ErrorCode};
use tracing::warn;
use walkdir::WalkDir;

use self::unpack::Lander;
use super::pump::{self, Incoming, Outgoing};
use super::search::NameOrPath;
use super::{blocking, fail, refuse, relative, READ_CHUNK};
use crate::stream::{OpError, OpResult, StreamCtx};

use tether_proto::sparse;
mod unpack;

/// Bytes of an incoming archive read at a time: 256 KiB.
const UNPACK_BUFFER: usize = 256 << 10;

/// `tar_read`: streams the archive on `out`, then `eof`.
pub(super) async fn tar_read(mut ctx: StreamCtx, root: PathBuf, exclude: Vec<String>) -> OpResult {
    let exclude = NameOrPath::new(exclude.iter().map(String::as_str))?;
    // A missing root is a plain error, not an empty archive.
    let root = blocking(move || {
        fs::metadata(&root).map_err(fail(&root))?;
        Ok(root)
    })
    .await?;
    let sent = pump::download(&ctx.out, &mut ctx.input, move |out| {
        build(&root, &exclude, out)
    })
    .await?;
    match sent {
        Some(()) => ctx.out.eof(Channel::Out).await,
        None => Ok(()),
    }
}

/// Writes the archive of `root` to `out`; entries are named relative to `root` (a single
/// file by its name). Excluded entries are skipped with everything beneath them.
fn build(root: &Path, exclude: &NameOrPath, out: &mut Outgoing) -> Result<(), OpError> {
    let mut tar = Builder::new(BufWriter::with_capacity(READ_CHUNK, out));
    let mut linked = HashMap::new();
    let meta = fs::metadata(root).map_err(fail(root))?;
    if meta.is_dir() {
        let walk = WalkDir::new(root)
            .min_depth(1)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| !exclude.is_match(&relative(root, e.path())));
        for entry in walk {
            let entry = entry.map_err(|e| {
                let path = e.path().unwrap_or(root).display().to_string();
                OpError::io(&path, &e.into())
            })?;
            let path = entry.path();
            let meta = entry.metadata().map_err(|e| fail(path)(e.into()))?;
            let name = relative(root, path);
            append(&mut tar, path, name.as_path(), &meta, &mut linked).map_err(fail(path))?;
        }
    } else {
        let name = root.file_name().unwrap_or(root.as_os_str());
        append(&mut tar, root, Path::new(name), &meta, &mut linked).map_err(fail(root))?;
    }
    tar.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(fail(root))
}

/// Appends one entry from its (not followed) metadata. `linked` maps the (device, inode)
/// of each archived file with several names to the first name it was archived under.
fn append<W: Write>(
    tar: &mut Builder<W>,
    path: &Path,
    name: &Path,
    meta: &Metadata,
    linked: &mut HashMap<(u64, u64), PathBuf>,
) -> io::Result<()> {
    let mut header = Header::new_gnu();
    header.set_metadata_in_mode(meta, HeaderMode::Complete);
    let kind = meta.file_type();
    if kind.is_symlink() {
        tar.append_link(&mut header, name, fs::read_link(path)?)
    } else if kind.is_dir() {
        tar.append_data(&mut header, name, io::empty())
    } else if kind.is_file() {
        if meta.nlink() > 1 {
            match linked.entry((meta.dev(), meta.ino())) {
                Entry::Occupied(first) => {
                    header.set_entry_type(EntryType::Link);
                    header.set_size(0);
                    return tar.append_link(&mut header, name, first.get());
                }
                Entry::Vacant(slot) => {
                    slot.insert(name.to_path_buf());
                }
            }
        }
        let file = File::open(path)?;
        if let Some(extents) = sparse::data_extents(&file, meta.len())? {
            return sparse::append_sparse(tar, &mut header, name, file, meta.len(), extents);
        }
        let file = Exactly {
            file,
            left: meta.len(),
            shrank: false,
            path,
        };
        tar.append_data(&mut header, name, file)
    } else if kind.is_fifo() || kind.is_char_device() || kind.is_block_device() {
        // The header alone: the receiver names it in its summary instead of making it.
        header.set_size(0);
        tar.append_data(&mut header, name, io::empty())
    } else {
        Ok(())
    }
}

/// A file's first `left` bytes, the size its header already announced. If the file shrinks
/// while it is read, the rest is zeros (as GNU tar does), so the archive stays well-formed.
struct Exactly<'a> {
    file: File,
    left: u64,
    shrank: bool,
    path: &'a Path,
}

impl Read for Exactly<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (buf.len() as u64).min(self.left) as usize;
        if want == 0 {
            return Ok(0);
        }
        let mut n = if self.shrank {
            0
        } else {
            self.file.read(&mut buf[..want])?
        };
        if n == 0 {
            if !self.shrank {
                let path = self.path.display();
                warn!(%path, "file shrank while archiving; padding with zeros");
                self.shrank = true;
            }
            buf[..want].fill(0);
            n = want;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// `tar_write`: unpacks the archive arriving on `in` into `dest`; replies `ok`.
pub(super) async fn tar_write(mut ctx: StreamCtx, dest: PathBuf, gzip: bool) -> OpResult {
    let done = pump::upload(&mut ctx.input, move |input| unpack(&dest, gzip, input)).await?;
    match done {
        Some(()) => ctx.out.reply(Reply::Ok).await,
        None => Ok(()),
    }
}

fn unpack(dest: &Path, gzip: bool, input: &mut Incoming) -> Result<(), OpError> {
    match fs::metadata(dest) {
        Ok(meta) if !meta.is_dir() => {
            return Err(refuse(ErrorCode::NotADirectory, dest, "Not a directory"))
        }
        Ok(_) => {}
        Err(_) => fs::create_dir_all(dest).map_err(fail(dest))?,
    }
    let dest = dest.canonicalize().map_err(fail(dest))?;
    // The tar parser reads 512-byte headers one at a time; the buffer turns those into
    // whole pieces of the stream (each read of `input` returns credit to the client and
    // wakes the connection, which per header would cost more than the header itself).
    let buffered = BufReader::with_capacity(UNPACK_BUFFER, &mut *input);
    let reader: Box<dyn Read + '_> = if gzip {
        Box::new(MultiGzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    };
    let mut archive = Archive::new(reader);
    let bad = |e: io::Error| malformed(&dest, e);
    let mut lander = Lander::new(&dest).map_err(fail(&dest))?;
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        lander.land(&mut entry).map_err(|e| {
            let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            malformed(&dest, io::Error::new(e.kind(), format!("{path}: {e}")))
        })?;
    }
    lander.finish().map_err(bad)?;
    drop(archive);
    // Whatever follows the end-of-archive marker (tar pads to its record size) is discarded,
    // and the reply waits for the client's eof.
    input.skip(u64::MAX).map_err(|e| malformed(&dest, e))?;
    Ok(())
}

/// An unpack failure: OS errors keep their code, anything else is a malformed archive.
fn malformed(dest: &Path, err: io::Error) -> OpError {
    let code = match ErrorCode::from_io(&err) {
        ErrorCode::Internal => ErrorCode::InvalidArgument,
        code => code,
    };
    // tar wraps the OS error in a description; show both.
    let mut message = err.to_string();
    let mut cause = err.source();
    while let Some(inner) = cause {
        let text = inner.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        cause = inner.source();
    }
    OpError::new(
        code,
        format!("unpacking into {}: {message}", dest.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use tar::EntryType;

    #[test]
    fn appends_symlinks_dirs_and_files_with_modes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir(root.join("empty")).unwrap();
        fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o751)).unwrap();
        std::os::unix::fs::symlink("run.sh", root.join("link")).unwrap();

        let mut tar = Builder::new(Vec::new());
        for name in ["empty", "link", "run.sh"] {
            let path = root.join(name);
            let meta = fs::symlink_metadata(&path).unwrap();
            append(&mut tar, &path, Path::new(name), &meta, &mut HashMap::new()).unwrap();
        }
        let bytes = tar.into_inner().unwrap();
        let mut archive = Archive::new(&bytes[..]);
        let entries: Vec<(String, EntryType, u32)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.entry_type(),
                    h.mode().unwrap() & 0o7777,
                )
            })
            .collect();
        assert_eq!(entries[0].0, "empty");
        assert_eq!(entries[0].1, EntryType::Directory);
        assert_eq!(entries[1].1, EntryType::Symlink);
        assert_eq!(entries[2], ("run.sh".into(), EntryType::Regular, 0o751));
        let mtime = fs::metadata(root.join("run.sh")).unwrap().mtime() as u64;
        let mut archive = Archive::new(&bytes[..]);
        let last = archive.entries().unwrap().last().unwrap().unwrap();
        assert_eq!(last.header().mtime().unwrap(), mtime);
    }

    #[test]
    fn shrinking_files_are_padded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, "abc").unwrap();
        let mut exactly = Exactly {
            file: File::open(&path).unwrap(),
            left: 5,
            shrank: false,
            path: &path,
        };
        let mut out = Vec::new();
        exactly.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"abc\0\0");
    }
}

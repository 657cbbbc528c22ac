//! Writing layers reproducibly: a list of entries becomes a gzip-compressed tar whose bytes
//! depend only on the entries' paths, content, modes and owners. Entries are sorted by
//! path, every mtime is the build's fixed time, user and group names are empty, and the gzip
//! header holds no time or file name. Both digests a manifest needs (compressed blob,
//! uncompressed `diff_id`) are computed on the way through.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use flate2::{Compression, GzBuilder};

use super::config::{Descriptor, MEDIA_LAYER_GZIP};
use super::constants::GZIP_LEVEL;
use super::digest::{Digest, HashingWriter};
use super::error::{ImageError, IoContext};
use super::layout::{descriptor, Layout};

/// One file, directory or link of a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The path inside the image, relative (`usr/local/bin/tether-agent`).
    pub(crate) path: String,
    /// What it is.
    pub(crate) kind: Kind,
    /// Permission bits, with setuid, setgid and sticky.
    pub(crate) mode: u32,
    /// Owner.
    pub(crate) uid: u64,
    /// Group.
    pub(crate) gid: u64,
}

/// What an [`Entry`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A directory.
    Dir,
    /// A regular file whose content is read from this host path.
    File(PathBuf),
    /// A symbolic link to this target.
    Symlink(String),
    /// A hard link to this earlier entry's path.
    Hardlink(String),
    /// A character device (major, minor).
    Char(u32, u32),
    /// A block device (major, minor).
    Block(u32, u32),
    /// A named pipe.
    Fifo,
}

/// A layer written to a layout.
#[derive(Clone, Debug)]
pub struct Written {
    /// The compressed blob.
    pub desc: Descriptor,
    /// The uncompressed tar's digest.
    pub diff_id: Digest,
}

/// Writes `entries` (in any order) as a layer blob of `layout`, every timestamp `mtime`
/// (seconds since the epoch).
pub fn write(layout: &Layout, mut entries: Vec<Entry>, mtime: u64) -> Result<Written, ImageError> {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    entries.dedup_by(|a, b| a.path == b.path);
    let what = || format!("writing a layer in {}", layout.root().display());
    let blob = layout.blob_writer()?;
    // No file name and no time in the gzip header; OS "unknown".
    let gzip = GzBuilder::new().write(blob, Compression::new(GZIP_LEVEL));
    let mut tar = tar::Builder::new(HashingWriter::new(gzip));
    for entry in &entries {
        append(&mut tar, entry, mtime)?;
    }
    let hashing = tar.into_inner().io(what)?;
    let (gzip, diff_id, _) = hashing.finish();
    let blob = gzip.finish().io(what)?;
    let (digest, size) = blob.finish()?;
    Ok(Written {
        desc: descriptor(MEDIA_LAYER_GZIP, digest, size),
        diff_id,
    })
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    entry: &Entry,
    mtime: u64,
) -> Result<(), ImageError> {
    let what = || format!("adding {} to a layer", entry.path);
    let mut header = tar::Header::new_gnu();
    header.set_mode(entry.mode & 0o7777);
    header.set_uid(entry.uid);
    header.set_gid(entry.gid);
    header.set_mtime(mtime);
    header.set_size(0);
    match &entry.kind {
        Kind::Dir => {
            header.set_entry_type(tar::EntryType::Directory);
            tar.append_data(&mut header, format!("{}/", entry.path), io::empty())
                .io(what)
        }
        Kind::File(source) => {
            let file = File::open(source).io(|| format!("opening {}", source.display()))?;
            let len = file
                .metadata()
                .io(|| format!("reading {}", source.display()))?
                .len();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(len);
            // A file that grows or shrinks while read makes the archive fail, never corrupt.
            tar.append_data(&mut header, &entry.path, file.take_exact(len))
                .io(what)
        }
        Kind::Symlink(target) => {
            header.set_entry_type(tar::EntryType::Symlink);
            tar.append_link(&mut header, &entry.path, target).io(what)
        }
        Kind::Hardlink(target) => {
            header.set_entry_type(tar::EntryType::Link);
            tar.append_link(&mut header, &entry.path, target).io(what)
        }
        Kind::Char(major, minor) | Kind::Block(major, minor) => {
            let kind = if matches!(entry.kind, Kind::Char(..)) {
                tar::EntryType::Char
            } else {
                tar::EntryType::Block
            };
            header.set_entry_type(kind);
            header.set_device_major(*major).io(what)?;
            header.set_device_minor(*minor).io(what)?;
            tar.append_data(&mut header, &entry.path, io::empty())
                .io(what)
        }
        Kind::Fifo => {
            header.set_entry_type(tar::EntryType::Fifo);
            tar.append_data(&mut header, &entry.path, io::empty())
                .io(what)
        }
    }
}

/// A reader that yields exactly `len` bytes or fails.
trait TakeExact: io::Read + Sized {
    fn take_exact(self, len: u64) -> ExactReader<Self> {
        ExactReader {
            inner: self,
            left: len,
        }
    }
}
impl<R: io::Read> TakeExact for R {}

struct ExactReader<R> {
    inner: R,
    left: u64,
}

impl<R: io::Read> io::Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let max = buf.len().min(self.left as usize);
        let n = self.inner.read(&mut buf[..max])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while it was read",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// The entries that put `file` at `path` (absolute, in the image) with `mode`, owned by root,
/// with its parent directories (mode 0755).
pub fn file_with_parents(path: &str, file: &Path, mode: u32) -> Vec<Entry> {
    let rel = path.trim_start_matches('/');
    let mut entries = Vec::new();
    let mut parent = String::new();
    for part in rel
        .split('/')
        .collect::<Vec<_>>()
        .split_last()
        .map(|(_, dirs)| dirs)
        .unwrap_or(&[])
    {
        if !parent.is_empty() {
            parent.push('/');
        }
        parent.push_str(part);
        entries.push(Entry {
            path: parent.clone(),
            kind: Kind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
        });
    }
    entries.push(Entry {
        path: rel.to_string(),
        kind: Kind::File(file.to_path_buf()),
        mode,
        uid: 0,
        gid: 0,
    });
    entries
}

/// Every entry under the root filesystem directory `root`, for a layer of it. Files owned by
/// the user running the build are recorded as root's (a root filesystem unpacked without
/// privileges belongs to root in the image); other owners are kept. Sockets are skipped.
pub(crate) fn entries_of_dir(
    root: &Path,
    build_uid: u32,
    build_gid: u32,
) -> Result<Vec<Entry>, ImageError> {
    let mut entries = Vec::new();
    let mut links: HashMap<(u64, u64), String> = HashMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut children: Vec<_> = fs::read_dir(&dir)
            .io(|| format!("listing {}", dir.display()))?
            .collect::<Result<_, _>>()
            .io(|| format!("listing {}", dir.display()))?;
        children.sort_by_key(|c| c.file_name());
        for child in children {
            let rel = rel.join(child.file_name());
            let path = root.join(&rel);
            let name = rel.to_str().ok_or_else(|| ImageError::BadBase {
                path: root.to_path_buf(),
                reason: format!(
                    "{} is not valid UTF-8, which image layers cannot hold portably",
                    rel.display()
                ),
            })?;
            let meta = fs::symlink_metadata(&path).io(|| format!("reading {}", path.display()))?;
            let owner = |id: u32, builder: u32| if id == builder { 0 } else { u64::from(id) };
            let (uid, gid) = (owner(meta.uid(), build_uid), owner(meta.gid(), build_gid));
            let ft = meta.file_type();
            let kind = if ft.is_dir() {
                stack.push(rel.clone());
                Kind::Dir
            } else if ft.is_symlink() {
                let target = fs::read_link(&path).io(|| format!("reading {}", path.display()))?;
                Kind::Symlink(target.to_string_lossy().into_owned())
            } else if ft.is_file() {
                if meta.nlink() > 1 {
                    if let Some(first) = links.get(&(meta.dev(), meta.ino())) {
                        entries.push(Entry {
                            path: name.into(),
                            kind: Kind::Hardlink(first.clone()),
                            mode: meta.mode(),
                            uid,
                            gid,
                        });
                        continue;
                    }
                    links.insert((meta.dev(), meta.ino()), name.to_string());
                }
                Kind::File(path.clone())
            } else if ft.is_char_device() {
                Kind::Char(major(meta.rdev()), minor(meta.rdev()))
            } else if ft.is_block_device() {
                Kind::Block(major(meta.rdev()), minor(meta.rdev()))
            } else if ft.is_fifo() {
                Kind::Fifo
            } else {
                continue;
            };
            entries.push(Entry {
                path: name.into(),
                kind,
                mode: meta.mode(),
                uid,
                gid,
            });
        }
    }
    // Hard links must follow their target in the tar, which the sort by path may break:
    // the first of each group in path order becomes the file.
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    relink_in_order(&mut entries);
    Ok(entries)
}

/// After sorting, makes the first path of each hard-link group the file and the others
/// links to it.
fn relink_in_order(entries: &mut [Entry]) {
    let mut renamed: HashMap<String, String> = HashMap::new();
    for i in 0..entries.len() {
        let Kind::Hardlink(target) = entries[i].kind.clone() else {
            continue;
        };
        let target = renamed.get(&target).cloned().unwrap_or(target);
        if entries[i].path < target {
            // This link sorts before its file: swap roles.
            let file = entries
                .iter()
                .position(|e| e.path == target)
                .expect("hard link target is listed");
            let content = std::mem::replace(
                &mut entries[file].kind,
                Kind::Hardlink(entries[i].path.clone()),
            );
            entries[i].kind = content;
            renamed.insert(target, entries[i].path.clone());
        } else {
            entries[i].kind = Kind::Hardlink(target);
        }
    }
}

fn major(dev: u64) -> u32 {
    (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)) as u32
}

fn minor(dev: u64) -> u32 {
    (((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn layer_bytes(entries: Vec<Entry>, mtime: u64) -> (Written, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(dir.path()).unwrap();
        let written = write(&layout, entries, mtime).unwrap();
        let bytes = fs::read(layout.blob_path(&written.desc.digest)).unwrap();
        (written, bytes)
    }

    #[test]
    fn layers_depend_only_on_their_entries() {
        let src = tempfile::tempdir().unwrap();
        let file = src.path().join("agent");
        fs::write(&file, b"binary").unwrap();
        let entries = file_with_parents("/usr/local/bin/tether-agent", &file, 0o755);
        assert_eq!(
            entries.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(),
            [
                "usr",
                "usr/local",
                "usr/local/bin",
                "usr/local/bin/tether-agent"
            ]
        );
        let mut reversed = entries.clone();
        reversed.reverse();
        let (a, bytes_a) = layer_bytes(entries.clone(), 0);
        let (b, bytes_b) = layer_bytes(reversed, 0);
        assert_eq!(bytes_a, bytes_b);
        assert_eq!(a.desc.digest, b.desc.digest);
        // Nothing in the gzip header varies: MTIME is zero and no name is stored.
        assert_eq!(&bytes_a[..4], &[0x1f, 0x8b, 8, 0]);
        assert_eq!(&bytes_a[4..8], &[0, 0, 0, 0]);
        let (c, _) = layer_bytes(entries, 1_700_000_000);
        assert_ne!(a.diff_id, c.diff_id);

        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(&bytes_a[..])
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(Digest::of(&tar), a.diff_id);
        let mut archive = tar::Archive::new(&tar[..]);
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "usr/local/bin/tether-agent"
            ]
        );
    }

    #[test]
    fn a_directory_becomes_sorted_entries_with_hard_links_after_their_file() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fs::create_dir_all(r.join("bin")).unwrap();
        fs::write(r.join("bin/z"), b"z").unwrap();
        fs::hard_link(r.join("bin/z"), r.join("bin/a")).unwrap();
        std::os::unix::fs::symlink("z", r.join("bin/sh")).unwrap();
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let entries = entries_of_dir(r, uid, gid).unwrap();
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["bin", "bin/a", "bin/sh", "bin/z"]);
        assert!(matches!(entries[1].kind, Kind::File(_)));
        assert_eq!(entries[2].kind, Kind::Symlink("z".into()));
        assert_eq!(entries[3].kind, Kind::Hardlink("bin/a".into()));
        assert!(entries.iter().all(|e| e.uid == 0 && e.gid == 0));
    }
}

//! Writing a host tree into a tar stream exactly: [`Packer`] archives each path by what it
//! is. A file with holes goes as a GNU sparse entry (only its data, found with
//! `SEEK_DATA`/`SEEK_HOLE`), a second name of a file already archived as a hard link to the
//! first, and a FIFO, socket or device is left out and named in [`Packer::skipped`] for the
//! summary line. The agent's `tar_write` (and [`super::unpack`]) land all of these.

use std::collections::HashMap;
use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use tar::{Builder, EntryType, Header, HeaderMode};
pub use tether_proto::sparse::{copy_sparse, data_extents};

/// Archives paths one by one, remembering the files it has archived to keep hard links.
#[derive(Default)]
pub struct Packer {
    /// Archived files with more than one name: (device, inode) to the first name.
    linked: HashMap<(u64, u64), PathBuf>,
    /// Paths left out because no archive can carry them (FIFOs, sockets, devices).
    pub skipped: Vec<PathBuf>,
}

/// What [`Packer::append`] did with a path.
#[derive(Debug, PartialEq, Eq)]
pub enum Packed {
    /// Archived (with its content, as a link, or as a directory).
    Archived,
    /// A FIFO, socket or device: left out, and recorded in [`Packer::skipped`].
    Special,
}

impl Packer {
    /// Appends `path` (not followed) under `name`, by its metadata `meta`.
    pub fn append<W: Write>(
        &mut self,
        tar: &mut Builder<W>,
        path: &Path,
        name: &Path,
        meta: &Metadata,
    ) -> io::Result<Packed> {
        let mut header = Header::new_gnu();
        header.set_metadata_in_mode(meta, HeaderMode::Complete);
        let kind = meta.file_type();
        if kind.is_symlink() {
            tar.append_link(&mut header, name, fs::read_link(path)?)?;
        } else if kind.is_dir() {
            header.set_size(0);
            tar.append_data(&mut header, name, io::empty())?;
        } else if kind.is_file() {
            if let Some(first) = self.first_name(meta, name) {
                header.set_entry_type(EntryType::Link);
                header.set_size(0);
                tar.append_link(&mut header, name, first)?;
            } else {
                append_file(tar, &mut header, name, File::open(path)?, meta.len())?;
            }
        } else {
            self.skipped.push(path.to_path_buf());
            return Ok(Packed::Special);
        }
        Ok(Packed::Archived)
    }

    /// The name a file with several links was first archived under; records `name` as its
    /// first when it is new.
    fn first_name(&mut self, meta: &Metadata, name: &Path) -> Option<PathBuf> {
        if meta.nlink() < 2 {
            return None;
        }
        let key = (meta.dev(), meta.ino());
        if let Some(first) = self.linked.get(&key) {
            return Some(first.clone());
        }
        self.linked.insert(key, name.to_path_buf());
        None
    }
}

/// Appends a regular file's content: only its data when it has holes (a GNU sparse entry),
/// else all of it. `header` is a GNU header filled from the file's metadata.
pub fn append_file<W: Write>(
    tar: &mut Builder<W>,
    header: &mut Header,
    name: &Path,
    file: File,
    size: u64,
) -> io::Result<()> {
    let extents = match data_extents(&file, size)? {
        Some(extents) => extents,
        None => {
            header.set_size(size);
            return tar.append_data(header, name, Exactly::new(file, size));
        }
    };
    tether_proto::sparse::append_sparse(tar, header, name, file, size, extents)
}

/// A file's first `left` bytes, the size its header announced; zeros make up the rest if
/// it shrinks while read (as GNU tar does), so the archive stays well-formed.
pub struct Exactly {
    file: File,
    left: u64,
}

impl Exactly {
    /// The first `len` bytes of `file`, from where it stands.
    pub fn new(file: File, len: u64) -> Self {
        Self { file, left: len }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom};

    #[test]
    fn holes_hard_links_and_fifos_are_kept_linked_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let sparse = root.join("sparse");
        let f = File::create(&sparse).unwrap();
        f.set_len(64 << 20).unwrap();
        drop(f);
        let mut f = fs::OpenOptions::new().write(true).open(&sparse).unwrap();
        f.seek(SeekFrom::Start(32 << 20)).unwrap();
        f.write_all(b"middle").unwrap();
        drop(f);
        fs::write(root.join("a"), "shared").unwrap();
        fs::hard_link(root.join("a"), root.join("b")).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(root.join("fifo"))
            .status()
            .unwrap();
        assert!(made.success());

        let mut tar = Builder::new(Vec::new());
        let mut packer = Packer::default();
        for name in ["a", "b", "fifo", "sparse"] {
            let path = root.join(name);
            let meta = fs::symlink_metadata(&path).unwrap();
            packer
                .append(&mut tar, &path, Path::new(name), &meta)
                .unwrap();
        }
        let bytes = tar.into_inner().unwrap();
        assert!(
            bytes.len() < 1 << 20,
            "the hole went into the archive: {}",
            bytes.len()
        );
        assert_eq!(packer.skipped, [root.join("fifo")]);

        let mut archive = tar::Archive::new(&bytes[..]);
        let mut kinds = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            kinds.push(entry.header().entry_type());
            if entry.header().entry_type() == EntryType::GNUSparse {
                let mut out = tempfile::tempfile().unwrap();
                let n = copy_sparse(&mut entry, &mut out, &mut vec![0; 256 << 10]).unwrap();
                assert_eq!(n, 64 << 20);
                let meta = out.metadata().unwrap();
                assert_eq!(meta.len(), 64 << 20);
                assert!(meta.blocks() * 512 < 1 << 20, "landed dense");
                let mut middle = [0; 6];
                out.seek(SeekFrom::Start(32 << 20)).unwrap();
                out.read_exact(&mut middle).unwrap();
                assert_eq!(&middle, b"middle");
            }
        }
        assert_eq!(
            kinds,
            [EntryType::Regular, EntryType::Link, EntryType::GNUSparse]
        );
    }
}

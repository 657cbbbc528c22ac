//! Writing a host tree into a tar stream exactly: [`Packer`] archives each path by what it
//! is. A file with holes goes as a GNU sparse entry (only its data, found with
//! `SEEK_DATA`/`SEEK_HOLE`), a second name of a file already archived as a hard link to the
//! first, and a FIFO, socket or device is left out and named in [`Packer::skipped`] for the
//! summary line. The agent's `tar_write` (and [`super::unpack`]) land all of these.

use std::collections::HashMap;
use std::fs::{self, File, Metadata};
use std::io::{self, Cursor, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::SeekFrom as Whence;
use rustix::io::Errno;
use tar::{Builder, EntryType, GnuExtSparseHeader, Header, HeaderMode};

/// Sparse map entries a GNU header holds itself; the rest go in extension blocks.
const HEADER_EXTENTS: usize = 4;
/// Sparse map entries per GNU extension block.
const EXTENSION_EXTENTS: usize = 21;

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
    mut file: File,
    size: u64,
) -> io::Result<()> {
    let extents = match data_extents(&file, size)? {
        Some(extents) => extents,
        None => {
            header.set_size(size);
            return tar.append_data(header, name, Exactly { file, left: size });
        }
    };
    let stored: u64 = extents.iter().map(|&(_, len)| len).sum();
    // The map ends with an empty extent at the real size, as GNU tar writes it, so a file
    // that ends in a hole keeps its length.
    let mut map = extents.clone();
    map.push((size, 0));
    header.set_entry_type(EntryType::GNUSparse);
    header.set_size(stored);
    let gnu = header
        .as_gnu_mut()
        .ok_or_else(|| io::Error::other("a sparse entry needs a GNU header"))?;
    gnu.set_real_size(size);
    let (first, rest) = map.split_at(map.len().min(HEADER_EXTENTS));
    for (slot, &(offset, len)) in gnu.sparse.iter_mut().zip(first) {
        slot.set_offset(offset);
        slot.set_length(len);
    }
    gnu.set_is_extended(!rest.is_empty());
    // Extension blocks sit between the header and the data; the tar crate pads after the
    // whole, and both are whole blocks, so they travel as the front of the entry's body.
    let mut extensions = Vec::new();
    let blocks: Vec<&[(u64, u64)]> = rest.chunks(EXTENSION_EXTENTS).collect();
    for (i, block) in blocks.iter().enumerate() {
        let mut ext = GnuExtSparseHeader::new();
        for (slot, &(offset, len)) in ext.sparse_mut().iter_mut().zip(*block) {
            slot.set_offset(offset);
            slot.set_length(len);
        }
        ext.set_is_extended(i + 1 < blocks.len());
        extensions.extend_from_slice(ext.as_bytes());
    }
    file.seek(SeekFrom::Start(0))?;
    let data = Extents {
        file,
        extents,
        at: 0,
        left: 0,
    };
    tar.append_data(header, name, Cursor::new(extensions).chain(data))
}

/// The data extents (offset, length) of a file that has holes; `None` for one without.
pub fn data_extents(file: &File, size: u64) -> io::Result<Option<Vec<(u64, u64)>>> {
    let meta = file.metadata()?;
    if size == 0 || meta.blocks().saturating_mul(512) >= size {
        return Ok(None);
    }
    let mut extents = Vec::new();
    let mut pos = 0;
    while pos < size {
        let data = match rustix::fs::seek(file, Whence::Data(pos)) {
            Ok(data) => data,
            // No data after `pos`: the rest is a hole.
            Err(Errno::NXIO) => break,
            // A filesystem without SEEK_DATA: send it whole.
            Err(Errno::INVAL | Errno::OPNOTSUPP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if data >= size {
            break;
        }
        let hole = rustix::fs::seek(file, Whence::Hole(data))?.min(size);
        extents.push((data, hole - data));
        pos = hole;
    }
    Ok(Some(extents))
}

/// A file's first `left` bytes, the size its header announced; zeros make up the rest if
/// it shrinks while read (as GNU tar does), so the archive stays well-formed.
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

/// The bytes of a file's data extents, one after the other.
struct Extents {
    file: File,
    extents: Vec<(u64, u64)>,
    /// The next extent.
    at: usize,
    /// Bytes left of the current extent.
    left: u64,
}

impl Read for Extents {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.left == 0 {
            let Some(&(offset, len)) = self.extents.get(self.at) else {
                return Ok(0);
            };
            self.file.seek(SeekFrom::Start(offset))?;
            self.at += 1;
            self.left = len;
        }
        let want = (buf.len() as u64).min(self.left) as usize;
        let mut n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            buf[..want].fill(0);
            n = want;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Writes what `from` yields to `to`, leaving a hole (seeking past it) for every chunk that
/// is all zeros, then sets the length: a sparse entry lands sparse. Returns the bytes
/// accounted for.
pub fn copy_sparse(from: &mut impl Read, to: &mut File, buffer: &mut [u8]) -> io::Result<u64> {
    let mut copied = 0u64;
    loop {
        match from.read(buffer) {
            Ok(0) => break,
            Ok(n) => {
                if buffer[..n].iter().all(|&b| b == 0) {
                    to.seek(SeekFrom::Current(n as i64))?;
                } else {
                    to.write_all(&buffer[..n])?;
                }
                copied += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    to.set_len(copied)?;
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

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

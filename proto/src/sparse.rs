//! Sparse files in tar streams, both ways, for the agent and the client alike: [`append_sparse`]
//! archives a file with holes as a GNU sparse entry (only its data, found with
//! [`data_extents`]: `SEEK_DATA`/`SEEK_HOLE`), and [`copy_sparse`] lands one with its holes
//! ([`copy_dense`] a plain entry).
//! Archives are part of the wire contract (`tar_read`/`tar_write` carry them), so both ends
//! share this one writer and reader of the format.

use std::fs::File;
use std::io::{self, Cursor, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::SeekFrom as Whence;
use rustix::io::Errno;
use tar::{Builder, EntryType, GnuExtSparseHeader, Header};

/// Sparse map entries a GNU header holds itself; the rest go in extension blocks.
const HEADER_EXTENTS: usize = 4;
/// Sparse map entries per GNU extension block.
const EXTENSION_EXTENTS: usize = 21;

/// Appends a file with holes as a GNU sparse entry holding only `extents`, its data
/// ([`data_extents`]). `header` is a GNU header filled from the file's metadata.
pub fn append_sparse<W: Write>(
    tar: &mut Builder<W>,
    header: &mut Header,
    name: &Path,
    mut file: File,
    size: u64,
    extents: Vec<(u64, u64)>,
) -> io::Result<()> {
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

/// Writes what `from` yields to `to` through `buffer` (a dense entry's content); returns the
/// bytes copied. `io::copy` would write in pieces of its own 8 KiB stack buffer.
pub fn copy_dense(from: &mut impl Read, to: &mut impl Write, buffer: &mut [u8]) -> io::Result<u64> {
    let mut copied = 0u64;
    loop {
        match from.read(buffer) {
            Ok(0) => return Ok(copied),
            Ok(n) => {
                to.write_all(&buffer[..n])?;
                copied += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
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

//! Landing a tar archive's entries in a destination directory, each file atomically.
//!
//! A regular file, symlink or hard link is made under a temp name beside its destination
//! ([`super::super::atomic::temp_name`]) and renamed over it only once whole: a reader in the
//! sandbox sees the old file or the new one, never a half-written one, and a cut stream
//! leaves the old file, never a truncated one (the temp file is removed on drop).
//!
//! Paths are resolved component by component from a descriptor of the destination
//! (`openat` with `O_NOFOLLOW`), with the last directory's descriptor kept, so a file costs
//! a handful of system calls rather than the full-path lookups and `realpath`s of
//! `tar::Entry::unpack_in`. Nothing is written outside the destination: `..` entries are
//! skipped, a leading `/` is stripped, and a symlinked directory on the way is followed only
//! if it resolves inside the destination. Directories get their modes and mtimes last,
//! deepest first, so a read-only directory does not block its own contents. There is no
//! fsync, for the reason given in [`super::super::atomic`].

use std::ffi::{OsStr, OsString};
use std::fs::{File, FileTimes, Permissions};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use tar::{EntryType, Header};
use tracing::warn;

use super::super::atomic::temp_name;
use tether_proto::sparse::{copy_dense, copy_sparse};

/// Bytes copied from the archive to a file per write: 256 KiB.
const COPY_BUFFER: usize = 256 << 10;

/// Mode asked for a directory the archive implies but does not list (the umask applies),
/// as `mkdir -p` and the tar crate do.
const IMPLIED_DIR_MODE: u32 = 0o777;

/// A destination directory being filled from an archive.
pub(super) struct Lander {
    root: Rc<OwnedFd>,
    /// The destination, canonical: symlinks met on the way must resolve inside it.
    canonical: PathBuf,
    /// The directory the last entry landed in, by its components: archives list a
    /// directory's files together, so one lookup serves many files.
    last_dir: Option<(Vec<OsString>, Rc<OwnedFd>)>,
    /// Directory entries, applied by [`Lander::finish`].
    dirs: Vec<(Vec<OsString>, u32, i64)>,
    buffer: Vec<u8>,
}

impl Lander {
    /// Opens `dest`, an existing directory.
    pub(super) fn new(dest: &Path) -> io::Result<Lander> {
        let canonical = dest.canonicalize()?;
        let root = rustix::fs::open(&canonical, dir_flags(), Mode::empty())?;
        Ok(Lander {
            root: Rc::new(root),
            canonical,
            last_dir: None,
            dirs: Vec::new(),
            buffer: vec![0; COPY_BUFFER],
        })
    }

    /// Lands one entry. Entries whose path leaves the destination are skipped, as are
    /// devices and fifos (the agent never archives them).
    pub(super) fn land<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> io::Result<()> {
        let Some(mut parts) = components(&entry.path_bytes()) else {
            return Ok(());
        };
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode()? & 0o7777;
        let mtime = header.mtime()? as i64;
        if kind == EntryType::Directory {
            self.dir(&parts, true)?;
            self.dirs.push((parts, mode, mtime));
            return Ok(());
        }
        let name = parts.pop().expect("components are never empty");
        let shown = || shown(&parts, &name);
        let dir = self.dir(&parts, true)?;
        let temp = Temp::new(dir.clone(), &name);
        match kind {
            EntryType::Symlink => {
                let target = link_name(header)?;
                rustix::fs::symlinkat(target.as_os_str(), &*dir, &temp.name)?;
            }
            EntryType::Link => {
                let source = link_name(header)?;
                let Some(mut from) = components(source.as_os_str().as_bytes()) else {
                    return Err(outside(&shown()));
                };
                let from_name = from.pop().expect("components are never empty");
                let from_dir = self.dir(&from, false)?;
                rustix::fs::linkat(&*from_dir, &from_name, &*dir, &temp.name, AtFlags::empty())?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                warn!(path = %shown().display(), "device or fifo in an archive; skipped");
                return Ok(());
            }
            // Anything else is a regular file, as POSIX asks of unknown types.
            _ => {
                let fd = rustix::fs::openat(
                    &*dir,
                    &temp.name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )?;
                let mut file = File::from(fd);
                let size = entry.size();
                let copied = match kind {
                    EntryType::GNUSparse => copy_sparse(entry, &mut file, &mut self.buffer)?,
                    _ => copy_dense(entry, &mut file, &mut self.buffer)?,
                };
                if copied != size {
                    // The entry's reader ends quietly where the archive does.
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the archive ends inside this file",
                    ));
                }
                let time = UNIX_EPOCH + Duration::from_secs(landed_mtime(mtime) as u64);
                file.set_times(FileTimes::new().set_modified(time).set_accessed(time))?;
                file.set_permissions(Permissions::from_mode(mode))?;
            }
        }
        temp.commit(&name).map_err(|e| match e.raw_os_error() {
            Some(code) if code == Errno::ISDIR.raw_os_error() => io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{}: a directory is in the way", shown().display()),
            ),
            _ => e,
        })
    }

    /// Gives directories their modes and mtimes, deepest first.
    pub(super) fn finish(mut self) -> io::Result<()> {
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_unstable();
        self.last_dir = None;
        for (parts, mode, mtime) in dirs.into_iter().rev() {
            let fd = self.dir(&parts, false)?;
            let file = File::from(rustix::io::dup(&*fd)?);
            rustix::fs::fchmod(&file, Mode::from_bits_truncate(mode))?;
            let time = UNIX_EPOCH + Duration::from_secs(landed_mtime(mtime) as u64);
            file.set_times(FileTimes::new().set_modified(time).set_accessed(time))?;
        }
        Ok(())
    }

    /// The directory at `parts` below the destination, created (and its parents) when
    /// `create`.
    fn dir(&mut self, parts: &[OsString], create: bool) -> io::Result<Rc<OwnedFd>> {
        if let Some((last, fd)) = &self.last_dir {
            if last.as_slice() == parts {
                return Ok(fd.clone());
            }
        }
        let mut fd = self.root.clone();
        for (i, part) in parts.iter().enumerate() {
            fd = Rc::new(
                match rustix::fs::openat(&*fd, part, dir_flags(), Mode::empty()) {
                    Ok(next) => next,
                    Err(Errno::NOENT) if create => {
                        match rustix::fs::mkdirat(
                            &*fd,
                            part,
                            Mode::from_bits_truncate(IMPLIED_DIR_MODE),
                        ) {
                            Ok(()) | Err(Errno::EXIST) => {}
                            Err(e) => return Err(e.into()),
                        }
                        rustix::fs::openat(&*fd, part, dir_flags(), Mode::empty())?
                    }
                    // A symlink (or not a directory at all): followed only if it stays inside.
                    Err(Errno::LOOP | Errno::NOTDIR) => self.follow(&parts[..=i])?,
                    Err(e) => return Err(e.into()),
                },
            );
        }
        self.last_dir = Some((parts.to_vec(), fd.clone()));
        Ok(fd)
    }

    /// Opens the directory a symlink at `parts` leads to, if it is inside the destination.
    fn follow(&self, parts: &[OsString]) -> io::Result<OwnedFd> {
        let path: PathBuf = parts.iter().fold(self.canonical.clone(), |p, c| p.join(c));
        let resolved = path.canonicalize().map_err(|_| outside(&path))?;
        if !resolved.starts_with(&self.canonical) {
            return Err(outside(&path));
        }
        Ok(rustix::fs::open(&resolved, dir_flags(), Mode::empty())?)
    }
}

/// A file made under a temp name; removed on drop unless committed.
struct Temp {
    dir: Rc<OwnedFd>,
    name: OsString,
    committed: bool,
}

impl Temp {
    fn new(dir: Rc<OwnedFd>, name: &OsStr) -> Temp {
        Temp {
            dir,
            name: temp_name(name.as_bytes()),
            committed: false,
        }
    }

    /// Renames the temp file over `name`, replacing what is there (not a directory).
    fn commit(mut self, name: &OsStr) -> io::Result<()> {
        rustix::fs::renameat(&*self.dir, &self.name, &*self.dir, name)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.committed {
            let _ = rustix::fs::unlinkat(self.dir.as_fd(), &self.name, AtFlags::empty());
        }
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// An entry's path as components below the destination: a leading `/` and `.` parts are
/// dropped; `None` for a path with a `..` part (skipped, as tar does) or with nothing left.
fn components(path: &[u8]) -> Option<Vec<OsString>> {
    let mut parts = Vec::new();
    for part in Path::new(OsStr::from_bytes(path)).components() {
        match part {
            Component::Normal(p) => parts.push(p.to_os_string()),
            Component::ParentDir => return None,
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    (!parts.is_empty()).then_some(parts)
}

/// The mtime an unpacked entry gets: an mtime of 0 becomes 1, as the tar crate does, since
/// some tools take 0 for "unknown".
fn landed_mtime(mtime: i64) -> i64 {
    if mtime <= 0 {
        1
    } else {
        mtime
    }
}

fn link_name(header: &Header) -> io::Result<PathBuf> {
    header
        .link_name()?
        .map(|p| p.into_owned())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a link without a target"))
}

fn shown(parent: &[OsString], name: &OsStr) -> PathBuf {
    parent
        .iter()
        .map(OsString::as_os_str)
        .chain([name])
        .collect()
}

fn outside(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{}: leads outside the destination; not unpacked",
            path.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use tar::Builder;

    fn archive(build: impl FnOnce(&mut Builder<Vec<u8>>)) -> Vec<u8> {
        let mut tar = Builder::new(Vec::new());
        build(&mut tar);
        tar.into_inner().unwrap()
    }

    fn header(kind: EntryType, mode: u32, size: u64) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(1_000_000_000);
        h
    }

    fn land_all(dest: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut lander = Lander::new(dest)?;
        let mut archive = tar::Archive::new(bytes);
        for entry in archive.entries()? {
            lander.land(&mut entry?)?;
        }
        lander.finish()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn lands_files_links_and_directories_with_their_metadata() {
        let dest = tempfile::tempdir().unwrap();
        fs::write(dest.path().join("old"), "replace me").unwrap();
        let bytes = archive(|t| {
            t.append_data(
                &mut header(EntryType::Directory, 0o700, 0),
                "d",
                io::empty(),
            )
            .unwrap();
            t.append_data(
                &mut header(EntryType::Regular, 0o751, 5),
                "d/e/f",
                &b"hello"[..],
            )
            .unwrap();
            t.append_data(
                &mut header(EntryType::Regular, 0o644, 3),
                "old",
                &b"new"[..],
            )
            .unwrap();
            t.append_link(&mut header(EntryType::Symlink, 0o777, 0), "l", "d/e/f")
                .unwrap();
            t.append_link(&mut header(EntryType::Link, 0o644, 0), "hard", "old")
                .unwrap();
        });
        land_all(dest.path(), &bytes).unwrap();
        let f = dest.path().join("d/e/f");
        assert_eq!(fs::read(&f).unwrap(), b"hello");
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o751);
        assert_eq!(fs::metadata(&f).unwrap().mtime(), 1_000_000_000);
        let d = fs::metadata(dest.path().join("d")).unwrap();
        assert_eq!((d.mode() & 0o7777, d.mtime()), (0o700, 1_000_000_000));
        assert_eq!(fs::read(dest.path().join("old")).unwrap(), b"new");
        assert_eq!(
            fs::read_link(dest.path().join("l")).unwrap(),
            Path::new("d/e/f")
        );
        assert_eq!(fs::read(dest.path().join("hard")).unwrap(), b"new");
        assert_eq!(
            names(dest.path()),
            ["d", "hard", "l", "old"],
            "no temp files left"
        );
    }

    #[test]
    fn a_cut_archive_leaves_the_old_file_and_no_temp_file() {
        let dest = tempfile::tempdir().unwrap();
        fs::write(dest.path().join("big"), "old content").unwrap();
        let body = vec![7u8; 1 << 20];
        let bytes = archive(|t| {
            t.append_data(
                &mut header(EntryType::Regular, 0o644, body.len() as u64),
                "big",
                &body[..],
            )
            .unwrap();
        });
        let cut = &bytes[..bytes.len() / 2];
        assert!(land_all(dest.path(), cut).is_err());
        let kept = fs::read(dest.path().join("big")).unwrap();
        assert!(kept == b"old content", "the old content was replaced");
        assert_eq!(names(dest.path()), ["big"]);
    }

    #[test]
    fn stays_inside_the_destination() {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("dest");
        fs::create_dir(&dest).unwrap();
        fs::create_dir(root.path().join("inner")).unwrap();
        std::os::unix::fs::symlink(root.path(), dest.join("out")).unwrap();
        std::os::unix::fs::symlink(".", dest.join("here")).unwrap();
        let bytes = archive(|t| {
            t.append_data(
                &mut header(EntryType::Regular, 0o644, 2),
                "here/ok",
                &b"ok"[..],
            )
            .unwrap();
        });
        land_all(&dest, &bytes).unwrap();
        assert_eq!(fs::read(dest.join("ok")).unwrap(), b"ok");
        let mut escape = header(EntryType::Regular, 0o644, 4);
        escape.set_path("out/pwned").unwrap();
        escape.set_cksum();
        let bytes = archive(|t| t.append(&escape, &b"evil"[..]).unwrap());
        let err = land_all(&dest, &bytes).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(!root.path().join("pwned").exists());
        assert_eq!(components(b"/a/./b"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(components(b"a/../b"), None);
        assert_eq!(components(b"/"), None);
    }
}

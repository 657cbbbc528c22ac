//! Replacing a file atomically: write a temp file beside it, then rename it into place.
//!
//! Every operation that replaces a file's content (write, edit, write_batch) goes through
//! [`AtomicFile`], so a reader sees the old file or the new one, never a mix. A write that
//! fails or is cancelled drops its `AtomicFile`, which removes the temp file and leaves the
//! target untouched.
//!
//! There is no fsync. Atomicity against concurrent readers comes from the rename alone; an
//! fsync would only add durability across a machine crash, which a sandbox's disposable
//! filesystem does not need, at a cost that dominates small writes and halves large ones.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{RenameFlags, CWD};
use tether_proto::ErrorCode;

use super::{fail, refuse, DEFAULT_FILE_MODE};
use crate::stream::OpError;

/// Bytes of the target's name kept in its temp file's name, so that name stays within
/// the filesystem's 255-byte limit: 200.
const TEMP_NAME_KEEP: usize = 200;

/// How to create an [`AtomicFile`].
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Options {
    /// Permission bits; otherwise the replaced file's, or [`DEFAULT_FILE_MODE`] for a new one.
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub create_parents: bool,
    /// Fail with `already_exists` if the target exists, checked again at the rename.
    pub no_replace: bool,
}

/// A new version of a file, written to a temp file until [`AtomicFile::commit`].
#[derive(Debug)]
pub(super) struct AtomicFile {
    /// The path as the client named it, for messages.
    shown: PathBuf,
    /// Where the file lands: the client's path, or the file a symlink there points to.
    target: PathBuf,
    temp: PathBuf,
    file: File,
    mode: u32,
    /// Owner and group of the file being replaced, kept when the agent may set them.
    owner: Option<(u32, u32)>,
    no_replace: bool,
    committed: bool,
}

impl AtomicFile {
    /// Starts a new version of `path`: checks the target and creates the temp file.
    pub(super) fn create(path: &Path, opts: Options) -> Result<AtomicFile, OpError> {
        let target = through_symlink(path);
        let existing = match fs::metadata(&target) {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(fail(path)(e)),
        };
        if let Some(meta) = &existing {
            if meta.is_dir() {
                return Err(refuse(ErrorCode::IsDirectory, path, "Is a directory"));
            }
            if opts.no_replace {
                return Err(refuse(ErrorCode::AlreadyExists, path, "File exists"));
            }
        }
        let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
            return Err(refuse(ErrorCode::InvalidPath, path, "names no file"));
        };
        if opts.create_parents {
            fs::create_dir_all(parent).map_err(fail(parent))?;
        }
        let (temp, file) = create_temp(parent, name.as_bytes()).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                refuse(
                    ErrorCode::NotFound,
                    parent,
                    "No such file or directory (create it, or pass create_parents)",
                )
            } else {
                fail(parent)(e)
            }
        })?;
        Ok(AtomicFile {
            shown: path.to_path_buf(),
            mode: opts
                .mode
                .or(existing.as_ref().map(|m| m.mode()))
                .unwrap_or(DEFAULT_FILE_MODE)
                & 0o7777,
            owner: existing.as_ref().map(|m| (m.uid(), m.gid())),
            target,
            temp,
            file,
            no_replace: opts.no_replace,
            committed: false,
        })
    }

    /// The temp file, to write the new content into.
    pub(super) fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Gives the new content its mode and owner and renames it over the target.
    pub(super) fn commit(mut self) -> Result<(), OpError> {
        // Owner first: chown clears setuid and setgid bits, the chmod then sets them.
        // Only root may give a file away; anyone else keeps the file as their own.
        if let Some((uid, gid)) = self.owner {
            let _ = std::os::unix::fs::fchown(&self.file, Some(uid), Some(gid));
        }
        self.file
            .set_permissions(Permissions::from_mode(self.mode))
            .map_err(fail(&self.shown))?;
        let renamed = if self.no_replace {
            rename_no_replace(&self.temp, &self.target)
        } else {
            fs::rename(&self.temp, &self.target)
        };
        renamed.map_err(fail(&self.shown))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// The file a symlink at `path` points to, so a write replaces that file and keeps the
/// link; `path` itself when it is no symlink or a dangling one (the write replaces the link).
fn through_symlink(path: &Path) -> PathBuf {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
        }
        _ => path.to_path_buf(),
    }
}

/// Creates `.tether-UNIQUE.NAME` in `dir`, readable by the owner only until it is committed.
fn create_temp(dir: &Path, name: &[u8]) -> io::Result<(PathBuf, File)> {
    loop {
        let temp = dir.join(temp_name(name));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
        {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `.tether-UNIQUE.NAME`: the name a new version of `name` is written under, beside it.
/// The reserved prefix ([`tether_proto::names::TEMP_PREFIX`]) tells every tool that it is
/// ours, mid-transfer, and no user's file: a `tether sync` rerun at once after a cut one
/// must not take the cut one's temporary for a file the sandbox made (and keep it as a
/// conflict copy, where its writer's cleanup no longer finds it). Unique within this
/// process, and across processes by the pid and the clock.
pub(super) fn temp_name(name: &[u8]) -> OsString {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = String::from_utf8_lossy(&name[..name.len().min(TEMP_NAME_KEEP)]);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    OsString::from(format!(
        "{}{:x}{n:x}{nanos:x}.{name}",
        tether_proto::names::TEMP_PREFIX,
        std::process::id()
    ))
}

/// Renames `from` to `to` unless `to` exists, without a window in which another writer's
/// file at `to` could be replaced: `renameat2(RENAME_NOREPLACE)`, or on filesystems without
/// it, a hard link (which fails if `to` exists) and an unlink. Directories cannot be
/// hard-linked, so there the fallback checks first and is not race-free.
pub(super) fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    match rustix::fs::renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        Ok(()) => return Ok(()),
        Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOSYS => {}
        Err(e) => return Err(e.into()),
    }
    if fs::symlink_metadata(from)?.is_dir() {
        if fs::symlink_metadata(to).is_ok() {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        return fs::rename(from, to);
    }
    fs::hard_link(from, to)?;
    fs::remove_file(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn commit_replaces_and_keeps_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, Permissions::from_mode(0o600)).unwrap();
        let mut f = AtomicFile::create(&path, Options::default()).unwrap();
        f.file().write_all(b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"old");
        f.commit().unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        assert_eq!(entries(dir.path()), ["f"]);
    }

    #[test]
    fn drop_removes_the_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = AtomicFile::create(&path, Options::default()).unwrap();
        f.file().write_all(b"partial").unwrap();
        assert_eq!(entries(dir.path()).len(), 1);
        drop(f);
        assert!(entries(dir.path()).is_empty());
    }

    #[test]
    fn no_replace_refuses_existing_targets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let opts = Options {
            no_replace: true,
            ..Options::default()
        };
        let early = AtomicFile::create(&path, opts).unwrap();
        fs::write(&path, "raced").unwrap();
        let err = early.commit().unwrap_err();
        assert_eq!(err.code, ErrorCode::AlreadyExists);
        assert_eq!(fs::read(&path).unwrap(), b"raced");
        let err = AtomicFile::create(&path, opts).unwrap_err();
        assert_eq!(err.code, ErrorCode::AlreadyExists);
        assert_eq!(entries(dir.path()), ["f"]);
    }

    #[test]
    fn writes_through_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        let link = dir.path().join("link");
        fs::write(&real, "old").unwrap();
        std::os::unix::fs::symlink("real", &link).unwrap();
        let mut f = AtomicFile::create(&link, Options::default()).unwrap();
        f.file().write_all(b"new").unwrap();
        f.commit().unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&real).unwrap(), b"new");
    }

    #[test]
    fn missing_parent_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/f");
        let err = AtomicFile::create(&path, Options::default()).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        let opts = Options {
            create_parents: true,
            mode: Some(0o640),
            ..Options::default()
        };
        AtomicFile::create(&path, opts).unwrap().commit().unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);
    }
}

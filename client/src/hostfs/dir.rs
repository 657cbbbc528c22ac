//! [`Dest`]: the destination directory, opened once by fd, and everything below it reached
//! from that fd one component at a time with `O_NOFOLLOW | O_DIRECTORY`. A symlink or a
//! file where a directory is expected is refused, so whatever the sandbox planted (or a
//! lying agent claims), no write ever lands outside the destination.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, CWD};
use rustix::io::Errno;

use super::error::HostFsError;
use super::path::SandboxPath;
use crate::escape::{escape, escape_os};

/// Mode of a directory created on the way to a file (the umask applies); directories the
/// sandbox lists get their own mode afterwards.
const NEW_DIR_MODE: u32 = 0o755;

/// Flags of every directory opened below the destination.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// The destination directory of a transfer from a sandbox.
#[derive(Debug)]
pub struct Dest {
    root: OwnedFd,
    shown: PathBuf,
}

impl Dest {
    /// Opens `path` (created with its parents when `create`). The path is the user's own
    /// choice, so it may itself be reached through symlinks; nothing below it may.
    pub fn open(path: &Path, create: bool) -> Result<Dest, HostFsError> {
        let shown = escape_os(path.as_os_str()).into_owned();
        if create {
            std::fs::create_dir_all(path)
                .map_err(HostFsError::io("create the directory", &shown))?;
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let root = rustix::fs::openat(CWD, path, flags, Mode::empty())
            .map_err(|e| HostFsError::io("open the directory", &shown)(e.into()))?;
        Ok(Dest {
            root,
            shown: path.to_path_buf(),
        })
    }

    /// The destination's own fd.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The local path of `rel`, escaped, for messages.
    pub fn shown(&self, rel: &SandboxPath) -> String {
        self.shown_bytes(rel.as_bytes())
    }

    fn shown_bytes(&self, rel: &[u8]) -> String {
        let root = escape_os(self.shown.as_os_str());
        format!("{}/{}", root.trim_end_matches('/'), escape(rel))
    }

    /// Opens the directory `dirs` (components below the destination), creating what is
    /// missing when `create`. `whole` names the path being worked on, for errors.
    fn walk(
        &self,
        dirs: &[&OsStr],
        create: bool,
        whole: &SandboxPath,
    ) -> Result<OwnedFd, HostFsError> {
        let mut current = self
            .root
            .try_clone()
            .map_err(HostFsError::io("open", self.shown(whole)))?;
        for (depth, name) in dirs.iter().enumerate() {
            let here = || {
                let rel: Vec<&[u8]> = dirs[..=depth].iter().map(|n| n.as_bytes()).collect();
                self.shown_bytes(&rel.join(&b'/'))
            };
            let opened = match rustix::fs::openat(&current, *name, dir_flags(), Mode::empty()) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&current, *name, super::permissions(NEW_DIR_MODE)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => {
                            return Err(HostFsError::io("create the directory", here())(e.into()))
                        }
                    }
                    rustix::fs::openat(&current, *name, dir_flags(), Mode::empty())
                }
                other => other,
            };
            current = match opened {
                Ok(fd) => fd,
                Err(Errno::LOOP | Errno::NOTDIR) => {
                    return Err(HostFsError::NotADirectory { path: here() })
                }
                Err(e) => return Err(HostFsError::io("open the directory", here())(e.into())),
            };
        }
        Ok(current)
    }

    /// The directory `path` itself, created (with what is above it) if missing.
    pub fn mkdir_all(&self, path: &SandboxPath) -> Result<OwnedFd, HostFsError> {
        let dirs: Vec<&OsStr> = path.components().collect();
        self.walk(&dirs, true, path)
    }

    /// The directory holding `path` (created if `create`), and `path`'s last component.
    pub fn parent<'p>(
        &self,
        path: &'p SandboxPath,
        create: bool,
    ) -> Result<(OwnedFd, &'p OsStr), HostFsError> {
        let (dirs, name) = path.split_last();
        Ok((self.walk(&dirs, create, path)?, name))
    }

    /// Makes `to` a second name of the file `from` (both below the destination), replacing
    /// a file or symlink already at `to`.
    pub fn hard_link(&self, from: &SandboxPath, to: &SandboxPath) -> Result<(), HostFsError> {
        let (from_dir, from_name) = self.parent(from, false)?;
        let (to_dir, to_name) = self.parent(to, true)?;
        self.unlink(to)?;
        rustix::fs::linkat(&from_dir, from_name, &to_dir, to_name, AtFlags::empty())
            .map_err(|e| HostFsError::io("link", self.shown(to))(e.into()))
    }

    /// Removes the file or symlink `path` (never a directory); a missing one is no error.
    pub fn unlink(&self, path: &SandboxPath) -> Result<(), HostFsError> {
        let (dir, name) = self.parent(path, false)?;
        match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(HostFsError::io("remove", self.shown(path))(e.into())),
        }
    }

    /// Renames `from` to `to`, both below the destination (symlinks are renamed, not
    /// followed).
    pub fn rename(&self, from: &SandboxPath, to: &SandboxPath) -> Result<(), HostFsError> {
        let (from_dir, from_name) = self.parent(from, false)?;
        let (to_dir, to_name) = self.parent(to, true)?;
        rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name)
            .map_err(|e| HostFsError::io("rename", self.shown(from))(e.into()))
    }

    /// Gives the directory `path` the permission bits `mode`.
    pub fn chmod_dir(&self, path: &SandboxPath, mode: u32) -> Result<(), HostFsError> {
        let dir = self.mkdir_all(path)?;
        rustix::fs::fchmod(&dir, super::permissions(mode))
            .map_err(|e| HostFsError::io("set the mode of", self.shown(path))(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_on_the_way_are_refused_not_followed() {
        let outside = tempfile::tempdir().unwrap();
        let dest_dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dest_dir.path().join("link")).unwrap();
        std::fs::write(dest_dir.path().join("file"), "x").unwrap();
        let dest = Dest::open(dest_dir.path(), false).unwrap();
        let through_link = SandboxPath::parse(b"link/sub/f").unwrap();
        assert!(matches!(
            dest.parent(&through_link, true),
            Err(HostFsError::NotADirectory { .. })
        ));
        let through_file = SandboxPath::parse(b"file/f").unwrap();
        assert!(matches!(
            dest.parent(&through_file, true),
            Err(HostFsError::NotADirectory { .. })
        ));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        let made = SandboxPath::parse(b"a/b/c").unwrap();
        dest.mkdir_all(&made).unwrap();
        assert!(dest_dir.path().join("a/b/c").is_dir());
    }
}

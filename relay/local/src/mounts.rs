//! The mount primitives the sandbox init builds a root from: read-only and read-write binds,
//! tmpfs mounts, remounts and mount points. Each keeps the flags a user namespace locks on a
//! mount (nosuid, nodev, noexec, atime), since a remount that drops them is refused there.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sys::statvfs::{statvfs, FsFlags};

use super::error::{InitError, Step};

/// Stops every mount event from propagating between the sandbox and the host, both ways.
pub(super) fn make_private() -> Result<(), InitError> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .step(|| "making the sandbox's mounts private (mount --make-rprivate /)".into())
}

/// Binds `src` onto `dst` (not recursively: mounts under `src` stay hidden), then applies
/// `flags` (e.g. `MS_RDONLY | MS_NOSUID`) to the new mount.
pub(super) fn bind(src: &Path, dst: &Path, flags: MsFlags) -> Result<(), InitError> {
    let what = || format!("bind-mounting {} on {}", src.display(), dst.display());
    match mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>) {
        // The sandbox's user is an unprivileged one on the host: a directory above either path
        // that others cannot search (a `/` of mode 0700) stops it.
        Err(Errno::EACCES) => {
            return Err(InitError::Unsupported {
                what: what(),
                errno: Errno::EACCES,
                hint: "the sandbox's user cannot reach one of these paths: every directory \
                       above them, the host's / included, must be searchable by others \
                       (chmod o+x)",
            })
        }
        other => other.step(what)?,
    }
    if flags.is_empty() {
        return Ok(());
    }
    remount_bind(dst, flags)
}

/// Changes the per-mount flags of the bind mount at `dst`, keeping the ones already set.
pub(super) fn remount_bind(dst: &Path, flags: MsFlags) -> Result<(), InitError> {
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | flags | current_flags(dst);
    mount(None::<&str>, dst, None::<&str>, flags, None::<&str>)
        .step(|| format!("remounting {} with {flags:?}", dst.display()))
}

/// Mounts a new tmpfs on `dst` with `options` (e.g. `size=1024,mode=755`).
pub(super) fn tmpfs(dst: &Path, options: &str, flags: MsFlags) -> Result<(), InitError> {
    mount(Some("tmpfs"), dst, Some("tmpfs"), flags, Some(options))
        .step(|| format!("mounting a tmpfs on {} ({options})", dst.display()))
}

/// Makes the file system mounted at `dst` (a tmpfs we built) read-only.
pub(super) fn remount_readonly(dst: &Path, flags: MsFlags) -> Result<(), InitError> {
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | flags | current_flags(dst);
    mount(None::<&str>, dst, None::<&str>, flags, None::<&str>)
        .step(|| format!("making {} read-only", dst.display()))
}

/// `ST_RELATIME` from statvfs(3), which the libc crate lacks on musl.
const ST_RELATIME: libc::c_ulong = 4096;

/// The flags of the mount at `path` that a remount must repeat.
fn current_flags(path: &Path) -> MsFlags {
    let Ok(st) = statvfs(path) else {
        return MsFlags::empty();
    };
    let f = st.flags();
    let mut flags = [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
    ]
    .into_iter()
    .filter(|(st, _)| f.contains(*st))
    .fold(MsFlags::empty(), |acc, (_, ms)| acc | ms);
    // A remount without an atime flag means relatime; repeat strictatime explicitly.
    if f.bits() & ST_RELATIME != 0 {
        flags |= MsFlags::MS_RELATIME;
    } else if !f.contains(FsFlags::ST_NOATIME) {
        flags |= MsFlags::MS_STRICTATIME;
    }
    flags
}

/// Creates directory `path` (and its parents) to mount on; an existing one is fine.
pub(super) fn mount_point_dir(path: &Path) -> Result<(), InitError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .step(|| format!("creating mount point {}", path.display()))
}

/// Creates an empty file `path` to bind a file onto; an existing one is fine.
pub(super) fn mount_point_file(path: &Path) -> Result<(), InitError> {
    if let Some(parent) = path.parent() {
        mount_point_dir(parent)?;
    }
    // create_new: opening an image's existing file for writing would copy it up for nothing.
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).step(|| format!("creating mount point {}", path.display())),
    }
}

/// Creates symlink `path` -> `target`, replacing nothing.
pub(super) fn symlink(target: &Path, path: &Path) -> Result<(), InitError> {
    std::os::unix::fs::symlink(target, path)
        .step(|| format!("linking {} to {}", path.display(), target.display()))
}

/// Writes a small generated file into the root being built.
pub(super) fn write_file(path: &Path, contents: &str) -> Result<(), InitError> {
    fs::write(path, contents).step(|| format!("writing {}", path.display()))
}

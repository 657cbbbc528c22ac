//! How a file or symlink from a sandbox lands: [`Landing`] writes a file under a short
//! random name (`O_CREAT | O_EXCL | O_NOFOLLOW`, so nothing planted at that name is ever
//! opened) in a directory held by fd, then gives it its mode and mtime through that same fd
//! and renames it into place with `renameat`, which replaces a symlink standing at the final
//! name rather than following it. [`Links`] holds symlinks back until every file has landed,
//! so no write of the same transfer can go through one.
//!
//! Every temporary file is also listed in [`UNLANDED`] until it lands or is dropped, so a
//! process about to die of a signal can remove them all with [`abandon`] (a guard's `Drop`
//! never runs then), and no new one is made after.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use rustix::fs::{AtFlags, OFlags, Timespec, Timestamps};
use rustix::io::Errno;

use super::dir::Dest;
use super::error::HostFsError;
use super::path::{SandboxPath, MAX_PATH_BYTES};
use crate::escape::escape;

/// Prefix of temporary names; with [`TEMP_RANDOM_HEX`] random hex digits the name stays
/// 20 bytes, whatever the length of the final name (which may be 255 bytes itself).
const TEMP_PREFIX: &str = ".tether-";
/// Random hex digits in a temporary name (48 bits).
const TEMP_RANDOM_HEX: usize = 12;
/// Names tried before giving up when each is taken (only ever more than one if something
/// else creates files with the same prefix at the same time).
const TEMP_ATTEMPTS: usize = 16;

/// The temporary files not yet landed or dropped: their directories (a duplicate of each
/// fd) and names, by [`Landing`] id; `None` once [`abandon`] ran.
static UNLANDED: Mutex<Option<Vec<(u64, OwnedFd, OsString)>>> = Mutex::new(Some(Vec::new()));

/// Ids of [`Landing`]s, to find their [`UNLANDED`] entries.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Removes every temporary file a [`Landing`] of this process still has, and refuses new
/// ones from now on: for a process ending on a signal, where no `Drop` will run.
pub fn abandon() {
    let mut unlanded = UNLANDED.lock().unwrap_or_else(|e| e.into_inner());
    for (_, dir, tmp) in unlanded.take().unwrap_or_default() {
        let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
    }
}

/// A short random name for a temporary file.
fn temp_name() -> OsString {
    let random: u64 = rand::random();
    let hex = format!("{random:016x}");
    OsString::from(format!("{TEMP_PREFIX}{}", &hex[..TEMP_RANDOM_HEX]))
}

/// A file being written under a temporary name; removed on drop unless it landed, so a
/// failed or cut transfer leaves the old file (or none), never a partial one.
#[derive(Debug)]
pub struct Landing {
    dir: OwnedFd,
    tmp: OsString,
    file: File,
    /// The final path, escaped, for messages.
    shown: String,
    landed: bool,
    /// Its entry in [`UNLANDED`].
    id: u64,
}

impl Landing {
    /// A new empty file in `dir`; `shown` names its final path in errors.
    pub fn create(dir: OwnedFd, shown: String) -> Result<Landing, HostFsError> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut last = Errno::EXIST;
        // Held while the file is made and listed, so [`abandon`] sees it or stops it.
        let mut unlanded = UNLANDED.lock().unwrap_or_else(|e| e.into_inner());
        let Some(listed) = unlanded.as_mut() else {
            return Err(HostFsError::io("create a temporary file for", shown)(
                Errno::CANCELED.into(),
            ));
        };
        for _ in 0..TEMP_ATTEMPTS {
            let tmp = temp_name();
            match rustix::fs::openat(&dir, &tmp, flags, super::permissions(0o600)) {
                Ok(fd) => {
                    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                    match rustix::io::dup(&dir) {
                        Ok(copy) => listed.push((id, copy, tmp.clone())),
                        Err(e) => {
                            let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
                            last = e;
                            break;
                        }
                    }
                    return Ok(Landing {
                        dir,
                        tmp,
                        file: File::from(fd),
                        shown,
                        landed: false,
                        id,
                    });
                }
                Err(Errno::EXIST) => last = Errno::EXIST,
                Err(e) => {
                    last = e;
                    break;
                }
            }
        }
        Err(HostFsError::io("create a temporary file for", shown)(
            last.into(),
        ))
    }

    /// The file being written.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// The final path, escaped.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Gives the file `mode` (already filtered by the mode policy) and `mtime`, and renames
    /// it to `name` in its directory, replacing what is there (a directory there is an
    /// error).
    pub fn land(
        mut self,
        name: &OsStr,
        mode: u32,
        mtime: Option<SystemTime>,
    ) -> Result<(), HostFsError> {
        let fail = |action| HostFsError::io(action, self.shown.clone());
        rustix::fs::fchmod(&self.file, super::permissions(mode))
            .map_err(|e| fail("set the mode of")(e.into()))?;
        if let Some(mtime) = mtime {
            let at = timespec(mtime);
            let times = Timestamps {
                last_access: at,
                last_modification: at,
            };
            rustix::fs::futimens(&self.file, &times)
                .map_err(|e| fail("set the time of")(e.into()))?;
        }
        rustix::fs::renameat(&self.dir, &self.tmp, &self.dir, name)
            .map_err(|e| fail("move into place")(e.into()))?;
        self.landed = true;
        self.unlist();
        Ok(())
    }
}

impl Landing {
    /// Takes this file off [`UNLANDED`].
    fn unlist(&self) {
        let mut unlanded = UNLANDED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(listed) = unlanded.as_mut() {
            listed.retain(|(id, _, _)| *id != self.id);
        }
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        if !self.landed {
            let _ = rustix::fs::unlinkat(&self.dir, &self.tmp, AtFlags::empty());
            self.unlist();
        }
    }
}

fn timespec(t: SystemTime) -> Timespec {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timespec {
        tv_sec: since.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: since.subsec_nanos().into(),
    }
}

/// Symlinks from a sandbox, created only by [`Links::create`], once every file has landed.
#[derive(Debug, Default)]
pub struct Links {
    links: Vec<(SandboxPath, Vec<u8>)>,
}

impl Links {
    /// Records that `path` is a symlink to `target`. Any target is allowed (a link is never
    /// followed here), but it must be one the kernel can store.
    pub fn add(&mut self, path: SandboxPath, target: &[u8]) -> Result<(), HostFsError> {
        let reason = match target {
            [] => Some("is a symlink with an empty target"),
            t if t.contains(&0) => Some("is a symlink whose target contains a NUL byte"),
            t if t.len() > MAX_PATH_BYTES => {
                Some("is a symlink whose target is longer than 4,095 bytes")
            }
            _ => None,
        };
        if let Some(reason) = reason {
            return Err(HostFsError::BadPath {
                path: format!("{} -> {}", path.shown(), escape(target)),
                reason,
            });
        }
        self.links.push((path, target.to_vec()));
        Ok(())
    }

    /// How many are waiting.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Creates them all, each under a temporary name first and then renamed over what is
    /// at its path (a file or an older link; a directory there is an error).
    pub fn create(self, dest: &Dest) -> Result<usize, HostFsError> {
        let count = self.links.len();
        for (path, target) in self.links {
            let (dir, name) = dest.parent(&path, true)?;
            let fail = |action| HostFsError::io(action, dest.shown(&path));
            let mut made = None;
            for _ in 0..TEMP_ATTEMPTS {
                let tmp = temp_name();
                match rustix::fs::symlinkat(target.as_slice(), &dir, &tmp) {
                    Ok(()) => {
                        made = Some(tmp);
                        break;
                    }
                    Err(Errno::EXIST) => continue,
                    Err(e) => return Err(fail("create the symlink")(e.into())),
                }
            }
            let tmp = made.ok_or_else(|| fail("create the symlink")(Errno::EXIST.into()))?;
            if let Err(e) = rustix::fs::renameat(&dir, &tmp, &dir, name) {
                let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
                return Err(fail("move into place the symlink")(e.into()));
            }
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn files_replace_planted_symlinks_and_long_names_work() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("f")).unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        let path = SandboxPath::parse(b"f").unwrap();
        let (fd, name) = dest.parent(&path, true).unwrap();
        let mut landing = Landing::create(fd, dest.shown(&path)).unwrap();
        landing.file().write_all(b"new").unwrap();
        landing.land(name, 0o644, None).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("f")).unwrap(),
            "new"
        );

        let long = "n".repeat(255);
        let path = SandboxPath::parse(long.as_bytes()).unwrap();
        let (fd, name) = dest.parent(&path, true).unwrap();
        let landing = Landing::create(fd, dest.shown(&path)).unwrap();
        landing.land(name, 0o4755, None).unwrap();
        let mode = std::fs::metadata(dir.path().join(&long))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o4755, "the mode given is the mode set");
    }

    #[test]
    fn unlanded_files_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        let path = SandboxPath::parse(b"f").unwrap();
        let (fd, _) = dest.parent(&path, true).unwrap();
        let mut landing = Landing::create(fd, dest.shown(&path)).unwrap();
        landing.file().write_all(b"partial").unwrap();
        drop(landing);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn links_wait_and_replace() {
        let dir = tempfile::tempdir().unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        std::fs::write(dir.path().join("l"), "old").unwrap();
        let mut links = Links::default();
        links
            .add(SandboxPath::parse(b"l").unwrap(), b"/etc")
            .unwrap();
        links
            .add(SandboxPath::parse(b"d/m").unwrap(), b"../l")
            .unwrap();
        assert!(links.add(SandboxPath::parse(b"x").unwrap(), b"").is_err());
        assert_eq!(links.create(&dest).unwrap(), 2);
        assert_eq!(
            std::fs::read_link(dir.path().join("l")).unwrap(),
            Path::new("/etc")
        );
        assert_eq!(
            std::fs::read_link(dir.path().join("d/m")).unwrap(),
            Path::new("../l")
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    use std::path::Path;
}

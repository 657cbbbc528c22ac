//! A sandbox's writable storage: an ext4 file system of a fixed size and inode count, in a
//! sparse image file in the sandbox's directory, on a loop device, mounted at
//! `<dir>/disk` by the relay before the sandbox init starts. `/workspace`, `/tmp` (with
//! HOME) and an image's overlay layers are directories on it, so a sandbox that fills its
//! disk or its inodes gets ENOSPC and takes nothing from the host's file system, and `/tmp`
//! no longer sits in memory charged to the sandbox (where filling it starved the agent).
//!
//! Formatting is the slow part (mkfs.ext4 takes 5–20 ms), so each size is formatted once into
//! a template under `<data_dir>/local/disks/` and each sandbox gets a sparse copy of it (a few
//! hundred KiB of metadata). The file system has no journal (a sandbox's disk does not outlive
//! a host crash) and is mounted with `noinit_itable`, so the kernel never zeroes inode tables
//! into the sparse image, and `discard`, so deleted files give their space back to the host.
//!
//! The image is only ever written through the kernel's ext4 driver: nothing in the sandbox
//! can reach the image file or the loop device, and no image is ever mounted twice.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::unistd::{lseek, Whence};

use super::constants::{
    DEFAULT_DISK_BYTES, DISK_BLOCK_BYTES, DISK_BYTES_PER_INODE, DISK_FORMAT, DISK_INODE_BYTES,
    DISK_TEMPLATES_KEEP, DISK_TEMPLATE_DIR, LOOP_ATTACH_BACKOFF_MAX, LOOP_ATTACH_BACKOFF_MIN,
    LOOP_ATTACH_TIMEOUT, LOOP_DETACH_TIMEOUT, MAX_DISK_BYTES, MAX_LOOP_NUMBER, MIN_DISK_BYTES,
    POLL_INTERVAL, PROVIDER_DIR,
};
use super::error::{IoContext, LocalError};
use super::layout::Layout;
use super::loopdev::{LoopControl, LoopDevice, LO_FLAGS_AUTOCLEAR};
use tether_relay_core::provider::SandboxSpec;

/// Where mkfs.ext4 may be when it is not on the relay's `PATH` (a non-login root shell on
/// Debian has no sbin directories on it).
const MKFS_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin"];

/// The file system's features: ext4's usual ones (extents, extended attributes for overlayfs,
/// checksums), without a journal (a sandbox's disk does not outlive a host crash) or room
/// reserved for growing it.
const DISK_FEATURES: &str = "extent,ext_attr,flex_bg,dir_index,dir_nlink,extra_isize,filetype,\
                             sparse_super,large_file,huge_file,64bit,metadata_csum,\
                             ^has_journal,^resize_inode";
/// A configuration file that never exists, for mke2fs (see [`mkfs`]).
const MKE2FS_NO_CONFIG: &str = "/nonexistent/tether/mke2fs.conf";

/// How many mounts stacked on a disk's mount point a delete takes off (the relay makes one).
const MAX_STACKED_MOUNTS: usize = 8;

/// The buffer a template's data is copied through (a template holds a few hundred KiB).
const COPY_BUFFER_BYTES: usize = 256 << 10; // 256 KiB

/// The size of the disk `spec` asks for, with the default filled in, in whole blocks.
pub(super) fn size(spec: &SandboxSpec) -> Result<u64, LocalError> {
    let bytes = spec.disk_bytes.unwrap_or(DEFAULT_DISK_BYTES);
    if bytes < MIN_DISK_BYTES {
        return Err(LocalError::BadSpec(format!(
            "disk size {bytes} bytes is below the local provider's minimum of {} MiB; ask for \
             at least --disk {}M",
            MIN_DISK_BYTES >> 20,
            MIN_DISK_BYTES >> 20
        )));
    }
    if bytes > MAX_DISK_BYTES {
        return Err(LocalError::BadSpec(format!(
            "disk size {bytes} bytes is above the local provider's maximum of {} TiB; ask for \
             less",
            MAX_DISK_BYTES >> 40
        )));
    }
    Ok(bytes.div_ceil(DISK_BLOCK_BYTES) * DISK_BLOCK_BYTES)
}

/// What a sandbox's storage is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Storage {
    /// Its own file system of this many bytes (the relay runs as root).
    Disk(u64),
    /// Plain directories on the host's file system, without a quota: a relay that is not
    /// root can neither attach loop devices nor mount ext4.
    Directories,
}

impl Storage {
    /// The storage for `spec`: a disk of the size asked for (or the default) when this process
    /// can make one. An explicit size that cannot be honoured is refused, never ignored.
    pub(super) fn plan(spec: &SandboxSpec, is_root: bool) -> Result<Storage, LocalError> {
        let bytes = size(spec)?;
        match (is_root, spec.disk_bytes) {
            (true, _) => Ok(Storage::Disk(bytes)),
            (false, None) => Ok(Storage::Directories),
            (false, Some(_)) => Err(LocalError::Unavailable(
                "a disk quota (--disk) needs loop devices and an ext4 mount, which only a relay \
                 running as root can make; run `tether serve` as root or drop --disk"
                    .into(),
            )),
        }
    }
}

/// Makes the sandbox's storage at `layout.disk()` (which [`Layout::create`] made) and its top
/// directories (`workspace`, `tmp`, and `upper` and `work` when `overlay`), owned by `uid` and
/// `gid`:
/// the host ids of the sandbox's root. Blocking. On error the caller's teardown (see
/// [`release`]) removes whatever was made.
pub(super) fn create(
    layout: &Layout,
    data_dir: &Path,
    storage: Storage,
    overlay: bool,
    (uid, gid): (u32, u32),
) -> Result<(), LocalError> {
    if let Storage::Disk(bytes) = storage {
        let template = template(data_dir, bytes)?;
        copy_template(&template, &layout.disk_image(), bytes)?;
        attach_and_mount(&layout.disk_image(), &layout.disk())?;
    }
    let mut dirs = vec![(layout.workspace(), 0o755), (layout.tmp(), 0o1777)];
    if overlay {
        dirs.extend([(layout.upper(), 0o755), (layout.work(), 0o755)]);
    }
    for (dir, mode) in dirs {
        DirBuilder::new()
            .mode(mode)
            .create(&dir)
            .context(|| format!("create {}", dir.display()))?;
        // The umask may have masked the sticky bit or group and world bits.
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
            .context(|| format!("set the mode of {}", dir.display()))?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .context(|| format!("give {} to the sandbox's root", dir.display()))?;
    }
    Ok(())
}

/// Mounts a stopped sandbox's disk again at `<dir>/disk`, as `create` left it; a sandbox
/// without a disk image (a relay that is not root keeps plain directories) has nothing to
/// mount.
pub(super) fn remount(layout: &Layout) -> Result<(), LocalError> {
    let image = layout.disk_image();
    if !image.exists() {
        return Ok(());
    }
    attach_and_mount(&image, &layout.disk())
}

/// Unmounts the sandbox's disk and detaches its loop device, waiting (a bounded time) for the
/// kernel to let go of it. Accepts "never made" and "already gone", so it runs on every delete
/// and after every failed create. Blocking.
pub(super) fn release(layout: &Layout) -> Result<(), LocalError> {
    let mount_point = layout.disk();
    for _ in 0..MAX_STACKED_MOUNTS {
        match umount2(&mount_point, MntFlags::empty()) {
            // Unmounted; something mounted over it too needs another pass.
            Ok(()) => continue,
            // Not (or no longer) a mount point, or the directory is gone.
            Err(Errno::EINVAL | Errno::ENOENT) => break,
            // Something still has a file open on it: the sandbox is dead, so it is a stray
            // host process; detach lazily, the loop device goes when it lets go.
            Err(Errno::EBUSY) => {
                umount2(&mount_point, MntFlags::MNT_DETACH)
                    .map_err(io::Error::from)
                    .context(|| format!("unmount {}", mount_point.display()))?;
                break;
            }
            Err(e) => {
                return Err(io::Error::from(e))
                    .context(|| format!("unmount {}", mount_point.display()))
            }
        }
    }
    let image = layout.disk_image();
    for device in loop_devices_backed_by(&image) {
        detach_if_backed_by(&device, &image).context(|| format!("detach {}", device.display()))?;
    }
    let start = Instant::now();
    while !loop_devices_backed_by(&image).is_empty() {
        if start.elapsed() > LOOP_DETACH_TIMEOUT {
            // Another mount namespace (one made while this disk was mounted) still holds it;
            // it is marked to detach when that lets go, and the image's space is freed then.
            tracing::warn!(
                "the loop device of {} is still in use after {LOOP_DETACH_TIMEOUT:?}; it will \
                 detach when its last user lets go",
                image.display()
            );
            break;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    Ok(())
}

/// The formatted, empty image of `bytes` bytes, made once per size and format.
fn template(data_dir: &Path, bytes: u64) -> Result<PathBuf, LocalError> {
    let dir = data_dir.join(PROVIDER_DIR).join(DISK_TEMPLATE_DIR);
    let path = dir.join(format!("{DISK_FORMAT}-{bytes}.img"));
    if path.exists() {
        // Marks it recently used, for pruning; a failure only makes it older.
        let _ = File::open(&path).and_then(|f| f.set_modified(SystemTime::now()));
        return Ok(path);
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .context(|| format!("create {}", dir.display()))?;
    // Formatted under a unique name and renamed into place: concurrent creates of the same
    // size each make a whole template, and the last rename wins.
    let partial = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(&dir)
        .context(|| format!("create a disk image in {}", dir.display()))?;
    partial
        .as_file()
        .set_len(bytes)
        .context(|| format!("size {}", partial.path().display()))?;
    mkfs(partial.path(), bytes)?;
    partial
        .persist(&path)
        .map_err(|e| e.error)
        .context(|| format!("save the disk template {}", path.display()))?;
    prune_templates(&dir, &path);
    Ok(path)
}

/// Formats `image` as ext4: 4 KiB blocks, one inode per [`DISK_BYTES_PER_INODE`], nothing
/// reserved for root (the sandbox's root is its user), no journal, inode tables left unzeroed.
fn mkfs(image: &Path, bytes: u64) -> Result<(), LocalError> {
    let program = mkfs_program().ok_or_else(|| {
        LocalError::Unavailable(
            "mkfs.ext4 is not installed; the local provider formats each sandbox's disk with \
             it: install e2fsprogs (apt-get install e2fsprogs)"
                .into(),
        )
    })?;
    let blocks = bytes / DISK_BLOCK_BYTES;
    let output = Command::new(&program)
        .args(["-q", "-F", "-t", "ext4", "-m", "0", "-L", "tether"])
        .args(["-b", &DISK_BLOCK_BYTES.to_string()])
        .args(["-i", &DISK_BYTES_PER_INODE.to_string()])
        .args(["-I", &DISK_INODE_BYTES.to_string()])
        .args(["-O", DISK_FEATURES])
        .args(["-E", "lazy_itable_init=1,nodiscard,root_owner=0:0"])
        .arg(image)
        .arg(blocks.to_string())
        // mke2fs uses its built-in profile when its configuration file is missing (an empty
        // one would define no ext4 at all), so the host's settings change nothing.
        .env("MKE2FS_CONFIG", MKE2FS_NO_CONFIG)
        .stdin(Stdio::null())
        .output()
        .context(|| format!("run {}", program.display()))?;
    if !output.status.success() {
        return Err(LocalError::io(
            format!("format {} with {}", image.display(), program.display()),
            io::Error::other(String::from_utf8_lossy(&output.stderr).trim().to_string()),
        ));
    }
    Ok(())
}

fn mkfs_program() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(MKFS_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join("mkfs.ext4"))
        .find(|p| p.is_file())
}

/// Keeps the [`DISK_TEMPLATES_KEEP`] most recently used templates besides `keep`: sizes are
/// the caller's choice, so their number must not grow without bound.
fn prune_templates(dir: &Path, keep: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut templates: Vec<(SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p != keep && p.extension().is_some_and(|e| e == "img"))
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .filter_map(|p| Some((fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    templates.sort_by_key(|t| std::cmp::Reverse(t.0));
    for (_, old) in templates
        .into_iter()
        .skip(DISK_TEMPLATES_KEEP.saturating_sub(1))
    {
        let _ = fs::remove_file(old);
    }
}

/// Copies the template into a new image, only its data: the holes stay holes.
fn copy_template(template: &Path, image: &Path, bytes: u64) -> Result<(), LocalError> {
    let from = File::open(template).context(|| format!("open {}", template.display()))?;
    let to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(image)
        .context(|| format!("create {}", image.display()))?;
    copy_sparse(&from, &to, bytes).context(|| {
        format!(
            "copy the disk template {} to {}",
            template.display(),
            image.display()
        )
    })
}

/// Copies the data extents of `from` (of length `len`) into the empty file `to`.
fn copy_sparse(from: &File, to: &File, len: u64) -> io::Result<()> {
    to.set_len(len)?;
    let len = i64::try_from(len).map_err(io::Error::other)?;
    let mut buf = vec![0u8; COPY_BUFFER_BYTES];
    let mut offset: i64 = 0;
    while offset < len {
        let data = match lseek(from.as_raw_fd(), offset, Whence::SeekData) {
            Ok(data) => data,
            // No data after `offset`: the rest is a hole.
            Err(Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = lseek(from.as_raw_fd(), data, Whence::SeekHole)?.min(len);
        let mut at = data as u64;
        while at < hole as u64 {
            let want = buf.len().min((hole as u64 - at) as usize);
            let read = from.read_at(&mut buf[..want], at)?;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            to.write_all_at(&buf[..read], at)?;
            at += read as u64;
        }
        offset = hole;
    }
    Ok(())
}

/// Attaches `image` to a free loop device and mounts it on `mount_point`. The device clears
/// itself when the mount goes (or when this process dies before mounting), and [`release`]
/// also finds it by its backing file whatever happened in between.
fn attach_and_mount(image: &Path, mount_point: &Path) -> Result<(), LocalError> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .context(|| format!("open {}", image.display()))?;
    // Held open until the mount holds the device itself: an auto-clearing device with no
    // opener unbinds at once.
    let device = attach(image, &backing)?;
    mount(
        Some(device.path()),
        mount_point,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("noinit_itable,discard,errors=remount-ro"),
    )
    .map_err(io::Error::from)
    .context(|| {
        format!(
            "mount {} ({}) on {}",
            device.path().display(),
            image.display(),
            mount_point.display()
        )
    })
}

/// Serialises this relay's picks of a free loop device with their binding. The kernel tells
/// every caller asking at the same moment the same free number, and only one can bind it: a
/// burst of creates in one relay otherwise takes turns failing on one device, every loser
/// asking again at once and colliding again on the next.
static ATTACH_TURN: Mutex<()> = Mutex::new(());

/// Binds `backing` (the open `image`) to a loop device, auto-clearing, and returns the device,
/// open. Other processes on the host may take the device this one was told is free, or hold
/// a free device open exclusively (so binding it fails until they let go): each such refusal
/// is retried after a jittered, growing pause, on a device that did not refuse, until
/// [`LOOP_ATTACH_TIMEOUT`].
fn attach(image: &Path, backing: &File) -> Result<LoopDevice, LocalError> {
    let control = LoopControl::open().map_err(|e| {
        LocalError::Unavailable(format!(
            "cannot open /dev/loop-control ({e}); sandbox disks are loop devices: load the \
             loop module (modprobe loop) and run the relay as root"
        ))
    })?;
    let start = Instant::now();
    let mut refused: Vec<u32> = Vec::new();
    let mut pause = LOOP_ATTACH_BACKOFF_MIN;
    loop {
        let attempt = {
            let _turn = ATTACH_TURN.lock().unwrap_or_else(PoisonError::into_inner);
            bind_free(&control, backing, &refused)
        };
        let (number, error) = match attempt {
            Ok(device) => return Ok(device),
            Err(failed) => failed,
        };
        let contended = matches!(error.raw_os_error(), Some(libc::EBUSY | libc::ENXIO));
        if !contended {
            return Err(error).context(|| format!("attach {} to a loop device", image.display()));
        }
        if let Some(number) = number.filter(|n| !refused.contains(n)) {
            refused.push(number);
        }
        if start.elapsed() + pause > LOOP_ATTACH_TIMEOUT {
            return Err(LocalError::Unavailable(format!(
                "could not attach {} to a loop device: every free device was taken by another \
                 process for {LOOP_ATTACH_TIMEOUT:?} ({error}); retry the create, and check \
                 `losetup -a` and `lsof /dev/loop*` for programs holding loop devices",
                image.display()
            )));
        }
        // Full jitter: relays (or other programs) that collided do not retry in step.
        std::thread::sleep(pause.mul_f64(rand::random::<f64>()));
        pause = (pause * 2).min(LOOP_ATTACH_BACKOFF_MAX);
    }
}

/// One attempt of [`attach`]: the device the kernel says is free or, when that one refused an
/// earlier attempt (another process holds it open), another unbound device, made if need be.
/// On failure, the number of the device that refused, when there was one.
fn bind_free(
    control: &LoopControl,
    backing: &File,
    refused: &[u32],
) -> Result<LoopDevice, (Option<u32>, io::Error)> {
    let mut number = control.free().map_err(|e| (None, e))?;
    if refused.contains(&number) {
        number = unbound_device_besides(control, refused).map_err(|e| (None, e))?;
    }
    let device = LoopDevice::open_number(number).map_err(|e| (Some(number), e))?;
    device
        .bind(backing, LO_FLAGS_AUTOCLEAR)
        .map_err(|e| (Some(number), e))?;
    Ok(device)
}

/// The lowest loop device not in `refused` that is unbound (sysfs shows a bound device's
/// `loop` attributes), made when every existing one is bound or refused.
fn unbound_device_besides(control: &LoopControl, refused: &[u32]) -> io::Result<u32> {
    for number in (0..=MAX_LOOP_NUMBER).filter(|n| !refused.contains(n)) {
        let sys = Path::new("/sys/block").join(format!("loop{number}"));
        if sys.exists() {
            if !sys.join("loop").exists() {
                return Ok(number);
            }
            continue;
        }
        match control.add(number) {
            Ok(made) => return Ok(made),
            // Made by someone else since we looked (or sysfs is not mounted here).
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ENOSPC))
}

/// Unbinds loop device `path` if it is still bound to `image`. The check is made on the open
/// device, which cannot auto-clear and be bound to another sandbox's image while it is held
/// open: a device found in sysfs a moment ago may since have been given to someone else.
fn detach_if_backed_by(path: &Path, image: &Path) -> io::Result<()> {
    let device = match LoopDevice::open(path.to_path_buf()) {
        Ok(device) => device,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENOENT)) => return Ok(()),
        Err(e) => return Err(e),
    };
    let info = match device.status() {
        Ok(info) => info,
        // Unbound since it was listed.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(()),
        Err(e) => return Err(e),
    };
    let ours = match fs::metadata(image) {
        Ok(meta) => (info.lo_device, info.lo_inode) == (meta.dev(), meta.ino()),
        // The image is gone (a directory removed under a crashed create): it is ours if sysfs
        // still names it as this device's backing file now that the device is held.
        Err(_) => loop_devices_backed_by(image)
            .iter()
            .any(|listed| listed == path),
    };
    if !ours {
        return Ok(());
    }
    // On a device still open elsewhere (a file system mounted in another mount namespace)
    // this marks it to unbind itself on its last close.
    match device.unbind() {
        Err(e) if e.raw_os_error() != Some(libc::ENXIO) => Err(e),
        _ => Ok(()),
    }
}

/// The loop devices (`/dev/loopN`) whose backing file is `image`, from sysfs.
fn loop_devices_backed_by(image: &Path) -> Vec<PathBuf> {
    // The kernel names the backing file by its real path, with " (deleted)" once unlinked.
    let real = image
        .parent()
        .and_then(|dir| fs::canonicalize(dir).ok())
        .zip(image.file_name())
        .map(|(dir, name)| dir.join(name))
        .unwrap_or_else(|| image.to_path_buf());
    let real = real.to_string_lossy().into_owned();
    let deleted = format!("{real} (deleted)");
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter(|e| {
            fs::read_to_string(e.path().join("loop/backing_file")).is_ok_and(|b| {
                b.trim_end_matches('\n') == real || b.trim_end_matches('\n') == deleted
            })
        })
        .map(|e| Path::new("/dev").join(e.file_name()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn sizes_have_a_default_bounds_and_whole_blocks() {
        let spec = |disk_bytes| SandboxSpec {
            disk_bytes,
            ..Default::default()
        };
        assert_eq!(size(&spec(None)).unwrap(), DEFAULT_DISK_BYTES);
        assert_eq!(size(&spec(Some(64 << 20))).unwrap(), 64 << 20);
        assert_eq!(
            size(&spec(Some((64 << 20) + 1))).unwrap(),
            (64 << 20) + 4096
        );
        assert!(matches!(
            size(&spec(Some(1 << 20))),
            Err(LocalError::BadSpec(_))
        ));
        assert!(matches!(
            size(&spec(Some(u64::MAX))),
            Err(LocalError::BadSpec(_))
        ));

        assert_eq!(
            Storage::plan(&spec(None), false).unwrap(),
            Storage::Directories
        );
        assert_eq!(
            Storage::plan(&spec(Some(64 << 20)), true).unwrap(),
            Storage::Disk(64 << 20)
        );
        assert!(matches!(
            Storage::plan(&spec(Some(64 << 20)), false),
            Err(LocalError::Unavailable(_))
        ));
    }

    #[test]
    fn copies_keep_holes_and_data() {
        let dir = tempfile::tempdir().unwrap();
        let len: u64 = 1 << 30;
        let mut from = File::create(dir.path().join("from")).unwrap();
        from.set_len(len).unwrap();
        from.write_all(b"head").unwrap();
        from.seek(SeekFrom::Start(len - 4096)).unwrap();
        from.write_all(b"tail").unwrap();
        from.sync_all().unwrap();
        let from = File::open(dir.path().join("from")).unwrap();
        let to_path = dir.path().join("to");
        let to = File::create(&to_path).unwrap();
        copy_sparse(&from, &to, len).unwrap();

        let meta = fs::metadata(&to_path).unwrap();
        assert_eq!(meta.len(), len);
        assert!(
            meta.blocks() * 512 < 1 << 20,
            "the copy allocated {} bytes",
            meta.blocks() * 512
        );
        let mut to = File::open(&to_path).unwrap();
        let mut buf = [0u8; 4];
        to.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"head");
        to.seek(SeekFrom::Start(len / 2)).unwrap();
        to.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [0; 4]);
        to.seek(SeekFrom::Start(len - 4096)).unwrap();
        to.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"tail");
    }

    /// Releases a test's disk even when an assertion fails.
    struct Released<'a>(&'a Layout);

    impl Drop for Released<'_> {
        fn drop(&mut self) {
            let _ = release(self.0);
        }
    }

    /// How many disks [`disks_attach_at_once_while_another_process_holds_a_free_device`]
    /// attaches at once.
    const BURST: usize = 200;

    /// Root-only. A burst of disks attached at once in one relay, while another process holds
    /// the free loop device the kernel hands out next open exclusively (as a program probing
    /// or formatting it does): every attach succeeds, and release leaves no device attached.
    #[test]
    fn disks_attach_at_once_while_another_process_holds_a_free_device() {
        if !nix::unistd::geteuid().is_root() || mkfs_program().is_none() {
            return eprintln!("skipped: needs root and mkfs.ext4");
        }
        let data = tempfile::tempdir().unwrap();
        let bytes = MIN_DISK_BYTES;
        let template = template(data.path(), bytes).unwrap();
        let layouts: Vec<Layout> = (0..BURST)
            .map(|i| {
                let layout = Layout::new(data.path(), &format!("sb-burst-{i}"));
                layout.create().unwrap();
                copy_template(&template, &layout.disk_image(), bytes).unwrap();
                layout
            })
            .collect();
        let _cleanup: Vec<Released<'_>> = layouts.iter().map(Released).collect();
        let free = Command::new("losetup").arg("-f").output().unwrap();
        let free = String::from_utf8(free.stdout).unwrap();
        let _held = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(free.trim())
            .unwrap();

        let barrier = std::sync::Barrier::new(BURST);
        let start = Instant::now();
        let failed: Vec<String> = std::thread::scope(|scope| {
            let attaching: Vec<_> = layouts
                .iter()
                .map(|layout| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        attach_and_mount(&layout.disk_image(), &layout.disk())
                    })
                })
                .collect();
            attaching
                .into_iter()
                .filter_map(|t| t.join().unwrap().err().map(|e| e.to_string()))
                .collect()
        });
        eprintln!(
            "{BURST} attaches at once: {} failed, in {:?}",
            failed.len(),
            start.elapsed()
        );
        assert!(
            failed.is_empty(),
            "{} of {BURST} attaches failed; the first: {}",
            failed.len(),
            failed[0]
        );
        for layout in &layouts {
            release(layout).unwrap();
            assert!(loop_devices_backed_by(&layout.disk_image()).is_empty());
        }
    }

    /// Root-only: loop devices and mounts.
    #[test]
    fn a_real_disk_has_its_size_and_inodes_and_is_released() {
        if !nix::unistd::geteuid().is_root() || mkfs_program().is_none() {
            return eprintln!("skipped: needs root and mkfs.ext4");
        }
        let data = tempfile::tempdir().unwrap();
        let layout = Layout::new(data.path(), "sb-disk");
        layout.create().unwrap();
        let cleanup = Released(&layout);
        create(
            &layout,
            data.path(),
            Storage::Disk(32 << 20),
            true,
            (1234, 5678),
        )
        .unwrap();

        let st = nix::sys::statvfs::statvfs(&layout.workspace()).unwrap();
        let total = st.blocks() as u64 * st.fragment_size() as u64;
        assert!(total <= 32 << 20 && total > 24 << 20, "{total} bytes");
        assert_eq!(st.files() as u64, (32 << 20) / DISK_BYTES_PER_INODE);
        let tmp = fs::metadata(layout.tmp()).unwrap();
        assert_eq!(tmp.mode() & 0o7777, 0o1777);
        assert_eq!((tmp.uid(), tmp.gid()), (1234, 5678));
        assert!(layout.upper().is_dir() && layout.work().is_dir());
        // The image takes from the host only what was written to it.
        let image = fs::metadata(layout.disk_image()).unwrap();
        assert!(image.blocks() * 512 < 4 << 20, "{} blocks", image.blocks());
        assert_eq!(loop_devices_backed_by(&layout.disk_image()).len(), 1);
        let template = data
            .path()
            .join(PROVIDER_DIR)
            .join(DISK_TEMPLATE_DIR)
            .join(format!("{DISK_FORMAT}-{}.img", 32 << 20));
        let dump = Command::new("dumpe2fs").arg("-h").arg(&template).output();
        if let Ok(dump) = dump {
            let dump = String::from_utf8_lossy(&dump.stdout);
            let features = dump
                .lines()
                .find_map(|l| l.strip_prefix("Filesystem features:"))
                .unwrap_or_default();
            for want in ["extent", "ext_attr", "metadata_csum"] {
                assert!(features.contains(want), "{want} missing from {features}");
            }
            assert!(!features.contains("has_journal"), "{features}");
        }

        release(&layout).unwrap();
        assert!(loop_devices_backed_by(&layout.disk_image()).is_empty());
        let mounted = tether_mountinfo::current()
            .into_iter()
            .any(|m| m.mount_point.starts_with(layout.dir()));
        assert!(!mounted, "a mount is left under {}", layout.dir().display());
        // Releasing twice, or what was never made, is fine.
        release(&layout).unwrap();
        drop(cleanup);
    }
}

//! The sandbox's `/dev`: a small read-only tmpfs holding the harmless character devices
//! (bound from the host), a private devpts instance for terminals, a `/dev/shm` tmpfs and the
//! usual links into `/proc/self/fd`. No disk, console or kernel-memory device is reachable.

use std::path::Path;

use nix::mount::{mount, MsFlags};

use super::constants::{DEV_SHM_SIZE_BYTES, DEV_SIZE_BYTES};
use super::error::{InitError, Step};
use super::mounts;

/// Host devices the sandbox may use.
const NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Links every Linux userland expects in `/dev`.
const LINKS: [(&str, &str); 5] = [
    ("ptmx", "pts/ptmx"),
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// Builds `<root>/dev`. In a user namespace the host's `tty` group cannot be named, so
/// terminals are owned by the sandbox's root group instead.
pub(super) fn populate(root: &Path, single_id: bool) -> Result<(), InitError> {
    let dev = root.join("dev");
    mounts::mount_point_dir(&dev)?;
    let fixed = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    mounts::tmpfs(&dev, &format!("size={DEV_SIZE_BYTES},mode=755"), fixed)?;

    for name in NODES {
        let host = Path::new("/dev").join(name);
        if !host.exists() {
            continue;
        }
        let node = dev.join(name);
        mounts::mount_point_file(&node)?;
        mounts::bind(&host, &node, MsFlags::empty())?;
    }

    let pts = dev.join("pts");
    mounts::mount_point_dir(&pts)?;
    // With only the relay's own id mapped, there is no group 5 (tty) to give the terminals.
    let tty_group = if single_id { "" } else { ",gid=5" };
    let options = format!("newinstance,ptmxmode=0666,mode=0620{tty_group}");
    mount(
        Some("devpts"),
        &pts,
        Some("devpts"),
        fixed,
        Some(options.as_str()),
    )
    .step(|| {
        format!(
            "mounting a new devpts instance on {} ({options})",
            pts.display()
        )
    })?;

    let shm = dev.join("shm");
    mounts::mount_point_dir(&shm)?;
    mounts::tmpfs(
        &shm,
        &format!("size={DEV_SHM_SIZE_BYTES},mode=1777"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )?;

    for (name, target) in LINKS {
        mounts::symlink(Path::new(target), &dev.join(name))?;
    }
    mounts::remount_readonly(&dev, fixed)
}

//! Staging, for root relays: before the sandbox's PID 1 exists, the init (still root on the
//! host) puts what PID 1 must mount into the sandbox's own directory, inside a mount namespace
//! private to the init, so nothing shows on the host and everything vanishes with the init.
//!
//! PID 1 is root only inside its user namespace: it cannot traverse the relay's private
//! directories (a data directory under `/root`, say) to reach an image or the agent binary,
//! and the image's files, owned by host root, would be nobody's to it. So the init binds the
//! agent binary at `<sandbox>/agent` and clones the image's root as an idmapped, read-only
//! mount at `<sandbox>/lower`, through which host uid N appears as the sandbox's uid N. PID 1
//! starts in `<sandbox>` (its working directory) and reaches both by relative paths.

use std::ffi::CString;
use std::fs::{DirBuilder, File, OpenOptions};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::unistd::Pid;

use super::config::InitConfig;
use super::constants::{STAGED_AGENT, STAGED_LOWER};
use super::error::{InitError, Step};
use super::plan::Rootfs;
use super::{mounts, sys};

/// Moves the init into a mount namespace of its own, whose mounts never propagate to the host,
/// and returns the host's, to go back to with [`leave`].
pub(super) fn private_mount_namespace() -> Result<OwnedFd, InitError> {
    let host =
        File::open("/proc/self/ns/mnt").step(|| "opening the host's mount namespace".into())?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .step(|| "unshare(CLONE_NEWNS) for the init's staging mounts".into())?;
    mounts::make_private()?;
    Ok(host.into())
}

/// Returns the init to the host's mount namespace once the sandbox's processes have the
/// staging namespace. The init lives as long as the sandbox: staying would keep a copy of
/// every mount the host had at creation, other sandboxes' disks included, and pin their loop
/// devices after those sandboxes are deleted. The staging namespace goes with its last member.
pub(super) fn leave(host: OwnedFd) -> Result<(), InitError> {
    nix::sched::setns(host, nix::sched::CloneFlags::CLONE_NEWNS)
        .step(|| "returning to the host's mount namespace".into())
}

/// Binds the agent binary at `<sandbox>/agent` (the working directory), read-only.
pub(super) fn agent(config: &InitConfig) -> Result<(), InitError> {
    let target = Path::new(STAGED_AGENT);
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o500)
        .open(target)
        .step(|| "creating the staged agent's mount point".into())?;
    mount(
        Some(&config.agent_binary),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .step(|| format!("binding the agent binary {}", config.agent_binary.display()))?;
    mounts::remount_bind(
        target,
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
    )
}

/// Clones an image's root at `<sandbox>/lower`, idmapped through `child`'s user namespace.
pub(super) fn image(config: &InitConfig, child: Pid) -> Result<(), InitError> {
    let Rootfs::Image(lower) = &config.rootfs else {
        return Ok(());
    };
    let userns = File::open(format!("/proc/{child}/ns/user"))
        .step(|| "opening the sandbox's user namespace".into())?;
    let source = CString::new(lower.as_os_str().as_bytes())
        .map_err(|_| InitError::Config("the image path holds a NUL byte".into()))?;
    let dir = sys::open_dir_no_symlinks(&source).map_err(|errno| InitError::Sys {
        what: format!(
            "opening the image {} (it must be a directory reached without symlinks)",
            lower.display()
        ),
        errno,
    })?;
    let tree = sys::idmapped_clone(dir.as_fd(), userns.as_fd()).map_err(|errno| match errno {
        Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP => InitError::Unsupported {
            what: format!("an idmapped mount of the image {}", lower.display()),
            errno,
            hint: "sandboxes with an image need idmapped mounts: Linux 5.12 or later, with the \
                   relay's data directory on ext4, xfs, btrfs or tmpfs",
        },
        errno => InitError::Sys {
            what: format!("an idmapped mount of the image {}", lower.display()),
            errno,
        },
    })?;
    DirBuilder::new()
        .mode(0o755)
        .create(STAGED_LOWER)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Ok(()),
            _ => Err(e),
        })
        .step(|| "creating the staged image's mount point".into())?;
    let target = CString::new(STAGED_LOWER).expect("no NUL in a constant");
    sys::attach_mount(tree.as_fd(), &target).step(|| "attaching the idmapped image".into())
}

//! Assembling a sandbox's root file system in its own mount namespace and pivoting into it.
//! Without an image, `/` is a small tmpfs, read-only once built, holding the host's system
//! directories bound read-only and a trimmed `/etc`; with an image, `/` is an overlay whose
//! writes land on the sandbox's disk. Either way the sandbox gets its workspace and `/tmp` from
//! its disk, a fresh `/dev` and `/proc`, and the agent binary; then the host's root is detached, so
//! home directories, the relay's data and secrets are out of reach.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::unistd::{chdir, pivot_root};

use super::config::{IdMapping, InitConfig};
use super::constants::{AGENT_PATH, HOST_ROOTFS_HOME, ROOT_SIZE_BYTES, WORKSPACE};
use super::error::{InitError, Step};
use super::layout::Layout;
use super::plan::Rootfs;
use super::{devfs, etc, mounts, procfs, trust};
use tether_relay_core::provider::NetworkPolicy;

/// Host directories a sandbox without an image sees, read-only; symlinks among them (such as
/// `/bin -> usr/bin`) are recreated as symlinks.
const HOST_DIRS: [&str; 7] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

const NO_DEVICES: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV);
const READ_ONLY: MsFlags = MsFlags::MS_RDONLY.union(NO_DEVICES);

/// Builds the sandbox's root at `config.layout.root()`. Runs in the sandbox's first process,
/// in its new mount and PID namespaces, before [`enter`].
pub(super) fn assemble(config: &InitConfig) -> Result<(), InitError> {
    let root = config.layout.root();
    mounts::make_private()?;

    match &config.rootfs {
        Rootfs::Host => {
            mounts::tmpfs(
                &root,
                &format!("size={ROOT_SIZE_BYTES},mode=755"),
                NO_DEVICES,
            )?;
            let visible = bind_host_dirs(&root)?;
            etc::populate_from_host(&root, &config.id, &visible)?;
            for (dir, mode) in [("root", 0o700), ("home", 0o755)] {
                let path = root.join(dir);
                DirBuilder::new()
                    .mode(mode)
                    .create(&path)
                    .step(|| format!("creating {}", path.display()))?;
            }
        }
        Rootfs::Image(lower) => {
            mount_overlay(&root, lower, &config.layout)?;
            etc::write_identity(&root, &config.id)?;
            if config.network == NetworkPolicy::Host {
                etc::copy_resolver(&root)?;
            }
        }
    }

    let workspace = root.join(WORKSPACE.trim_start_matches('/'));
    mounts::mount_point_dir(&workspace)?;
    mounts::bind(&config.layout.workspace(), &workspace, NO_DEVICES)?;

    // /tmp is on the sandbox's disk, not a tmpfs: its pages would count against the memory
    // limit, so filling it would leave the agent no memory.
    let tmp = root.join("tmp");
    mounts::mount_point_dir(&tmp)?;
    mounts::bind(&config.layout.tmp(), &tmp, NO_DEVICES)?;
    if config.rootfs == Rootfs::Host {
        // This root is read-only, so HOME (where pip, npm, git and shells keep caches and
        // settings) lives in the sandbox's own /tmp.
        // A sandbox started again after a stop finds the one its first boot made (or
        // whatever its code left there: its own to keep, as nothing here follows it).
        let home = root.join(HOST_ROOTFS_HOME.trim_start_matches('/'));
        match DirBuilder::new().mode(0o700).create(&home) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            other => other.step(|| format!("creating {}", home.display()))?,
        }
    }

    devfs::populate(&root, matches!(config.users, IdMapping::Own { .. }))?;
    procfs::mount_proc(&root)?;

    let agent = root.join(AGENT_PATH.trim_start_matches('/'));
    mounts::mount_point_file(&agent)?;
    mounts::bind(&config.agent_binary, &agent, READ_ONLY)?;
    if config.trust_egress_ca {
        trust::install(&root, &config.layout)?;
    }

    if config.rootfs == Rootfs::Host {
        mounts::remount_readonly(&root, NO_DEVICES)?;
    }
    Ok(())
}

/// Binds the host's system directories into `root`; returns those bound as directories.
fn bind_host_dirs(root: &Path) -> Result<Vec<PathBuf>, InitError> {
    let mut visible = Vec::new();
    for dir in HOST_DIRS {
        let host = Path::new(dir);
        let Ok(meta) = fs::symlink_metadata(host) else {
            continue;
        };
        let dst = root.join(dir.trim_start_matches('/'));
        if meta.is_symlink() {
            let target = fs::read_link(host).step(|| format!("reading link {dir}"))?;
            mounts::symlink(&target, &dst)?;
        } else if meta.is_dir() {
            mounts::mount_point_dir(&dst)?;
            mounts::bind(host, &dst, READ_ONLY)?;
            visible.push(host.to_path_buf());
        }
    }
    Ok(visible)
}

/// Mounts the image `lower` with a writable layer in the sandbox's directory on `root`.
fn mount_overlay(root: &Path, lower: &Path, layout: &Layout) -> Result<(), InitError> {
    let mut options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        layout.upper().display(),
        layout.work().display()
    );
    // Mounted from the sandbox's user namespace, the overlay keeps its metadata in user.*
    // instead of trusted.* xattrs.
    options.push_str(",userxattr");
    let what = || format!("mounting the image {} as an overlay", lower.display());
    match mount(
        Some("overlay"),
        root,
        Some("overlay"),
        NO_DEVICES,
        Some(options.as_str()),
    ) {
        Ok(()) => Ok(()),
        Err(errno @ Errno::ENODEV) => Err(InitError::Unsupported {
            what: what(),
            errno,
            hint: "this kernel has no overlayfs; load it with `modprobe overlay`",
        }),
        Err(errno @ Errno::EINVAL) => Err(InitError::Unsupported {
            what: what(),
            errno,
            hint: "the image and the relay's data directory must not contain each other, and \
                   the data directory must be on a file system that can hold an overlay's upper \
                   layer (ext4, xfs, btrfs or tmpfs, not overlayfs itself)",
        }),
        Err(errno) => Err(errno).step(what),
    }
}

/// Makes the assembled root the process's `/` and detaches the host's root from the mount
/// namespace, so no path leads back to it.
pub(super) fn enter(root: &Path) -> Result<(), InitError> {
    chdir(root).step(|| format!("changing into {}", root.display()))?;
    // Stacking the old root under the new one, then detaching it, needs no put_old directory.
    pivot_root(".", ".").step(|| format!("pivoting the root to {}", root.display()))?;
    umount2(".", MntFlags::MNT_DETACH).step(|| "detaching the host's root".into())?;
    chdir("/").step(|| "changing into the new root".into())
}

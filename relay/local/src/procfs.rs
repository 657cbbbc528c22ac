//! The sandbox's `/proc`: a new proc mounted inside the sandbox's PID namespace, so it lists
//! only the sandbox's processes, with the host-wide knobs masked the way container runtimes
//! do: `/proc/sys` and friends read-only (root inside could otherwise set
//! `kernel.core_pattern`), `sysrq-trigger` and kernel-memory views hidden.

use std::path::Path;

use nix::mount::{mount, MsFlags};

use super::error::{InitError, Step};
use super::mounts;

/// Entries that stay readable but become read-only.
const READ_ONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// Files hidden behind `/dev/null`.
const MASKED_FILES: [&str; 6] = [
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "timer_stats",
];
/// Directories hidden behind an empty read-only tmpfs.
const MASKED_DIRS: [&str; 2] = ["acpi", "scsi"];

const FIXED: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// Mounts `<root>/proc`. Must run in the sandbox's first process, after the PID namespace
/// exists, and before the old root is detached (a user namespace may only mount proc while
/// an unmasked proc is visible).
pub(super) fn mount_proc(root: &Path) -> Result<(), InitError> {
    let proc = root.join("proc");
    mounts::mount_point_dir(&proc)?;
    mount(Some("proc"), &proc, Some("proc"), FIXED, None::<&str>)
        .step(|| format!("mounting proc on {}", proc.display()))?;

    for name in READ_ONLY {
        let path = proc.join(name);
        if path.exists() {
            mounts::bind(&path, &path, MsFlags::MS_RDONLY | FIXED)?;
        }
    }
    for name in MASKED_FILES {
        let path = proc.join(name);
        if path.exists() {
            mounts::bind(Path::new("/dev/null"), &path, MsFlags::MS_RDONLY | FIXED)?;
        }
    }
    for name in MASKED_DIRS {
        let path = proc.join(name);
        if path.is_dir() {
            mounts::tmpfs(&path, "size=0,mode=555", MsFlags::MS_RDONLY | FIXED)?;
        }
    }
    Ok(())
}

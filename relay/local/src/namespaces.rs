//! Creating the sandbox's namespaces, with errors that say what the host is missing. The
//! monitor (or, for root relays, the child that owns it: see `userns`) makes the user
//! namespace and the PID namespace, whose first
//! child is the sandbox's PID 1; that child then makes the mount, UTS, IPC and (unless the
//! network is shared) network namespaces for itself, and its cgroup namespace once it has been
//! moved into the sandbox's cgroup.

use std::path::Path;

use nix::errno::Errno;
use nix::sched::{unshare, CloneFlags};

use super::error::{InitError, Step};
use tether_relay_core::provider::NetworkPolicy;

/// Enters a new user namespace in which the relay's user (not root) is root.
pub(super) fn enter_user_namespace(uid: u32, gid: u32) -> Result<(), InitError> {
    unshare_or_explain(CloneFlags::CLONE_NEWUSER)?;
    // An unprivileged process may map only its own ids, and only once setgroups is denied.
    for (file, line) in [
        ("/proc/self/setgroups", "deny".to_string()),
        ("/proc/self/uid_map", format!("0 {uid} 1")),
        ("/proc/self/gid_map", format!("0 {gid} 1")),
    ] {
        std::fs::write(Path::new(file), line.as_bytes())
            .step(|| format!("writing {line:?} to {file}"))?;
    }
    Ok(())
}

/// Moves the calling process into a new user namespace, whose ids the init maps from outside.
pub(super) fn unshare_user_namespace() -> Result<(), InitError> {
    unshare_or_explain(CloneFlags::CLONE_NEWUSER)
}

/// Makes the next child the first process of a new PID namespace.
pub(super) fn new_pid_namespace() -> Result<(), InitError> {
    unshare_or_explain(CloneFlags::CLONE_NEWPID)
}

/// Moves the calling process into new mount, UTS and IPC namespaces, and a new network
/// namespace unless the network is shared with the host.
pub(super) fn enter_sandbox_namespaces(network: NetworkPolicy) -> Result<(), InitError> {
    let mut flags = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWIPC;
    if network != NetworkPolicy::Host {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    unshare_or_explain(flags)
}

/// Moves the calling process into a new cgroup namespace rooted at its current cgroup, so the
/// sandbox sees its own cgroup as `/`. Kernels before 4.6 lack cgroup namespaces; they only
/// hide paths, so the sandbox then runs without one.
pub(super) fn enter_cgroup_namespace() -> Result<(), InitError> {
    if !Path::new("/proc/self/ns/cgroup").exists() {
        return Ok(());
    }
    unshare_or_explain(CloneFlags::CLONE_NEWCGROUP)
}

fn unshare_or_explain(flags: CloneFlags) -> Result<(), InitError> {
    let names: Vec<&str> = flags.iter_names().map(|(name, _)| name).collect();
    let what = format!("unshare({})", names.join("|"));
    match unshare(flags) {
        Ok(()) => Ok(()),
        Err(errno @ (Errno::EPERM | Errno::EACCES)) => Err(InitError::Unsupported {
            what,
            errno,
            hint: "the local provider needs root or unprivileged user namespaces (sysctl \
                   kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0); in a \
                   container, run the relay privileged or with a seccomp profile that allows \
                   unshare",
        }),
        Err(errno @ Errno::EINVAL) => Err(InitError::Unsupported {
            what,
            errno,
            hint: "this kernel lacks a namespace the local provider needs (CONFIG_USER_NS, \
                   CONFIG_PID_NS, CONFIG_NET_NS, CONFIG_UTS_NS, CONFIG_IPC_NS)",
        }),
        Err(errno @ (Errno::ENOSPC | Errno::EUSERS)) => Err(InitError::Unsupported {
            what,
            errno,
            hint: "the host's namespace limit is reached; delete sandboxes or raise \
                   /proc/sys/user/max_*_namespaces",
        }),
        Err(errno) => Err(InitError::Sys { what, errno }),
    }
}

//! The seccomp filter every process of a local sandbox runs under, the agent included,
//! installed by PID 1 as the last step before it execs the agent (after `no_new_privs`).
//!
//! The floor is Docker's default profile: every system call that profile refuses to an
//! unprivileged container is refused here with `EPERM`, namely kernel keyrings, io_uring,
//! perf events, userfaultfd, BPF, module loading and kexec, the whole mount API, new
//! namespaces (`unshare`, `setns`, and `clone` with any `CLONE_NEW*` flag: a new user
//! namespace would hand sandbox code a full capability set again), file handles, clock and
//! swap and accounting changes, NUMA policy, and raw I/O ports. `clone3` answers `ENOSYS`,
//! which makes every libc fall back to `clone`, whose flags a filter can read (`clone3`
//! passes them in memory, out of a filter's reach). On x86-64 the x32 ABI is refused, since
//! it numbers the same calls differently; other architectures' calls kill the process
//! (seccompiler's architecture check).
//!
//! `ptrace` stays allowed, as in Docker, so debuggers work on the sandbox's own processes; the
//! agent is out of its reach because it is not dumpable and no sandbox process has
//! `CAP_SYS_PTRACE`.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule,
};

use super::error::InitError;

/// System calls refused outright (Docker's default profile's refusals).
const DENIED: &[libc::c_long] = &[
    libc::SYS_add_key,
    libc::SYS_keyctl,
    libc::SYS_request_key,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_bpf,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_acct,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_syslog,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_vhangup,
    libc::SYS_lookup_dcookie,
    libc::SYS_kcmp,
    libc::SYS_mbind,
    libc::SYS_set_mempolicy,
    libc::SYS_get_mempolicy,
    libc::SYS_move_pages,
    libc::SYS_migrate_pages,
    libc::SYS_fanotify_init,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ustat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_sysfs,
    #[cfg(target_arch = "x86_64")]
    libc::SYS__sysctl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// Every flag that makes `clone` create a namespace.
const NAMESPACE_FLAGS: [libc::c_int; 7] = [
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWCGROUP,
];

/// The personalities a program may switch to (Docker's list): Linux, with or without
/// randomisation disabled for debuggers, and the query. Others (such as `READ_IMPLIES_EXEC`)
/// weaken the sandbox's memory protections.
const PERSONALITIES: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// System call numbers at or above this are the x32 ABI on x86-64.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Installs the filters on the calling thread; whatever it execs inherits them.
pub(super) fn apply() -> Result<(), InitError> {
    for program in programs()? {
        seccompiler::apply_filter(&program)
            .map_err(|e| InitError::Config(format!("installing the seccomp filter: {e}")))?;
    }
    Ok(())
}

/// The filters, in the order they are installed. Every filter sees every call; the kernel
/// takes the strictest answer.
fn programs() -> Result<Vec<BpfProgram>, InitError> {
    let bad = |e: seccompiler::BackendError| {
        InitError::Config(format!("building the seccomp filter: {e}"))
    };
    let arch = std::env::consts::ARCH.try_into().map_err(|_| {
        InitError::Config(format!("no seccomp filter for {}", std::env::consts::ARCH))
    })?;

    let mut denied: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    let new_namespace = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u64;
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad)?;
    denied.insert(libc::SYS_clone, new_namespace);
    let odd_personality = SeccompRule::new(
        PERSONALITIES
            .iter()
            .map(|&p| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?,
    )
    .map_err(bad)?;
    denied.insert(libc::SYS_personality, vec![odd_personality]);
    let deny = SeccompFilter::new(
        denied,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(bad)?;

    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(bad)?;

    let mut programs = vec![
        BpfProgram::try_from(deny).map_err(bad)?,
        BpfProgram::try_from(clone3).map_err(bad)?,
    ];
    #[cfg(target_arch = "x86_64")]
    programs.push(x32_guard());
    Ok(programs)
}

/// Refuses every x32 system call with `ENOSYS`: `nr >= X32_SYSCALL_BIT`.
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        // seccomp_data.nr is the first field.
        insn(LD_W_ABS, 0, 0, 0),
        insn(JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_build_for_this_machine() {
        let programs = programs().unwrap();
        assert!(programs.len() >= 2);
        assert!(programs.iter().all(|p| !p.is_empty() && p.len() < 4096));
    }

    #[test]
    fn the_issues_named_calls_are_denied() {
        for nr in [
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_io_uring_setup,
            libc::SYS_perf_event_open,
            libc::SYS_userfaultfd,
            libc::SYS_bpf,
            libc::SYS_kexec_load,
            libc::SYS_init_module,
            libc::SYS_mount,
            libc::SYS_unshare,
        ] {
            assert!(DENIED.contains(&nr), "system call {nr} must be denied");
        }
    }
}

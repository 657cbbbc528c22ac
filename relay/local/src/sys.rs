//! The local provider's only `unsafe` code: the few system calls that neither `std` nor `nix`
//! wraps safely (fork, an interface-flags ioctl, capability sets, `close_range`, restoring
//! SIGPIPE, owning a duplicated descriptor); the other signals' dispositions are reset through
//! `tether_signals`. Each wrapper is small, checks its result and documents its invariant.
#![expect(
    unsafe_code,
    reason = "the one module of this crate that needs unsafe; each block says why it is sound"
)]

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::signal::{SigHandler, Signal};
use nix::unistd::ForkResult;

/// Forks the calling process.
///
/// Only called by the sandbox init, a freshly exec'd single-threaded process, so the child
/// cannot inherit a lock held by another thread and may allocate freely.
pub(super) fn fork() -> nix::Result<ForkResult> {
    // SAFETY: the caller is single-threaded (see above), which is fork's safety condition.
    unsafe { nix::unistd::fork() }
}

/// Sets `IFF_UP` on interface `name`, through any socket of the network namespace.
pub(super) fn set_interface_up(socket: BorrowedFd<'_>, name: &str) -> nix::Result<()> {
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return Err(Errno::EINVAL);
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value (empty name, no flags).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq that outlives both calls; SIOCGIFFLAGS and SIOCSIFFLAGS
    // read the name and read or write only `ifru_flags`, which we access as written.
    unsafe {
        Errno::result(libc::ioctl(
            socket.as_raw_fd(),
            libc::SIOCGIFFLAGS as _,
            &mut req,
        ))?;
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        Errno::result(libc::ioctl(
            socket.as_raw_fd(),
            libc::SIOCSIFFLAGS as _,
            &req,
        ))?;
    }
    Ok(())
}

/// The highest capability number this kernel knows.
pub(super) fn last_capability() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Removes `cap` from the bounding set, so no exec can grant it again.
pub(super) fn drop_bounding_capability(cap: u32) -> nix::Result<()> {
    // SAFETY: PR_CAPBSET_DROP takes a capability number and touches no memory of ours.
    let res = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    match Errno::result(res) {
        // Capabilities this kernel does not have are not in the set to begin with.
        Err(Errno::EINVAL) => Ok(()),
        other => other.map(drop),
    }
}

/// Empties the ambient and inheritable capability sets, so exec grants a root process exactly
/// its bounding set.
pub(super) fn clear_inherited_capabilities() -> nix::Result<()> {
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes no pointers.
    let res = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    Errno::result(res)?;

    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522; // _LINUX_CAPABILITY_VERSION_3: two Data words
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: version 3 reads and writes exactly two Data structs; both pointers are valid
    // for the duration of the calls, and pid 0 means the calling thread.
    unsafe {
        Errno::result(libc::syscall(
            libc::SYS_capget,
            &mut header,
            data.as_mut_ptr(),
        ))?;
        for d in &mut data {
            d.inheritable = 0;
        }
        Errno::result(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()))?;
    }
    Ok(())
}

/// Marks every descriptor from `first` on close-on-exec, so the agent inherits only 0 to
/// `first - 1`, whatever the relay or a library leaked.
pub(super) fn cloexec_from(first: RawFd) -> nix::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on our own descriptors.
    let res = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    Errno::result(res).map(drop)
}

/// Restores the default action of SIGPIPE, which the Rust runtime ignores and exec would
/// otherwise pass on to the agent and every command it runs.
pub(super) fn reset_sigpipe() -> nix::Result<()> {
    // SAFETY: installing SIG_DFL runs no handler code, so no signal-safety rule applies.
    unsafe { nix::sys::signal::signal(Signal::SIGPIPE, SigHandler::SigDfl) }.map(drop)
}

/// Duplicates `fd` to a new close-on-exec descriptor numbered `min` or higher, so it cannot
/// collide with the low numbers the agent's contract fixes (fd 3).
pub(super) fn dup_above(fd: BorrowedFd<'_>, min: RawFd) -> nix::Result<OwnedFd> {
    let new = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(min))?;
    // SAFETY: F_DUPFD_CLOEXEC just returned `new` as a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Opens directory `path` without following any symlink on the way (`O_PATH`): a path the
/// relay resolved and checked must still be the same path, not a link planted since.
pub(super) fn open_dir_no_symlinks(path: &std::ffi::CStr) -> nix::Result<OwnedFd> {
    // SAFETY: open_how is plain old data; all-zero is valid (no flags, no resolve rules).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: `path` is NUL-terminated and `how` valid for the call, whose size we pass.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = Errno::result(fd)? as RawFd;
    // SAFETY: openat2 just returned `fd` as a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Clones the mount of directory `dir` (not its submounts) as a detached mount, read-only,
/// nosuid and nodev, whose file owners appear through the id mapping of the user namespace
/// `userns`: host uid 0 shows as the namespace's uid 0, and so on. Returns the detached mount.
pub(super) fn idmapped_clone(dir: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> nix::Result<OwnedFd> {
    // SAFETY: the empty path with AT_EMPTY_PATH makes open_tree act on `dir` itself; it
    // returns a new descriptor or -1 and touches no other memory.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir.as_raw_fd(),
            c"".as_ptr(),
            (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint
                | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    let tree = Errno::result(tree)? as RawFd;
    // SAFETY: open_tree just returned `tree` as a fresh descriptor nobody else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP
            | libc::MOUNT_ATTR_RDONLY
            | libc::MOUNT_ATTR_NOSUID
            | libc::MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: `attr` is a valid mount_attr whose size we pass; the empty path with
    // AT_EMPTY_PATH makes the call act on `tree` itself.
    let res = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    Errno::result(res)?;
    Ok(tree)
}

/// Attaches the detached mount `tree` at `target`.
pub(super) fn attach_mount(tree: BorrowedFd<'_>, target: &std::ffi::CStr) -> nix::Result<()> {
    // SAFETY: both strings are valid and NUL-terminated for the duration of the call;
    // MOVE_MOUNT_F_EMPTY_PATH makes the empty source path name `tree` itself.
    let res = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    Errno::result(res).map(drop)
}

/// Makes the calling process the reaper of its orphaned descendants, so a sandbox's PID 1
/// stays the init's to wait for after the intermediate process that forked it exits.
pub(super) fn become_subreaper() -> nix::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer and touches no memory of ours.
    let res = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    Errno::result(res).map(drop)
}

/// Sets `no_new_privs`: no exec in the sandbox can gain privileges (setuid, file
/// capabilities), and the seccomp filter may be installed without `CAP_SYS_ADMIN`.
pub(super) fn set_no_new_privs() -> nix::Result<()> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integers and touches no memory of ours.
    let res = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) };
    Errno::result(res).map(drop)
}

/// Marks the calling process dumpable again (see `userns::become_root_inside`).
pub(super) fn set_dumpable() -> nix::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes integers and touches no memory of ours.
    let res = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1 as libc::c_ulong, 0, 0, 0) };
    Errno::result(res).map(drop)
}

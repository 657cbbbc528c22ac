//! The agent's only unsafe code: adopting inherited file descriptors, reading into
//! uninitialised buffers, terminal ioctls, what a child does between fork and exec (its signal
//! dispositions through `tether_signals`), and guarding the agent's own process (not dumpable,
//! its token scrubbed from memory).
#![expect(
    unsafe_code,
    reason = "the one module of this crate that needs unsafe; each block says why it is sound"
)]

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use bytes::BytesMut;
use nix::libc;
use nix::unistd::{Gid, Uid};
use tokio::io::unix::AsyncFd;

/// Takes ownership of inherited descriptor `fd`, checking first that it is open.
pub(crate) fn adopt_fd(fd: RawFd) -> anyhow::Result<OwnedFd> {
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).map_err(|e| {
        anyhow::anyhow!("file descriptor {fd} is not open ({e}); was it passed to the agent?")
    })?;
    // SAFETY: the descriptor was inherited from our parent for this purpose, is open (checked
    // above), and nothing else in this process owns it: main() adopts each flag's fd once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Registers `fd` with tokio's reactor, for readiness-driven non-blocking I/O.
pub(crate) fn watch_fd(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is an open descriptor that stays open, and always reports the same
    // number, until it is dropped, which the `AsyncFd` owning it does last.
    Ok(unsafe { AsyncFd::register(fd) }?)
}

/// Reads at most `max` bytes from `fd`, appending them to `buf` without zeroing its spare
/// capacity first (a 256 KiB memset per read would cost more than the read).
pub(crate) fn read_into(fd: BorrowedFd<'_>, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let len = spare.len().min(max);
    // SAFETY: `spare` is writable memory owned by `buf` of at least `len` bytes, and `fd` is
    // an open descriptor borrowed for the duration of the call.
    let n = unsafe { libc::read(fd.as_raw_fd(), spare.as_mut_ptr().cast(), len) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel initialised the first `n <= len` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n as usize) };
    Ok(n as usize)
}

/// Opens a new PTY master (close-on-exec, not our controlling terminal), unlocked and with
/// its slave's permissions granted. Returns it with the slave's path.
pub(crate) fn open_pty_master() -> io::Result<(OwnedFd, String)> {
    use nix::fcntl::OFlag;
    let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    nix::pty::grantpt(&master)?;
    nix::pty::unlockpt(&master)?;
    let slave = nix::pty::ptsname_r(&master)?;
    // SAFETY: `into_raw_fd` releases the descriptor from `PtyMaster`, so the `OwnedFd` is its
    // only owner.
    let master = unsafe { OwnedFd::from_raw_fd(master.into_raw_fd()) };
    Ok((master, slave))
}

/// Sets a terminal's window size; on a PTY master the kernel then sends SIGWINCH to the
/// terminal's foreground process group.
pub(crate) fn set_window_size(fd: BorrowedFd<'_>, cols: u16, rows: u16) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` through the pointer, which is valid for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The identity a child switches to.
#[derive(Debug, Clone)]
pub(crate) struct Credentials {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary group ids.
    pub groups: Vec<u32>,
}

/// What a child does between fork and exec beyond what [`Command`] offers. Each step costs
/// the fast `posix_spawn` path (a closure forces fork), so only set what is needed.
#[derive(Debug, Default)]
pub(crate) struct ChildSetup {
    /// Write 0 to its OOM score: the agent shields itself with -1000, which children inherit.
    pub reset_oom: bool,
    /// Restore every signal's default action and unblock every signal (as `posix_spawn` with
    /// `POSIX_SPAWN_SETSIGDEF` does): needed when the agent inherited ignored signals, which
    /// exec would pass on. (`Command` itself only unblocks signals and restores SIGPIPE.)
    pub default_signals: bool,
    /// Start a new session whose controlling terminal is stdin (a PTY slave).
    pub controlling_tty: bool,
    /// Switch to this identity.
    pub credentials: Option<Credentials>,
    /// Change to this directory after switching identity, so its permissions apply.
    pub chdir: Option<CString>,
}

impl ChildSetup {
    /// True when there is nothing to do, and `Command` may use `posix_spawn`.
    pub(crate) fn is_empty(&self) -> bool {
        !self.reset_oom
            && !self.default_signals
            && !self.controlling_tty
            && self.credentials.is_none()
            && self.chdir.is_none()
    }

    /// Arranges for `cmd`'s child to run these steps.
    pub(crate) fn install(self, cmd: &mut Command) {
        if self.is_empty() {
            return;
        }
        let groups: Option<Vec<Gid>> = self
            .credentials
            .as_ref()
            .map(|c| c.groups.iter().map(|&g| Gid::from_raw(g)).collect());
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe work is allowed. It makes plain system calls on data prepared
        // before the fork (the group list, the directory): no allocation, no locks.
        unsafe {
            cmd.pre_exec(move || {
                if self.default_signals {
                    tether_signals::restore_default_dispositions(&[]);
                }
                if self.reset_oom {
                    reset_oom_score();
                }
                if self.controlling_tty {
                    nix::unistd::setsid()?;
                    if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if let (Some(c), Some(groups)) = (&self.credentials, &groups) {
                    nix::unistd::setgroups(groups)?;
                    nix::unistd::setgid(Gid::from_raw(c.gid))?;
                    nix::unistd::setuid(Uid::from_raw(c.uid))?;
                }
                if let Some(dir) = &self.chdir {
                    nix::unistd::chdir(dir.as_c_str())?;
                }
                Ok(())
            })
        };
    }
}

/// Sets the calling process's OOM score adjustment to 0. Async-signal-safe; failures are
/// ignored (an unprivileged agent has nothing to undo).
fn reset_oom_score() {
    // SAFETY: the path is a static NUL-terminated string and the buffer a static byte;
    // open, write and close are async-signal-safe and the descriptor is closed before return.
    unsafe {
        let fd = libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if fd >= 0 {
            libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
        }
    }
}

/// Keeps the sandbox's processes off the agent: a process that is not dumpable cannot be
/// traced, and its memory, environment and descriptors under `/proc/<pid>/` are closed to any
/// process without `CAP_SYS_PTRACE` (which sandbox processes never have), same uid or not.
/// Exec'd children are dumpable again, so debuggers still work on them.
pub(crate) fn make_undumpable() -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes integers and touches no memory of ours.
    let res = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) };
    if res == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Overwrites the value of environment variable `name` with zeros where the process received
/// it, the memory `/proc/<pid>/environ` shows, then removes the variable. Removing it alone
/// only unlinks it from `environ`; the bytes would stay readable.
///
/// Must run before any other thread exists (it touches the environment unsynchronised).
pub(crate) fn scrub_env(name: &CStr) {
    // SAFETY: single-threaded (the caller's contract), so no other thread reads or changes the
    // environment meanwhile. getenv returns NULL or a pointer to the NUL-terminated value
    // inside the process's own environment block, which is writable memory; we overwrite
    // exactly strlen(value) bytes and leave the terminator.
    unsafe {
        let value = libc::getenv(name.as_ptr());
        if !value.is_null() {
            let len = libc::strlen(value);
            for i in 0..len {
                std::ptr::write_volatile(value.add(i), 0);
            }
        }
    }
    std::env::remove_var(OsStr::from_bytes(name.to_bytes()));
}

/// True when a child would inherit an ignored signal from this process, so it must restore
/// the defaults itself. SIGPIPE does not count: the Rust runtime ignores it, and `Command`
/// restores it in every child. Under glibc always true: its `posix_spawn` leaves the
/// real-time signals glibc keeps for itself ignored in the child.
pub(crate) fn children_inherit_ignored_signals() -> bool {
    cfg!(target_env = "gnu") || tether_signals::any_ignored(&[libc::SIGPIPE])
}

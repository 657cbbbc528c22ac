//! What a Linux process must undo before it execs another, so that the new program starts with
//! every signal at its default action and none blocked, as `posix_spawn` with
//! `POSIX_SPAWN_SETSIGDEF` would leave it. Ignored signals and the signal mask survive exec:
//! whatever a parent inherited (`nohup` ignores SIGHUP, a shell adds SIGINT and SIGQUIT, a
//! service manager may block some, glibc's `posix_spawn` ignores its own real-time signals)
//! would otherwise reach every command a sandbox runs.
//!
//! Two places need it: the agent, between fork and exec of a command, and the local provider's
//! sandbox init, before it execs the agent. The crate is its own because the agent depends on
//! the wire contract only, and the contract (`tether-proto`) holds no system calls.
//!
//! The calls go to `rt_sigaction` directly, with the kernel's `struct sigaction`: libc's
//! `sigaction` refuses the real-time signals libc keeps for itself (32 to 34), which can be
//! inherited ignored all the same.
#![allow(
    unsafe_code,
    reason = "rt_sigaction and sigprocmask have no safe wrapper that reaches every signal"
)]

use libc::c_int;

/// The highest signal number Linux has (`_NSIG - 1`: 31 standard and 33 real-time signals).
const LAST_SIGNAL: c_int = 64;

/// The kernel's `struct sigaction` (x86-64 and arm64 share it), which `rt_sigaction` takes.
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// The default action, to install.
const DEFAULT_ACTION: KernelSigaction = KernelSigaction {
    handler: libc::SIG_DFL,
    flags: 0,
    restorer: 0,
    mask: 0,
};

/// The signals whose action can be changed, but for those in `except`.
fn settable(except: &[c_int]) -> impl Iterator<Item = c_int> + '_ {
    (1..=LAST_SIGNAL).filter(|s| *s != libc::SIGKILL && *s != libc::SIGSTOP && !except.contains(s))
}

/// Restores the default action of every signal but those in `except`, and unblocks every
/// signal in the calling thread.
///
/// Async-signal-safe (raw `rt_sigaction` and `sigprocmask` on stack values, no allocation), so
/// it may run in a child between fork and exec. The caller must be single-threaded or about to
/// exec: libc's handlers for its own signals are reset too. The calls cannot fail for the
/// signals it passes them.
pub fn restore_default_dispositions(except: &[c_int]) {
    for signal in settable(except) {
        rt_sigaction(signal, Some(&DEFAULT_ACTION), None);
    }
    // SAFETY: sigset_t is plain old data; all-zero is a valid (empty) set, which sigemptyset
    // also makes it. Both pointers are to that stack value, alive for the calls; the old mask
    // is not asked for.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
}

/// Whether any signal but those in `except` is ignored in this process, which a child would
/// inherit through exec.
pub fn any_ignored(except: &[c_int]) -> bool {
    settable(except).any(|signal| {
        let mut current = DEFAULT_ACTION;
        rt_sigaction(signal, None, Some(&mut current)) && current.handler == libc::SIG_IGN
    })
}

/// Installs `new` as `signal`'s action and/or reads the current one into `old`; whether the
/// kernel accepted the call. Async-signal-safe.
fn rt_sigaction(
    signal: c_int,
    new: Option<&KernelSigaction>,
    old: Option<&mut KernelSigaction>,
) -> bool {
    let new = new.map_or(std::ptr::null(), |n| n as *const KernelSigaction);
    let old = old.map_or(std::ptr::null_mut(), |o| o as *mut KernelSigaction);
    // SAFETY: each pointer is null or comes from a reference alive for the call, to a valid
    // kernel sigaction whose mask is 8 bytes, as the last argument says. The only actions
    // this crate installs are SIG_DFL and (in tests) SIG_IGN, which run no handler code.
    let res = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            signal,
            new,
            old,
            std::mem::size_of::<u64>(),
        )
    };
    res == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field of `/proc/thread-self/status` (`SigIgn`, `SigBlk`) as a bit set.
    fn status_mask(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap();
        u64::from_str_radix(line.trim(), 16).unwrap()
    }

    fn bit(signal: c_int) -> u64 {
        1 << (signal - 1)
    }

    fn ignore(signal: c_int) {
        let ignore = KernelSigaction {
            handler: libc::SIG_IGN,
            ..DEFAULT_ACTION
        };
        assert!(
            rt_sigaction(signal, Some(&ignore), None),
            "cannot ignore signal {signal}"
        );
    }

    // One test only: dispositions belong to the whole test process. SIGPIPE stays ignored, as
    // the Rust runtime set it, since other code of the harness may write to closed pipes.
    #[test]
    fn inherited_ignores_and_blocks_are_undone_but_the_exceptions() {
        // What `nohup` leaves, and a real-time signal libc's sigaction would refuse (33).
        for signal in [libc::SIGPIPE, libc::SIGHUP, libc::SIGUSR1, 33, LAST_SIGNAL] {
            ignore(signal);
        }
        // SAFETY: sigset_t is plain old data; sigemptyset and sigaddset fill the stack value
        // that the pointers name, alive for the calls.
        unsafe {
            let mut blocked: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut blocked);
            libc::sigaddset(&mut blocked, libc::SIGUSR2);
            libc::sigprocmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut());
        }
        let ignored = bit(libc::SIGHUP) | bit(libc::SIGUSR1) | bit(33) | bit(LAST_SIGNAL);
        assert_eq!(status_mask("SigIgn") & ignored, ignored);
        assert_ne!(status_mask("SigBlk") & bit(libc::SIGUSR2), 0);
        assert!(any_ignored(&[libc::SIGPIPE]));

        restore_default_dispositions(&[libc::SIGPIPE]);

        assert_eq!(status_mask("SigIgn"), bit(libc::SIGPIPE));
        assert_eq!(status_mask("SigBlk"), 0);
        assert!(!any_ignored(&[libc::SIGPIPE]));
        assert!(any_ignored(&[]), "SIGPIPE was an exception");
    }
}

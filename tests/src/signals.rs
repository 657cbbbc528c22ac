//! Starting a binary the way operators do when it inherits odd process state: `nohup` ignores
//! SIGHUP, a shell adds SIGINT and SIGQUIT, a service manager may block signals or set a low
//! descriptor limit. The only unsafe code of the test support: `pre_exec` hooks.
#![expect(unsafe_code, reason = "pre_exec hooks run between fork and exec")]

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};

/// The signals `nohup` and a non-interactive shell leave ignored.
pub const NOHUP_SIGNALS: [Signal; 3] = [Signal::SIGHUP, Signal::SIGINT, Signal::SIGQUIT];

/// Makes `cmd`'s process start with `signals` both ignored and blocked.
pub fn ignore_and_block(cmd: &mut Command, signals: &[Signal]) {
    let signals = signals.to_vec();
    let mut mask = SigSet::empty();
    for &signal in &signals {
        mask.add(signal);
    }
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    // SAFETY: the hook runs between fork and exec, where only async-signal-safe calls are
    // allowed: sigaction and sigprocmask on values built before the fork, no allocation.
    // Installing SIG_IGN runs no handler code.
    unsafe {
        cmd.pre_exec(move || {
            for &signal in &signals {
                sigaction(signal, &ignore)?;
            }
            nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)?;
            Ok(())
        });
    }
}

/// Makes `cmd`'s process start with at most `nofile` descriptors, soft and hard limit alike,
/// so it cannot raise them.
pub(crate) fn limit_descriptors(cmd: &mut Command, nofile: u64) {
    // SAFETY: the hook runs between fork and exec, where only async-signal-safe calls are
    // allowed: setrlimit on integers, no allocation.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_NOFILE,
                nofile,
                nofile,
            )?;
            Ok(())
        });
    }
}

/// The bit mask `/proc/PID/status` shows for `signals` (`SigIgn:`, `SigBlk:`).
pub fn status_mask(signals: &[Signal]) -> u64 {
    signals
        .iter()
        .fold(0, |bits, &s| bits | 1 << (s as i32 - 1))
}

/// The mask `field` (`SigIgn`, `SigBlk`, ...) holds in `/proc/PID/status` text.
pub fn status_field(status: &str, field: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

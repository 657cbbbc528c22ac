//! Telling whether a sandbox's first process is still the one we started: a pid plus its
//! start time from `/proc/<pid>/stat`, since the kernel reuses pids.
//!
//! The answer has three values, because only positive evidence may end a sandbox: the kernel
//! saying there is no such process (`ESRCH`, `ENOENT` on its `/proc` entry), a different
//! process under the pid (another start time), or a zombie. Any other failure to look (no
//! descriptor left, `EMFILE`; a `/proc` that cannot be read) is [`Liveness::Unknown`], which
//! the relay logs and asks again later but never acts on.

use std::fmt;
use std::io;

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// A process, identified so that a reused pid does not pass for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ProcessIdentity {
    /// The pid in the host's PID namespace.
    pub pid: i32,
    /// Clock ticks after boot at which it started (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
}

/// What is known about whether a process still runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Liveness {
    /// It runs (and is not a zombie).
    Alive,
    /// It has ended; the evidence says how we know.
    Dead(String),
    /// It could not be told; the reason says what failed. Never a reason to remove anything.
    Unknown(String),
}

impl fmt::Display for Liveness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Liveness::Alive => f.write_str("alive"),
            Liveness::Dead(evidence) => write!(f, "dead: {evidence}"),
            Liveness::Unknown(reason) => write!(f, "unknown: {reason}"),
        }
    }
}

impl ProcessIdentity {
    /// The identity of the running process `pid`.
    pub(super) fn of(pid: i32) -> io::Result<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let (_, start_time) = parse_stat(&stat).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unreadable /proc/{pid}/stat"),
            )
        })?;
        Ok(ProcessIdentity { pid, start_time })
    }

    /// Whether this very process still runs, as far as can be told.
    pub(super) fn liveness(&self) -> Liveness {
        // `kill(pid, 0)` needs no descriptor, so it answers even when the relay has none left.
        if let Err(Errno::ESRCH) = kill(Pid::from_raw(self.pid), None) {
            return Liveness::Dead(format!("no process has pid {} (ESRCH)", self.pid));
        }
        self.judge(std::fs::read_to_string(format!("/proc/{}/stat", self.pid)))
    }

    /// Shorthand for "known to run": false when dead or unknown.
    pub(super) fn is_alive(&self) -> bool {
        self.liveness() == Liveness::Alive
    }

    /// Judges the outcome of reading `/proc/<pid>/stat`.
    fn judge(&self, stat: io::Result<String>) -> Liveness {
        let pid = self.pid;
        let stat = match stat {
            Ok(stat) => stat,
            // The entry vanished, or the process exited while it was read.
            Err(e)
                if matches!(
                    Errno::from_raw(e.raw_os_error().unwrap_or(0)),
                    Errno::ENOENT | Errno::ESRCH
                ) =>
            {
                return Liveness::Dead(format!("/proc/{pid}/stat: {e}"));
            }
            Err(e) => return Liveness::Unknown(format!("cannot read /proc/{pid}/stat: {e}")),
        };
        match parse_stat(&stat) {
            None => Liveness::Unknown(format!("cannot parse /proc/{pid}/stat: {stat:?}")),
            Some((_, start)) if start != self.start_time => Liveness::Dead(format!(
                "pid {pid} now belongs to another process (started at tick {start}, ours at {})",
                self.start_time
            )),
            Some((state @ ('Z' | 'X' | 'x'), _)) => {
                Liveness::Dead(format!("pid {pid} is a zombie (state {state})"))
            }
            Some(_) => Liveness::Alive,
        }
    }
}

/// The state letter and start time of a `/proc/<pid>/stat` line. The command name in
/// parentheses may hold spaces and parentheses, so fields are counted after the last `)`.
fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3) comes field 4; the start time is field 22.
    let start_time = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start_time))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_line(state: char, start: u64) -> String {
        format!("4242 (a) b (c)) {state} 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 {start} 1000 200 18446744073709551615")
    }

    #[test]
    fn parses_state_and_start_time_past_odd_names() {
        assert_eq!(parse_stat(&stat_line('S', 987654)), Some(('S', 987654)));
        assert_eq!(parse_stat("1 (x) R 0"), None);
    }

    #[test]
    fn knows_itself_and_rejects_a_reused_pid() {
        let me = ProcessIdentity::of(std::process::id() as i32).unwrap();
        assert_eq!(me.liveness(), Liveness::Alive);
        let impostor = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(matches!(impostor.liveness(), Liveness::Dead(_)));
    }

    #[test]
    fn an_exited_process_is_dead_by_esrch() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcessIdentity::of(child.id() as i32).unwrap();
        // Until it is reaped it is a zombie: dead already.
        child.wait().unwrap();
        match id.liveness() {
            Liveness::Dead(evidence) => assert!(evidence.contains("ESRCH"), "{evidence}"),
            other => panic!("a reaped child should be dead, not {other}"),
        }
    }

    #[test]
    fn only_the_kernel_saying_no_such_process_means_dead() {
        let id = ProcessIdentity {
            pid: 4242,
            start_time: 987654,
        };
        let errno = |e: Errno| Err(io::Error::from_raw_os_error(e as i32));
        assert!(matches!(id.judge(errno(Errno::ESRCH)), Liveness::Dead(_)));
        assert!(matches!(id.judge(errno(Errno::ENOENT)), Liveness::Dead(_)));
        // Running out of descriptors, or anything else, says nothing about the process.
        for e in [
            Errno::EMFILE,
            Errno::ENFILE,
            Errno::EACCES,
            Errno::EIO,
            Errno::ENOMEM,
        ] {
            assert!(matches!(id.judge(errno(e)), Liveness::Unknown(_)), "{e}");
        }
        assert!(matches!(
            id.judge(Ok("garbage".into())),
            Liveness::Unknown(_)
        ));
        assert_eq!(id.judge(Ok(stat_line('S', 987654))), Liveness::Alive);
        assert!(matches!(
            id.judge(Ok(stat_line('Z', 987654))),
            Liveness::Dead(_)
        ));
        assert!(matches!(id.judge(Ok(stat_line('S', 1))), Liveness::Dead(_)));
    }
}

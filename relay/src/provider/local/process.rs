//! Telling whether a sandbox's first process is still the one we started: a pid plus its
//! start time from `/proc/<pid>/stat`, since the kernel reuses pids.

use std::io;

use serde::{Deserialize, Serialize};

/// A process, identified so that a reused pid does not pass for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ProcessIdentity {
    /// The pid in the host's PID namespace.
    pub pid: i32,
    /// Clock ticks after boot at which it started (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
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

    /// Whether this very process still runs (a zombie does not count).
    pub(super) fn is_alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        matches!(parse_stat(&stat), Some((state, start)) if start == self.start_time && !matches!(state, 'Z' | 'X' | 'x'))
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

    #[test]
    fn parses_state_and_start_time_past_odd_names() {
        let stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 200 18446744073709551615";
        assert_eq!(parse_stat(stat), Some(('S', 987654)));
        assert_eq!(parse_stat("1 (x) R 0"), None);
    }

    #[test]
    fn knows_itself_and_rejects_a_reused_pid() {
        let me = ProcessIdentity::of(std::process::id() as i32).unwrap();
        assert!(me.is_alive());
        let impostor = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!impostor.is_alive());
        assert!(!ProcessIdentity {
            pid: i32::MAX,
            start_time: 0
        }
        .is_alive());
    }
}

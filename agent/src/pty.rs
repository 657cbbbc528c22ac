//! Pseudo-terminals: opening a master/slave pair of a given size, resizing it, the settings
//! a child under a terminal gets, and killing everything in a terminal's session.
//!
//! The master is read without a thread: the process module wraps it in tokio's `AsyncFd`
//! (non-blocking), so a thousand idle terminals cost a thousand registered descriptors and
//! nothing else. When every slave descriptor is closed (the child and its descendants exited)
//! reading the master fails with EIO, which is the terminal's end of output.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use nix::libc;
use nix::sys::signal::{kill, Signal};
use nix::sys::termios::{self, InputFlags, SetArg};
use nix::unistd::Pid;

use crate::sys;

/// `TERM` for a terminal whose spec names none.
pub(crate) const DEFAULT_TERM: &str = "xterm-256color";

/// The byte a terminal turns into end-of-file for a reader at the start of a line (Ctrl-D).
/// Writing it is how a client's half-close reaches a program under a PTY.
pub(crate) const EOF_BYTE: u8 = 0x04;

/// A new terminal: the agent keeps the master, the child gets the slave.
#[derive(Debug)]
pub(crate) struct Pty {
    /// The agent's side: what the child writes comes out here, what is written here is typed.
    pub master: OwnedFd,
    /// The child's side, for its stdin, stdout and stderr.
    pub slave: OwnedFd,
}

impl Pty {
    /// Opens a terminal of `cols` × `rows`. Both descriptors are close-on-exec; the child
    /// gets the slave through its standard streams.
    pub(crate) fn open(cols: u16, rows: u16) -> io::Result<Pty> {
        let (master, slave_path) = sys::open_pty_master()?;
        let slave: OwnedFd = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(&slave_path)?
            .into();
        // Line editing of UTF-8 text (erasing a multi-byte character) needs IUTF8, which
        // terminal emulators set and the kernel's default leaves off.
        if let Ok(mut attrs) = termios::tcgetattr(&slave) {
            attrs.input_flags.insert(InputFlags::IUTF8);
            let _ = termios::tcsetattr(&slave, SetArg::TCSANOW, &attrs);
        }
        resize(&master, cols, rows)?;
        Ok(Pty { master, slave })
    }
}

/// Changes the terminal's size; the kernel tells its foreground process group (SIGWINCH).
pub(crate) fn resize(master: &impl AsFd, cols: u16, rows: u16) -> io::Result<()> {
    sys::set_window_size(master.as_fd(), cols.max(1), rows.max(1))
}

/// SIGKILLs every process in session `sid` (a terminal's session: job control moves jobs into
/// process groups of their own), found by scanning /proc.
pub(crate) fn kill_session(sid: i32) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if session_of(&stat) == Some(sid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The session id field of a /proc/PID/stat line. The command name in parentheses may contain
/// spaces and parentheses, so fields are counted from the last `)`.
fn session_of(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // state, ppid, pgrp, session
    rest.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_a_terminal_of_the_requested_size() {
        let pty = Pty::open(100, 30).expect("open a pty");
        assert!(nix::unistd::isatty(std::os::fd::AsRawFd::as_raw_fd(&pty.slave)).unwrap());
        resize(&pty.master, 120, 40).expect("resize");
    }

    #[test]
    fn parses_the_session_of_a_stat_line() {
        let stat = "1234 (my (odd) cmd) S 1 1234 1230 34816 1234 4194560 0";
        assert_eq!(session_of(stat), Some(1230));
        assert_eq!(session_of("garbage"), None);
    }
}

//! The state shared by every connection to this agent: its token, settings and processes.

use std::path::PathBuf;

use crate::process::Processes;

/// One agent process's shared state.
#[derive(Debug)]
pub(crate) struct Agent {
    /// The sandbox token clients must present; `None` only for loopback development.
    pub token: Option<String>,
    /// The default working directory of processes and base of relative paths.
    pub workdir: PathBuf,
    /// The user processes run as when their request names none (`--user`).
    pub default_user: Option<String>,
    /// Replay ring capacity per output channel of a process, in bytes.
    pub ring_bytes: usize,
    /// Every process started through this agent.
    pub processes: Processes,
    /// The descriptor budget: every stream takes a place in it.
    pub budget: crate::budget::Budget,
}

impl Agent {
    /// Resolves a client path: absolute as is, relative against the working directory.
    pub(crate) fn resolve(&self, p: &std::path::Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.workdir.join(p)
        }
    }
}

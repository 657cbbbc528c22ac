//! How a process ended: what the agent reports when a process exits, and what a finished
//! process's listing carries.

use serde::{Deserialize, Serialize};

/// How a process ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// The exit code, if the process exited normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// The signal number that ended it, if a signal did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The agent killed the process group because its timeout elapsed.
    #[serde(default)]
    pub timed_out: bool,
    /// Output was cut at the exec's output limit.
    #[serde(default)]
    pub truncated: bool,
}

impl ExitStatus {
    /// The status a shell would report: the code, 128 + signal, or 124 on timeout
    /// (as `timeout(1)` does).
    pub fn shell_code(&self) -> i32 {
        if self.timed_out {
            124
        } else if let Some(code) = self.code {
            code
        } else if let Some(sig) = self.signal {
            128 + sig
        } else {
            255
        }
    }

    /// True when the process exited with code 0 and was not cut short.
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }
}

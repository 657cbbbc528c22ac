//! The local provider's errors: [`LocalError`] for what the relay side hits (bad specs, missing
//! host features, cgroup and file failures) and its mapping to [`ProviderError`], and
//! [`InitError`] for a failing step inside the sandbox init, which travels back to the relay
//! as a sentence.

use std::io;
use std::path::PathBuf;

use nix::errno::Errno;

use tether_relay_core::provider::ProviderError;

/// Why a local-provider operation failed, on the relay's side.
#[derive(Debug, thiserror::Error)]
pub(super) enum LocalError {
    /// The id cannot name a directory, a cgroup and a hostname.
    #[error(
        "sandbox id {0:?} cannot be used by the local provider: use 1 to 63 letters, digits, \
         '-', '_' or '.', not starting with '.' or '-'"
    )]
    BadId(String),
    /// The spec asks for something this provider cannot do.
    #[error("{0}")]
    BadSpec(String),
    /// The host lacks a feature or privilege the provider needs.
    #[error("{0}")]
    Unavailable(String),
    /// A sandbox with this id still has files on disk.
    #[error(
        "sandbox directory {0} already exists: a sandbox with this id was not deleted; delete \
         it first"
    )]
    Exists(PathBuf),
    /// A file-system or cgroup operation failed.
    #[error("could not {what}: {source}")]
    Io {
        /// What we were doing, as a verb phrase.
        what: String,
        /// The cause.
        source: io::Error,
    },
    /// The sandbox init reported a failing step (the message names it).
    #[error("starting the sandbox failed: {0}")]
    InitFailed(String),
    /// The sandbox init did not report in time.
    #[error("the sandbox did not start within {0:?}; see {1} for the sandbox's own output")]
    StartTimeout(std::time::Duration, PathBuf),
    /// The metadata the relay stored for the sandbox cannot be read.
    #[error(
        "the local provider's metadata for sandbox {id} is unreadable ({reason}); delete \
             the sandbox and create it again"
    )]
    BadMeta {
        /// The sandbox.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The sandbox is not in a state the call can start from (pausing a paused one).
    #[error("{0}")]
    Conflict(String),
    /// The host cannot do what was asked for this sandbox (pause without a cgroup freezer).
    #[error("{0}")]
    Unsupported(String),
    /// Some processes outlived every kill.
    #[error("processes of sandbox {id} survived SIGKILL for {timeout:?} (pids {pids:?})")]
    Unkillable {
        /// The sandbox.
        id: String,
        /// How long we tried.
        timeout: std::time::Duration,
        /// Who is left.
        pids: Vec<i32>,
    },
}

impl LocalError {
    /// An I/O error with what we were doing (a verb phrase: "create cgroup X"). Permission
    /// errors among them reach users as `ProviderError::Unavailable`, with what to do.
    pub(super) fn io(what: impl Into<String>, source: io::Error) -> Self {
        LocalError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Adds "what we were doing" to an `io::Result`.
pub(super) trait IoContext<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, LocalError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, LocalError> {
        self.map_err(|e| LocalError::io(what(), e))
    }
}

impl From<LocalError> for ProviderError {
    fn from(e: LocalError) -> Self {
        match e {
            LocalError::BadId(_) | LocalError::BadSpec(_) => {
                ProviderError::InvalidSpec(e.to_string())
            }
            LocalError::Unavailable(m) => ProviderError::Unavailable(m),
            LocalError::Conflict(m) => ProviderError::Conflict(m),
            LocalError::Unsupported(m) => ProviderError::Unsupported(m),
            LocalError::Io { ref source, .. }
                if source.kind() == io::ErrorKind::PermissionDenied =>
            {
                ProviderError::Unavailable(format!(
                    "{e}; the local provider needs root (or a delegated cgroup and unprivileged \
                     user namespaces)"
                ))
            }
            other => ProviderError::Other(anyhow::Error::new(other)),
        }
    }
}

/// A step of the sandbox init that failed. Its text is what the relay reports to the user.
#[derive(Debug, thiserror::Error)]
pub(super) enum InitError {
    /// The kernel or the host's policy forbids what the sandbox needs.
    #[error("{what} failed: {errno}; {hint}")]
    Unsupported {
        /// The step.
        what: String,
        /// The kernel's answer.
        errno: Errno,
        /// What the user can do about it.
        hint: &'static str,
    },
    /// A system call failed.
    #[error("{what} failed: {errno}")]
    Sys {
        /// The step.
        what: String,
        /// The kernel's answer.
        errno: Errno,
    },
    /// A file operation failed.
    #[error("{what} failed: {source}")]
    Io {
        /// The step.
        what: String,
        /// The cause.
        source: io::Error,
    },
    /// The relay sent a configuration the init cannot read.
    #[error("the sandbox init could not read its configuration: {0}")]
    Config(String),
}

impl InitError {
    /// Whether this failure means the host cannot run sandboxes at all (rather than this one
    /// sandbox failing).
    pub(super) fn is_unavailable(&self) -> bool {
        matches!(self, InitError::Unsupported { .. })
    }
}

/// Names the step of a failing system call.
pub(super) trait Step<T> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T, InitError>;
}

impl<T> Step<T> for nix::Result<T> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T, InitError> {
        self.map_err(|errno| InitError::Sys {
            what: what(),
            errno,
        })
    }
}

impl<T> Step<T> for io::Result<T> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T, InitError> {
        self.map_err(|source| InitError::Io {
            what: what(),
            source,
        })
    }
}

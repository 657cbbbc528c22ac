//! Why writing what a sandbox sent failed. Paths in messages are escaped: they are the
//! sandbox's choice.

use std::io;

use crate::ClientError;

/// A failure to land what a sandbox sent. The sandbox-side variants ([`BadPath`],
/// [`NotADirectory`], [`Unsupported`], [`Malformed`]) mean the sandbox sent something this
/// side refuses: nothing was written for it.
///
/// [`BadPath`]: HostFsError::BadPath
/// [`NotADirectory`]: HostFsError::NotADirectory
/// [`Unsupported`]: HostFsError::Unsupported
/// [`Malformed`]: HostFsError::Malformed
#[derive(Debug, thiserror::Error)]
pub enum HostFsError {
    /// A path from the sandbox would leave the destination, or cannot name a file here.
    #[error(
        "the sandbox sent the path `{path}`, which {reason}; refusing to write it (the \
         sandbox's agent is broken or hostile: nothing was written outside the destination)"
    )]
    BadPath {
        /// The path, escaped.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Something on this machine that is not a directory (a symlink, a file) stands where
    /// the sandbox sends a directory.
    #[error(
        "{path} is a symlink or a file on this machine where the sandbox sends a directory; \
         refusing to follow it (move it out of the way and retry)"
    )]
    NotADirectory {
        /// The destination-relative path, escaped.
        path: String,
    },
    /// An entry of a kind that is never copied (hard link, device, fifo).
    #[error(
        "the sandbox sent {path} as a {kind}; only files, directories and symlinks are copied"
    )]
    Unsupported {
        /// The path, escaped.
        path: String,
        /// What it is.
        kind: String,
    },
    /// The archive from the sandbox is not a valid tar stream.
    #[error("the archive from the sandbox is malformed: {0}")]
    Malformed(String),
    /// The sandbox sent a file's path but not all of its bytes.
    #[error("the sandbox stopped sending {path} before its end; it was not written")]
    Truncated {
        /// The path, escaped.
        path: String,
    },
    /// A local file operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done (`create a file in`, `rename`, ...).
        action: &'static str,
        /// The local path, escaped.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// The sandbox refused or failed the transfer, or the connection broke.
    #[error(transparent)]
    Remote(#[from] ClientError),
}

impl HostFsError {
    /// A local I/O error while doing `action` on `path` (already escaped).
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<String>,
    ) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| HostFsError::Io {
            action,
            path,
            source,
        }
    }

    /// Whether the sandbox sent something this side refuses (as opposed to a local failure
    /// or a broken connection).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            HostFsError::BadPath { .. }
                | HostFsError::NotADirectory { .. }
                | HostFsError::Unsupported { .. }
                | HostFsError::Malformed(_)
        )
    }
}

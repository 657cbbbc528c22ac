//! Why a sync failed. Each message names the path or the side concerned and what to do.

use std::io;
use std::path::PathBuf;

use tether_client::ClientError;

/// A sync failure.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A local file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Local {
        /// The local path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The local side of the sync is not a directory.
    #[error("{} is not a directory: sync mirrors a directory (use `tether cp` for one file)", .0.display())]
    LocalNotADirectory(PathBuf),
    /// The remote side of the sync is not a directory.
    #[error("{0} in the sandbox is not a directory: sync into a directory")]
    RemoteNotADirectory(String),
    /// The directory a pull was asked for is not in the sandbox.
    #[error("{0} does not exist in the sandbox: nothing to pull (check the path with `tether exec ID -- ls`)")]
    RemoteMissing(String),
    /// An `--exclude` pattern is not valid gitignore syntax.
    #[error("invalid exclude pattern `{pattern}`: {reason}")]
    Pattern {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The sandbox refused or failed an operation, or the connection broke.
    #[error("{context}: {source}")]
    Remote {
        /// What the sync was doing, with the path.
        context: String,
        /// The client's error.
        source: ClientError,
    },
    /// A request got no answer in time; the connection is presumed dead.
    #[error(
        "{0}: no answer from the sandbox within the time limit; the connection is presumed lost"
    )]
    Timeout(String),
    /// Local file watching could not start.
    #[error("cannot watch {}: {reason}", path.display())]
    Watch {
        /// The directory.
        path: PathBuf,
        /// Why (often the inotify watch limit: raise `fs.inotify.max_user_watches`).
        reason: String,
    },
    /// The sandbox sent something this side refuses (a path leaving the destination, a
    /// symlink where a directory goes), or landing a file here failed.
    #[error(transparent)]
    Host(#[from] tether_client::hostfs::HostFsError),
    /// A blocking task died (a bug).
    #[error("a sync worker failed: {0}")]
    Worker(String),
}

impl SyncError {
    /// Whether the connection to the sandbox is gone, so reconnecting may help.
    pub(crate) fn is_disconnect(&self) -> bool {
        match self {
            SyncError::Remote { source, .. } => matches!(
                source,
                ClientError::Disconnected
                    | ClientError::PeerSilent { .. }
                    | ClientError::Connect { .. }
                    | ClientError::Interrupted { .. }
            ),
            SyncError::Timeout(_) => true,
            _ => false,
        }
    }

    /// A local I/O error at `path`.
    pub(crate) fn local(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> SyncError {
        let path = path.into();
        move |source| SyncError::Local { path, source }
    }

    /// A remote failure while doing `context`.
    pub(crate) fn remote(context: impl Into<String>) -> impl FnOnce(ClientError) -> SyncError {
        let context = context.into();
        move |source| SyncError::Remote { context, source }
    }
}

//! Wire error codes (what an operation failed with) and the codec's own error type.
//!
//! The mapping from OS errors to wire codes lives here and nowhere else.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why an operation failed, as sent in a [`crate::Control::Error`] message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The path, process, stream or port does not exist.
    NotFound,
    /// The caller lacks permission for the path or process.
    PermissionDenied,
    /// A file was expected, a directory was found.
    IsDirectory,
    /// A directory was expected, something else was found.
    NotADirectory,
    /// The target exists and the caller asked not to overwrite it.
    AlreadyExists,
    /// The path is empty, relative where it must be absolute, or contains a NUL byte.
    InvalidPath,
    /// A field of the request is out of range or inconsistent.
    InvalidArgument,
    /// The operation did not finish in the time it was given.
    Timeout,
    /// The request or its result exceeds a limit.
    TooLarge,
    /// The token is missing or wrong.
    Unauthorized,
    /// The peer does not support this operation or protocol version.
    Unsupported,
    /// A bug or an unexpected condition on the agent; the message says what.
    Internal,
}

impl ErrorCode {
    /// The code's wire name, as in `PROTOCOL.md`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::IsDirectory => "is_directory",
            ErrorCode::NotADirectory => "not_a_directory",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::InvalidPath => "invalid_path",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Timeout => "timeout",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Internal => "internal",
        }
    }

    /// Maps an OS error to the closest wire code.
    pub fn from_io(err: &std::io::Error) -> ErrorCode {
        use std::io::ErrorKind as K;
        match err.kind() {
            K::NotFound => ErrorCode::NotFound,
            // A read-only file system refuses a write as surely as a mode does.
            K::PermissionDenied | K::ReadOnlyFilesystem => ErrorCode::PermissionDenied,
            K::AlreadyExists => ErrorCode::AlreadyExists,
            K::IsADirectory => ErrorCode::IsDirectory,
            K::NotADirectory => ErrorCode::NotADirectory,
            K::InvalidInput | K::InvalidFilename => ErrorCode::InvalidArgument,
            K::TimedOut => ErrorCode::Timeout,
            K::FileTooLarge | K::StorageFull | K::QuotaExceeded => ErrorCode::TooLarge,
            K::Unsupported => ErrorCode::Unsupported,
            _ => match err.raw_os_error() {
                Some(21) => ErrorCode::IsDirectory,   // EISDIR
                Some(20) => ErrorCode::NotADirectory, // ENOTDIR
                Some(39) => ErrorCode::AlreadyExists, // ENOTEMPTY: target exists
                // EMFILE, ENFILE: out of file descriptors, a resource limit like a full disk.
                Some(24 | 23) => ErrorCode::TooLarge,
                _ => ErrorCode::Internal,
            },
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A frame or message that could not be decoded. Never a panic: every malformed input
/// ends here, and the receiver answers it with an error instead of dying.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    /// Fewer bytes than a header; the frame was cut short.
    #[error("frame truncated: {0} bytes is shorter than the 6-byte header")]
    Truncated(usize),
    /// The payload exceeds [`crate::limits::MAX_PAYLOAD`].
    #[error("frame too large: payload of {0} bytes exceeds the 1 MiB limit")]
    TooLarge(usize),
    /// The high nibble of the first byte is not a frame version this crate speaks.
    #[error("unsupported frame version {0}; this peer speaks version 1")]
    WrongVersion(u8),
    /// The low nibble of the first byte is not a known frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The channel byte is not 0, 1 or 2.
    #[error("unknown channel {0}")]
    UnknownChannel(u8),
    /// A window frame whose payload is not exactly 4 bytes, or grants zero credit.
    #[error("malformed window frame: {0}")]
    BadWindow(&'static str),
    /// A data or window frame addressed to stream 0.
    #[error("data and window frames must name a non-zero stream")]
    ZeroStream,
    /// A control frame whose payload is not a valid control message.
    #[error("malformed control message: {0}")]
    BadControl(String),
}

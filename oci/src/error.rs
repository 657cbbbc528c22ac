//! The one error type of the image module: each variant names what went wrong, with which
//! file, image or registry, and what to do about it.

use std::path::PathBuf;

/// Why building, pushing or unpacking an image failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// `--base` points at nothing.
    #[error(
        "the base {0} does not exist; pass an OCI image layout directory, an OCI or `docker \
         save` tarball, or a root filesystem directory (or no --base for the agent alone)"
    )]
    BaseMissing(PathBuf),
    /// The base exists but cannot be used as one.
    #[error("the base {path} cannot be used: {reason}")]
    BadBase {
        /// The base given.
        path: PathBuf,
        /// What is wrong with it, as a sentence.
        reason: String,
    },
    /// The base (or an image to unpack) is for another platform.
    #[error(
        "{path} is a {found} image, but sandboxes run linux/amd64; use the amd64 variant (for \
         example `skopeo copy --override-arch amd64 docker://IMAGE oci:DIR`)"
    )]
    WrongPlatform {
        /// The image given.
        path: PathBuf,
        /// Its `os/architecture`.
        found: String,
    },
    /// No agent binary was given and none was found where cargo puts the static build.
    #[error(
        "no static tether-agent found (looked in {looked}); build it with `cargo build \
         --release --target x86_64-unknown-linux-musl -p tether-agent` or pass --agent PATH"
    )]
    AgentNotFound {
        /// The places searched, comma-separated.
        looked: String,
    },
    /// The agent binary cannot run in an arbitrary image.
    #[error(
        "the agent {path} cannot go in an image: {reason}; images need the static x86_64 \
         build: `cargo build --release --target x86_64-unknown-linux-musl -p tether-agent`"
    )]
    BadAgent {
        /// The binary given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// An image to push or unpack is not a valid OCI image.
    #[error("{path} is not a usable OCI image: {reason}")]
    BadImage {
        /// The layout directory or tarball.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The output path cannot take the image.
    #[error("cannot write the image to {path}: {reason}")]
    Output {
        /// The output given.
        path: PathBuf,
        /// Why not.
        reason: String,
    },
    /// A registry reference that does not parse.
    #[error("{reference:?} is not an image reference ({reason}); write REGISTRY/NAME:TAG, e.g. localhost:5000/sandbox:v1")]
    BadReference {
        /// What was given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The registry refused our credentials, or we had none and it wants some.
    #[error("{registry} refused access: {reason}")]
    Auth {
        /// The registry host.
        registry: String,
        /// What it said, and where credentials come from.
        reason: String,
    },
    /// The registry answered a request with an error.
    #[error("{registry} refused {what}: HTTP {status}{message}")]
    Registry {
        /// The registry host.
        registry: String,
        /// The request, e.g. "the upload of blob sha256:…".
        what: String,
        /// The HTTP status.
        status: u16,
        /// The registry's own error codes and messages, prefixed with ": ", or empty.
        message: String,
    },
    /// The registry could not be reached.
    #[error("cannot reach {registry}: {cause}{hint}")]
    Network {
        /// The registry host.
        registry: String,
        /// The transport error with its causes, e.g. "tcp connect error: Connection refused".
        cause: String,
        /// A suggestion, prefixed with "; ", or empty.
        hint: String,
    },
    /// A file operation failed.
    // The OS error is in the message rather than a `source`, so it is printed once.
    #[error("{what}: {error}")]
    Io {
        /// What we were doing, with the path.
        what: String,
        /// The OS error.
        error: std::io::Error,
    },
}

/// Attaches "what we were doing" to I/O errors.
pub(crate) trait IoContext<T> {
    /// Wraps the error in [`ImageError::Io`] with the sentence `what()`.
    fn io(self, what: impl FnOnce() -> String) -> Result<T, ImageError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io(self, what: impl FnOnce() -> String) -> Result<T, ImageError> {
        self.map_err(|error| ImageError::Io {
            what: what(),
            error,
        })
    }
}

/// An error and its causes on one line: `a: b: c`.
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = e.source();
    }
    text
}

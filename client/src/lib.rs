//! The Rust client of Tether: what the `tether` CLI itself uses, with nothing of the server.
//! It builds without SQLite, an HTTP server, OCI or provider code, and off Linux.
//!
//! - [`RelayClient`] talks to a relay's REST API: create, list, get, delete, renew sandboxes,
//!   and [`RelayClient::connect`] opens a protocol [`Session`] to one of them.
//! - [`Session`] is one multiplexed connection to an agent. Run processes with
//!   [`Session::exec`] (a [`Process`] handle streams output and takes stdin, signals,
//!   resizes), and files with the helpers in [`files`]. [`Session::open`] is the low-level
//!   entry point for any operation.
//! - [`tls`]: whom `https://` and `wss://` connections trust (the webpki roots, plus the
//!   PEM file in `TETHER_CA_CERT` for a relay with a private CA or a self-signed certificate).
//!
//! ```no_run
//! # async fn demo() -> Result<(), tether_client::ClientError> {
//! use tether_client::RelayClient;
//! use tether_proto::op::ExecSpec;
//!
//! let relay = RelayClient::from_env()?;
//! let sandbox = relay.create(&Default::default()).await?;
//! let session = relay.connect(&sandbox.id).await?;
//! let out = session.exec(ExecSpec::argv(["uname", "-a"])).await?.output().await?;
//! print!("{}", String::from_utf8_lossy(&out.stdout));
//! relay.delete(&sandbox.id).await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod api;
pub mod escape;
pub mod files;
pub mod hostfs;
pub mod local;
mod process;
mod relay;
mod session;
pub mod size;
pub mod tls;

pub use process::{Output, Process, ProcessEvent};
pub use relay::{RelayClient, DEFAULT_RELAY};
pub use session::{Event, RawStream, Session, StreamSender};

use tether_proto::ErrorCode;

/// Why a client call failed. Every message says what to do next where it can.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    /// The agent refused or failed the operation. Its message is the sandbox's text: shown
    /// escaped, on one line, so it can neither drive a terminal nor fake a line of output.
    #[error("{}", crate::escape::escape_str(.message))]
    Remote {
        /// The wire error code.
        code: ErrorCode,
        /// The agent's explanation.
        message: String,
    },
    /// The relay answered an HTTP request with an error.
    #[error("{message}")]
    Http {
        /// HTTP status.
        status: u16,
        /// The relay's error code (`not_found`, `unauthorized`, ...).
        code: String,
        /// The relay's explanation.
        message: String,
    },
    /// The connection could not be opened.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// Where.
        url: String,
        /// Why.
        reason: String,
    },
    /// The TLS handshake with the relay failed: an untrusted or mismatched certificate, or a
    /// server that does not speak TLS. The reason says which, and what to do.
    #[error("cannot connect to {url} over TLS: {reason}")]
    Tls {
        /// Where.
        url: String,
        /// Why, and what to do.
        reason: String,
    },
    /// `TETHER_CA_CERT` names a file that cannot be used.
    #[error(transparent)]
    CaCert(#[from] tls::CaCertError),
    /// The connection was lost while the operation ran.
    #[error("the connection to the sandbox was lost; retry, or check that the relay and sandbox are up (`tether ls`)")]
    Disconnected,
    /// Nothing at all (no frame, no answer to a ping) came over the connection for the peer
    /// timeout: the network between here and the relay (or the relay itself) is taken for
    /// dead, since a black-holed connection would otherwise hang forever.
    #[error(
        "the connection to the sandbox went silent: nothing arrived for {} (the peer \
         timeout, TETHER_PEER_TIMEOUT), not even an answer to a ping; check the network and \
         that the relay is up (`tether ls`), then retry",
        humantime::format_duration(*.timeout)
    )]
    PeerSilent {
        /// The peer timeout that ran out.
        timeout: std::time::Duration,
    },
    /// The peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A local I/O error (reading a file to upload, writing a download).
    #[error("{0}")]
    Local(String),
}

impl ClientError {
    /// The wire error code, for errors the agent reported.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Remote { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Builds an error from an HTTP status and a body that is, ideally, the relay's ErrorBody.
    pub(crate) fn from_http(status: u16, body: &str) -> ClientError {
        match serde_json::from_str::<crate::api::ErrorBody>(body) {
            Ok(b) => ClientError::Http {
                status,
                code: b.error.code,
                message: b.error.message,
            },
            Err(_) => ClientError::Http {
                status,
                code: match status {
                    401 => "unauthorized".into(),
                    404 => "not_found".into(),
                    _ => "http_error".into(),
                },
                message: if body.is_empty() {
                    format!("the server answered HTTP {status}")
                } else {
                    format!("the server answered HTTP {status}: {body}")
                },
            },
        }
    }
}

//! The Rust client of Tether: what the `tether` CLI itself uses, with nothing of the server.
//! It builds without SQLite, an HTTP server, OCI or provider code, and off Linux.
//!
//! - [`RelayClient`] talks to a relay's REST API: create, list, get, delete, renew sandboxes,
//!   and [`RelayClient::connect`] opens a protocol [`Session`] to one of them.
//! - [`Session`] is one multiplexed connection to an agent. Run processes with
//!   [`Session::exec`] (a [`Process`] handle streams output and takes stdin, signals,
//!   resizes), and files with the helpers in [`files`]. [`Session::open`] is the low-level
//!   entry point for any operation; [`Session::download_blocking`] hands a download's bytes
//!   to code that writes them with blocking calls ([`Received`]).
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
mod received;
mod relay;
mod session;
pub mod size;
pub mod tls;

pub use process::{Output, Process, ProcessEvent};
pub use received::Received;
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
    /// The relay was reached and the request sent, but the connection ended (or timed out)
    /// before the whole answer came: the relay went away mid-request. Unlike [`Connect`],
    /// the relay may have done what was asked (a create may have made its sandbox).
    ///
    /// [`Connect`]: ClientError::Connect
    #[error(
        "the relay at {url} went away in the middle of the request ({reason}): it may have \
         done what was asked (a sandbox being created may exist); list the sandboxes before \
         retrying"
    )]
    Interrupted {
        /// Where.
        url: String,
        /// What the connection did.
        reason: String,
    },
    /// Something answered at the relay's address, but not as a Tether relay does (an HTML
    /// page, a server that does not take WebSockets): the address is probably wrong.
    #[error(
        "{url} answered, but not as a Tether relay ({reason}): check the relay's address \
         (TETHER_RELAY)"
    )]
    NotRelay {
        /// Where.
        url: String,
        /// What it answered.
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
    #[error("the connection to the sandbox was lost; retry once the relay and the sandbox are up")]
    Disconnected,
    /// Nothing at all (no frame, no answer to a ping) came over the connection for the peer
    /// timeout: the network between here and the relay (or the relay itself) is taken for
    /// dead, since a black-holed connection would otherwise hang forever.
    #[error(
        "the connection to the sandbox went silent: nothing arrived for {} (the peer \
         timeout, TETHER_PEER_TIMEOUT), not even an answer to a ping; check the network and \
         that the relay is up, then retry",
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

    /// Builds an error from an HTTP status and a body that is, ideally, the relay's ErrorBody;
    /// a body that is not JSON at all comes from something else at `url`.
    pub(crate) fn from_http(url: &str, status: u16, body: &str) -> ClientError {
        if let Ok(b) = serde_json::from_str::<crate::api::ErrorBody>(body) {
            return ClientError::Http {
                status,
                code: b.error.code,
                message: b.error.message,
            };
        }
        // A plain-text error is an agent's (its upgrade refusals are text); a page is not.
        if let Some(what) = foreign_body(body).filter(|_| body.trim_start().starts_with('<')) {
            return ClientError::NotRelay {
                url: url.to_string(),
                reason: format!("HTTP {status} with {what}"),
            };
        }
        ClientError::Http {
            status,
            code: match status {
                401 => "unauthorized".into(),
                404 => "not_found".into(),
                _ => "http_error".into(),
            },
            message: match body.is_empty() {
                true => format!("the server answered HTTP {status}"),
                false => format!(
                    "the server answered HTTP {status}: {}",
                    escape::escape_str(body)
                ),
            },
        }
    }

    /// The error for a successful answer that is not the JSON the relay sends: from something
    /// else at `url` when the body is no JSON at all, else a relay that broke the API.
    pub(crate) fn from_unexpected(url: &str, body: &str, err: &serde_json::Error) -> ClientError {
        match foreign_body(body) {
            Some(what) => ClientError::NotRelay {
                url: url.to_string(),
                reason: format!("an answer with {what}"),
            },
            None => ClientError::Protocol(format!("unexpected answer from the relay: {err}")),
        }
    }
}

/// What a body that no Tether relay sends is, shortly (an HTML page and its title, or the
/// start of its text), or `None` for JSON, which a relay might have sent.
fn foreign_body(body: &str) -> Option<String> {
    let text = body.trim_start();
    if text.is_empty() || text.starts_with(['{', '[']) {
        return None;
    }
    if text.starts_with('<') {
        let title = text
            .find("<title>")
            .and_then(|at| text[at + 7..].split('<').next())
            .map(str::trim)
            .filter(|t| !t.is_empty());
        return Some(match title {
            Some(title) => format!("an HTML page titled \"{}\"", excerpt(title)),
            None => "an HTML page".into(),
        });
    }
    Some(format!("the text \"{}\"", excerpt(text)))
}

/// The first line of `text`, at most 80 characters, escaped for a terminal.
fn excerpt(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let short: String = line.chars().take(80).collect();
    let more = if short.len() < line.len() { "..." } else { "" };
    format!("{}{more}", escape::escape_str(&short))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_that_no_relay_sends_are_named_not_dumped() {
        let html = "<!DOCTYPE html>\n<html><head><title> Not \x1b[2JFound </title>";
        let err = ClientError::from_http("http://h:1", 404, html);
        let said = err.to_string();
        assert!(matches!(err, ClientError::NotRelay { .. }), "{said}");
        assert!(said.starts_with("http://h:1 answered, but not as a Tether relay (HTTP 404 with an HTML page titled \"Not \\x1b[2JFound\")"), "{said}");

        let long = "x".repeat(200) + "\nsecond line";
        let not_json = serde_json::from_str::<u32>(&long).unwrap_err();
        let said = ClientError::from_unexpected("u", &long, &not_json).to_string();
        assert!(
            said.contains(&format!("the text \"{}...\"", "x".repeat(80))),
            "{said}"
        );
        assert!(!said.contains("second"), "{said}");

        // An agent refuses an upgrade in plain text: that is its message, not a stranger's.
        let agent = ClientError::from_http("u", 401, "wrong sandbox token: pass the token");
        assert!(
            matches!(agent, ClientError::Http { status: 401, .. }),
            "{agent}"
        );

        // The relay's own errors, and bodies a relay may send, stay what they were.
        let body = r#"{"error":{"code":"not_found","message":"no sandbox sb-1"}}"#;
        assert_eq!(
            ClientError::from_http("u", 404, body),
            ClientError::Http {
                status: 404,
                code: "not_found".into(),
                message: "no sandbox sb-1".into()
            }
        );
        let empty = ClientError::from_http("u", 401, "");
        assert!(
            matches!(empty, ClientError::Http { status: 401, ref code, .. } if code == "unauthorized")
        );
        let json = serde_json::from_str::<u32>("[1]").unwrap_err();
        let odd = ClientError::from_unexpected("u", "[1]", &json);
        assert!(matches!(odd, ClientError::Protocol(_)), "{odd}");
    }
}

//! Opening an agent's WebSocket through a provider's edge (E2B's proxy, Daytona's preview
//! proxy, a Modal tunnel): an HTTP/1.1 upgrade sent with the provider's routing and access
//! headers plus the agent token (a bearer token, or `X-Tether-Agent-Token` where the edge
//! reads `Authorization` itself). An edge that refuses answers with a plain
//! HTTP status, which [`EdgeError::Refused`] keeps for the provider to interpret.
//!
//! Why by hand over reqwest rather than tokio-tungstenite's own connect, now that it has TLS:
//! the upgrade goes out through the provider's `reqwest::Client`, the one its control-plane
//! calls use, so it takes the same way out of the relay's network: `HTTPS_PROXY`,
//! `HTTP_PROXY` and `NO_PROXY` (which reqwest honours and tokio-tungstenite does not: it
//! only dials directly), the same connect timeout and DNS resolution. A relay whose egress
//! goes through a proxy reaches E2B's, Daytona's and Modal's edges only this way. What is
//! left by hand is small: the key, the accept check, and the status and body of a refusal.

use std::time::Instant;

use bytes::Bytes;
use reqwest::header::{self, HeaderMap, HeaderValue};

use super::constants::{AGENT_START_TIMEOUT, HANDSHAKE_TIMEOUT, POLL_INTERVAL};
use super::http::message_of;
use tether_relay_core::provider::upgrade;
use tether_relay_core::provider::AgentSocket;

/// Why the agent's WebSocket could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EdgeError {
    /// The edge (or the agent) answered the upgrade with this status.
    #[error("HTTP {status}: {message}")]
    Refused {
        /// The status.
        status: u16,
        /// The body's message.
        message: String,
        /// Its `Location`, for redirects.
        location: Option<String>,
    },
    /// The edge could not be reached, or the upgrade broke.
    #[error("{0}")]
    Network(String),
}

impl EdgeError {
    /// The status, when the edge answered.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            EdgeError::Refused { status, .. } => Some(*status),
            EdgeError::Network(_) => None,
        }
    }
}

/// Where the agent token goes in the upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenIn {
    /// `Authorization: Bearer <token>`.
    Authorization,
    /// `X-Tether-Agent-Token`, for an edge that reads `Authorization` itself (Daytona's
    /// preview proxy tries any bearer as a Daytona credential, and counts each refusal
    /// against the relay's IP).
    TetherHeader,
}

/// Opens a WebSocket to `url` (`http(s)://` or `ws(s)://`) with `headers` and the agent token
/// as a bearer token.
pub(crate) async fn open(
    http: &reqwest::Client,
    url: &str,
    headers: HeaderMap,
    agent_token: &str,
) -> Result<AgentSocket, EdgeError> {
    open_with(http, url, headers, agent_token, TokenIn::Authorization).await
}

/// Opens a WebSocket to `url` with `headers` and the agent token where `token_in` says.
pub(crate) async fn open_with(
    http: &reqwest::Client,
    url: &str,
    mut headers: HeaderMap,
    agent_token: &str,
    token_in: TokenIn,
) -> Result<AgentSocket, EdgeError> {
    let url = match url.split_once("://") {
        Some(("ws", rest)) => format!("http://{rest}"),
        Some(("wss", rest)) => format!("https://{rest}"),
        _ => url.to_string(),
    };
    let key = upgrade::new_key();
    let bad = |_| EdgeError::Network("the agent token is not a valid header value".into());
    match token_in {
        TokenIn::Authorization => headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {agent_token}")).map_err(bad)?,
        ),
        TokenIn::TetherHeader => headers.insert(
            tether_proto::auth::TOKEN_HEADER,
            HeaderValue::from_str(agent_token).map_err(bad)?,
        ),
    };
    upgrade::upgrade_headers(&mut headers, &key);
    let upgrading = async {
        let resp = http
            .get(&url)
            .headers(headers)
            .send()
            .await
            .map_err(|e| EdgeError::Network(format!("cannot reach {url}: {e}")))?;
        let status = resp.status().as_u16();
        if status != 101 {
            let location = resp
                .headers()
                .get(header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .map(str::to_string);
            let body = resp.bytes().await.unwrap_or_default();
            return Err(EdgeError::Refused {
                status,
                message: message_of(&body),
                location,
            });
        }
        if let Err(e) = upgrade::check_accept(resp.headers(), &key) {
            return Err(EdgeError::Network(format!("{url}: {e}")));
        }
        resp.upgrade()
            .await
            .map_err(|e| EdgeError::Network(format!("the WebSocket upgrade at {url} failed: {e}")))
    };
    let upgraded = tokio::time::timeout(HANDSHAKE_TIMEOUT, upgrading)
        .await
        .map_err(|_| {
            EdgeError::Network(format!(
                "{url} did not complete the WebSocket upgrade within {HANDSHAKE_TIMEOUT:?}"
            ))
        })??;
    // reqwest's upgraded stream replays whatever it read past the `101` itself.
    Ok(AgentSocket::new(upgraded, Bytes::new()))
}

/// Opens an agent's WebSocket with `open`, waiting while the agent is still starting: a
/// provider's edge answers 502, 503 or 504 until something listens on the agent's port. Tries
/// again every [`POLL_INTERVAL`] until [`AGENT_START_TIMEOUT`] has passed; any other answer
/// ends the wait. `what` names the sandbox in the log (e.g. "Runloop devbox dbx_1").
pub(crate) async fn open_when_ready<F, Fut>(
    what: &str,
    mut open: F,
) -> Result<AgentSocket, EdgeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<AgentSocket, EdgeError>>,
{
    let deadline = Instant::now() + AGENT_START_TIMEOUT;
    loop {
        match open().await {
            Err(
                e @ EdgeError::Refused {
                    status: 502..=504, ..
                },
            ) if Instant::now() < deadline => {
                tracing::debug!("{what}: agent not ready yet ({e})");
            }
            done => return done,
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

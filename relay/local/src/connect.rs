//! Reaching a sandbox's agent: a Unix socket connection to `agent.sock`, upgraded to a
//! WebSocket at `ws://sandbox/v1/agent` that presents the sandbox's agent token.

use std::io;
use std::path::Path;

use anyhow::{anyhow, Context};
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use tokio::net::UnixStream;

use super::constants::{AGENT_URL, HANDSHAKE_TIMEOUT};
use tether_relay_core::provider::upgrade::upgrade;
use tether_relay_core::provider::{AgentSocket, ProviderError};

/// Opens an authenticated WebSocket to the agent listening on `socket`.
pub(super) async fn open(
    socket: &Path,
    id: &str,
    agent_token: &str,
) -> Result<AgentSocket, ProviderError> {
    let stream = match UnixStream::connect(socket).await {
        Ok(stream) => stream,
        // No socket file, or nobody listening on it: the agent, which is PID 1, seems gone
        // (the caller confirms with the process itself).
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Err(ProviderError::Gone(id.to_string()))
        }
        // The relay's own shortage says nothing about the sandbox.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            return Err(ProviderError::Unavailable(format!(
                "the relay has no file descriptor left to reach sandbox {id} ({e}); close some \
                 tunnels or sessions and try again, or raise the relay's limit (`ulimit -Hn`)"
            )))
        }
        Err(e) => {
            return Err(anyhow!(e)
                .context(format!(
                    "connecting to the agent socket {}",
                    socket.display()
                ))
                .into())
        }
    };
    let mut headers = HeaderMap::new();
    let bearer = HeaderValue::from_str(&format!("Bearer {agent_token}"))
        .context("the agent token cannot be sent in an HTTP header")?;
    headers.insert(AUTHORIZATION, bearer);

    let handshake = upgrade(stream, AGENT_URL, headers);
    let socket = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| {
            anyhow!(
                "the agent of sandbox {id} did not answer the WebSocket handshake within \
                 {HANDSHAKE_TIMEOUT:?}"
            )
        })?
        .with_context(|| format!("the agent of sandbox {id} refused the WebSocket handshake"))?;
    Ok(socket)
}

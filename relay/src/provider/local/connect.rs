//! Reaching a sandbox's agent: a Unix socket connection to `agent.sock`, upgraded to a
//! WebSocket at `ws://sandbox/v1/agent` that presents the sandbox's agent token.

use std::io;
use std::path::Path;
use std::pin::Pin;

use anyhow::{anyhow, Context};
use tokio::net::UnixStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{header::AUTHORIZATION, HeaderValue};

use super::constants::{AGENT_URL, HANDSHAKE_TIMEOUT};
use crate::provider::{AgentIo, AgentSocket, ProviderError};

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
    let mut request = AGENT_URL
        .into_client_request()
        .context("building the agent request")?;
    let bearer = HeaderValue::from_str(&format!("Bearer {agent_token}"))
        .context("the agent token cannot be sent in an HTTP header")?;
    request.headers_mut().insert(AUTHORIZATION, bearer);

    let io: Pin<Box<dyn AgentIo>> = Box::pin(stream);
    let handshake = tokio_tungstenite::client_async(request, io);
    let (socket, _response) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
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

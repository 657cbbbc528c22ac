//! The agent's tunnel: finding the one Modal opened for the agent's port
//! (`SandboxGetTunnels`), and opening the agent's WebSocket through it once the agent listens.

use std::time::Instant;

use anyhow::anyhow;
use reqwest::header::HeaderMap;

use super::client::Modal;
use super::pb;
use crate::provider::cloud::constants::{AGENT_PORT, AGENT_START_TIMEOUT, POLL_INTERVAL};
use crate::provider::cloud::websocket::{self, EdgeError};
use crate::provider::{AgentSocket, ProviderError};

/// The server-side wait of one `SandboxGetTunnels` call, in seconds.
const LONG_POLL_SECS: f32 = 55.0;

/// The agent's tunnel URL, once Modal has opened it.
pub(super) async fn find(
    modal: &Modal,
    sandbox_id: &str,
    tls: bool,
) -> Result<String, ProviderError> {
    let deadline = Instant::now() + AGENT_START_TIMEOUT;
    loop {
        let req = pb::SandboxGetTunnelsRequest {
            sandbox_id: sandbox_id.to_string(),
            timeout: LONG_POLL_SECS,
        };
        let answer = modal
            .call("SandboxGetTunnels", req, |mut c, r| async move {
                c.sandbox_get_tunnels(r).await
            })
            .await?;
        if let Some(t) = answer
            .tunnels
            .iter()
            .find(|t| t.container_port == u32::from(AGENT_PORT))
        {
            let scheme = if tls { "wss" } else { "ws" };
            return Ok(format!("{scheme}://{}:{}", t.host, t.port));
        }
        if Instant::now() > deadline {
            return Err(ProviderError::Other(anyhow!(
                "Modal opened no tunnel for port {AGENT_PORT} of sandbox {sandbox_id} within {AGENT_START_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Opens the agent's WebSocket, waiting while the agent is still starting.
pub(super) async fn open_when_ready(
    http: &reqwest::Client,
    url: &str,
    agent_token: &str,
) -> Result<AgentSocket, EdgeError> {
    let deadline = Instant::now() + AGENT_START_TIMEOUT;
    loop {
        match websocket::open(http, url, HeaderMap::new(), agent_token).await {
            Ok(socket) => return Ok(socket),
            Err(
                e @ (EdgeError::Network(_)
                | EdgeError::Refused {
                    status: 502..=504, ..
                }),
            ) if Instant::now() < deadline => {
                tracing::debug!("Modal tunnel {url}: agent not ready yet ({e})");
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

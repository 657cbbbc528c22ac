//! The agent's tunnel: finding the one Modal opened for the agent's port
//! (`SandboxGetTunnels`), and opening the agent's WebSocket through it once the agent listens.

use std::time::{Duration, Instant};

use anyhow::anyhow;
use reqwest::header::HeaderMap;

use super::client::Modal;
use super::pb;
use crate::cloud::constants::{AGENT_PORT, AGENT_START_TIMEOUT, POLL_INTERVAL};
use crate::cloud::websocket::{self, EdgeError};
use tether_relay_core::provider::{AgentSocket, ProviderError};

/// The server-side wait of one `SandboxGetTunnels` call, in seconds.
const LONG_POLL_SECS: f32 = 55.0;
/// How long a new sandbox may wait for capacity before its tunnel opens: the SDK's
/// `_SANDBOX_SCHEDULING_TIMEOUT` (its create waits this long for the sandbox's task).
const SCHEDULING_TIMEOUT: Duration = Duration::from_secs(21 * 60);

/// The agent's tunnel URL, once Modal has opened it: after the sandbox is scheduled, which
/// may take as long as the SDK waits for it; a sandbox that ends first fails at once.
pub(super) async fn find(
    modal: &Modal,
    sandbox_id: &str,
    tls: bool,
) -> Result<String, ProviderError> {
    let deadline = Instant::now() + SCHEDULING_TIMEOUT;
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
        if let Some(result) = answer.result {
            return Err(ProviderError::Other(anyhow!(
                "Modal sandbox {sandbox_id} ended before opening its tunnel (status {}, exit \
                 code {}): {}; the image must have tether-agent on its PATH and no ENTRYPOINT",
                result.status,
                result.exitcode,
                result.exception
            )));
        }
        if Instant::now() > deadline {
            return Err(ProviderError::Other(anyhow!(
                "Modal opened no tunnel for port {AGENT_PORT} of sandbox {sandbox_id} within \
                 {SCHEDULING_TIMEOUT:?} (Modal found no capacity for it)"
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

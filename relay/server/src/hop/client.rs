//! The entry relay's side of the relay-to-relay hop: a WebSocket to the owner's
//! `/v1/cluster/sandboxes/{id}/ws`, which the owner joins to the sandbox's agent, so the
//! entry relay gets what a provider's `connect` gives (an [`AgentSocket`]) and its tunnel,
//! preview or session code runs unchanged over it; and a delete. Each carries a grant, never
//! the client's token. A peer serving TLS is trusted as clients trust relays: the webpki roots
//! and the CA certificates in `TETHER_CA_CERT`.

use anyhow::anyhow;
use hyper::header::{HeaderMap, HeaderValue};
use tether_client::api::ErrorBody;
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;

use crate::cluster::grant::{Op, GRANT_HEADER};
use crate::constants::HOP_CONNECT_TIMEOUT;
use crate::state::{now_ms, Relay};
use tether_relay_core::provider::upgrade::{self, UpgradeError};
use tether_relay_core::provider::{AgentSocket, ProviderError};
use tether_store::{NodeId, SandboxRecord};

/// A session to `sandbox`'s agent through its owner `node` at `address`.
pub(super) async fn session(
    relay: &Relay,
    node: &NodeId,
    address: &str,
    sandbox: &SandboxRecord,
) -> Result<AgentSocket, ProviderError> {
    let grant = relay.cluster.grants.issue(
        Op::Session,
        &sandbox.id,
        &sandbox.tenant,
        &relay.node,
        node,
        now_ms(),
    );
    let url = format!(
        "{}/v1/cluster/sandboxes/{}/ws",
        address.replacen("http", "ws", 1),
        sandbox.id
    );
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| anyhow!("relay {node} has an unusable address {address}: {e}"))?;
    let mut headers = HeaderMap::new();
    let value = HeaderValue::from_str(&grant).map_err(|e| anyhow!("a grant header: {e}"))?;
    headers.insert(GRANT_HEADER, value);
    let host = uri.host().unwrap_or_default().to_string();
    let tls = uri.scheme_str() == Some("wss");
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let unreachable = |e: &dyn std::fmt::Display| {
        ProviderError::Unavailable(format!(
            "cannot reach relay {node} at {address}, which runs sandbox {}: {e}; the sandbox \
             is unavailable until that relay is back",
            sandbox.id
        ))
    };
    let connect = TcpStream::connect((host.trim_matches(['[', ']']), port));
    let tcp = tokio::time::timeout(HOP_CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| unreachable(&"the connection timed out"))?
        .map_err(|e| unreachable(&e))?;
    let _ = tcp.set_nodelay(true);
    // A plain connection stays a `TcpStream`, which both relays can splice.
    let handshake = async {
        if tls {
            let name = ServerName::try_from(host.clone()).map_err(|e| {
                UpgradeError::Invalid(format!(
                    "relay {node}'s address {address} names no valid host: {e}"
                ))
            })?;
            let connector = tokio_rustls::TlsConnector::from(relay.cluster.tls.clone());
            let io = connector
                .connect(name, tcp)
                .await
                .map_err(|e| UpgradeError::Broken(e.to_string()))?;
            upgrade::upgrade(io, &url, headers).await
        } else {
            upgrade::upgrade(tcp, &url, headers).await
        }
    };
    match tokio::time::timeout(HOP_CONNECT_TIMEOUT, handshake).await {
        Err(_) => Err(unreachable(&"the WebSocket handshake timed out")),
        Ok(Ok(socket)) => Ok(socket),
        Ok(Err(UpgradeError::Refused { status, body, .. })) => {
            Err(refused(node, sandbox, status, body.as_bytes()))
        }
        Ok(Err(e)) => Err(unreachable(&e)),
    }
}

/// Deletes, pauses, resumes, stops or starts (`op`) `sandbox` at its provider through its
/// owner `node` at `address`.
pub(super) async fn act(
    relay: &Relay,
    op: Op,
    node: &NodeId,
    address: &str,
    sandbox: &SandboxRecord,
) -> Result<(), ProviderError> {
    let grant = relay.cluster.grants.issue(
        op,
        &sandbox.id,
        &sandbox.tenant,
        &relay.node,
        node,
        now_ms(),
    );
    let url = format!("{address}/v1/cluster/sandboxes/{}", sandbox.id);
    let request = match op {
        Op::Delete => relay.cluster.http.delete(&url),
        Op::Session => unreachable!("a session is a WebSocket: `session` opens it"),
        _ => relay.cluster.http.post(format!("{url}/{}", op.name())),
    };
    let verb = op.name();
    let sent = request.header(GRANT_HEADER, grant).send().await;
    let response = sent.map_err(|e| {
        ProviderError::Unavailable(format!(
            "cannot reach relay {node} at {address}, which runs sandbox {}, to {verb} it: {e}; \
             try again once that relay is back",
            sandbox.id
        ))
    })?;
    let status = response.status().as_u16();
    if response.status().is_success() {
        return Ok(());
    }
    let body = response.bytes().await.unwrap_or_default();
    Err(refused(node, sandbox, status, &body))
}

/// What the owner's refusal (`status`, an [`ErrorBody`] in `body`) means here.
fn refused(node: &NodeId, sandbox: &SandboxRecord, status: u16, body: &[u8]) -> ProviderError {
    let message = serde_json::from_slice::<ErrorBody>(body)
        .map(|b| b.error.message)
        .unwrap_or_else(|_| String::from_utf8_lossy(body).into_owned());
    match status {
        404 | 410 => ProviderError::Gone(sandbox.id.to_string()),
        503 => ProviderError::Unavailable(message),
        409 => ProviderError::Conflict(message),
        501 => ProviderError::Unsupported(message),
        401 => ProviderError::Other(anyhow!(
            "relay {node}, which runs sandbox {}, refused this relay: {message}",
            sandbox.id
        )),
        _ => ProviderError::Other(anyhow!(
            "relay {node}, which runs sandbox {}, answered {status}: {message}",
            sandbox.id
        )),
    }
}

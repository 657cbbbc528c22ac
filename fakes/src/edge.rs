//! The fakes' edge: carries one HTTP request (a WebSocket upgrade included) to a TCP port
//! inside a sandbox, as a provider's proxy does. The connection into the sandbox is the
//! agent's port forwarding, so what listens there sees an ordinary HTTP client.

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tether_client::files::splice;

use crate::sandboxes::{DialError, Sandboxes};

/// A listener of its own for one sandbox port (a Daytona preview, a Modal tunnel), closed on
/// drop.
pub(crate) struct PortListener {
    /// Its address.
    pub addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl PortListener {
    /// Serves `router` on a new `127.0.0.1` port.
    pub(crate) async fn bind(router: axum::Router) -> std::io::Result<PortListener> {
        let socket = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = socket.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(socket, router).await;
        });
        Ok(PortListener { addr, task })
    }
}

impl Drop for PortListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Buffer of the in-memory pipe between the HTTP client and the forwarded stream.
const PIPE_BYTES: usize = 64 << 10; // 64 KiB

/// Why a request could not be carried into the sandbox.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    /// The port could not be dialled.
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The server inside broke the exchange.
    #[error("the server on port {port} in sandbox {id} failed the request: {reason}")]
    Upstream {
        /// The sandbox.
        id: String,
        /// The port.
        port: u16,
        /// What broke.
        reason: String,
    },
}

/// Sends `req` to `port` in sandbox `id` and returns its answer. For an upgrade, the two
/// upgraded connections are joined in the background once both sides have switched.
pub(crate) async fn proxy(
    sandboxes: &Sandboxes,
    id: &str,
    port: u16,
    mut req: Request<Body>,
) -> Result<Response<Body>, ProxyError> {
    let stream = sandboxes.dial(id, port).await?;
    let upstream = |reason: String| ProxyError::Upstream {
        id: id.to_string(),
        port,
        reason,
    };
    let (near, far) = tokio::io::duplex(PIPE_BYTES);
    tokio::spawn(async move {
        let _ = splice(stream, far).await;
    });
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(near))
        .await
        .map_err(|e| upstream(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let upgrading = req.headers().contains_key(header::UPGRADE);
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut req));
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| upstream(e.to_string()))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let server_upgrade = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                let (Ok(client), Ok(server)) = (client_upgrade.await, server_upgrade.await) else {
                    return;
                };
                let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    }
    Ok(resp.map(Body::new))
}

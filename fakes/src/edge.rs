//! The fakes' edge: carries one HTTP request (a WebSocket upgrade included) to a TCP port
//! inside a sandbox, as a provider's proxy does. The connection into the sandbox is the
//! agent's port forwarding, so what listens there sees an ordinary HTTP client. A port's own
//! listener can count its open connections ([`Activity`]), for idle timeouts.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tether_client::files::splice;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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

    /// [`PortListener::bind`], counting its open connections in `activity`.
    pub(crate) async fn bind_counted(
        router: axum::Router,
        activity: Arc<Activity>,
    ) -> std::io::Result<PortListener> {
        let socket = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = socket.local_addr()?;
        let counted = Counting {
            inner: socket,
            activity,
        };
        let task = tokio::spawn(async move {
            let _ = axum::serve(counted, router).await;
        });
        Ok(PortListener { addr, task })
    }
}

/// The connections of one or more listeners: how many are open, and since when none has
/// been (what a provider's idle timeout counts).
#[derive(Debug)]
pub(crate) struct Activity {
    open: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Activity {
    /// No connection yet: idle from now.
    pub(crate) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        })
    }

    /// How long no connection has been open; `None` while one is.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        let since = self.idle_since.lock().expect("activity");
        (self.open.load(Ordering::SeqCst) == 0).then(|| since.elapsed())
    }

    fn opened(&self) {
        let _since = self.idle_since.lock().expect("activity");
        self.open.fetch_add(1, Ordering::SeqCst);
    }

    fn closed(&self) {
        let mut since = self.idle_since.lock().expect("activity");
        self.open.fetch_sub(1, Ordering::SeqCst);
        *since = Instant::now();
    }
}

/// A listener whose connections count in an [`Activity`] while they are open.
struct Counting {
    inner: tokio::net::TcpListener,
    activity: Arc<Activity>,
}

/// A connection counted in an [`Activity`] until dropped.
struct Counted {
    io: tokio::net::TcpStream,
    activity: Arc<Activity>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.activity.closed();
    }
}

impl axum::serve::Listener for Counting {
    type Io = Counted;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Counted, std::net::SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok((io, addr)) => {
                    self.activity.opened();
                    let activity = self.activity.clone();
                    return (Counted { io, activity }, addr);
                }
                // Out of descriptors, or a connection reset before it was taken: try again.
                Err(_) => tokio::time::sleep(ACCEPT_RETRY).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Drop for PortListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The pause before accepting again after a failed accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
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

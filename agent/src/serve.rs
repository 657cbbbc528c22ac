//! Where connections come from: TCP listeners, an inherited Unix listener or socket, stdio,
//! or dialling out to a relay. Each accepted connection is upgraded to a WebSocket (checking
//! the token at the upgrade when the client sends one) and handed to [`crate::conn::serve`].

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{header, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tracing::{debug, info, warn};

use tether_proto::{auth, limits};

use crate::agent::Agent;
use crate::{budget, conn, ws_out};

/// Largest WebSocket message accepted: twice the largest frame, so a slightly oversized
/// frame reaches the decoder (and gets a protocol error) while a huge one is cut off.
const MAX_MESSAGE: usize = 2 * (limits::MAX_PAYLOAD + limits::HEADER_LEN);

/// Read buffer of each connection's WebSocket: 16 KiB. The library's default, 128 KiB, is
/// zeroed on the first read and stays resident, which made each idle session cost the agent
/// 163 KiB; with 16 KiB it costs 44 KiB (300 PTY sessions, measured), and a 64 KiB frame
/// takes four reads instead of one.
const READ_BUFFER: usize = 16 << 10;

/// How long to wait before accepting again after `accept` failed.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Backoff when dialling a relay fails: start, cap.
const DIAL_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(10));

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
        .read_buffer_size(READ_BUFFER)
}

/// Accepts TCP connections on `addr` forever.
pub(crate) async fn tcp(addr: SocketAddr, agent: Arc<Agent>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    info!("listening on ws://{local}");
    // A machine-readable readiness line for whoever started us (tests, scripts).
    println!("listening ws://{local}");
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(x) => {
                agent.budget.rearm_spare();
                x
            }
            Err(e) => {
                accept_failed(&agent, &e).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        debug!("connection from {peer}");
        tokio::spawn(upgrade_and_serve(sock, agent.clone()));
    }
}

/// Accepts connections on an inherited, already listening Unix socket forever.
pub(crate) async fn unix_listener(fd: OwnedFd, agent: Arc<Agent>) -> anyhow::Result<()> {
    let std_listener = std::os::unix::net::UnixListener::from(fd);
    std_listener.set_nonblocking(true)?;
    let listener = UnixListener::from_std(std_listener)
        .context("inherited fd is not a listening Unix socket")?;
    accept_unix(listener, agent).await
}

/// Creates a Unix socket at `path` (mode 0600: only the agent's user may connect) and
/// accepts connections on it forever.
pub(crate) async fn unix_path(path: PathBuf, agent: Arc<Agent>) -> anyhow::Result<()> {
    let listener = bind_private(&path).with_context(|| {
        format!(
            "cannot listen on the Unix socket {}: remove what is there, or choose another path",
            path.display()
        )
    })?;
    info!("listening on unix:{}", path.display());
    // A machine-readable readiness line for whoever started us (tests, scripts).
    println!("listening unix:{}", path.display());
    accept_unix(listener, agent).await
}

/// Binds a Unix socket that appears at `path` already restricted to mode 0600. A socket is
/// created with the umask's mode, so binding at `path` and restricting it after would leave
/// a moment in which anyone the umask allows could connect. It is bound in a new directory
/// of mode 0700 beside `path`, restricted there, then hard-linked at `path`, which refuses a
/// path already taken rather than replacing it.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "it names no file"))?;
    let mut staging = parent.to_path_buf();
    staging.push(format!(
        ".{}.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&staging)?;
    let socket = staging.join("s");
    let bound = (|| {
        let listener = UnixListener::bind(&socket)?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
        std::fs::hard_link(&socket, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_dir(&staging);
    bound
}

async fn accept_unix(listener: UnixListener, agent: Arc<Agent>) -> anyhow::Result<()> {
    loop {
        match listener.accept().await {
            Ok((sock, _)) => {
                agent.budget.rearm_spare();
                tokio::spawn(upgrade_and_serve(sock, agent.clone()));
            }
            Err(e) => accept_failed(&agent, &e).await,
        }
    }
}

/// After a failed `accept`: out of descriptors, the spare one is released so the next accept
/// gets the connection (whose streams the budget then refuses, rather than the relay finding
/// the agent unreachable); otherwise, or with no spare left, a pause before trying again
/// instead of a spin.
async fn accept_failed(agent: &Agent, e: &std::io::Error) {
    if budget::out_of_descriptors(e) && agent.budget.release_spare() {
        warn!("accept failed: {e}; using the spare descriptor");
        return;
    }
    warn!("accept failed: {e}");
    tokio::time::sleep(ACCEPT_RETRY).await;
}

/// Serves the one connection on an inherited, connected stream socket.
pub(crate) async fn unix_conn(fd: OwnedFd, agent: Arc<Agent>) -> anyhow::Result<()> {
    let std_sock = std::os::unix::net::UnixStream::from(fd);
    std_sock.set_nonblocking(true)?;
    let sock =
        UnixStream::from_std(std_sock).context("inherited fd is not a connected Unix socket")?;
    upgrade_and_serve(sock, agent).await;
    Ok(())
}

/// Serves one connection over stdin and stdout.
pub(crate) async fn stdio(agent: Arc<Agent>) -> anyhow::Result<()> {
    let io = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
    upgrade_and_serve(io, agent).await;
    Ok(())
}

#[expect(
    clippy::result_large_err,
    reason = "the callback's signature is tungstenite's, large error type included"
)]
async fn upgrade_and_serve<S>(io: S, agent: Arc<Agent>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut authed = false;
    let expected = agent.token.clone();
    let check = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let given = if let Some(value) = req.headers().get(header::AUTHORIZATION) {
            value.to_str().ok().and_then(auth::bearer).unwrap_or("")
        } else if let Some(value) = req.headers().get(auth::TOKEN_HEADER) {
            value.to_str().map(str::trim).unwrap_or("")
        } else {
            return Ok(resp); // the token must then come in hello
        };
        match &expected {
            Some(exp) if !auth::token_matches(given, exp) => {
                let mut refuse = ErrorResponse::new(Some(
                    "wrong sandbox token: pass the token the sandbox was created with\n".into(),
                ));
                *refuse.status_mut() = StatusCode::UNAUTHORIZED;
                Err(refuse)
            }
            _ => {
                authed = true;
                Ok(resp)
            }
        }
    };
    // The upgrade writes its response to the socket; then the agent's own writer takes the
    // socket's writing side, and tungstenite only reads.
    let (read, write) = tokio::io::split(io);
    let io = ws_out::Duplex::new(read, write);
    let config = ws_out::reader_config(ws_config());
    match tokio_tungstenite::accept_hdr_async_with_config(io, check, Some(config)).await {
        Ok(mut ws) => {
            let Some((socket, tap)) = ws.get_mut().take_writer() else {
                unreachable!("a fresh connection's writer is taken once");
            };
            conn::serve(ws_out::Writer::new(socket, tap), &mut ws, agent, authed).await;
            // The close frame is out (the writer has ended); read on until the client
            // closes too, so it is not reset while still sending (an oversized message) and
            // does read why the connection closed.
            tether_proto::linger::linger(ws.get_mut()).await;
        }
        Err(e) => debug!("WebSocket upgrade failed: {e}"),
    }
}

/// Dials `url` and serves the protocol over each connection, keeping one idle connection
/// open: as soon as a relay starts using one (its hello arrives), another is dialled.
pub(crate) async fn dial(url: String, agent: Arc<Agent>) -> anyhow::Result<()> {
    let mut backoff = DIAL_BACKOFF.0;
    loop {
        let mut req = url
            .as_str()
            .into_client_request()
            .with_context(|| format!("invalid relay URL {url}"))?;
        if let Some(token) = &agent.token {
            req.headers_mut().insert(
                header::AUTHORIZATION,
                format!("Bearer {token}")
                    .parse()
                    .context("token is not a valid header value")?,
            );
        }
        match tokio_tungstenite::connect_async_with_config(req, Some(ws_config()), true).await {
            Ok((mut ws, _)) => {
                backoff = DIAL_BACKOFF.0;
                // Wait until the relay speaks on this connection before dialling the next.
                use futures_util::StreamExt;
                let first = loop {
                    match ws.next().await {
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                        other => break other,
                    }
                };
                let Some(Ok(first)) = first else {
                    continue;
                };
                let agent = agent.clone();
                tokio::spawn(async move {
                    let (sink, source) = ws.split();
                    let source =
                        futures_util::stream::once(std::future::ready(Ok(first))).chain(source);
                    // We dialled the relay we were configured with, so it is trusted.
                    conn::serve(conn::SinkWriter(sink), source, agent, true).await;
                });
            }
            Err(e) => {
                warn!("cannot reach relay at {url}: {e}; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(DIAL_BACKOFF.1);
            }
        }
    }
}

//! The data path: `GET /v1/sandboxes/{id}/ws` upgrades the client, opens a fresh connection
//! to the sandbox's agent, and carries the session between them.
//!
//! The relay answers the client's upgrade itself, once the agent's side is open (so a
//! sandbox it cannot reach is a 502 before the upgrade): the accept of the client's key, no
//! extension and no subprotocol (none could pass through), and the longest interval it needs
//! between the client's pings (`x-tether-ping-interval`, a third of the peer timeout). The
//! session then runs end to end, and how the relay carries it depends on whether it can hear
//! both sides alive without pinging them itself:
//!
//! - **Spliced** (`splice`): when the client announced that it pings as often as asked, or
//!   the peer timeout is long enough for the agent's own pings, the relay copies bytes both
//!   ways without reading them. A side silent for the peer timeout is dropped with the other.
//! - **Forwarded** (below): otherwise, the relay reads messages and forwards them unchanged,
//!   answering and sending pings itself. Binary payloads move as the same `Bytes` from one
//!   socket to the other; whatever is already waiting is written in one batch with one flush.
//!   Each hop is watched on its own: the relay pings the client and the agent, and a side
//!   from which nothing at all (not even a pong) arrives for the peer timeout (`tether serve
//!   --peer-timeout`) is taken for dead, exactly as if its connection had dropped: the other
//!   side is closed, so the agent kills the session's foreground processes. A client that
//!   breaks the WebSocket protocol is closed with the code RFC 6455 gives its fault (1002,
//!   1007, 1009).
//!
//! Either way a black-holed connection, whose packets vanish without a reset, cannot hold a
//! session open for as long as TCP keeps retrying, or forever when nothing is being sent.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use futures_util::{FutureExt, Sink, SinkExt, Stream, StreamExt};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tether_proto::{keepalive, limits};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame, Role};
use tokio_tungstenite::tungstenite::{self as ts, protocol::WebSocketConfig, Message};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::activity::TunnelGuard;
use super::constants::{CLOSE_GRACE, MAX_BATCH, MAX_MESSAGE, SPLICE_UNANNOUNCED_MIN_TIMEOUT};
use super::error::ApiError;
use super::splice::{self, Conn, End, Raw};
use super::state::{find, Relay};
use crate::caller::Caller;
use tether_relay_core::provider::{AgentSocket, ProviderError, SandboxState};
use tether_store::SandboxId;

/// Close code sent to the client when the agent's side ends without a close (1011).
const AGENT_LOST: u16 = 1011;
/// Close code sent to either side when the relay shuts down or the client vanished (1001).
const GOING_AWAY: u16 = 1001;
/// Close code for a peer that broke the WebSocket protocol (RFC 6455 §7.4.1).
const PROTOCOL_ERROR: u16 = 1002;
/// Close code for a text message that is not UTF-8 (RFC 6455 §7.4.1).
const INVALID_PAYLOAD: u16 = 1007;
/// Close code for a message over the size limit (RFC 6455 §7.4.1).
const MESSAGE_TOO_BIG: u16 = 1009;
/// Read buffer of the client's WebSocket when the relay forwards messages: 32 KiB. The
/// library default, 128 KiB, is zeroed on the first read and stays resident, which made
/// 1,000 idle tunnels cost 128 MiB; a 64 KiB data frame now takes two reads instead of one.
const CLIENT_READ_BUFFER: usize = 32 << 10;
/// The most often the relay pings either side, or asks the client to: 100 ms, whatever the
/// peer timeout.
const MIN_PING_PERIOD: Duration = keepalive::MIN_PING_INTERVAL;

/// A client's WebSocket upgrade, checked as RFC 6455 §4.2.1 asks of a server.
pub(super) struct ClientUpgrade {
    /// Its `Sec-WebSocket-Key`.
    key: HeaderValue,
    /// Whether it announced that it pings as often as the `101` asks.
    pings_when_asked: bool,
    /// The connection, once the `101` is sent.
    on_upgrade: OnUpgrade,
}

impl<S: Send + Sync> FromRequestParts<S> for ClientUpgrade {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<ClientUpgrade, ApiError> {
        let refuse = |what: &str| {
            ApiError::Invalid(format!(
                "{what}: this endpoint is a WebSocket; connect with a WebSocket client"
            ))
        };
        let headers = &parts.headers;
        if !has_token(headers, header::CONNECTION, "upgrade") {
            return Err(refuse("the Connection header does not include 'upgrade'"));
        }
        if !has_token(headers, header::UPGRADE, "websocket") {
            return Err(refuse("the Upgrade header does not include 'websocket'"));
        }
        if headers
            .get(header::SEC_WEBSOCKET_VERSION)
            .map(|v| v.as_bytes())
            != Some(b"13")
        {
            return Err(refuse("the Sec-WebSocket-Version header is not 13"));
        }
        let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).cloned() else {
            return Err(refuse("the Sec-WebSocket-Key header is missing"));
        };
        let pings_when_asked = headers
            .get(keepalive::PING_INTERVAL_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(keepalive::parse_interval)
            .is_some();
        let Some(on_upgrade) = parts.extensions.remove::<OnUpgrade>() else {
            return Err(refuse("this connection cannot be upgraded"));
        };
        Ok(ClientUpgrade {
            key,
            pings_when_asked,
            on_upgrade,
        })
    }
}

/// Whether the comma-separated header `name` lists `token` (case-insensitively).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

impl ClientUpgrade {
    /// The `101` that completes the upgrade, asking for a ping at least every `ping`.
    fn accept(&self, ping: Duration) -> Response {
        let accept = derive_accept_key(self.key.as_bytes());
        Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_ACCEPT, accept)
            .header(
                keepalive::PING_INTERVAL_HEADER,
                keepalive::format_interval(ping),
            )
            .body(Body::empty())
            .expect("a 101 of valid headers")
    }
}

/// `GET /v1/sandboxes/{id}/ws`.
pub(super) async fn open(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(id): Path<String>,
    upgrade: Result<ClientUpgrade, ApiError>,
) -> Result<Response, ApiError> {
    let upgrade = upgrade?;
    let mut sandbox = find(&relay, &caller, id).await?;
    let provider = relay.provider_of(&sandbox)?;
    if sandbox.state == SandboxState::Dead {
        return Err(ApiError::dead(&sandbox.id));
    }
    let guard = admit(&relay, &sandbox.id)?;
    relay.record_activity(&sandbox.id).await;
    relay.wake(&*provider, &mut sandbox).await?;
    let agent = match relay.connect_agent(&*provider, &sandbox).await {
        Ok(agent) => agent,
        Err(ProviderError::Unavailable(message)) => return Err(ApiError::Unavailable(message)),
        Err(e @ ProviderError::Gone(_)) => {
            // Its state says which: dead (what it holds is still there, for `rm`) or gone.
            relay.refresh_state(&*provider, &mut sandbox).await;
            if sandbox.state == SandboxState::Dead {
                return Err(ApiError::dead(&sandbox.id));
            }
            return Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e));
        }
        Err(e) => {
            return Err(ApiError::Provider(format!(
                "cannot reach the agent of sandbox {}: {e:#}; `tether rm {}` and create a \
                 new one if this persists",
                sandbox.id, sandbox.id
            )))
        }
    };
    let keep_alive = keep_alive(provider, sandbox.handle());
    Ok(carry_session(relay, upgrade, agent, guard, keep_alive))
}

/// Admits one more tunnel to sandbox `id`: refused now (503) when the relay is short of
/// descriptors (the agent's socket is one more: better than failing half-open) or has as many
/// tunnels as it allows. Counted from before the agent's connect, so the reaper cannot idle
/// the sandbox out meanwhile.
pub(super) fn admit(relay: &Relay, id: &SandboxId) -> Result<TunnelGuard, ApiError> {
    relay
        .fds
        .admit()
        .map_err(|shortage| ApiError::Unavailable(shortage.to_string()))?;
    relay
        .tunnels
        .open(id.clone())
        .map_err(|full| ApiError::Unavailable(full.to_string()))
}

/// Answers the client's `upgrade` and carries the session between it and `agent` until it
/// ends: spliced when the relay can hear both sides alive by their bytes alone, forwarded
/// message by message otherwise. `guard` counts the tunnel (and is dropped with it);
/// `keep_alive`, the task keeping the sandbox alive at its provider, is aborted at the end.
/// The owner's side of a relay-to-relay hop carries its peer's session the same way.
pub(super) fn carry_session(
    relay: Arc<Relay>,
    upgrade: ClientUpgrade,
    agent: AgentSocket,
    guard: TunnelGuard,
    keep_alive: Option<tokio::task::JoinHandle<()>>,
) -> Response {
    let peer_timeout = relay.peer_timeout;
    let spliced = upgrade.pings_when_asked || peer_timeout >= SPLICE_UNANNOUNCED_MIN_TIMEOUT;
    debug!(
        "tunnel to sandbox {} open ({})",
        guard.id(),
        if spliced {
            "spliced"
        } else {
            "forwarding frames"
        }
    );
    let response = upgrade.accept(ping_period(peer_timeout));
    // Shutdown waits for tunnels through this token, not through hyper: an upgraded
    // connection has left hyper's hands.
    let task = relay.tasks.token();
    tokio::spawn(async move {
        match upgrade.on_upgrade.await {
            Ok(client) if spliced => {
                carry(client, agent, peer_timeout, &relay.shutdown).await;
            }
            Ok(client) => {
                let client = client_websocket(client).await;
                let agent = agent.into_websocket().await;
                forward(client, agent, peer_timeout, relay.shutdown.clone()).await;
            }
            Err(e) => debug!("the client's upgrade to sandbox {} failed: {e}", guard.id()),
        }
        if let Some(task) = keep_alive {
            task.abort();
        }
        relay.record_activity(guard.id()).await;
        debug!("tunnel to sandbox {} closed", guard.id());
        drop((guard, task));
    });
    response
}

/// Splices `client` and `agent` until the session ends, and logs how it did.
async fn carry(
    client: Upgraded,
    agent: AgentSocket,
    peer_timeout: Duration,
    shutdown: &CancellationToken,
) {
    // A plain TCP client can be spliced; under TLS (or anything else) hyper's stream is
    // copied, and it gives back what it read past the request itself.
    let (client, client_early) = match client.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => (Conn::Raw(Raw::Tcp(parts.io.into_inner())), parts.read_buf),
        Err(client) => (Conn::Stream(Box::pin(TokioIo::new(client))), Bytes::new()),
    };
    let (agent, agent_early) = agent.into_parts();
    let done = splice::run(
        client,
        client_early,
        agent.into(),
        agent_early,
        peer_timeout,
        shutdown,
    )
    .await;
    let silence = seconds(peer_timeout);
    match done.end {
        End::AgentSilent => warn!(
            "the sandbox's agent was silent for {silence}; closing a tunnel to it ({} bytes \
             up, {} down)",
            done.up, done.down
        ),
        end => debug!(
            "spliced tunnel ended ({end:?}; {} bytes up, {} down; peer timeout {silence})",
            done.up, done.down
        ),
    }
}

/// The client's connection as a WebSocket whose messages the relay reads.
async fn client_websocket(client: Upgraded) -> WebSocketStream<TokioIo<Upgraded>> {
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
        .read_buffer_size(CLIENT_READ_BUFFER);
    WebSocketStream::from_raw_socket(TokioIo::new(client), Role::Server, Some(config)).await
}

/// While a session is open, pushes ahead the timer of a provider that would end the sandbox
/// under it (E2B's timeout); the task is aborted when the session ends.
fn keep_alive(
    provider: Arc<dyn tether_relay_core::provider::Provider>,
    handle: tether_relay_core::provider::SandboxHandle,
) -> Option<tokio::task::JoinHandle<()>> {
    let every = provider.keep_alive_every(&handle)?;
    Some(tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = provider.keep_alive(&handle).await {
                warn!(
                    "cannot keep sandbox {} alive at its provider: {e}",
                    handle.id
                );
            }
        }
    }))
}

/// Forwards messages between `client` and `agent` until both sides have closed (or one has
/// and the other has not answered within [`CLOSE_GRACE`]), until either side is silent for
/// `peer_timeout`, or until `shutdown` fires.
async fn forward<C, A>(
    client: WebSocketStream<C>,
    agent: A,
    peer_timeout: Duration,
    shutdown: CancellationToken,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    A: Stream<Item = Result<Message, ts::Error>> + Sink<Message> + Unpin,
{
    let (mut client_tx, mut client_source) = client.split();
    let (mut agent_tx, agent_rx) = agent.split();
    let violation = {
        // Borrowed, so that the client's connection can be put back together at the end.
        let client_rx = (&mut client_source).take_until(shutdown.clone().cancelled_owned());
        let mut client_rx = std::pin::pin!(client_rx);
        let mut agent_rx = std::pin::pin!(agent_rx.take_until(shutdown.clone().cancelled_owned()));
        let up = async {
            let end = pump(&mut client_rx, &mut agent_tx, peer_timeout).await;
            let violation = match &end {
                Ended::Closed => return None,
                Ended::Broken(e) => violation(e),
                Ended::Lost | Ended::Silent => None,
            };
            // The client vanished without a close, went silent, broke the protocol, or the
            // relay stops.
            let silent;
            let reason = if violation.is_some() {
                "the client broke the WebSocket protocol"
            } else if shutdown.is_cancelled() {
                "the relay is shutting down"
            } else if matches!(end, Ended::Silent) {
                silent = format!("the client was silent for {}", seconds(peer_timeout));
                debug!("{silent}; closing its tunnel");
                &silent
            } else {
                "the client went away"
            };
            let _ = agent_tx.send(close(GOING_AWAY, reason)).await;
            violation
        };
        let down = async {
            let end = pump(&mut agent_rx, &mut client_tx, peer_timeout).await;
            if !matches!(end, Ended::Closed) {
                let (code, reason) = if shutdown.is_cancelled() {
                    (GOING_AWAY, "the relay is shutting down".to_string())
                } else if matches!(end, Ended::Silent) {
                    let reason = format!(
                        "the sandbox's agent was silent for {}",
                        seconds(peer_timeout)
                    );
                    warn!("{reason}; closing a tunnel to it");
                    (AGENT_LOST, reason)
                } else {
                    (
                        AGENT_LOST,
                        "lost the connection to the sandbox's agent".to_string(),
                    )
                };
                let _ = client_tx.send(close(code, &reason)).await;
            }
        };
        tokio::pin!(up, down);
        tokio::select! {
            violation = &mut up => {
                // A client that broke the protocol gets its close code now, not the agent's.
                if violation.is_none() {
                    let _ = tokio::time::timeout(CLOSE_GRACE, &mut down).await;
                }
                violation
            }
            () = &mut down => tokio::time::timeout(CLOSE_GRACE, &mut up).await.ok().flatten(),
        }
    };
    if let Some((code, reason)) = violation {
        debug!("closing a tunnel with {code}: {reason}");
        let _ = client_tx.send(close(code, reason)).await;
        // The client may still be sending (the rest of an oversized message): read on until
        // it closes, or it is reset before it reads the close frame and sees 1006.
        if let Ok(mut client) = client_tx.reunite(client_source) {
            tether_proto::linger::linger(client.get_mut()).await;
        }
    }
}

/// A close message with `code` and `reason`.
fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason.into(),
    }))
}

/// A duration as a close reason or log line says it: `30s`, `2.5s`.
fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// The close code and reason RFC 6455 gives a client's WebSocket error, if it is the client's
/// fault rather than a lost connection.
fn violation(e: &ts::Error) -> Option<(u16, &'static str)> {
    match e {
        ts::Error::Capacity(_) => Some((
            MESSAGE_TOO_BIG,
            "message too big: the limit is twice the largest protocol frame",
        )),
        ts::Error::Utf8(_) => Some((INVALID_PAYLOAD, "a text message is not valid UTF-8")),
        ts::Error::Protocol(_) => Some((PROTOCOL_ERROR, "WebSocket protocol violation")),
        _ => None,
    }
}

/// How a pump ended.
enum Ended<E> {
    /// A close was forwarded.
    Closed,
    /// The source ended, or the sink failed.
    Lost,
    /// Nothing came from the source for the peer timeout.
    Silent,
    /// The source failed with this error.
    Broken(E),
}

/// What the pump does with one message.
enum Step {
    /// Forward it.
    Data(Message),
    /// Forward this close, and stop.
    Close(Message),
    /// Drop it (pings and pongs: each side's WebSocket answers its own).
    Skip,
}

/// Moves messages from `source` to `sink` until a close has been forwarded, either side fails
/// or ends, or the source is silent for `timeout`; meanwhile pings the sink's peer often
/// enough that a live one is never taken for dead (its pongs come back on the other pump's
/// source).
async fn pump<S, K>(source: &mut S, sink: &mut K, timeout: Duration) -> Ended<ts::Error>
where
    S: Stream<Item = Result<Message, ts::Error>> + Unpin,
    K: Sink<Message> + Unpin,
{
    let period = ping_period(timeout);
    let mut ping = tokio::time::interval_at(Instant::now() + period, period);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The deadline is moved on lazily, when it fires, rather than for every message: one
    // clock read per batch is all the hot path pays.
    let mut heard = Instant::now();
    let deadline = tokio::time::sleep_until(heard + timeout);
    tokio::pin!(deadline);
    loop {
        let mut next = tokio::select! {
            next = source.next() => next,
            _ = ping.tick() => {
                if sink.send(Message::Ping(Bytes::new())).await.is_err() {
                    return Ended::Lost;
                }
                continue;
            }
            () = &mut deadline => {
                if heard.elapsed() >= timeout {
                    let _ = sink.flush().await;
                    return Ended::Silent;
                }
                deadline.as_mut().reset(heard + timeout);
                continue;
            }
        };
        heard = Instant::now();
        let mut batched = 0;
        loop {
            let msg = match next {
                Some(Ok(msg)) => msg,
                Some(Err(e)) => {
                    let _ = sink.flush().await;
                    return Ended::Broken(e);
                }
                None => {
                    let _ = sink.flush().await;
                    return Ended::Lost;
                }
            };
            match step(msg) {
                Step::Data(msg) => {
                    if sink.feed(msg).await.is_err() {
                        return Ended::Lost;
                    }
                }
                Step::Close(msg) => {
                    let _ = sink.send(msg).await;
                    // Keep reading until the source ends: the WebSocket sends its reply to
                    // the close it received only when read again.
                    while let Some(Ok(_)) = source.next().await {}
                    return Ended::Closed;
                }
                Step::Skip => {}
            }
            batched += 1;
            if batched == MAX_BATCH {
                break;
            }
            // Take what has already arrived without waiting; `next` is cancel-safe.
            match source.next().now_or_never() {
                Some(item) => next = item,
                None => break,
            }
        }
        if sink.flush().await.is_err() {
            return Ended::Lost;
        }
    }
}

/// How often to ping a peer that is taken for dead after `timeout` of silence: a third of it
/// (so two pongs may be late), and never less often than the protocol asks.
fn ping_period(timeout: Duration) -> Duration {
    let most = Duration::from_secs(limits::PING_INTERVAL_SECS - 5);
    (timeout / 3).clamp(MIN_PING_PERIOD, most)
}

fn step(msg: Message) -> Step {
    match msg {
        Message::Binary(_) | Message::Text(_) => Step::Data(msg),
        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => Step::Skip,
        Message::Close(_) => Step::Close(msg),
    }
}

//! The data path: `GET /v1/sandboxes/{id}/ws` upgrades the client, opens a fresh connection
//! to the sandbox's agent, and forwards messages both ways unchanged.
//!
//! Nothing is parsed: the protocol's handshake and its per-stream credit pass through, so flow
//! control is end to end and the relay holds at most one batch per direction. Binary payloads
//! move as the same `Bytes` from one socket to the other. Whatever is already waiting is
//! written in one batch with one flush; a lone message is flushed at once. Pings are answered
//! by each side's WebSocket; a close from either side is passed on. A client that breaks the
//! WebSocket protocol is closed with the code RFC 6455 gives its fault (1002, 1007, 1009).
//!
//! Each hop is watched on its own: the relay pings the client and the agent, and a side from
//! which nothing at all (not even a pong) arrives for the peer timeout (`tether serve
//! --peer-timeout`) is taken for dead, exactly as if its connection had dropped: the other
//! side is closed, so the agent kills the session's foreground processes. A black-holed
//! connection, whose packets vanish without a reset, would otherwise hold the session open
//! for as long as TCP keeps retrying, or forever when nothing is being sent.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{self, rejection::WebSocketUpgradeRejection, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::Response;
use bytes::Bytes;
use futures_util::{FutureExt, Sink, SinkExt, Stream, StreamExt};
use tether_proto::limits;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{self as ts, protocol::frame::coding::CloseCode};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::auth::Caller;
use super::constants::{CLOSE_GRACE, MAX_BATCH, MAX_MESSAGE};
use super::error::ApiError;
use super::sandboxes::find;
use super::state::{now_ms, Relay};
use crate::provider::{AgentSocket, ProviderError, SandboxState};

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
/// Read buffer of the client's WebSocket: 32 KiB. The library default, 128 KiB, is zeroed on
/// the first read and stays resident, which made 1,000 idle tunnels cost 128 MiB; a 64 KiB
/// data frame now takes two reads instead of one.
pub(super) const CLIENT_READ_BUFFER: usize = 32 << 10;
/// The most often the relay pings either side: 100 ms, whatever the peer timeout.
const MIN_PING_PERIOD: Duration = Duration::from_millis(100);

/// `GET /v1/sandboxes/{id}/ws`.
pub(super) async fn open(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(id): Path<String>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = upgrade.map_err(|e| {
        ApiError::Invalid(format!(
            "{}: this endpoint is a WebSocket; connect with a WebSocket client",
            e.body_text()
        ))
    })?;
    let mut sandbox = find(&relay, &caller, id).await?;
    let provider = relay.provider_of(&sandbox)?;
    if sandbox.state == SandboxState::Dead {
        return Err(ApiError::dead(&sandbox.id));
    }
    // The agent's socket is one more descriptor: refuse now rather than fail half-open.
    relay
        .fds
        .admit()
        .map_err(|shortage| ApiError::Unavailable(shortage.to_string()))?;
    // Counted from before the connect, so the reaper cannot idle it out meanwhile.
    let guard = relay
        .tunnels
        .open(sandbox.id.clone())
        .map_err(|full| ApiError::Unavailable(full.to_string()))?;
    relay
        .registry
        .touch(vec![sandbox.id.clone()], now_ms())
        .await?;
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
    debug!("tunnel to sandbox {} open", sandbox.id);
    // Shutdown waits for tunnels through this token, not through hyper: an upgraded
    // connection has left hyper's hands.
    let task = relay.tasks.token();
    Ok(upgrade
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .read_buffer_size(CLIENT_READ_BUFFER)
        .on_upgrade(move |client| async move {
            let keep_alive = keep_alive(provider, sandbox.handle());
            forward(client, agent, relay.peer_timeout, relay.shutdown.clone()).await;
            if let Some(task) = keep_alive {
                task.abort();
            }
            if let Err(e) = relay
                .registry
                .touch(vec![guard.id().clone()], now_ms())
                .await
            {
                warn!("cannot record activity on sandbox {}: {e}", guard.id());
            }
            debug!("tunnel to sandbox {} closed", guard.id());
            drop((guard, task));
        }))
}

/// While a session is open, pushes ahead the timer of a provider that would end the sandbox
/// under it (E2B's timeout); the task is aborted when the session ends.
fn keep_alive(
    provider: Arc<dyn crate::provider::Provider>,
    handle: crate::provider::SandboxHandle,
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

/// Forwards between `client` and `agent` until both sides have closed (or one has and the
/// other has not answered within [`CLOSE_GRACE`]), until either side is silent for
/// `peer_timeout`, or until `shutdown` fires.
pub(super) async fn forward(
    client: WebSocket,
    agent: AgentSocket,
    peer_timeout: Duration,
    shutdown: CancellationToken,
) {
    let (mut client_tx, client_rx) = client.split();
    let (mut agent_tx, agent_rx) = agent.split();
    let mut client_rx = std::pin::pin!(client_rx.take_until(shutdown.clone().cancelled_owned()));
    let mut agent_rx = std::pin::pin!(agent_rx.take_until(shutdown.clone().cancelled_owned()));
    // Each pump watches its source for silence and pings its sink: the pongs of the sink's
    // peer come back on the other pump's source.
    let watch_client = Liveness {
        timeout: peer_timeout,
        ping: || ts::Message::Ping(Bytes::new()),
    };
    let watch_agent = Liveness {
        timeout: peer_timeout,
        ping: || ws::Message::Ping(Bytes::new()),
    };

    let violation = {
        let up = async {
            let end = pump(&mut client_rx, &mut agent_tx, client_to_agent, watch_client).await;
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
            let frame = ts::protocol::CloseFrame {
                code: CloseCode::from(GOING_AWAY),
                reason: reason.into(),
            };
            let _ = agent_tx.send(ts::Message::Close(Some(frame))).await;
            violation
        };
        let down = async {
            let end = pump(&mut agent_rx, &mut client_tx, agent_to_client, watch_agent).await;
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
                let frame = ws::CloseFrame {
                    code,
                    reason: reason.into(),
                };
                let _ = client_tx.send(ws::Message::Close(Some(frame))).await;
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
        let frame = ws::CloseFrame {
            code,
            reason: reason.into(),
        };
        let _ = client_tx.send(ws::Message::Close(Some(frame))).await;
    }
}

/// A duration as a close reason or log line says it: `30s`, `2.5s`.
fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// The close code and reason RFC 6455 gives a client's WebSocket error, if it is the client's
/// fault rather than a lost connection.
fn violation(e: &axum::Error) -> Option<(u16, &'static str)> {
    let e = std::error::Error::source(e)?.downcast_ref::<ts::Error>()?;
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
enum Step<M> {
    /// Forward it.
    Data(M),
    /// Forward this close, and stop.
    Close(M),
    /// Drop it (pings and pongs: each side's WebSocket answers its own).
    Skip,
}

/// How a pump tells a dead peer from a quiet one.
struct Liveness<M> {
    /// The source is dead when nothing at all arrives from it for this long.
    timeout: Duration,
    /// Makes the ping sent to the sink's peer, so that its pongs keep the other pump's
    /// source alive.
    ping: fn() -> M,
}

/// Moves messages from `source` to `sink` until a close has been forwarded, either side fails
/// or ends, or the source is silent for `liveness.timeout`; meanwhile pings the sink's peer
/// often enough that a live one is never taken for dead.
async fn pump<A, B, E, S, K>(
    source: &mut S,
    sink: &mut K,
    step: fn(A) -> Step<B>,
    liveness: Liveness<B>,
) -> Ended<E>
where
    S: Stream<Item = Result<A, E>> + Unpin,
    K: Sink<B> + Unpin,
{
    let period = ping_period(liveness.timeout);
    let mut ping = tokio::time::interval_at(Instant::now() + period, period);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The deadline is moved on lazily, when it fires, rather than for every message: one
    // clock read per batch is all the hot path pays.
    let mut heard = Instant::now();
    let deadline = tokio::time::sleep_until(heard + liveness.timeout);
    tokio::pin!(deadline);
    loop {
        let mut next = tokio::select! {
            next = source.next() => next,
            _ = ping.tick() => {
                if sink.send((liveness.ping)()).await.is_err() {
                    return Ended::Lost;
                }
                continue;
            }
            () = &mut deadline => {
                if heard.elapsed() >= liveness.timeout {
                    let _ = sink.flush().await;
                    return Ended::Silent;
                }
                deadline.as_mut().reset(heard + liveness.timeout);
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

fn client_to_agent(msg: ws::Message) -> Step<ts::Message> {
    match msg {
        ws::Message::Binary(data) => Step::Data(ts::Message::Binary(data)),
        ws::Message::Text(text) => Step::Data(ts::Message::Text(text.as_str().into())),
        ws::Message::Ping(_) | ws::Message::Pong(_) => Step::Skip,
        ws::Message::Close(frame) => Step::Close(ts::Message::Close(frame.map(|f| {
            ts::protocol::CloseFrame {
                code: CloseCode::from(f.code),
                reason: f.reason.as_str().into(),
            }
        }))),
    }
}

fn agent_to_client(msg: ts::Message) -> Step<ws::Message> {
    match msg {
        ts::Message::Binary(data) => Step::Data(ws::Message::Binary(data)),
        ts::Message::Text(text) => Step::Data(ws::Message::Text(text.as_str().into())),
        ts::Message::Ping(_) | ts::Message::Pong(_) | ts::Message::Frame(_) => Step::Skip,
        ts::Message::Close(frame) => {
            Step::Close(ws::Message::Close(frame.map(|f| ws::CloseFrame {
                code: u16::from(f.code),
                reason: f.reason.as_str().into(),
            })))
        }
    }
}

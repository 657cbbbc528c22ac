//! One client connection: the handshake, then the multiplexer that routes frames to streams.
//!
//! A reader loop decodes frames and routes them; one writer task owns the socket's writing side
//! and sends whatever the streams queue in the bounded outbox, flushing once the queue is empty.
//! Each stream runs its operation in its own task, so a stalled stream stalls nobody else.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncWrite;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::Message;
use tracing::{debug, warn};

use tether_proto::limits::{INITIAL_WINDOW, MAX_WINDOW, PING_INTERVAL_SECS};
use tether_proto::{auth, writer, Channel, Control, ErrorCode, Frame, StreamId, PROTOCOL_VERSION};

use crate::agent::Agent;
use crate::stream::{Credit, Inbound, OpError, Outbox, Outgoing, StreamCtx};
use crate::{ops, ws_out};

/// Frames queued for the writer before producers wait: bounds the agent's memory per connection.
const OUTBOX_FRAMES: usize = 256;

/// A connection that sends nothing (not even a pong) for this long is considered dead.
const DEAD_AFTER: Duration = Duration::from_secs(3 * PING_INTERVAL_SECS);

/// How long, after the peer's close frame, the reader waits for the connection to end.
const CLOSE_REPLY: Duration = Duration::from_secs(1);

/// The capabilities this agent announces in `welcome`.
pub(crate) const CAPABILITIES: &[&str] = &[
    "exec",
    "pty",
    "background",
    "replay",
    "files",
    "tar",
    "batch",
    "watch",
    "forward",
    "ports",
    "info",
    "byte_paths",
    "byte_args",
];

/// What the connection knows about one open stream.
struct Entry {
    inbound: mpsc::UnboundedSender<Inbound>,
    credit: Arc<Credit>,
    /// Input bytes the client may still send before it must wait for a window frame;
    /// shared with the stream's input side, which adds to it as it returns credit.
    in_credit: Arc<AtomicU64>,
}

type Streams = Arc<Mutex<HashMap<StreamId, Entry>>>;

/// What sends a connection's frames: [`ws_out::Writer`] on connections the agent accepted,
/// tungstenite's own sink on those it dialled (where its frames must be masked).
pub(crate) trait Writer: Send + 'static {
    /// Sends what `queue` yields as binary messages, with pings between, until the queue
    /// closes or the peer goes; then a close frame with `code`, unless one went out already.
    fn run(
        self,
        queue: mpsc::Receiver<Outgoing>,
        code: Arc<AtomicU16>,
    ) -> impl Future<Output = ()> + Send;
}

impl<W: AsyncWrite + Unpin + Send + 'static> Writer for ws_out::Writer<W> {
    fn run(
        self,
        queue: mpsc::Receiver<Outgoing>,
        code: Arc<AtomicU16>,
    ) -> impl Future<Output = ()> + Send {
        ws_out::Writer::run(self, queue, code)
    }
}

/// Tungstenite's sink as a [`Writer`].
pub(crate) struct SinkWriter<Si>(pub(crate) Si);

impl<Si> Writer for SinkWriter<Si>
where
    Si: futures_util::Sink<Message, Error = WsError> + Unpin + Send + 'static,
{
    async fn run(self, mut queue: mpsc::Receiver<Outgoing>, code: Arc<AtomicU16>) {
        let mut sink = self.0;
        // Whether the queue closed or the peer went away, try to say goodbye with the code.
        let _ = writer::write_frames(&mut sink, &mut queue).await;
        let code = CloseCode::from(code.load(Ordering::Acquire));
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: "".into(),
            })))
            .await;
        let _ = sink.close().await;
    }
}

/// Serves one WebSocket connection until it closes. `authed` is true when the token was
/// already checked at the HTTP upgrade.
pub(crate) async fn serve<W, So>(out: W, mut source: So, agent: Arc<Agent>, authed: bool)
where
    W: Writer,
    So: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    let (outbox, queue) = mpsc::channel::<Outgoing>(OUTBOX_FRAMES);
    // The close code the writer sends: 1001 unless the reader saw a fault that has its own.
    let close_code = Arc::new(AtomicU16::new(CloseCode::Away.into()));
    let writer = tokio::spawn(out.run(queue, close_code.clone()));

    if let Err(e) = handshake(&mut source, &outbox, &agent, authed).await {
        debug!("handshake failed: {}", e.message);
        close_code.store(CloseCode::Policy.into(), Ordering::Release);
        let _ = outbox
            .send(Outgoing::control(&Control::Error {
                stream: None,
                code: e.code,
                message: e.message,
            }))
            .await;
        drop(outbox);
        let _ = writer.await;
        return;
    }

    let streams: Streams = Arc::new(Mutex::new(HashMap::new()));
    loop {
        let msg = match tokio::time::timeout(DEAD_AFTER, source.next()).await {
            Ok(Some(Ok(msg))) => msg,
            Ok(Some(Err(e))) => {
                debug!("connection error: {e}");
                if let Some(code) = violation_code(&e) {
                    close_code.store(code.into(), Ordering::Release);
                }
                break;
            }
            Ok(None) => break,
            Err(_) => {
                warn!("peer silent for {DEAD_AFTER:?}; closing the connection");
                break;
            }
        };
        let bytes = match msg {
            Message::Binary(b) => b,
            Message::Close(_) => {
                // Tungstenite sends its reply (the peer's code echoed) on the next read, which
                // then ends at once (or, where the agent dialled, once the peer hangs up).
                let _ = tokio::time::timeout(CLOSE_REPLY, source.next()).await;
                break;
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
            Message::Text(_) => {
                reject(
                    &outbox,
                    None,
                    "text messages are not part of the protocol; send binary frames",
                )
                .await;
                continue;
            }
        };
        match Frame::decode(bytes.clone()) {
            Ok(frame) => route(frame, &streams, &outbox, &agent).await,
            Err(e) => match undecodable_open(&bytes, &streams) {
                Some(stream) => {
                    let code = if unknown_op(&bytes) {
                        ErrorCode::Unsupported
                    } else {
                        ErrorCode::InvalidArgument
                    };
                    let _ = outbox
                        .send(Outgoing::control(&Control::Error {
                            stream: Some(stream),
                            code,
                            message: e.to_string(),
                        }))
                        .await;
                    let _ = outbox
                        .send(Outgoing::control(&Control::Closed { stream }))
                        .await;
                }
                None => reject(&outbox, None, &e.to_string()).await,
            },
        }
    }

    // The connection is gone: every stream's input ends, which cancels foreground work.
    streams.lock().expect("stream table lock").clear();
    drop(outbox);
    let _ = writer.await;
}

async fn handshake<S>(
    source: &mut S,
    outbox: &Outbox,
    agent: &Agent,
    authed: bool,
) -> Result<(), OpError>
where
    S: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    let first = loop {
        match tokio::time::timeout(DEAD_AFTER, source.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => break b,
            Ok(Some(Ok(Message::Ping(_) | Message::Pong(_)))) => continue,
            Ok(_) | Err(_) => {
                return Err(OpError::new(
                    ErrorCode::InvalidArgument,
                    "expected a hello frame to open the connection",
                ))
            }
        }
    };
    let Ok(Frame::Control(Control::Hello {
        protocol, token, ..
    })) = Frame::decode(first)
    else {
        return Err(OpError::new(
            ErrorCode::InvalidArgument,
            "the first frame must be a hello control message",
        ));
    };
    if protocol != PROTOCOL_VERSION {
        return Err(OpError::new(
            ErrorCode::Unsupported,
            format!(
                "protocol version {protocol} is not supported; this agent speaks version {PROTOCOL_VERSION}"
            ),
        ));
    }
    if !authed {
        if let Some(expected) = &agent.token {
            let ok = token
                .as_deref()
                .is_some_and(|t| auth::token_matches(t, expected));
            if !ok {
                return Err(OpError::new(
                    ErrorCode::Unauthorized,
                    "wrong or missing sandbox token; pass the token the sandbox was created with",
                ));
            }
        }
    }
    let welcome = Control::Welcome {
        protocol: PROTOCOL_VERSION,
        agent_version: tether_proto::TETHER_VERSION.to_string(),
        capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
    };
    outbox
        .send(Outgoing::control(&welcome))
        .await
        .map_err(|_| OpError::gone())
}

/// For a control frame that failed to decode: if it is an `open` whose stream id can be read
/// (an unknown op from a newer client, a bad field), that id, so the stream gets its error and
/// `closed` instead of waiting forever.
fn undecodable_open(bytes: &[u8], streams: &Streams) -> Option<StreamId> {
    let header = Frame::check(bytes).ok()?;
    if header.kind != tether_proto::FrameKind::Control {
        return None;
    }
    let value: serde_json::Value =
        serde_json::from_slice(&bytes[tether_proto::limits::HEADER_LEN..]).ok()?;
    if value.get("type")?.as_str()? != "open" {
        return None;
    }
    let id = StreamId(u32::try_from(value.get("stream")?.as_u64()?).ok()?);
    let open = streams.lock().expect("stream table lock").contains_key(&id);
    (id != StreamId::CONNECTION && !open).then_some(id)
}

/// Whether an undecodable `open` names an `op` this agent does not know (`unsupported`), as
/// opposed to a known op with a bad field or value (`invalid_argument`): the op alone is
/// decoded, so an "unknown variant" can only be about the op.
fn unknown_op(bytes: &[u8]) -> bool {
    let Some(payload) = bytes.get(tether_proto::limits::HEADER_LEN..) else {
        return false;
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
        return false;
    };
    let Some(op) = value.get("op").filter(|op| op.is_string()) else {
        return false;
    };
    match serde_json::from_value::<tether_proto::op::Op>(serde_json::json!({ "op": op })) {
        Ok(_) => false,
        Err(e) => e.to_string().starts_with("unknown variant"),
    }
}

/// The close code RFC 6455 gives a peer's fault, if the error is one (not a lost connection).
fn violation_code(e: &WsError) -> Option<CloseCode> {
    match e {
        WsError::Capacity(_) => Some(CloseCode::Size),
        WsError::Utf8(_) => Some(CloseCode::Invalid),
        WsError::Protocol(_) => Some(CloseCode::Protocol),
        _ => None,
    }
}

async fn reject(outbox: &Outbox, stream: Option<StreamId>, message: &str) {
    let _ = outbox
        .send(Outgoing::control(&Control::Error {
            stream,
            code: ErrorCode::InvalidArgument,
            message: message.to_string(),
        }))
        .await;
}

async fn route(frame: Frame, streams: &Streams, outbox: &Outbox, agent: &Arc<Agent>) {
    match frame {
        Frame::Data {
            stream,
            channel,
            payload,
        } => {
            // Errors without a stream are message errors; with one, the stream is cancelled
            // (and so gets its `closed`).
            let verdict: Result<(), (Option<StreamId>, String)> = {
                let table = streams.lock().expect("stream table lock");
                match table.get(&stream) {
                    None => Err((None, format!("data frame for {stream}, which is not open"))),
                    Some(e) if channel != Channel::In => {
                        let _ = e.inbound.send(Inbound::Cancel);
                        Err((
                            Some(stream),
                            format!("clients send data on channel in only, not {channel:?}; the stream is cancelled"),
                        ))
                    }
                    Some(e) => {
                        let len = payload.len() as u64;
                        let spent =
                            e.in_credit
                                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                                    c.checked_sub(len)
                                });
                        match spent {
                            Ok(_) => {
                                let _ = e.inbound.send(Inbound::Data(payload));
                                Ok(())
                            }
                            Err(have) => {
                                let _ = e.inbound.send(Inbound::Cancel);
                                Err((
                                    Some(stream),
                                    format!("{stream} sent {len} bytes with only {have} bytes of credit; the stream is cancelled"),
                                ))
                            }
                        }
                    }
                }
            };
            if let Err((stream, msg)) = verdict {
                reject(outbox, stream, &msg).await;
            }
        }
        Frame::Window { stream, credit } => {
            // A window for a stream that just closed is normal; ignore it.
            if let Some(e) = streams.lock().expect("stream table lock").get(&stream) {
                e.credit.grant(credit);
            }
        }
        Frame::Control(msg) => control(msg, streams, outbox, agent).await,
    }
}

async fn control(msg: Control, streams: &Streams, outbox: &Outbox, agent: &Arc<Agent>) {
    let (stream, inbound) = match msg {
        Control::Open { stream, window, op } => {
            return open(stream, window, op, streams, outbox, agent).await;
        }
        Control::Eof { stream, .. } => (stream, Inbound::Eof),
        Control::Resize { stream, cols, rows } => (stream, Inbound::Resize { cols, rows }),
        Control::Signal {
            stream,
            signal,
            group,
        } => (stream, Inbound::Signal { signal, group }),
        Control::Cancel { stream } => (stream, Inbound::Cancel),
        other => {
            let name = serde_json::to_value(&other)
                .ok()
                .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
                .unwrap_or_default();
            reject(
                outbox,
                None,
                &format!("a client may not send `{name}` messages"),
            )
            .await;
            return;
        }
    };
    let is_cancel = matches!(inbound, Inbound::Cancel);
    let delivered = streams
        .lock()
        .expect("stream table lock")
        .get(&stream)
        .map(|e| e.inbound.send(inbound).is_ok());
    // A cancel routinely crosses the stream's `closed` on the wire: ignore it.
    if delivered.is_none() && !is_cancel {
        reject(outbox, None, &format!("{stream} is not open")).await;
    }
}

async fn open(
    stream: StreamId,
    window: Option<u32>,
    op: tether_proto::op::Op,
    streams: &Streams,
    outbox: &Outbox,
    agent: &Arc<Agent>,
) {
    if stream == StreamId::CONNECTION {
        return reject(
            outbox,
            None,
            "stream 0 is the connection; open streams with ids from 1",
        )
        .await;
    }
    // Checked before the stream enters the table: a refused stream gets its error and
    // `closed` like any failed one, and holds nothing.
    let tunnel = matches!(op, tether_proto::op::Op::Connect { .. });
    let place = match agent.budget.stream(tunnel) {
        Ok(place) => place,
        Err(e) => {
            let open = streams
                .lock()
                .expect("stream table lock")
                .contains_key(&stream);
            if open {
                return reject(outbox, Some(stream), &format!("{stream} is already open")).await;
            }
            debug!("refusing {stream}: {}", e.message);
            let _ = outbox
                .send(Outgoing::control(&Control::Error {
                    stream: Some(stream),
                    code: e.code,
                    message: e.message,
                }))
                .await;
            let _ = outbox
                .send(Outgoing::control(&Control::Closed { stream }))
                .await;
            return;
        }
    };
    let window = window.unwrap_or(INITIAL_WINDOW).clamp(1, MAX_WINDOW);
    let (tx, rx) = mpsc::unbounded_channel();
    let credit = Arc::new(Credit::new(window));
    let in_credit = Arc::new(AtomicU64::new(INITIAL_WINDOW as u64));
    let inserted = {
        let mut table = streams.lock().expect("stream table lock");
        match table.entry(stream) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Entry {
                    inbound: tx,
                    credit: credit.clone(),
                    in_credit: in_credit.clone(),
                });
                true
            }
        }
    };
    if !inserted {
        return reject(outbox, Some(stream), &format!("{stream} is already open")).await;
    }
    let ctx = StreamCtx::new(
        stream,
        outbox.clone(),
        credit,
        rx,
        in_credit,
        INITIAL_WINDOW,
    );
    let streams = streams.clone();
    let outbox = outbox.clone();
    let agent = agent.clone();
    tokio::spawn(async move {
        let result = ops::run(ctx, op, agent).await;
        // Leave the table before `closed` goes out, so the client may reuse the id at once.
        streams.lock().expect("stream table lock").remove(&stream);
        drop(place);
        if let Err(e) = result {
            let _ = outbox
                .send(Outgoing::control(&Control::Error {
                    stream: Some(stream),
                    code: e.code,
                    message: e.message,
                }))
                .await;
        }
        let _ = outbox
            .send(Outgoing::control(&Control::Closed { stream }))
            .await;
    });
}

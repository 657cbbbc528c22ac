//! One protocol connection to an agent (directly, or tunneled through a relay), multiplexing
//! any number of streams.
//!
//! A reader task routes incoming frames to per-stream queues; a writer task owns the socket.
//! A stream's queue is bounded by the credit the client granted, and credit is returned only
//! when the consumer takes bytes with [`RawStream::next`], so a stream nobody reads stalls
//! that stream alone.
//!
//! The writer pings often enough for the peer timeout (`TETHER_PEER_TIMEOUT`), or as often as
//! a relay that splices the session asks (`x-tether-ping-interval`), and a session
//! that hears nothing at all for that long (no frame, no pong) is taken for dead: every
//! stream ends with [`ClientError::PeerSilent`], so a black-holed connection cannot hang a
//! caller forever.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, Semaphore};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::header;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use tether_proto::control::ExitStatus;
use tether_proto::limits::{BULK_CHUNK, DATA_CHUNK, HEADER_LEN, INITIAL_WINDOW, MAX_PAYLOAD};
use tether_proto::op::{Op, Reply, WatchEvent};
use tether_proto::window::RecvWindow;
use tether_proto::{
    frame, keepalive, writer, ByteOffset, Channel, Control, ErrorCode, Frame, ProcessId, StreamId,
    PROTOCOL_VERSION,
};

use super::local::DEFAULT_PEER_TIMEOUT;
use super::ClientError;

/// Frames queued for the writer before senders wait.
const OUTBOX_FRAMES: usize = 256;

/// The capability of an agent that takes and sends paths that are not UTF-8.
const BYTE_PATHS: &str = "byte_paths";

/// The capability of an agent that runs arguments and variables that are not UTF-8.
const BYTE_ARGS: &str = "byte_args";

/// How long to wait for the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a session that gives up after `peer_timeout` of silence pings: a third of it
/// (so two pongs may be late), at most every 100 ms and at least every 15 s.
fn ping_period(peer_timeout: Duration) -> Duration {
    (peer_timeout / 3).clamp(keepalive::MIN_PING_INTERVAL, writer::PING_PERIOD)
}

/// Something that happened on a stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Bytes on `out` or `err`.
    Data(Channel, Bytes),
    /// The agent will send no more on this channel.
    Eof(Channel),
    /// A process stream is running.
    Started {
        /// The agent's process id.
        process: ProcessId,
        /// Its pid.
        pid: u32,
        /// First offsets delivered, per channel.
        offsets: [ByteOffset; 2],
    },
    /// Bytes `from..to` of `channel` were lost from the replay ring.
    Dropped {
        /// `out` or `err`.
        channel: Channel,
        /// First lost offset.
        from: ByteOffset,
        /// First offset delivered after the gap.
        to: ByteOffset,
    },
    /// The process ended.
    Exit(ExitStatus),
    /// A request's result.
    Reply(Reply),
    /// A watch event.
    Watch(WatchEvent),
    /// The operation failed.
    Error(ClientError),
    /// The stream is finished.
    Closed,
}

struct Slot {
    events: mpsc::UnboundedSender<Event>,
    credit: Arc<Semaphore>,
}

struct Inner {
    outbox: mpsc::Sender<Bytes>,
    streams: Mutex<HashMap<StreamId, Slot>>,
    next_id: AtomicU32,
    /// Set when the connection is gone; streams opened after that fail at once.
    closed: AtomicBool,
    /// Why the connection is gone, when that is more than "disconnected".
    lost: Mutex<Option<ClientError>>,
    agent_version: String,
    capabilities: Vec<String>,
}

/// A connection to one agent. Cheap to clone; the connection closes when the last clone
/// and every stream are dropped.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("agent_version", &self.inner.agent_version)
            .finish()
    }
}

impl Session {
    /// Connects to `url` (an agent's `ws://host:port/`, or a relay's
    /// `ws://relay/v1/sandboxes/{id}/ws`), presenting `token` as a bearer token.
    pub async fn connect(url: &str, token: Option<&str>) -> Result<Session, ClientError> {
        let connect_err = |reason: String| ClientError::Connect {
            url: url.to_string(),
            reason,
        };
        let peer_timeout = super::local::peer_timeout().map_err(ClientError::Local)?;
        let mut req = url
            .into_client_request()
            .map_err(|e| connect_err(format!("invalid URL: {e}")))?;
        if let Some(token) = token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| connect_err("the token is not a valid header value".into()))?;
            req.headers_mut().insert(header::AUTHORIZATION, value);
        }
        // Announced, so a relay that copies the session's bytes unread may ask for more: it
        // hears this side alive only by its pings and its answers to the agent's.
        let mut ping_period = ping_period(peer_timeout);
        req.headers_mut().insert(
            keepalive::PING_INTERVAL_HEADER,
            keepalive::format_interval(ping_period)
                .parse()
                .expect("digits are a valid header value"),
        );
        let config = WebSocketConfig::default()
            .max_message_size(Some(2 * (MAX_PAYLOAD + HEADER_LEN)))
            .max_frame_size(Some(2 * (MAX_PAYLOAD + HEADER_LEN)));
        // A `wss://` session trusts what the REST client trusts (see `crate::tls`).
        #[cfg(feature = "rustls")]
        let connected = {
            let connector = match req.uri().scheme_str() {
                Some("wss") => Some(tokio_tungstenite::Connector::Rustls(
                    crate::tls::trust()?.config.clone(),
                )),
                _ => None,
            };
            tokio_tungstenite::connect_async_tls_with_config(req, Some(config), true, connector)
                .await
        };
        #[cfg(not(feature = "rustls"))]
        let connected = tokio_tungstenite::connect_async_with_config(req, Some(config), true).await;
        let (ws, response) = connected.map_err(|e| connect_error(url, e))?;
        if let Some(asked) = response
            .headers()
            .get(keepalive::PING_INTERVAL_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(keepalive::parse_interval)
        {
            ping_period = ping_period.min(asked);
        }
        Session::start(ws, peer_timeout, ping_period).await
    }

    /// Speaks the protocol over an already open WebSocket (any transport), with the default
    /// peer timeout.
    pub async fn handshake<S>(
        ws: tokio_tungstenite::WebSocketStream<S>,
    ) -> Result<Session, ClientError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        Session::handshake_with(ws, DEFAULT_PEER_TIMEOUT).await
    }

    /// Speaks the protocol over an already open WebSocket, taking the connection for dead
    /// when nothing arrives on it for `peer_timeout`.
    pub async fn handshake_with<S>(
        ws: tokio_tungstenite::WebSocketStream<S>,
        peer_timeout: Duration,
    ) -> Result<Session, ClientError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        Session::start(ws, peer_timeout, ping_period(peer_timeout)).await
    }

    /// Speaks the protocol over `ws`, pinging every `ping_period` and taking the connection
    /// for dead when nothing arrives on it for `peer_timeout`.
    async fn start<S>(
        ws: tokio_tungstenite::WebSocketStream<S>,
        peer_timeout: Duration,
        ping_period: Duration,
    ) -> Result<Session, ClientError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sink, mut source) = ws.split();
        let hello = Control::Hello {
            protocol: PROTOCOL_VERSION,
            token: None,
            client: format!("tether-client/{}", tether_proto::TETHER_VERSION),
        };
        sink.send(Message::Binary(frame::encode_control(&hello)))
            .await
            .map_err(|e| ClientError::Protocol(format!("cannot send hello: {e}")))?;
        let welcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            loop {
                match source.next().await {
                    Some(Ok(Message::Binary(b))) => return Frame::decode(b).ok(),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    _ => return None,
                }
            }
        })
        .await
        .ok()
        .flatten();
        let (agent_version, capabilities) = match welcome {
            Some(Frame::Control(Control::Welcome {
                agent_version,
                capabilities,
                ..
            })) => (agent_version, capabilities),
            Some(Frame::Control(Control::Error { code, message, .. })) => {
                return Err(ClientError::Remote { code, message })
            }
            _ => {
                return Err(ClientError::Protocol(
                    "the agent did not answer hello with welcome".into(),
                ))
            }
        };

        let (outbox, queue) = mpsc::channel::<Bytes>(OUTBOX_FRAMES);
        let inner = Arc::new(Inner {
            outbox,
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(1),
            closed: AtomicBool::new(false),
            lost: Mutex::new(None),
            agent_version,
            capabilities,
        });
        tokio::spawn(write_loop(sink, queue, ping_period));
        tokio::spawn(read_loop(source, Arc::downgrade(&inner), peer_timeout));
        Ok(Session { inner })
    }

    /// The agent's release version, from its welcome.
    pub fn agent_version(&self) -> &str {
        &self.inner.agent_version
    }

    /// The agent's capabilities, from its welcome.
    pub fn capabilities(&self) -> &[String] {
        &self.inner.capabilities
    }

    /// Whether the connection is known to be gone: every stream then fails with
    /// [`ClientError::Disconnected`], and a new session is needed.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Why the connection is gone: [`ClientError::Disconnected`] unless more is known.
    fn lost(&self) -> ClientError {
        self.inner.lost()
    }

    /// Opens a stream running `op`. The low-level entry point the helpers build on.
    pub async fn open(&self, op: Op) -> Result<RawStream, ClientError> {
        self.open_with_window(op, INITIAL_WINDOW).await
    }

    /// Opens a stream granting the agent `window` bytes of credit.
    pub async fn open_with_window(&self, op: Op, window: u32) -> Result<RawStream, ClientError> {
        let needs_byte_args = matches!(&op, Op::Exec(spec) if spec.needs_byte_args());
        for (needed, capability, what) in [
            (op.needs_byte_paths(), BYTE_PATHS, "name files"),
            (needs_byte_args, BYTE_ARGS, "run arguments or variables"),
        ] {
            if needed && !self.capabilities().iter().any(|c| c == capability) {
                return Err(ClientError::Remote {
                    code: ErrorCode::Unsupported,
                    message: format!(
                        "the sandbox's agent ({}) cannot {what} that are not UTF-8; \
                         rebuild the sandbox's image with a newer tether-agent",
                        self.inner.agent_version
                    ),
                });
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let credit = Arc::new(Semaphore::new(INITIAL_WINDOW as usize));
        let id = {
            let mut streams = self.inner.streams.lock().expect("stream table lock");
            let mut id;
            loop {
                id = StreamId(self.inner.next_id.fetch_add(1, Ordering::Relaxed).max(1));
                if !streams.contains_key(&id) {
                    break;
                }
            }
            streams.insert(
                id,
                Slot {
                    events: tx,
                    credit: credit.clone(),
                },
            );
            id
        };
        // Checked after the slot is in the table: the reader clears the table after setting
        // the flag, so a stream opened as the connection dies is either cleared or refused,
        // never left waiting for events that cannot come.
        if self.is_closed() {
            self.inner
                .streams
                .lock()
                .expect("stream table lock")
                .remove(&id);
            return Err(self.lost());
        }
        let msg = Control::Open {
            stream: id,
            window: (window != INITIAL_WINDOW).then_some(window),
            op,
        };
        self.inner
            .outbox
            .send(frame::encode_control(&msg))
            .await
            .map_err(|_| ClientError::Disconnected)?;
        Ok(RawStream {
            id,
            inner: self.inner.clone(),
            events: rx,
            credit,
            window: RecvWindow::new(window),
            finished: false,
        })
    }

    /// Runs a request/response operation and returns its reply.
    pub async fn request(&self, op: Op) -> Result<Reply, ClientError> {
        let mut stream = self.open(op).await?;
        let mut reply = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Event::Reply(r) => reply = Some(r),
                Event::Error(e) => return Err(e),
                Event::Closed => break,
                _ => {}
            }
        }
        reply.ok_or(ClientError::Disconnected)
    }
}

/// Why a WebSocket could not be opened: the server's HTTP answer, a TLS failure with what to
/// do about it, or the connection's error.
fn connect_error(url: &str, e: tokio_tungstenite::tungstenite::Error) -> ClientError {
    use tokio_tungstenite::tungstenite::Error;
    match e {
        Error::Http(resp) => {
            let body = resp
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).trim().to_string())
                .unwrap_or_default();
            ClientError::from_http(url, resp.status().as_u16(), &body)
        }
        // Something listens and speaks HTTP of a kind, but did not take the upgrade as a
        // relay does: not "no relay", the wrong address.
        e @ (Error::Protocol(_) | Error::HttpFormat(_)) => ClientError::NotRelay {
            url: url.to_string(),
            reason: format!("its answer to a WebSocket upgrade: {e}"),
        },
        other => {
            #[cfg(feature = "rustls")]
            if let Some(tls) = crate::tls::explain(url, &other) {
                return tls;
            }
            ClientError::Connect {
                url: url.to_string(),
                reason: other.to_string(),
            }
        }
    }
}

impl Inner {
    fn lost(&self) -> ClientError {
        self.lost
            .lock()
            .expect("lost reason lock")
            .clone()
            .unwrap_or(ClientError::Disconnected)
    }
}

async fn write_loop<S>(mut sink: S, mut queue: mpsc::Receiver<Bytes>, ping_period: Duration)
where
    S: futures_util::Sink<Message> + Unpin,
{
    // A sink that failed is gone: only a queue that closed (the session dropped) says goodbye.
    if writer::write_frames_pinging(&mut sink, &mut queue, ping_period)
        .await
        .is_ok()
    {
        let _ = sink.send(Message::Close(None)).await;
        let _ = sink.close().await;
    }
}

async fn read_loop<S>(mut source: S, inner: std::sync::Weak<Inner>, peer_timeout: Duration)
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    // The deadline moves on lazily, when it fires: a clock read per message is all the hot
    // path pays.
    let mut heard = tokio::time::Instant::now();
    let deadline = tokio::time::sleep_until(heard + peer_timeout);
    tokio::pin!(deadline);
    let mut silent = false;
    loop {
        let msg = tokio::select! {
            next = source.next() => match next {
                Some(Ok(msg)) => msg,
                _ => break,
            },
            () = &mut deadline => {
                if heard.elapsed() >= peer_timeout {
                    silent = true;
                    break;
                }
                deadline.as_mut().reset(heard + peer_timeout);
                continue;
            }
        };
        heard = tokio::time::Instant::now();
        let bytes = match msg {
            Message::Binary(b) => b,
            Message::Close(_) => break,
            _ => continue,
        };
        let Some(inner) = inner.upgrade() else { break };
        let Ok(frame) = Frame::decode(bytes) else {
            tracing::warn!("dropping a malformed frame from the agent");
            continue;
        };
        route(&inner, frame);
    }
    // The connection is gone: every open stream learns it from its queue closing.
    if let Some(inner) = inner.upgrade() {
        if silent {
            tracing::warn!("nothing arrived for {peer_timeout:?}; taking the connection for dead");
            *inner.lost.lock().expect("lost reason lock") = Some(ClientError::PeerSilent {
                timeout: peer_timeout,
            });
        }
        inner.closed.store(true, Ordering::Release);
        inner.streams.lock().expect("stream table lock").clear();
    }
}

fn route(inner: &Inner, frame: Frame) {
    let mut streams = inner.streams.lock().expect("stream table lock");
    match frame {
        Frame::Data {
            stream,
            channel,
            payload,
        } => {
            if let Some(slot) = streams.get(&stream) {
                let _ = slot.events.send(Event::Data(channel, payload));
            }
        }
        Frame::Window { stream, credit } => {
            if let Some(slot) = streams.get(&stream) {
                let room = (1usize << 30).saturating_sub(slot.credit.available_permits());
                slot.credit.add_permits((credit as usize).min(room));
            }
        }
        Frame::Control(msg) => {
            let (stream, event) = match msg {
                Control::Eof { stream, channel } => (stream, Event::Eof(channel)),
                Control::Started {
                    stream,
                    process,
                    pid,
                    offsets,
                } => (
                    stream,
                    Event::Started {
                        process,
                        pid,
                        offsets,
                    },
                ),
                Control::Dropped {
                    stream,
                    channel,
                    from,
                    to,
                } => (stream, Event::Dropped { channel, from, to }),
                Control::Exit { stream, status } => (stream, Event::Exit(status)),
                Control::Reply { stream, reply } => (stream, Event::Reply(reply)),
                Control::Event { stream, event } => (stream, Event::Watch(event)),
                Control::Error {
                    stream: Some(stream),
                    code,
                    message,
                } if stream != StreamId::CONNECTION => {
                    (stream, Event::Error(ClientError::Remote { code, message }))
                }
                Control::Error { code, message, .. } => {
                    // Stdin, `eof`, `resize` or `signal` that crossed a stream's `closed` on
                    // the wire (the process ended while they travelled) is answered this way:
                    // a routine race (PROTOCOL.md, "Messages for streams that are not open"),
                    // not worth a line on the user's terminal.
                    if code == ErrorCode::InvalidArgument && message.ends_with("is not open") {
                        tracing::debug!("agent: {message}");
                    } else {
                        tracing::warn!("agent reported a connection error ({code}): {message}");
                    }
                    return;
                }
                Control::Closed { stream } => {
                    if let Some(slot) = streams.remove(&stream) {
                        let _ = slot.events.send(Event::Closed);
                    }
                    return;
                }
                _ => return,
            };
            if let Some(slot) = streams.get(&stream) {
                let _ = slot.events.send(event);
            }
        }
    }
}

/// One open stream. Dropping it before the agent closed it cancels the operation.
pub struct RawStream {
    id: StreamId,
    inner: Arc<Inner>,
    events: mpsc::UnboundedReceiver<Event>,
    credit: Arc<Semaphore>,
    window: RecvWindow,
    finished: bool,
}

impl std::fmt::Debug for RawStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawStream").field("id", &self.id).finish()
    }
}

impl RawStream {
    /// The stream's id.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The next event; `None` after `Closed` or when the connection is lost
    /// (then the last event was not `Closed`).
    pub async fn next(&mut self) -> Option<Event> {
        if self.finished {
            return None;
        }
        let ev = self.events.recv().await;
        match &ev {
            Some(Event::Data(_, bytes)) => {
                if let Some(credit) = self.window.consumed(bytes.len()) {
                    let _ = self
                        .inner
                        .outbox
                        .send(frame::encode_window(self.id, credit))
                        .await;
                }
            }
            Some(Event::Closed) => self.finished = true,
            Some(_) => {}
            None => {
                self.finished = true;
                return Some(Event::Error(self.inner.lost()));
            }
        }
        ev
    }

    /// A cloneable handle for sending on this stream while another task reads it.
    pub fn sender(&self) -> StreamSender {
        StreamSender {
            id: self.id,
            inner: self.inner.clone(),
            credit: self.credit.clone(),
        }
    }

    /// Sends bytes on channel `in`, waiting for credit as needed.
    pub async fn send(&self, data: &[u8]) -> Result<(), ClientError> {
        self.sender().send(data).await
    }

    /// Half-closes channel `in`.
    pub async fn eof(&self) -> Result<(), ClientError> {
        self.sender().eof().await
    }

    /// Resizes the stream's PTY.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), ClientError> {
        self.sender().resize(cols, rows).await
    }

    /// Signals the stream's process (or its group).
    pub async fn signal(&self, signal: &str, group: bool) -> Result<(), ClientError> {
        self.sender().signal(signal, group).await
    }

    /// Asks the agent to abandon the operation; the stream then ends with `Closed`.
    pub async fn cancel(&self) -> Result<(), ClientError> {
        self.sender().cancel().await
    }
}

/// The sending side of a [`RawStream`]; cheap to clone.
#[derive(Clone)]
pub struct StreamSender {
    id: StreamId,
    inner: Arc<Inner>,
    credit: Arc<Semaphore>,
}

impl std::fmt::Debug for StreamSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSender")
            .field("id", &self.id)
            .finish()
    }
}

impl StreamSender {
    /// Sends bytes on channel `in`, waiting for credit as needed.
    pub async fn send(&self, mut data: &[u8]) -> Result<(), ClientError> {
        while !data.is_empty() {
            let want = data.len().min(DATA_CHUNK);
            let first = self
                .credit
                .acquire()
                .await
                .map_err(|_| ClientError::Disconnected)?;
            first.forget();
            let mut n = 1;
            let extra = (want - 1).min(self.credit.available_permits());
            if extra > 0 {
                if let Ok(more) = self.credit.try_acquire_many(extra as u32) {
                    more.forget();
                    n += extra;
                }
            }
            let (chunk, rest) = data.split_at(n);
            self.raw(frame::encode_data(self.id, Channel::In, chunk))
                .await?;
            data = rest;
        }
        Ok(())
    }

    /// Sends the data frame built in `frame` (from [`frame::data_buffer`], at most
    /// [`BULK_CHUNK`] bytes after the header's room) on channel `in`. With credit for the
    /// whole payload, the common case, the buffer itself goes out and the payload is never
    /// copied; with less, it goes in pieces as credit arrives, like [`Self::send`].
    pub async fn send_in_place(&self, mut frame: BytesMut) -> Result<(), ClientError> {
        let len = frame.len().saturating_sub(HEADER_LEN);
        if len == 0 {
            return Ok(());
        }
        if len <= BULK_CHUNK && self.credit.available_permits() >= len {
            if let Ok(permits) = self.credit.try_acquire_many(len as u32) {
                permits.forget();
                return self
                    .raw(frame::finish_data_in_place(frame, self.id, Channel::In))
                    .await;
            }
        }
        let payload = frame.split_off(HEADER_LEN);
        self.send(&payload).await
    }

    /// Half-closes channel `in`.
    pub async fn eof(&self) -> Result<(), ClientError> {
        self.control(Control::Eof {
            stream: self.id,
            channel: Channel::In,
        })
        .await
    }

    /// Resizes the stream's PTY.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), ClientError> {
        self.control(Control::Resize {
            stream: self.id,
            cols,
            rows,
        })
        .await
    }

    /// Signals the stream's process (or its group).
    pub async fn signal(&self, signal: &str, group: bool) -> Result<(), ClientError> {
        self.control(Control::Signal {
            stream: self.id,
            signal: signal.to_string(),
            group,
        })
        .await
    }

    /// Asks the agent to abandon the operation; the stream then ends with `Closed`.
    pub async fn cancel(&self) -> Result<(), ClientError> {
        self.control(Control::Cancel { stream: self.id }).await
    }

    async fn control(&self, msg: Control) -> Result<(), ClientError> {
        self.raw(frame::encode_control(&msg)).await
    }

    async fn raw(&self, bytes: Bytes) -> Result<(), ClientError> {
        self.inner
            .outbox
            .send(bytes)
            .await
            .map_err(|_| ClientError::Disconnected)
    }
}

impl Drop for RawStream {
    fn drop(&mut self) {
        if !self.finished {
            let cancel = frame::encode_control(&Control::Cancel { stream: self.id });
            if let Err(mpsc::error::TrySendError::Full(cancel)) = self.inner.outbox.try_send(cancel)
            {
                let outbox = self.inner.outbox.clone();
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move { outbox.send(cancel).await });
                }
            }
        }
    }
}

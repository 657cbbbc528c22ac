//! The agent's own WebSocket writer, for the connections it accepts (where it is the server,
//! so its frames go out unmasked): each frame's 2–10 header bytes and its payload reach the
//! socket in one `writev`, batched, with no copy of the payload. Tungstenite's writer copies
//! every frame into its write buffer first; for bulk output that copy was about half of the
//! agent's user-space `memcpy` (BENCHMARKS.md, "Targets missed, and why").
//!
//! Tungstenite still reads the connection and answers pings and close frames by itself. What
//! it writes goes into a [`Tap`] in place of the socket, and the writer passes it on between
//! its own frames, whole frames only, so the two never interleave mid-frame.
//!
//! The upgrade itself runs on a [`Duplex`] whose write side still is the socket; after it,
//! [`Duplex::take_writer`] hands the socket's write half to the writer and leaves the tap.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use tether_proto::writer::PING_PERIOD;

use crate::stream::Outgoing;

/// Frames written by one `writev` at most.
const BATCH_FRAMES: usize = 64;

/// Slices one `writev` is given at most: Linux's `IOV_MAX`. A batch may hold more (a frame
/// gathered from many small pieces); the rest goes in the next call.
const IOV_MAX: usize = 1024;

/// Bytes of payload one batch collects before it is written, so that a pong waiting in the
/// tap is not held behind megabytes of output.
const BATCH_BYTES: usize = 1 << 20;

/// What the tap holds before tungstenite's writes wait: its own writes are a pong (at most
/// 125 bytes of payload, and it keeps only the newest) or a close frame, so this is only
/// reached by a peer that floods pings and never reads.
const TAP_CAP: usize = 16 << 10;

const BINARY: OpCode = OpCode::Data(Data::Binary);
const CLOSE: OpCode = OpCode::Control(Control::Close);
const PING: OpCode = OpCode::Control(Control::Ping);

/// `config` for a connection whose writer is a [`Writer`]: tungstenite writes only pongs and
/// close replies, each at once, and holds back at most [`TAP_CAP`] of them (a peer that floods
/// pings and never reads gets its newest pong later, not all of them).
pub(crate) fn reader_config(config: WebSocketConfig) -> WebSocketConfig {
    config.write_buffer_size(0).max_write_buffer_size(TAP_CAP)
}

/// A stream read from one half and written to the other, the write half replaceable by a
/// [`Tap`] once the upgrade is done.
pub(crate) struct Duplex<R, W> {
    read: R,
    write: Side<W>,
}

enum Side<W> {
    Socket(W),
    Tap(Tap),
}

impl<R, W> Duplex<R, W> {
    pub(crate) fn new(read: R, write: W) -> Self {
        Self {
            read,
            write: Side::Socket(write),
        }
    }

    /// Takes the socket's write half for the [`Writer`], leaving a tap in its place; `None`
    /// if it was taken already.
    pub(crate) fn take_writer(&mut self) -> Option<(W, TapOut)> {
        let shared = Arc::new(TapShared::default());
        let tap = Side::Tap(Tap(shared.clone()));
        match std::mem::replace(&mut self.write, tap) {
            Side::Socket(w) => Some((w, TapOut(shared))),
            old @ Side::Tap(_) => {
                self.write = old;
                None
            }
        }
    }
}

impl<R: AsyncRead + Unpin, W: Unpin> AsyncRead for Duplex<R, W> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl<R: Unpin, W: AsyncWrite + Unpin> AsyncWrite for Duplex<R, W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.write {
            Side::Socket(w) => Pin::new(w).poll_write(cx, buf),
            Side::Tap(t) => t.poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.write {
            Side::Socket(w) => Pin::new(w).poll_flush(cx),
            Side::Tap(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.write {
            Side::Socket(w) => Pin::new(w).poll_shutdown(cx),
            // The writer owns the socket and shuts it down after its close frame.
            Side::Tap(_) => Poll::Ready(Ok(())),
        }
    }
}

#[derive(Default)]
struct TapShared {
    state: Mutex<TapState>,
    /// Wakes the writer when bytes arrive.
    arrived: Notify,
}

#[derive(Default)]
struct TapState {
    bytes: Vec<u8>,
    /// Tungstenite's task, waiting for room.
    blocked: Option<Waker>,
}

/// Where tungstenite's own writes go once the writer owns the socket.
struct Tap(Arc<TapShared>);

impl Tap {
    fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let mut state = self.0.state.lock().expect("tap lock");
        if state.bytes.len() >= TAP_CAP {
            state.blocked = Some(cx.waker().clone());
            return Poll::Pending;
        }
        state.bytes.extend_from_slice(buf);
        drop(state);
        self.0.arrived.notify_one();
        Poll::Ready(Ok(buf.len()))
    }
}

/// The writer's end of the tap.
pub(crate) struct TapOut(Arc<TapShared>);

impl TapOut {
    /// Waits until tungstenite has written something, then returns the whole frames among it
    /// (a partial one stays for later).
    async fn frames(&self) -> Vec<u8> {
        loop {
            self.0.arrived.notified().await;
            let mut state = self.0.state.lock().expect("tap lock");
            let end = whole_frames(&state.bytes);
            if end == 0 {
                continue;
            }
            let rest = state.bytes.split_off(end);
            let frames = std::mem::replace(&mut state.bytes, rest);
            if let Some(waker) = state.blocked.take() {
                waker.wake();
            }
            return frames;
        }
    }
}

/// The length of the whole WebSocket frames at the start of `bytes`.
fn whole_frames(bytes: &[u8]) -> usize {
    let mut at = 0;
    while let Some((_, len)) = frame_at(&bytes[at..]) {
        at += len;
    }
    at
}

/// The opcode and length of the frame at the start of `b`, if all of it is there.
fn frame_at(b: &[u8]) -> Option<(OpCode, usize)> {
    let mut cursor = io::Cursor::new(b);
    let (header, payload) = FrameHeader::parse(&mut cursor).ok()??;
    let end = usize::try_from(cursor.position().checked_add(payload)?).ok()?;
    (b.len() >= end).then_some((header.opcode, end))
}

/// Whether the whole frames in `frames` include a close frame.
fn has_close(frames: &[u8]) -> bool {
    let mut at = 0;
    while let Some((opcode, len)) = frame_at(&frames[at..]) {
        if opcode == CLOSE {
            return true;
        }
        at += len;
    }
    false
}

/// A final, unmasked frame's header: `opcode` and the payload length in 1, 3 or 9 bytes.
fn header(opcode: OpCode, len: usize) -> ([u8; 10], usize) {
    let mut h = [0u8; 10];
    let n = {
        let mut rest = &mut h[..];
        FrameHeader {
            opcode,
            ..FrameHeader::default()
        }
        .format(len as u64, &mut rest)
        .expect("an unmasked header takes at most 10 bytes");
        10 - rest.len()
    };
    (h, n)
}

/// The writer of one accepted connection: frames from the queue as binary messages, pings,
/// tungstenite's pongs and close replies from the tap, and at the end a close frame.
pub(crate) struct Writer<W> {
    socket: W,
    tap: TapOut,
}

impl<W: AsyncWrite + Unpin + Send> Writer<W> {
    pub(crate) fn new(socket: W, tap: TapOut) -> Self {
        Self { socket, tap }
    }

    /// Sends until the queue closes, the peer's close has been answered or the socket fails;
    /// then, unless a close frame went out already, a close frame with `code`, and shuts the
    /// socket's write side.
    pub(crate) async fn run(mut self, mut queue: mpsc::Receiver<Outgoing>, code: Arc<AtomicU16>) {
        match self.pump(&mut queue).await {
            Ok(Ended::QueueClosed) => {
                let code = code.load(Ordering::Acquire).to_be_bytes();
                let (h, n) = header(CLOSE, code.len());
                let frame = [&h[..n], &code[..]].concat();
                if self.socket.write_all(&frame).await.is_err() {
                    return;
                }
            }
            Ok(Ended::CloseSent) => {}
            Err(_) => return, // the peer is gone: nobody to say goodbye to
        }
        let _ = self.socket.shutdown().await;
    }

    async fn pump(&mut self, queue: &mut mpsc::Receiver<Outgoing>) -> io::Result<Ended> {
        // The first ping is due one period from now, as in `tether_proto::writer`.
        let start = tokio::time::Instant::now() + PING_PERIOD;
        let mut ping = tokio::time::interval_at(start, PING_PERIOD);
        // Grown on first use: an idle connection (thousands of idle terminals) keeps none.
        let mut batch = Vec::new();
        loop {
            tokio::select! {
                biased;
                frames = self.tap.frames() => {
                    self.socket.write_all(&frames).await?;
                    if has_close(&frames) {
                        return Ok(Ended::CloseSent);
                    }
                }
                next = queue.recv() => {
                    let Some(first) = next else { return Ok(Ended::QueueClosed) };
                    let mut bytes = first.len();
                    batch.push(first);
                    while batch.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
                        let Ok(more) = queue.try_recv() else { break };
                        bytes += more.len();
                        batch.push(more);
                    }
                    let written = write_binary(&mut self.socket, &batch).await;
                    batch.clear();
                    written?;
                }
                _ = ping.tick() => {
                    let (h, n) = header(PING, 0);
                    self.socket.write_all(&h[..n]).await?;
                }
            }
        }
    }
}

enum Ended {
    QueueClosed,
    CloseSent,
}

/// Writes each of `payloads` as one binary message, its header and its pieces side by side
/// in one `writev` (more where the socket takes less).
async fn write_binary<W: AsyncWrite + Unpin>(
    socket: &mut W,
    payloads: &[Outgoing],
) -> io::Result<()> {
    let headers: Vec<([u8; 10], usize)> =
        payloads.iter().map(|p| header(BINARY, p.len())).collect();
    let mut slices: Vec<IoSlice<'_>> = Vec::new();
    for ((h, n), payload) in headers.iter().zip(payloads) {
        slices.push(IoSlice::new(&h[..*n]));
        slices.extend(payload.pieces().iter().map(|p| IoSlice::new(p)));
    }
    let mut rest = &mut slices[..];
    IoSlice::advance_slices(&mut rest, 0); // drops empty payloads' slices from the front
    while !rest.is_empty() {
        let most = rest.len().min(IOV_MAX);
        let n = socket.write_vectored(&rest[..most]).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::WebSocketStream;

    /// A socket that takes at most `step` bytes per write, so every frame is cut somewhere.
    struct Trickle<W> {
        inner: W,
        step: usize,
    }

    impl<W: AsyncWrite + Unpin> AsyncWrite for Trickle<W> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.step);
            Pin::new(&mut self.inner).poll_write(cx, &buf[..n])
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            // Up to `step` bytes gathered across slices, as a short writev would take.
            let mut gathered = Vec::new();
            for b in bufs {
                let take = (self.step - gathered.len()).min(b.len());
                gathered.extend_from_slice(&b[..take]);
                if gathered.len() == self.step {
                    break;
                }
            }
            Pin::new(&mut self.inner).poll_write(cx, &gathered)
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    type Pipe = tokio::io::DuplexStream;
    type Server =
        WebSocketStream<Duplex<tokio::io::ReadHalf<Pipe>, Trickle<tokio::io::WriteHalf<Pipe>>>>;

    /// The agent's side of an upgraded connection (the upgrade itself skipped) with its
    /// writer running on `step`-byte writes, and the peer's side as a tungstenite client.
    async fn pair(
        step: usize,
    ) -> (
        Server,
        mpsc::Sender<Outgoing>,
        tokio::task::JoinHandle<()>,
        WebSocketStream<Pipe>,
    ) {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (r, w) = tokio::io::split(ours);
        let mut duplex = Duplex::new(r, Trickle { inner: w, step });
        let (socket, tap) = duplex.take_writer().unwrap();
        assert!(duplex.take_writer().is_none());
        let config = reader_config(WebSocketConfig::default());
        let server = WebSocketStream::from_raw_socket(duplex, Role::Server, Some(config)).await;
        let (tx, rx) = mpsc::channel(256);
        let code = Arc::new(AtomicU16::new(CloseCode::Away.into()));
        let writer = tokio::spawn(Writer::new(socket, tap).run(rx, code));
        let client = WebSocketStream::from_raw_socket(theirs, Role::Client, None).await;
        (server, tx, writer, client)
    }

    #[test]
    fn headers_use_the_shortest_length_form() {
        for (len, want) in [
            (0, vec![0x82, 0]),
            (125, vec![0x82, 125]),
            (126, vec![0x82, 126, 0, 126]),
            (0xffff, vec![0x82, 126, 0xff, 0xff]),
            (0x10000, vec![0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0]),
        ] {
            let (h, n) = header(BINARY, len);
            assert_eq!(&h[..n], &want[..], "length {len}");
            let mut frame = h[..n].to_vec();
            frame.resize(n + len, 7);
            assert_eq!(frame_at(&frame).map(|f| f.1), Some(n + len));
            if len > 0 {
                assert_eq!(frame_at(&frame[..n + len - 1]), None, "length {len}");
            }
        }
    }

    #[test]
    fn only_whole_frames_leave_the_tap() {
        let pong = [0x8a, 3, b'a', b'b', b'c'];
        let masked = [0x8a, 0x82, 1, 2, 3, 4, 9, 9];
        let mut bytes = [&pong[..], &masked[..], &pong[..3]].concat();
        assert_eq!(whole_frames(&bytes), pong.len() + masked.len());
        assert!(!has_close(&bytes));
        bytes.truncate(1);
        assert_eq!(whole_frames(&bytes), 0);
        // A length that cannot fit in memory is never whole, and does not overflow.
        assert_eq!(
            frame_at(&[0x82, 127, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        assert!(has_close(&[0x88, 2, 0x03, 0xe8]));
    }

    #[tokio::test]
    async fn frames_cut_anywhere_reach_a_tungstenite_peer_whole_and_in_order() {
        for step in [1, 3, 7, 4096] {
            let (_server, tx, writer, mut client) = pair(step).await;
            let sizes = [0usize, 1, 125, 126, 127, 0xffff, 0x10000, 300_000];
            let payloads: Vec<Bytes> = sizes
                .iter()
                .map(|&n| Bytes::from((0..n).map(|i| (i % 251) as u8).collect::<Vec<_>>()))
                .collect();
            let send = {
                let payloads = payloads.clone();
                tokio::spawn(async move {
                    for p in payloads {
                        tx.send(p.into()).await.unwrap();
                    }
                })
            };
            for want in &payloads {
                match client.next().await.unwrap().unwrap() {
                    Message::Binary(got) => assert_eq!(&got, want, "step {step}"),
                    other => panic!("step {step}: {other:?}"),
                }
            }
            send.await.unwrap();
            // The queue closed: the writer says goodbye with 1001 and ends.
            match client.next().await.unwrap().unwrap() {
                Message::Close(Some(f)) => assert_eq!(f.code, CloseCode::Away),
                other => panic!("{other:?}"),
            }
            writer.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_frame_in_more_pieces_than_one_writev_takes_arrives_whole() {
        let (_server, tx, writer, mut client) = pair(1 << 20).await;
        // 3,000 pieces of 3 bytes: three times IOV_MAX slices for one frame.
        let pieces: Vec<Bytes> = (0..3000u32)
            .map(|i| Bytes::from(i.to_be_bytes()[1..].to_vec()))
            .collect();
        let want = pieces.concat();
        tx.send(Outgoing::Parts(pieces)).await.unwrap();
        tx.send(Bytes::from_static(b"next").into()).await.unwrap();
        drop(tx);
        match client.next().await.unwrap().unwrap() {
            Message::Binary(got) => assert!(got[..] == want[..], "{} bytes", got.len()),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Message::Binary(Bytes::from_static(b"next"))
        );
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn pings_are_answered_between_frames_and_the_peers_close_ends_the_writer() {
        let (mut server, tx, writer, mut client) = pair(5).await;
        // The server's reader is what answers, as the agent's reader loop runs it: after the
        // peer's close, one more read lets tungstenite send its reply.
        let reader = tokio::spawn(async move {
            while let Some(Ok(msg)) = server.next().await {
                if msg.is_close() {
                    assert!(!matches!(server.next().await, Some(Ok(_))));
                    break;
                }
            }
        });
        tx.send(Bytes::from_static(b"before").into()).await.unwrap();
        client
            .send(Message::Ping(Bytes::from_static(b"p1")))
            .await
            .unwrap();
        tx.send(Bytes::from(vec![1u8; 200_000]).into())
            .await
            .unwrap();
        let mut seen = Vec::new();
        while seen.len() < 3 {
            match client.next().await.unwrap().unwrap() {
                Message::Binary(b) => seen.push(format!("binary {}", b.len())),
                Message::Pong(p) => seen.push(format!("pong {}", String::from_utf8_lossy(&p))),
                other => panic!("{other:?}"),
            }
        }
        let want = ["binary 6", "pong p1", "binary 200000"];
        assert!(
            want.iter().all(|w| seen.contains(&w.to_string())),
            "{seen:?}"
        );
        // The peer closes: tungstenite's reply (its code echoed) goes out through the tap, the
        // writer ends with the queue still open, and nothing follows the reply.
        let normal = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        client.send(Message::Close(Some(normal))).await.unwrap();
        reader.await.unwrap();
        writer.await.unwrap();
        assert!(tx.send(Bytes::from_static(b"after").into()).await.is_err());
        match client.next().await {
            Some(Ok(Message::Close(Some(f)))) => assert_eq!(f.code, CloseCode::Normal),
            other => panic!("{other:?}"),
        }
        assert!(matches!(client.next().await, None | Some(Err(_))));
    }

    #[tokio::test]
    async fn a_peer_flooding_pings_without_reading_holds_the_tap_at_its_cap() {
        let (ours, theirs) = tokio::io::duplex(1 << 10);
        let (r, w) = tokio::io::split(ours);
        let mut duplex = Duplex::new(r, w);
        let (_socket, tap) = duplex.take_writer().unwrap();
        // No writer drains the tap: the socket is stalled.
        let config = reader_config(WebSocketConfig::default());
        let mut server = WebSocketStream::from_raw_socket(duplex, Role::Server, Some(config)).await;
        let (_theirs_r, mut theirs_w) = tokio::io::split(theirs);
        let reader = tokio::spawn(async move { while server.next().await.is_some() {} });
        // 2,000 masked pings with 100-byte payloads.
        let ping: Vec<u8> = [&[0x89u8, 0x80 | 100, 0, 0, 0, 0][..], &[0u8; 100]].concat();
        for _ in 0..2000 {
            theirs_w.write_all(&ping).await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let held = tap.0.state.lock().unwrap().bytes.len();
        assert!(held <= TAP_CAP + 200, "the tap holds {held} bytes");
        reader.abort();
    }
}

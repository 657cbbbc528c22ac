//! One stream as its operation sees it: send data within credit, send control messages,
//! receive input and commands from the client.
//!
//! An operation handler gets a [`StreamCtx`]; if it needs to send and receive concurrently
//! (an exec pumping output while taking stdin and signals), it splits it into a cloneable
//! [`StreamOut`] and a [`StreamIn`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tether_proto::frame;
use tether_proto::limits::{BULK_CHUNK, DATA_CHUNK, HEADER_LEN};
use tether_proto::op::{Reply, WatchEvent};
use tether_proto::window::RecvWindow;
use tether_proto::{Channel, Control, ErrorCode, StreamId};
use tokio::sync::{mpsc, Semaphore};

/// What the connection delivers to a stream.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// Bytes on channel `in`.
    Data(Bytes),
    /// The client half-closed channel `in`.
    Eof,
    /// A PTY's new size.
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// A signal for the stream's process.
    Signal {
        /// Name or number, as sent.
        signal: String,
        /// For the whole process group.
        group: bool,
    },
    /// The client abandoned the stream.
    Cancel,
}

/// An operation failed: becomes an `error` message on the stream.
#[derive(Debug, Clone)]
pub(crate) struct OpError {
    /// The typed reason.
    pub code: ErrorCode,
    /// A sentence the user can act on.
    pub message: String,
}

impl OpError {
    /// An error with `code` and `message`.
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> OpError {
        OpError {
            code,
            message: message.into(),
        }
    }

    /// Maps an OS error on `what` (usually a path) to a wire error. A write refused by a
    /// read-only file system says where the sandbox can write.
    pub(crate) fn io(what: &str, err: &std::io::Error) -> OpError {
        if err.kind() == std::io::ErrorKind::ReadOnlyFilesystem {
            let places = crate::mounts::writable_places();
            let hint = match places.is_empty() {
                true => String::new(),
                false => format!("; writable here: {}", places.join(", ")),
            };
            return OpError::new(
                ErrorCode::PermissionDenied,
                format!("{what}: {err}: this path is on a read-only file system{hint}"),
            );
        }
        OpError::new(ErrorCode::from_io(err), format!("{what}: {err}"))
    }

    /// The connection went away while the operation was sending.
    pub(crate) fn gone() -> OpError {
        OpError::new(ErrorCode::Internal, "connection closed")
    }
}

/// Result of an operation handler.
pub(crate) type OpResult = Result<(), OpError>;

/// Where a connection's outgoing frames go: its writer task.
pub(crate) type Outbox = mpsc::Sender<Outgoing>;

/// One frame on its way to the connection's writer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outgoing {
    /// The whole frame in one piece.
    Whole(Bytes),
    /// A data frame as its header and the pieces of its payload as the output ring holds
    /// them: a writer that gathers (`writev`) sends them without copying.
    Parts(Vec<Bytes>),
}

impl Outgoing {
    /// A control frame carrying `msg`.
    pub(crate) fn control(msg: &Control) -> Outgoing {
        Outgoing::Whole(frame::encode_control(msg))
    }

    /// The frame's pieces, in order.
    pub(crate) fn pieces(&self) -> &[Bytes] {
        match self {
            Outgoing::Whole(frame) => std::slice::from_ref(frame),
            Outgoing::Parts(parts) => parts,
        }
    }

    /// The frame's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.pieces().iter().map(Bytes::len).sum()
    }
}

impl From<Bytes> for Outgoing {
    fn from(frame: Bytes) -> Outgoing {
        Outgoing::Whole(frame)
    }
}

/// The frame in one piece (copied together where it was in several), for a writer that takes
/// whole messages.
impl From<Outgoing> for Bytes {
    fn from(frame: Outgoing) -> Bytes {
        match frame {
            Outgoing::Whole(frame) => frame,
            Outgoing::Parts(parts) => parts.concat().into(),
        }
    }
}

/// Splits `pieces` after their first `n` bytes: the rest is returned, in order.
fn split_pieces(pieces: &mut Vec<Bytes>, n: usize) -> Vec<Bytes> {
    let mut kept = 0;
    for i in 0..pieces.len() {
        let len = pieces[i].len();
        if kept + len > n {
            let mut rest = pieces.split_off(i);
            let head = rest[0].split_to(n - kept);
            if !head.is_empty() {
                pieces.push(head);
            }
            return rest;
        }
        kept += len;
    }
    Vec::new()
}

/// Send credit for one stream's agent→client data, granted by window frames.
#[derive(Debug)]
pub(crate) struct Credit(Semaphore);

/// Credit beyond this is ignored, so a hostile grant cannot overflow the semaphore: 1 GiB.
const CREDIT_CAP: usize = 1 << 30;

impl Credit {
    /// Credit with `initial` bytes.
    pub(crate) fn new(initial: u32) -> Credit {
        Credit(Semaphore::new(initial as usize))
    }

    /// Adds credit from a window frame.
    pub(crate) fn grant(&self, credit: u32) {
        let room = CREDIT_CAP.saturating_sub(self.0.available_permits());
        self.0.add_permits((credit as usize).min(room));
    }

    /// Waits for at least one byte of credit and takes up to `max`.
    pub(crate) async fn take(&self, max: usize) -> usize {
        // The semaphore is never closed, so acquire cannot fail.
        let Ok(first) = self.0.acquire().await else {
            return 0;
        };
        first.forget();
        let extra = (max.saturating_sub(1)).min(self.0.available_permits());
        if extra > 0 {
            if let Ok(more) = self.0.try_acquire_many(extra as u32) {
                more.forget();
                return 1 + extra;
            }
        }
        1
    }

    /// Returns unused credit (taken but not sent).
    pub(crate) fn give_back(&self, n: usize) {
        self.0.add_permits(n);
    }
}

/// The sending half of a stream. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct StreamOut {
    id: StreamId,
    outbox: Outbox,
    credit: Arc<Credit>,
}

impl StreamOut {
    pub(crate) fn new(id: StreamId, outbox: Outbox, credit: Arc<Credit>) -> StreamOut {
        StreamOut { id, outbox, credit }
    }

    /// The stream's id.
    pub(crate) fn id(&self) -> StreamId {
        self.id
    }

    /// Sends `data` on `channel`, waiting for credit as needed and splitting it into frames
    /// of at most [`DATA_CHUNK`] bytes. Fails only when the connection is gone.
    pub(crate) async fn data(&self, channel: Channel, mut data: Bytes) -> OpResult {
        while !data.is_empty() {
            let want = data.len().min(DATA_CHUNK);
            let n = self.credit.take(want).await;
            let chunk = data.split_to(n);
            self.raw(frame::encode_data(self.id, channel, &chunk))
                .await?;
        }
        Ok(())
    }

    /// Sends the data frame built in `frame` (from [`frame::data_buffer`], its payload
    /// after the header's room) on `channel`. With credit for the whole payload, the
    /// common case, the buffer itself goes out and the payload is never copied; with less,
    /// it is sent in pieces as credit arrives, like [`Self::data`].
    pub(crate) async fn data_in_place(&self, channel: Channel, mut frame: BytesMut) -> OpResult {
        let len = frame.len().saturating_sub(HEADER_LEN);
        if len == 0 {
            return Ok(());
        }
        if len > BULK_CHUNK {
            return self
                .data(channel, frame.split_off(HEADER_LEN).freeze())
                .await;
        }
        let n = self.credit.take(len).await;
        if n == len {
            return self
                .raw(frame::finish_data_in_place(frame, self.id, channel))
                .await;
        }
        let mut payload = frame.split_off(HEADER_LEN).freeze();
        self.raw(frame::encode_data(self.id, channel, &payload.split_to(n)))
            .await?;
        self.data(channel, payload).await
    }

    /// Sends `payload`, given as the output ring's pieces, as one data frame on `channel`.
    /// With credit for all of it, the common case, the pieces go to the writer as they are
    /// (never copied on the agent's side); with less, what the credit covers goes first and
    /// the rest as credit arrives, like [`Self::data`].
    pub(crate) async fn data_parts(&self, channel: Channel, mut payload: Vec<Bytes>) -> OpResult {
        let len: usize = payload.iter().map(Bytes::len).sum();
        if len == 0 {
            return Ok(());
        }
        if len > BULK_CHUNK {
            return self.data(channel, payload.concat().into()).await;
        }
        let n = self.credit.take(len).await;
        let rest = split_pieces(&mut payload, n);
        let mut parts = Vec::with_capacity(1 + payload.len());
        parts.push(frame::data_header(self.id, channel));
        parts.extend(payload);
        self.raw(Outgoing::Parts(parts)).await?;
        if rest.is_empty() {
            return Ok(());
        }
        self.data(channel, rest.concat().into()).await
    }

    /// Waits for credit, then takes up to `max` bytes of it. For producers that read into
    /// a buffer sized to the credit they hold; return what was not used with [`Self::refund`].
    pub(crate) async fn reserve(&self, max: usize) -> usize {
        self.credit.take(max.min(DATA_CHUNK)).await
    }

    /// Returns credit taken with [`Self::reserve`] but not spent.
    pub(crate) fn refund(&self, n: usize) {
        if n > 0 {
            self.credit.give_back(n);
        }
    }

    /// Sends bytes for which credit was already reserved.
    pub(crate) async fn data_reserved(&self, channel: Channel, data: &[u8]) -> OpResult {
        self.raw(frame::encode_data(self.id, channel, data)).await
    }

    /// Sends a control message.
    pub(crate) async fn control(&self, msg: Control) -> OpResult {
        self.raw(frame::encode_control(&msg)).await
    }

    /// Sends the operation's reply.
    pub(crate) async fn reply(&self, reply: Reply) -> OpResult {
        self.control(Control::Reply {
            stream: self.id,
            reply,
        })
        .await
    }

    /// Sends a watch event.
    pub(crate) async fn event(&self, event: WatchEvent) -> OpResult {
        self.control(Control::Event {
            stream: self.id,
            event,
        })
        .await
    }

    /// Signals the end of `channel`.
    pub(crate) async fn eof(&self, channel: Channel) -> OpResult {
        self.control(Control::Eof {
            stream: self.id,
            channel,
        })
        .await
    }

    async fn raw(&self, frame: impl Into<Outgoing>) -> OpResult {
        self.outbox
            .send(frame.into())
            .await
            .map_err(|_| OpError::gone())
    }
}

/// The receiving half of a stream.
#[derive(Debug)]
pub(crate) struct StreamIn {
    id: StreamId,
    inbound: mpsc::UnboundedReceiver<Inbound>,
    window: RecvWindow,
    /// The connection's count of input bytes the client may still send.
    in_credit: Arc<AtomicU64>,
    outbox: Outbox,
}

impl StreamIn {
    /// The next input or command. `None` means the connection is gone: treat it as a cancel.
    pub(crate) async fn recv(&mut self) -> Option<Inbound> {
        self.inbound.recv().await
    }

    /// Records that `n` input bytes were delivered (written to the process or file), which
    /// returns credit to the client. Call it after the bytes are really gone, so input
    /// backpressure reaches the client.
    pub(crate) async fn consumed(&mut self, n: usize) {
        if let Some(credit) = self.window.consumed(n) {
            // Account for the credit before the client can learn of it.
            self.in_credit.fetch_add(credit as u64, Ordering::AcqRel);
            // A closed outbox means the connection is gone; recv() will say so.
            let _ = self
                .outbox
                .send(frame::encode_window(self.id, credit).into())
                .await;
        }
    }
}

/// For a blocking consumer of the input (a file being written), which takes the input to
/// its own thread so each piece of data reaches it with one wakeup instead of three.
impl StreamIn {
    /// Moves the input out, leaving in its place one that has ended (its `recv` says the
    /// connection is gone); put it back with [`Self::restore`].
    pub(crate) fn detach(&mut self) -> StreamIn {
        let (_, ended) = mpsc::unbounded_channel();
        StreamIn {
            id: self.id,
            inbound: std::mem::replace(&mut self.inbound, ended),
            window: self.window.clone(),
            in_credit: self.in_credit.clone(),
            outbox: self.outbox.clone(),
        }
    }

    /// Puts back an input moved out with [`Self::detach`].
    pub(crate) fn restore(&mut self, detached: StreamIn) {
        *self = detached;
    }

    /// [`Self::recv`] for a blocking thread (never on the runtime: it would panic).
    pub(crate) fn blocking_recv(&mut self) -> Option<Inbound> {
        self.inbound.blocking_recv()
    }

    /// [`Self::consumed`] for a blocking thread.
    pub(crate) fn blocking_consumed(&mut self, n: usize) {
        if let Some(credit) = self.window.consumed(n) {
            self.in_credit.fetch_add(credit as u64, Ordering::AcqRel);
            let _ = self
                .outbox
                .blocking_send(frame::encode_window(self.id, credit).into());
        }
    }
}

/// Everything an operation handler needs for its stream.
#[derive(Debug)]
pub(crate) struct StreamCtx {
    /// Sending half.
    pub out: StreamOut,
    /// Receiving half.
    pub input: StreamIn,
}

impl StreamCtx {
    pub(crate) fn new(
        id: StreamId,
        outbox: Outbox,
        credit: Arc<Credit>,
        inbound: mpsc::UnboundedReceiver<Inbound>,
        in_credit: Arc<AtomicU64>,
        in_window: u32,
    ) -> StreamCtx {
        StreamCtx {
            out: StreamOut::new(id, outbox.clone(), credit),
            input: StreamIn {
                id,
                inbound,
                window: RecvWindow::new(in_window),
                in_credit,
                outbox,
            },
        }
    }

    /// Splits into the sending and receiving halves.
    pub(crate) fn split(self) -> (StreamOut, StreamIn) {
        (self.out, self.input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(parts: &[&'static [u8]]) -> Vec<Bytes> {
        parts.iter().map(|p| Bytes::from_static(p)).collect()
    }

    #[test]
    fn pieces_split_after_any_byte() {
        let all = b"abcdefg";
        for n in 0..=all.len() + 1 {
            let mut head = pieces(&[b"ab", b"cde", b"", b"fg"]);
            let rest = split_pieces(&mut head, n);
            let cut = n.min(all.len());
            assert_eq!(head.concat(), &all[..cut], "n = {n}");
            assert_eq!(rest.concat(), &all[cut..], "n = {n}");
        }
    }

    #[test]
    fn a_frame_in_pieces_is_the_same_frame_whole() {
        let parts = Outgoing::Parts(pieces(&[b"head", b"er", b"payload"]));
        assert_eq!(parts.len(), 13);
        assert_eq!(Bytes::from(parts), Bytes::from_static(b"headerpayload"));
        let whole = Outgoing::from(Bytes::from_static(b"x"));
        assert_eq!(whole.pieces(), [Bytes::from_static(b"x")]);
    }
}

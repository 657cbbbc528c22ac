//! The bridge between a stream and the blocking thread that reads or writes its bytes.
//!
//! [`upload`] hands the stream's input to a blocking consumer as [`Incoming`], which takes
//! each piece straight from the connection's reader and returns credit to the client only
//! as the consumer takes bytes, so a slow disk slows the sender instead of filling memory.
//! [`download`] runs a blocking producer whose chunks ([`Outgoing`]) go out on `out` within
//! the client's credit through a queue of [`READ_AHEAD`] chunks, so the producer runs at
//! most that far ahead of the network; a file's chunks are data frames read in place.
//! Both stop the blocking side when the client cancels or the connection goes away, and
//! wait for it, so its cleanup (removing a temp file) is done before the stream reports
//! `closed`.

use std::io;

use bytes::{Bytes, BytesMut};
use tether_proto::Channel;
use tokio::sync::mpsc;

use super::{worker_failed, READ_AHEAD};
use crate::stream::{Inbound, OpError, StreamIn, StreamOut};

/// The error a blocking side sees once its stream is cancelled; the pump discards its result.
fn aborted() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the stream was cancelled")
}

/// The stream's `in` bytes, as a blocking consumer sees them: it owns the stream's input
/// while it runs, so each piece of data comes straight from the connection's reader.
///
/// The bytes handed out by one call count as consumed, and their credit goes back to the
/// client, when the consumer asks for more: by then it has written them.
pub(super) struct Incoming {
    input: StreamIn,
    /// What is left of the piece being handed out.
    current: Bytes,
    /// Bytes handed out and not yet acknowledged.
    unacked: usize,
    at_eof: bool,
    /// The client cancelled, or the connection went away.
    cancelled: bool,
}

impl Incoming {
    /// The next at most `max` (> 0) bytes, or `None` at the client's eof.
    pub(super) fn next(&mut self, max: usize) -> io::Result<Option<Bytes>> {
        if self.unacked > 0 {
            self.input
                .blocking_consumed(std::mem::take(&mut self.unacked));
        }
        if self.cancelled {
            return Err(aborted());
        }
        while self.current.is_empty() {
            if self.at_eof {
                return Ok(None);
            }
            match self.input.blocking_recv() {
                Some(Inbound::Data(bytes)) => self.current = bytes,
                Some(Inbound::Eof) => self.at_eof = true,
                Some(Inbound::Cancel) | None => {
                    self.cancelled = true;
                    return Err(aborted());
                }
                Some(_) => {}
            }
        }
        let chunk = self.current.split_to(max.min(self.current.len()));
        self.unacked = chunk.len();
        Ok(Some(chunk))
    }

    /// Reads and discards up to `n` bytes; returns how many there were before eof.
    pub(super) fn skip(&mut self, n: u64) -> io::Result<u64> {
        let mut skipped = 0;
        while skipped < n {
            let want = usize::try_from(n - skipped).unwrap_or(usize::MAX);
            match self.next(want)? {
                Some(chunk) => skipped += chunk.len() as u64,
                None => break,
            }
        }
        Ok(skipped)
    }
}

impl io::Read for Incoming {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        match self.next(buf.len())? {
            Some(chunk) => {
                buf[..chunk.len()].copy_from_slice(&chunk);
                Ok(chunk.len())
            }
            None => Ok(0),
        }
    }
}

/// Runs `consume` on the blocking pool with the stream's `in` bytes until it returns.
/// `Ok(None)` means the client cancelled (or the connection went away) and the consumer
/// has finished cleaning up; the caller then ends the stream without a reply.
pub(super) async fn upload<T, F>(input: &mut StreamIn, consume: F) -> Result<Option<T>, OpError>
where
    T: Send + 'static,
    F: FnOnce(&mut Incoming) -> Result<T, OpError> + Send + 'static,
{
    let mut incoming = Incoming {
        input: input.detach(),
        current: Bytes::new(),
        unacked: 0,
        at_eof: false,
        cancelled: false,
    };
    let worker = tokio::task::spawn_blocking(move || {
        let result = consume(&mut incoming);
        (result, incoming)
    });
    let (result, incoming) = worker.await.map_err(worker_failed)?;
    let cancelled = incoming.cancelled;
    input.restore(incoming.input);
    if cancelled {
        return Ok(None);
    }
    result.map(Some)
}

/// Waits until the client cancels the stream or the connection goes away, ignoring any
/// other input (an operation that takes none has nothing to do with it).
pub(super) async fn cancelled(input: &mut StreamIn) {
    loop {
        if let Some(Inbound::Cancel) | None = input.recv().await {
            return;
        }
    }
}

/// What a blocking producer queues for `out`.
enum Chunk {
    /// Bytes, framed (and so copied once) as they are sent.
    Bytes(Bytes),
    /// Data frames built in place ([`tether_proto::frame::data_buffer`]), sent as they are.
    Frames(Vec<BytesMut>),
}

/// Where a blocking producer puts the bytes for `out`.
pub(super) struct Outgoing {
    chunks: mpsc::Sender<Chunk>,
}

impl Outgoing {
    /// Queues `chunk` for the client, waiting while the queue is full. Fails once the stream
    /// is cancelled or the connection is gone.
    pub(super) fn send(&mut self, chunk: Bytes) -> io::Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        self.chunks
            .blocking_send(Chunk::Bytes(chunk))
            .map_err(|_| aborted())
    }

    /// Queues data frames whose payloads were read into their buffers after the header's
    /// room, as one chunk: they go out without being copied again.
    pub(super) fn send_frames(&mut self, frames: Vec<BytesMut>) -> io::Result<()> {
        if frames.is_empty() {
            return Ok(());
        }
        self.chunks
            .blocking_send(Chunk::Frames(frames))
            .map_err(|_| aborted())
    }
}

/// For producers that write (a tar builder): wrap it in a `BufWriter` of
/// [`super::READ_CHUNK`] so chunks are large.
impl io::Write for Outgoing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send(Bytes::copy_from_slice(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs `produce` on the blocking pool and sends what it queues on `out`, within credit.
/// `Ok(None)` means the client cancelled or the connection went away; otherwise the caller
/// sends `eof` (the producer's error, if any, is returned after the data it did produce).
pub(super) async fn download<T, F>(
    out: &StreamOut,
    input: &mut StreamIn,
    produce: F,
) -> Result<Option<T>, OpError>
where
    T: Send + 'static,
    F: FnOnce(&mut Outgoing) -> Result<T, OpError> + Send + 'static,
{
    let (chunks, mut rx) = mpsc::channel(READ_AHEAD);
    let worker = tokio::task::spawn_blocking(move || produce(&mut Outgoing { chunks }));
    // Owns the receiver: once this future is dropped the producer's next send fails.
    let send = async move {
        while let Some(chunk) = rx.recv().await {
            match chunk {
                Chunk::Bytes(bytes) => out.data(Channel::Out, bytes).await?,
                Chunk::Frames(frames) => {
                    for frame in frames {
                        out.data_in_place(Channel::Out, frame).await?;
                    }
                }
            }
        }
        Ok::<(), OpError>(())
    };
    let finished = tokio::select! {
        sent = send => Some(sent),
        () = cancelled(input) => None,
    };
    // Both futures are dropped now, the queue's receiver with them, so a producer blocked
    // on a full queue wakes up and ends.
    let done = worker.await.map_err(worker_failed);
    match finished {
        Some(sent) => {
            sent?;
            done?.map(Some)
        }
        None => Ok(None),
    }
}

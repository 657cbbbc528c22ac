//! A download consumed with blocking calls: [`Session::download_blocking`] hands the bytes
//! of a stream's `out` channel, as they arrive, to one blocking thread that writes them (a
//! file, a tar unpacker) and sees them as [`Received`].
//!
//! The pieces cross as the `Bytes` the frames carried, through a queue of [`QUEUED_PIECES`],
//! so nothing is copied on the way and the consumer stays on one thread for the whole
//! download. A `tokio::fs::File` as the sink instead copied every frame into its own buffer
//! and made one trip through the blocking pool per write, and a `duplex` pipe with
//! `SyncIoBridge` in front of the tar unpacker copied every byte twice more.

use std::io;

use bytes::{Buf, Bytes};
use tokio::sync::mpsc;

use tether_proto::op::Op;
use tether_proto::Channel;

use super::session::{Event, Session};
use super::ClientError;

/// Pieces (each one frame's payload, so bounded by the frame size) received and not yet
/// taken by the consumer. Credit goes back to the agent as pieces enter the queue, so this
/// is what the consumer may lag behind the window.
const QUEUED_PIECES: usize = 8;

/// What the receiving side queues for the consumer.
enum Piece {
    Data(Bytes),
    /// The agent closed the stream without error: everything was sent.
    End,
}

/// The bytes of a download, on the consumer's blocking thread. A stream cut before its end
/// (the agent failed, the connection dropped) reads as an error, never as a clean end, so a
/// consumer cannot mistake a cut file or archive for a whole one.
pub struct Received {
    pieces: mpsc::Receiver<Piece>,
    /// What is left of the piece being read through [`io::Read`].
    current: Bytes,
    ended: bool,
}

impl Received {
    /// The next piece as it arrived; `None` once the agent has sent everything.
    pub fn next_piece(&mut self) -> io::Result<Option<Bytes>> {
        if !self.current.is_empty() {
            return Ok(Some(std::mem::take(&mut self.current)));
        }
        while !self.ended {
            match self.pieces.blocking_recv() {
                Some(Piece::Data(bytes)) if bytes.is_empty() => {}
                Some(Piece::Data(bytes)) => return Ok(Some(bytes)),
                Some(Piece::End) => self.ended = true,
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the download was cut before its end",
                    ))
                }
            }
        }
        Ok(None)
    }

    /// Writes everything still to come to `sink`, each piece straight from its frame;
    /// returns how many bytes that was.
    pub fn write_all_to(&mut self, sink: &mut impl io::Write) -> io::Result<u64> {
        let mut total = 0;
        while let Some(piece) = self.next_piece()? {
            sink.write_all(&piece)?;
            total += piece.len() as u64;
        }
        sink.flush()?;
        Ok(total)
    }
}

impl io::Read for Received {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.current.is_empty() {
            match self.next_piece()? {
                Some(piece) => self.current = piece,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

impl Session {
    /// Runs a download operation (`read`, `tar_read`, `read_batch`) whose `out` bytes
    /// `consume` takes on a blocking thread of its own, as [`Received`]; `progress` gets the
    /// running count of bytes received.
    ///
    /// When the stream fails, its error is returned, whatever `consume` made of the cut.
    /// When `consume` fails, the stream is cancelled and `consume`'s error returned. When
    /// `consume` returns before the end (an unpacker past the archive's end), the rest is
    /// not waited for.
    pub async fn download_blocking<T, E>(
        &self,
        op: Op,
        consume: impl FnOnce(&mut Received) -> Result<T, E> + Send + 'static,
        mut progress: impl FnMut(u64),
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<ClientError> + Send + 'static,
    {
        let mut stream = self.open(op).await?;
        let (pieces, rx) = mpsc::channel(QUEUED_PIECES);
        let consumer = tokio::task::spawn_blocking(move || {
            consume(&mut Received {
                pieces: rx,
                current: Bytes::new(),
                ended: false,
            })
        });
        let received = async {
            let mut total = 0u64;
            loop {
                match stream.next().await {
                    Some(Event::Data(Channel::Out, bytes)) => {
                        let n = bytes.len() as u64;
                        if pieces.send(Piece::Data(bytes)).await.is_err() {
                            // The consumer is done; its result says how.
                            return Ok(());
                        }
                        total += n;
                        progress(total);
                    }
                    Some(Event::Closed) => {
                        let _ = pieces.send(Piece::End).await;
                        return Ok(());
                    }
                    Some(Event::Error(e)) => return Err(e),
                    None => return Err(ClientError::Disconnected),
                    Some(_) => {}
                }
            }
        }
        .await;
        // The consumer waiting for more now sees the end, or the cut; a stream its consumer
        // left early is cancelled.
        drop(pieces);
        drop(stream);
        let consumed = consumer
            .await
            .map_err(|e| ClientError::Local(format!("the download's writer stopped: {e}")))?;
        received?;
        consumed
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn received(pieces: &[&'static [u8]], end: bool) -> Received {
        let (tx, rx) = mpsc::channel(pieces.len() + 1);
        for p in pieces {
            tx.try_send(Piece::Data(Bytes::from_static(p))).unwrap();
        }
        if end {
            tx.try_send(Piece::End).unwrap();
        }
        Received {
            pieces: rx,
            current: Bytes::new(),
            ended: false,
        }
    }

    #[test]
    fn reads_across_pieces_to_the_end() {
        let mut r = received(&[b"hel", b"", b"lo"], true);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        assert_eq!(r.read(&mut [0; 4]).unwrap(), 0);

        let mut out = Vec::new();
        let n = received(&[b"ab", b"c"], true)
            .write_all_to(&mut out)
            .unwrap();
        assert_eq!((n, &out[..]), (3, &b"abc"[..]));
    }

    #[test]
    fn a_cut_stream_is_an_error_not_an_end() {
        let mut r = received(&[b"partial"], false);
        let mut s = Vec::new();
        let err = r.read_to_end(&mut s).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(s, b"partial");
        let err = received(&[b"x"], false)
            .write_all_to(&mut Vec::new())
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}

//! A connection whose first bytes the proxy reads ahead (a request head, a TLS ClientHello)
//! and then passes on untouched: [`Peeked`] keeps what was read and yields it again before
//! the rest, so whatever is forwarded is exactly what the client sent. It works over any
//! stream (a TCP connection from a local sandbox, TLS from a sandbox elsewhere), and waiting
//! for more bytes is a read, not a timed re-peek.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// Bytes read per call to [`Peeked::fill`] at most.
const FILL_CHUNK: usize = 4096;

/// A stream with the bytes read ahead of its reader in front.
#[derive(Debug)]
pub(super) struct Peeked<S> {
    inner: S,
    ahead: Vec<u8>,
    /// How much of `ahead` has been consumed.
    start: usize,
}

impl<S> Peeked<S> {
    /// `inner`, nothing read ahead.
    pub(super) fn new(inner: S) -> Self {
        Self {
            inner,
            ahead: Vec::new(),
            start: 0,
        }
    }

    /// The bytes read ahead and not consumed yet.
    pub(super) fn ahead(&self) -> &[u8] {
        &self.ahead[self.start..]
    }

    /// Drops the first `n` bytes read ahead (a request head the proxy answered itself).
    pub(super) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.ahead.len());
        if self.start == self.ahead.len() {
            self.ahead.clear();
            self.start = 0;
        }
    }
}

impl<S: AsyncRead + Unpin> Peeked<S> {
    /// Reads more bytes ahead, so that at most `limit` are held; returns how many came (0 at
    /// the end of the stream, or when `limit` is reached). Cancel-safe: bytes are kept only
    /// once read.
    pub(super) async fn fill(&mut self, limit: usize) -> io::Result<usize> {
        let room = limit.saturating_sub(self.ahead().len()).min(FILL_CHUNK);
        if room == 0 {
            return Ok(0);
        }
        let mut chunk = [0u8; FILL_CHUNK];
        let n = self.inner.read(&mut chunk[..room]).await?;
        self.ahead.extend_from_slice(&chunk[..n]);
        Ok(n)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Peeked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let ahead = this.ahead();
        if !ahead.is_empty() {
            let n = ahead.len().min(buf.remaining());
            buf.put_slice(&ahead[..n]);
            this.consume(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Peeked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn bytes_read_ahead_come_first_then_the_rest() {
        let (mut near, far) = tokio::io::duplex(64);
        let mut peeked = Peeked::new(far);
        near.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        assert_eq!(peeked.fill(1024).await.unwrap(), 16);
        assert_eq!(peeked.ahead(), b"GET / HTTP/1.1\r\n");
        // The limit bounds what is held.
        near.write_all(b"Host: a\r\n\r\nbody").await.unwrap();
        assert_eq!(peeked.fill(20).await.unwrap(), 4);
        assert_eq!(peeked.fill(20).await.unwrap(), 0);
        peeked.consume(4);
        near.shutdown().await.unwrap();
        let mut all = Vec::new();
        peeked.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"/ HTTP/1.1\r\nHost: a\r\n\r\nbody");
    }
}

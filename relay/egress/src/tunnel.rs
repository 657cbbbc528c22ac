//! Moving the bytes of an allowed connection both ways, until both sides are done or nothing
//! has moved either way for the idle bound: a peer that vanished without a FIN (a sandbox
//! paused or killed, an upstream behind a dead NAT entry) must not hold one of its sandbox's
//! connection slots, and the relay's buffers, forever.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::constants::COPY_BUFFER_BYTES;

/// When bytes last moved, as milliseconds after `base`.
#[derive(Clone)]
struct Clock {
    base: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Clock {
    fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A stream that tells `clock` whenever bytes come out of it.
struct Watched<'a, S> {
    inner: &'a mut S,
    clock: Clock,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<'_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut *this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.clock.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<'_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Copies `a` to `b` and `b` to `a` until both have ended, or fails with `TimedOut` once no
/// byte has come from either for `idle`. Returns the bytes moved each way.
pub(super) async fn copy<A, B>(a: &mut A, b: &mut B, idle: Duration) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let clock = Clock {
        base: Instant::now(),
        last_ms: Arc::new(AtomicU64::new(0)),
    };
    let mut a = Watched {
        inner: a,
        clock: clock.clone(),
    };
    let mut b = Watched {
        inner: b,
        clock: clock.clone(),
    };
    let copy = tokio::io::copy_bidirectional_with_sizes(
        &mut a,
        &mut b,
        COPY_BUFFER_BYTES,
        COPY_BUFFER_BYTES,
    );
    tokio::pin!(copy);
    loop {
        tokio::select! {
            done = &mut copy => return done,
            () = tokio::time::sleep_until(clock.last() + idle) => {
                if clock.last() + idle <= Instant::now() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no byte moved either way for {idle:?}"),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const IDLE: Duration = Duration::from_secs(600);

    #[tokio::test(start_paused = true)]
    async fn a_silent_tunnel_ends_after_the_bound_and_a_busy_one_does_not() {
        let (mut client, mut near) = tokio::io::duplex(1024);
        let (mut far, mut upstream) = tokio::io::duplex(1024);
        let started = Instant::now();
        let tunnel = tokio::spawn(async move { copy(&mut near, &mut far, IDLE).await });

        // Bytes every so often, each gap under the bound, for three bounds in all.
        let mut buf = [0u8; 4];
        for _ in 0..6 {
            tokio::time::sleep(IDLE / 2).await;
            client.write_all(b"ping").await.unwrap();
            upstream.read_exact(&mut buf).await.unwrap();
            upstream.write_all(b"pong").await.unwrap();
            client.read_exact(&mut buf).await.unwrap();
        }
        assert!(!tunnel.is_finished(), "a busy tunnel was cut");
        let busy_until = Instant::now();

        // Then nothing: the tunnel ends one bound after the last byte, not before.
        let err = tunnel.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(Instant::now() - busy_until, IDLE);
        assert!(started.elapsed() >= IDLE * 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_whose_sides_finish_ends_with_their_byte_counts() {
        let (mut client, mut near) = tokio::io::duplex(1024);
        let (mut far, mut upstream) = tokio::io::duplex(1024);
        let tunnel = tokio::spawn(async move { copy(&mut near, &mut far, IDLE).await });
        client.write_all(b"hello").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
        upstream.write_all(b"bye").await.unwrap();
        upstream.shutdown().await.unwrap();
        assert_eq!(tunnel.await.unwrap().unwrap(), (5, 3));
    }
}

//! A body that gives up when its source stalls: what both directions of an intercepted
//! exchange stream through, so a peer that stops sending mid-body does not hold a connection
//! (and the relay's memory for it) forever.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::BODY_IDLE_TIMEOUT;

type BoxError = Box<dyn StdError + Send + Sync>;

/// A body that fails when no frame comes for [`BODY_IDLE_TIMEOUT`] while it is being read,
/// so a stalled peer does not hold a connection forever. Time the reader spends not asking
/// (the other side's backpressure) does not count.
pub(super) struct Idle<B> {
    inner: B,
    timer: Pin<Box<Sleep>>,
    waiting: bool,
}

impl<B> Idle<B> {
    pub(super) fn new(inner: B) -> Self {
        Self {
            inner,
            timer: Box::pin(tokio::time::sleep(BODY_IDLE_TIMEOUT)),
            waiting: false,
        }
    }
}

/// The error of a body that stalled.
#[derive(Debug, thiserror::Error)]
#[error("no body data for {BODY_IDLE_TIMEOUT:?}")]
struct Stalled;

impl<B> Body for Idle<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if !this.waiting {
            this.timer
                .as_mut()
                .reset(Instant::now() + BODY_IDLE_TIMEOUT);
            this.waiting = true;
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = false;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Stalled.into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use http_body_util::BodyExt;
    use tokio::sync::mpsc;

    use super::*;

    /// A body fed by the test, one chunk at a time.
    struct Fed(mpsc::Receiver<Bytes>);

    impl Body for Fed {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0
                .poll_recv(cx)
                .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_source_fails_and_a_slow_reader_does_not() {
        let (tx, rx) = mpsc::channel(1);
        let mut body = Idle::new(Fed(rx));
        tx.send(Bytes::from_static(b"a")).await.unwrap();
        assert!(body.frame().await.unwrap().is_ok());

        // The reader takes its time: that is backpressure, not a stall.
        tokio::time::sleep(BODY_IDLE_TIMEOUT * 2).await;
        tx.send(Bytes::from_static(b"b")).await.unwrap();
        assert!(body.frame().await.unwrap().is_ok());

        // Waiting for the source just short of the bound is fine...
        let short = BODY_IDLE_TIMEOUT - Duration::from_secs(1);
        assert!(tokio::time::timeout(short, body.frame()).await.is_err());
        tx.send(Bytes::from_static(b"c")).await.unwrap();
        assert!(body.frame().await.unwrap().is_ok());

        // ...and a source silent for the whole bound ends the body with an error.
        let started = tokio::time::Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), BODY_IDLE_TIMEOUT);
        assert!(err.to_string().contains("no body data"), "{err}");
        drop(tx);
    }
}

//! The upstream connections of one intercepted connection. Each request takes an idle one (or
//! a new one is opened); its response body gives it back when the body has ended, so the next
//! request on an HTTP/1.1 connection reuses it, and concurrent HTTP/2 streams each get their
//! own.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use hyper::client::conn::http1::SendRequest;

use super::MAX_IDLE_UPSTREAM;

/// Idle upstream connections, ready for another request.
pub(super) struct Pool<B> {
    idle: Mutex<Vec<SendRequest<B>>>,
}

impl<B> Pool<B> {
    pub(super) fn new() -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An idle connection that has not closed since, if any.
    pub(super) fn take(&self) -> Option<SendRequest<B>> {
        let mut idle = self.idle();
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    /// Keeps a connection whose last response has ended, unless enough are kept already.
    fn put(&self, sender: SendRequest<B>) {
        let mut idle = self.idle();
        if !sender.is_closed() && idle.len() < MAX_IDLE_UPSTREAM {
            idle.push(sender);
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<SendRequest<B>>> {
        // A Vec of senders stays consistent even if a holder panicked.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A response body that holds its upstream connection until it ends, then gives it back (a
/// body dropped before its end takes the connection with it: HTTP/1.1 cannot skip the rest).
pub(super) struct Leased<R, B> {
    inner: R,
    sender: Option<SendRequest<B>>,
    pool: Arc<Pool<B>>,
}

impl<R, B> Leased<R, B> {
    pub(super) fn new(inner: R, sender: SendRequest<B>, pool: Arc<Pool<B>>) -> Self {
        Self {
            inner,
            sender: Some(sender),
            pool,
        }
    }
}

impl<R: Body, B> Leased<R, B> {
    fn give_back_if_ended(&mut self) {
        if self.inner.is_end_stream() {
            if let Some(sender) = self.sender.take() {
                self.pool.put(sender);
            }
        }
    }
}

impl<R: Body + Unpin, B> Body for Leased<R, B> {
    type Data = R::Data;
    type Error = R::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<R::Data>, R::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            // The end, found now or announced by the last frame.
            Poll::Ready(None) => {
                if let Some(sender) = this.sender.take() {
                    this.pool.put(sender);
                }
            }
            Poll::Ready(Some(Ok(_))) => this.give_back_if_ended(),
            Poll::Ready(Some(Err(_))) => this.sender = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<R, B> Drop for Leased<R, B> {
    fn drop(&mut self) {
        // Bodies that are empty from the start (HEAD, 204, 304) are never read to their end.
        // An unfinished one drops its connection here, with the sender.
        if let Some(sender) = self.sender.take() {
            if sender.is_ready() {
                self.pool.put(sender);
            }
        }
    }
}

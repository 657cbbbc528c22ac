//! The writer half of a WebSocket connection, as the agent and the client both run it
//! (`PROTOCOL.md` section 12): frames from a bounded queue go out batched, everything already
//! queued in one flush, and a ping goes out every [`PING_PERIOD`] whatever else is sent.
//!
//! Only with the `ws` feature (tokio and tungstenite); the rest of the crate has no async code.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{Sink, SinkExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::limits::PING_INTERVAL_SECS;

/// How often the writer pings: 5 s inside [`PING_INTERVAL_SECS`], so that timer slack never
/// lets the interval the peer counts on run out.
pub const PING_PERIOD: Duration = Duration::from_secs(PING_INTERVAL_SECS - 5);

/// Sends what `queue` yields on `sink` as binary messages, with pings between, until the queue
/// closes (`Ok`) or the sink fails (its error). The sink is left open: the caller sends the
/// close frame it chooses.
pub async fn write_frames<S, T>(sink: &mut S, queue: &mut mpsc::Receiver<T>) -> Result<(), S::Error>
where
    S: Sink<Message> + Unpin,
    T: Into<Bytes>,
{
    write_frames_pinging(sink, queue, PING_PERIOD).await
}

/// [`write_frames`], pinging every `period` instead of every [`PING_PERIOD`]: a side that
/// gives up on a peer silent for less than [`PING_INTERVAL_SECS`] pings more often, so that a
/// live peer's pongs always arrive in time.
pub async fn write_frames_pinging<S, T>(
    sink: &mut S,
    queue: &mut mpsc::Receiver<T>,
    period: Duration,
) -> Result<(), S::Error>
where
    S: Sink<Message> + Unpin,
    T: Into<Bytes>,
{
    // The first ping is due one period from now; `interval` would fire at once and cost a
    // timer-wheel tick before the first frame goes out.
    let start = tokio::time::Instant::now() + period;
    let mut ping = tokio::time::interval_at(start, period);
    loop {
        tokio::select! {
            next = queue.recv() => {
                let Some(first) = next else { return Ok(()) };
                sink.feed(Message::Binary(first.into())).await?;
                // Batch whatever else is already queued into one flush.
                while let Ok(more) = queue.try_recv() {
                    sink.feed(Message::Binary(more.into())).await?;
                }
                sink.flush().await?;
            }
            _ = ping.tick() => sink.send(Message::Ping(Bytes::new())).await?,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A sink that records what it is given, and how many flushes, and fails after `fail_after`
    /// messages.
    #[derive(Default)]
    struct Recorder {
        sent: Vec<Message>,
        flushes: usize,
        fail_after: Option<usize>,
    }

    impl Sink<Message> for Recorder {
        type Error = &'static str;
        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn start_send(mut self: Pin<&mut Self>, msg: Message) -> Result<(), Self::Error> {
            if self.fail_after == Some(self.sent.len()) {
                return Err("the connection is gone");
            }
            self.sent.push(msg);
            Ok(())
        }
        fn poll_flush(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Result<(), Self::Error>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
    }

    fn binary(b: &'static [u8]) -> Message {
        Message::Binary(Bytes::from_static(b))
    }

    #[tokio::test(start_paused = true)]
    async fn queued_frames_go_out_in_order_in_one_flush_until_the_queue_closes() {
        let (tx, mut rx) = mpsc::channel(8);
        for b in [&b"a"[..], b"b", b"c"] {
            tx.send(Bytes::from_static(b)).await.unwrap();
        }
        drop(tx);
        let mut sink = Recorder::default();
        assert_eq!(write_frames(&mut sink, &mut rx).await, Ok(()));
        assert_eq!(sink.sent, [binary(b"a"), binary(b"b"), binary(b"c")]);
        assert_eq!(sink.flushes, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_pinged_every_period() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut sink = Recorder::default();
        let writer = async {
            write_frames(&mut sink, &mut rx).await.unwrap();
            sink
        };
        let feeder = async move {
            // Time is paused: the sleeps advance it exactly, with no waiting.
            tokio::time::sleep(PING_PERIOD * 2 + PING_PERIOD / 2).await;
            tx.send(Bytes::from_static(b"x")).await.unwrap();
        };
        let (sink, ()) = tokio::join!(writer, feeder);
        let ping = Message::Ping(Bytes::new());
        assert_eq!(sink.sent, [ping.clone(), ping, binary(b"x")]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_sink_ends_the_writer_with_its_error() {
        let (tx, mut rx) = mpsc::channel(8);
        for b in [&b"a"[..], b"b"] {
            tx.send(Bytes::from_static(b)).await.unwrap();
        }
        let mut sink = Recorder {
            fail_after: Some(1),
            ..Recorder::default()
        };
        // The queue is still open: only the sink's failure can end the writer.
        let result = write_frames(&mut sink, &mut rx).await;
        assert_eq!(result, Err("the connection is gone"));
        assert_eq!(sink.sent, [binary(b"a")]);
        drop(tx);
    }
}

//! The end of a WebSocket close (`PROTOCOL.md` section 2), as the agent and the relay both
//! run it: after sending its close frame, the closing side reads and discards what the peer
//! still sends until the peer closes too, for at most [`CLOSE_LINGER_MS`] and
//! [`CLOSE_LINGER_BYTES`], before it drops the connection.
//!
//! Why: a socket closed with unread bytes in its receive queue makes the kernel send a reset,
//! and a reset makes the peer's kernel throw away what the peer has not read yet, the close
//! frame among it. A client cut off in the middle of an oversized message was still writing
//! it, so it saw the connection reset (1006) instead of the close frame's 1009.
//!
//! Only with the `ws` feature (tokio); the rest of the crate has no async code.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::limits::{CLOSE_LINGER_BYTES, CLOSE_LINGER_MS};

/// Reads and discards what `read` yields until it ends or fails, [`CLOSE_LINGER_BYTES`]
/// have been read, or [`CLOSE_LINGER_MS`] have passed.
pub async fn linger<R: AsyncRead + Unpin + ?Sized>(read: &mut R) {
    let mut limited = read.take(CLOSE_LINGER_BYTES);
    let mut sink = tokio::io::sink();
    let drain = tokio::io::copy(&mut limited, &mut sink);
    let _ = tokio::time::timeout(Duration::from_millis(CLOSE_LINGER_MS), drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn it_reads_until_the_peer_closes() {
        let (mut ours, mut theirs) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            // Eight times the pipe's capacity: only a reader lets this finish.
            theirs.write_all(&[7u8; 8192]).await.unwrap();
        });
        linger(&mut ours).await;
        writer.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn it_gives_up_on_a_peer_that_never_closes() {
        let (mut ours, _theirs) = tokio::io::duplex(1024);
        let started = tokio::time::Instant::now();
        linger(&mut ours).await;
        assert_eq!(started.elapsed(), Duration::from_millis(CLOSE_LINGER_MS));
    }
}

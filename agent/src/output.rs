//! The output pump: moves what a process writes to one output descriptor (a pipe, or a PTY
//! master) into that channel's replay ring.
//!
//! Non-blocking reads on the runtime (no thread per process): per readiness event, reads until
//! the descriptor is drained or a batch is gathered, then one push into the ring. Before each
//! batch the pump waits for room in the ring and reads no more than that, which is how an
//! attached client that reads slowly holds the process back: the pipe fills and the
//! process's writes block. Output beyond the exec's limit is still read, so the process
//! never blocks on it, but discarded.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_proto::Channel;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tracing::debug;

use crate::process::Process;
use crate::sys;

/// Most bytes read from a pipe per push into the ring: 256 KiB (one read).
const READ_BYTES: usize = 256 << 10;

/// Most bytes gathered from a terminal per push, over its 4 KiB reads: 64 KiB, one frame.
/// Small enough that the ring's readers send while the pump reads on, and the buffer is
/// sized to it, so a batch pins no larger allocation.
const TERMINAL_BATCH_BYTES: usize = 64 << 10;

/// The most a PTY master gives per read while its writer streams: its line discipline's
/// 4 KiB buffer less one byte.
const TERMINAL_READ_BYTES: usize = (4 << 10) - 1;

/// A batch shorter than this is copied into a buffer of its own, so a terminal's small reads
/// do not each pin part of a large read buffer: 4 KiB.
const COPY_BELOW: usize = 4 << 10;

/// Once the process has exited, its output is drained until EOF or until nothing has arrived
/// for this long: 200 ms. A background descendant may hold the pipe open indefinitely.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);

/// A PTY master can report the hangup (EIO: every slave descriptor closed) before the
/// kernel's worker has moved the last bytes the slave wrote into the master's buffer:
/// measured on this project's VMs, about 1 exit in 1,000 of a writer streaming into a
/// terminal lost up to 8 KiB of its tail that way, and a read a moment later returned those
/// bytes. So a hangup is confirmed by reading again: once at once, and when the terminal was
/// streaming when it hung up (its last read was full), this many more times...
const HANGUP_RETRIES: u32 = 5;

/// ...this far apart: 1 ms. A streaming end costs at most 5 ms more; an interactive
/// command's small output ends without waiting.
const HANGUP_RETRY_EVERY: Duration = Duration::from_millis(1);

/// Why reading a descriptor stopped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// End of file, or a read error: nothing more will come.
    Done,
    /// A PTY master's EIO: the slave side is closed, but its last bytes may still be on
    /// their way (see [`HANGUP_RETRIES`]).
    Hangup,
}

/// Moves the bytes of one output descriptor (`None`: the channel is unused) into the
/// process's ring for `channel` until EOF (a confirmed EIO for a PTY), or until it has been
/// idle for [`DRAIN_AFTER_EXIT`] once `leader_gone` says the process exited. Then closes the
/// ring.
pub(crate) async fn pump(
    process: &Process,
    channel: Channel,
    fd: Option<Arc<AsyncFd<OwnedFd>>>,
    mut leader_gone: watch::Receiver<bool>,
) {
    let ring = process.ring(channel);
    let Some(fd) = fd else {
        ring.close();
        return;
    };
    let mut buf = BytesMut::new();
    // Whether the last read filled what it asked for (or a terminal's line discipline
    // buffer): more was likely waiting behind it.
    let mut full_read = false;
    // Reads that found the hangup again since the last bytes arrived.
    let mut hangups = 0;
    loop {
        let room = if process.output_exhausted() {
            READ_BYTES // beyond the limit output is drained and discarded, never held back
        } else {
            ring.room().await.min(READ_BYTES)
        };
        let ready = if *leader_gone.borrow() {
            match tokio::time::timeout(DRAIN_AFTER_EXIT, fd.readable()).await {
                Ok(ready) => ready,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                ready = fd.readable() => ready,
                _ = leader_gone.changed() => continue,
            }
        };
        let Ok(mut ready) = ready else { break };
        // Read until the descriptor is drained or a batch is gathered, then push once: a
        // streaming terminal gives 4 KiB per read, and a push per read would wake the ring's
        // readers, and send a frame, per 4 KiB. A short read pushes at once (an echo).
        let most = if process.pty {
            TERMINAL_BATCH_BYTES
        } else {
            READ_BYTES
        };
        let limit = room.min(most);
        let mut ended = None;
        while buf.len() < limit {
            let want = limit - buf.len();
            match ready.try_io(|fd| sys::read_into(fd.get_ref().as_fd(), &mut buf, want)) {
                Err(_would_block) => {
                    full_read = false;
                    break;
                }
                Ok(Ok(0)) => {
                    ended = Some(End::Done);
                    break;
                }
                Ok(Ok(n)) => {
                    if hangups > 0 {
                        debug!(
                            "{n} bytes of {} arrived after its terminal hung up \
                             ({hangups} reads saw the hangup)",
                            process.id
                        );
                        hangups = 0;
                    }
                    // A short read drained the descriptor, unless a terminal cut it at its
                    // line discipline's buffer: then more is almost always waiting.
                    full_read = n >= want || (process.pty && n >= TERMINAL_READ_BYTES);
                    if !full_read {
                        break;
                    }
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                // EIO is how a PTY master reports that every slave descriptor was closed.
                Ok(Err(e)) if process.pty && e.raw_os_error() == Some(nix::libc::EIO) => {
                    ended = Some(End::Hangup);
                    break;
                }
                Ok(Err(e)) => {
                    debug!("reading {channel:?} of {} failed: {e}", process.id);
                    ended = Some(End::Done);
                    break;
                }
            }
        }
        if !buf.is_empty() {
            let chunk = if buf.len() < COPY_BELOW {
                let small = Bytes::copy_from_slice(&buf);
                buf.clear();
                small
            } else {
                buf.split().freeze()
            };
            ring.push(process.within_limit(chunk));
        }
        match ended {
            None => {}
            Some(End::Hangup) if hangups < if full_read { 1 + HANGUP_RETRIES } else { 1 } => {
                // The readiness stays set after a hangup, so the loop reads again at once.
                if hangups > 0 {
                    tokio::time::sleep(HANGUP_RETRY_EVERY).await;
                }
                hangups += 1;
            }
            Some(_) => break,
        }
    }
    ring.close();
}

//! The output pump: moves what a process writes to one output descriptor (a pipe, or a PTY
//! master) into that channel's replay ring.
//!
//! One non-blocking read of up to 256 KiB per readiness event, on the runtime (no thread per
//! process). Before each read the pump waits for room in the ring, which is how an attached
//! client that reads slowly holds the process back: the pipe fills and the process's writes
//! block. Output beyond the exec's limit is still read, so the process never blocks on it,
//! but discarded.

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

/// Most bytes read from an output descriptor at once: 256 KiB.
const READ_BYTES: usize = 256 << 10;

/// A read shorter than this is copied into a buffer of its own, so a terminal's small reads
/// do not each pin part of a large read buffer: 4 KiB.
const COPY_BELOW: usize = 4 << 10;

/// Once the process has exited, its output is drained until EOF or until nothing has arrived
/// for this long: 200 ms. A background descendant may hold the pipe open indefinitely.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);

/// Moves the bytes of one output descriptor (`None`: the channel is unused) into the
/// process's ring for `channel` until EOF (EIO for a PTY), or until it has been idle for
/// [`DRAIN_AFTER_EXIT`] once `leader_gone` says the process exited. Then closes the ring.
pub async fn pump(
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
        match ready.try_io(|fd| sys::read_into(fd.get_ref().as_fd(), &mut buf, room)) {
            Err(_would_block) => continue,
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => {
                let chunk = if n < COPY_BELOW {
                    let small = Bytes::copy_from_slice(&buf);
                    buf.clear();
                    small
                } else {
                    buf.split().freeze()
                };
                ring.push(process.within_limit(chunk));
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Ok(Err(e)) => {
                // EIO is how a PTY master reports that every slave descriptor was closed.
                if !(process.pty && e.raw_os_error() == Some(nix::libc::EIO)) {
                    debug!("reading {channel:?} of {} failed: {e}", process.id);
                }
                break;
            }
        }
    }
    ring.close();
}

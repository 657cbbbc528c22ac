//! The agent's file descriptors: the soft limit raised to the hard one at start, a cap on the
//! streams open at once (each may hold a few descriptors: a forwarded connection's socket, a
//! process's pipes, a file), and a spare descriptor for when `accept` runs out anyway.
//!
//! Without a cap, a client that opens port tunnels until the agent's descriptors run out makes
//! every later open, accept and spawn of the agent fail with `EMFILE`, whatever asks: the
//! sandbox is as good as lost. With it, the stream over the cap is refused with `too_large`
//! and a message that says what to do, while [`RESERVE_FDS`] stay free for the agent's own
//! work (connections from the relay, `/proc` reads, the processes it already runs). Port
//! tunnels may take only half of the streams, so a client that opens all it can still
//! leaves room to exec, look at files, and close them.

use std::fs::File;
use std::sync::{Arc, Mutex};

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{info, warn};

use tether_proto::ErrorCode;

use crate::stream::OpError;

/// Descriptors kept out of the streams' reach: connections, the WebSocket, `/proc`, logs.
const RESERVE_FDS: u64 = 64;
/// Descriptors one stream is assumed to hold at most: an exec's three pipes and its pidfd.
const FDS_PER_STREAM: u64 = 4;
/// The limit assumed when it cannot be read.
const FALLBACK_LIMIT: u64 = 1024;

/// The agent's descriptor budget.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    max_streams: usize,
    streams: Arc<Semaphore>,
    max_tunnels: usize,
    tunnels: Arc<Semaphore>,
    /// Released when `accept` fails for want of a descriptor, re-opened when one is free.
    spare: Mutex<Option<File>>,
}

impl Budget {
    /// A budget for this process: raises the soft limit to the hard one first.
    pub(crate) fn for_this_process() -> Budget {
        Budget::with_limit(raise_limit())
    }

    /// A budget for a process that may open `limit` descriptors.
    pub(crate) fn with_limit(limit: u64) -> Budget {
        let streams = (limit.saturating_sub(RESERVE_FDS) / FDS_PER_STREAM).max(1);
        let max_streams = usize::try_from(streams).unwrap_or(usize::MAX);
        let max_tunnels = (max_streams / 2).max(1);
        Budget {
            limit,
            max_streams,
            streams: Arc::new(Semaphore::new(max_streams)),
            max_tunnels,
            tunnels: Arc::new(Semaphore::new(max_tunnels)),
            spare: Mutex::new(open_spare()),
        }
    }

    /// A place for one more stream (`tunnel`: a port tunnel), held until it drops; refused
    /// with `too_large` when as many streams, or tunnels, are open as the descriptors allow.
    pub(crate) fn stream(&self, tunnel: bool) -> Result<Place, OpError> {
        let tunnel = match tunnel {
            false => None,
            true => Some(self.tunnels.clone().try_acquire_owned().map_err(|_| {
                OpError::new(
                    ErrorCode::TooLarge,
                    format!(
                        "the sandbox's agent has {} port tunnels open, as many as its {} file \
                         descriptors allow (half its streams); close some port forwards and \
                         retry",
                        self.max_tunnels, self.limit
                    ),
                )
            })?),
        };
        let stream = self.streams.clone().try_acquire_owned().map_err(|_| {
            OpError::new(
                ErrorCode::TooLarge,
                format!(
                    "the sandbox's agent has {} streams open, as many as its {} file \
                     descriptors allow; close some port forwards, processes' streams or \
                     transfers and retry",
                    self.max_streams, self.limit
                ),
            )
        })?;
        Ok(Place {
            _stream: stream,
            _tunnel: tunnel,
        })
    }

    /// Closes the spare descriptor so one `accept` can succeed; false if it is already gone.
    pub(crate) fn release_spare(&self) -> bool {
        self.lock_spare().take().is_some()
    }

    /// Opens the spare descriptor again if it was released and one is free.
    pub(crate) fn rearm_spare(&self) {
        let mut spare = self.lock_spare();
        if spare.is_none() {
            *spare = open_spare();
        }
    }

    fn lock_spare(&self) -> std::sync::MutexGuard<'_, Option<File>> {
        // An Option has no invariant a panic could break.
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One stream's place in the budget, given back on drop.
#[derive(Debug)]
pub(crate) struct Place {
    _stream: OwnedSemaphorePermit,
    _tunnel: Option<OwnedSemaphorePermit>,
}

fn open_spare() -> Option<File> {
    File::open("/dev/null").ok()
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the limit in force.
fn raise_limit() -> u64 {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            warn!("cannot read the file descriptor limit ({e}); assuming {FALLBACK_LIMIT}");
            return FALLBACK_LIMIT;
        }
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            info!("raised the file descriptor limit from {soft} to {hard}");
            hard
        }
        Err(e) => {
            warn!("cannot raise the file descriptor limit from {soft} to {hard}: {e}");
            soft
        }
    }
}

/// Whether an I/O error is the process or the system running out of descriptors.
pub(crate) fn out_of_descriptors(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    e.raw_os_error()
        .is_some_and(|n| n == Errno::EMFILE as i32 || n == Errno::ENFILE as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_beyond_the_descriptors_are_refused_until_one_closes() {
        let budget = Budget::with_limit(RESERVE_FDS + 2 * FDS_PER_STREAM);
        let first = budget.stream(false).unwrap();
        let _second = budget.stream(false).unwrap();
        let refused = budget.stream(false).unwrap_err();
        assert_eq!(refused.code, ErrorCode::TooLarge);
        assert!(
            refused.message.contains("2 streams open"),
            "{}",
            refused.message
        );
        drop(first);
        let _third = budget.stream(false).unwrap();
    }

    #[test]
    fn tunnels_take_half_the_streams_at_most() {
        let budget = Budget::with_limit(RESERVE_FDS + 4 * FDS_PER_STREAM);
        let _tunnels = [budget.stream(true).unwrap(), budget.stream(true).unwrap()];
        let refused = budget.stream(true).unwrap_err();
        assert_eq!(refused.code, ErrorCode::TooLarge);
        assert!(
            refused.message.contains("2 port tunnels open"),
            "{}",
            refused.message
        );
        // Other streams still fit.
        let _exec = budget.stream(false).unwrap();
    }

    #[test]
    fn the_spare_descriptor_is_released_once_and_rearmed() {
        let budget = Budget::with_limit(1024);
        assert!(budget.release_spare());
        assert!(!budget.release_spare());
        budget.rearm_spare();
        assert!(budget.release_spare());
    }
}

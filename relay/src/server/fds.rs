//! The relay's file descriptors: the soft limit raised to the hard limit at start, and a
//! budget that tells when too few are left to take on more work.
//!
//! Every client connection, tunnel, agent socket, database file and `/proc` read costs a
//! descriptor. Run short, and whichever of them asks next fails (`EMFILE`), somewhere random.
//! So the relay keeps [`RESERVE_FDS`] free: a request that arrives with fewer left is refused
//! with 503 before it starts anything (see `admission`). One more descriptor, the spare, is
//! held open to be released when even `accept` fails, so the refusal can still be delivered.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tracing::{info, warn};

/// Descriptors kept free for work already admitted: the agent socket of a tunnel being
/// opened, a sandbox's start (pipes, its log, its socket), `/proc` reads, the database.
pub(super) const RESERVE_FDS: u64 = 64;
/// Below this hard limit the relay warns that it can hold few connections.
const LOW_HARD_LIMIT: u64 = 4096;
/// Where the process's open descriptors are listed, one entry each.
const FD_DIR: &str = "/proc/self/fd";

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (the default soft limit, 1024, is for
/// programs that use `select`, which the relay does not). Returns the limit now in force.
pub(super) fn raise_limit() -> u64 {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            warn!("cannot read the file descriptor limit ({e}); assuming 1024");
            return 1024;
        }
    };
    let limit = if soft < hard {
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
    } else {
        soft
    };
    if limit < LOW_HARD_LIMIT {
        warn!(
            "the relay may open only {limit} file descriptors, so it holds a few hundred \
             tunnels at most and refuses more with 503; raise the hard limit (`ulimit -Hn`, \
             or LimitNOFILE= in a systemd unit) for more"
        );
    }
    limit
}

/// Why no more work can be admitted.
#[derive(Debug, thiserror::Error)]
pub(super) enum Shortage {
    /// Fewer than the reserve are left.
    #[error(
        "the relay is out of file descriptors ({in_use} of {limit} open, {RESERVE_FDS} kept in \
         reserve); close some tunnels or sessions and try again, or raise the relay's limit \
         (`ulimit -Hn`, LimitNOFILE=)"
    )]
    Low {
        /// Descriptors open.
        in_use: u64,
        /// The limit.
        limit: u64,
    },
    /// Not even the count could be taken, which is itself a shortage.
    #[error(
        "the relay is out of file descriptors (cannot even list them: {0}); close some tunnels \
         or sessions and try again, or raise the relay's limit (`ulimit -Hn`, LimitNOFILE=)"
    )]
    Exhausted(io::Error),
}

/// The relay's descriptor budget.
#[derive(Debug)]
pub(super) struct FdBudget {
    limit: u64,
    /// Whether the last check found a shortage, so only its start and end are logged.
    short: AtomicBool,
    /// Released when `accept` fails for want of a descriptor, re-opened when one is free.
    spare: Mutex<Option<File>>,
}

impl FdBudget {
    /// A budget for the process's current limit, holding its spare descriptor.
    pub(super) fn new(limit: u64) -> FdBudget {
        FdBudget {
            limit,
            short: AtomicBool::new(false),
            spare: Mutex::new(open_spare()),
        }
    }

    /// [`FdBudget::check`], logging when a shortage starts and when it ends rather than at
    /// every refusal.
    pub(super) fn admit(&self) -> Result<(), Shortage> {
        let verdict = self.check();
        let short = verdict.is_err();
        if self.short.swap(short, Ordering::Relaxed) != short {
            match &verdict {
                Err(shortage) => {
                    warn!("{shortage}; refusing requests with 503 until descriptors free up")
                }
                Ok(()) => info!("file descriptors are available again; admitting requests"),
            }
        }
        verdict
    }

    /// Whether a new request may start: at least [`RESERVE_FDS`] descriptors are free.
    pub(super) fn check(&self) -> Result<(), Shortage> {
        let in_use = count_open().map_err(Shortage::Exhausted)?;
        if in_use.saturating_add(RESERVE_FDS) > self.limit {
            return Err(Shortage::Low {
                in_use,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// Closes the spare descriptor so one `accept` can succeed; false if it is already gone.
    pub(super) fn release_spare(&self) -> bool {
        self.spare.lock().expect("spare fd lock").take().is_some()
    }

    /// Opens the spare descriptor again if it was released and one is free.
    pub(super) fn rearm_spare(&self) {
        let mut spare = self.spare.lock().expect("spare fd lock");
        if spare.is_none() {
            *spare = open_spare();
        }
    }
}

fn open_spare() -> Option<File> {
    File::open("/dev/null").ok()
}

/// How many descriptors the process has open (not counting the one used to list them).
fn count_open() -> io::Result<u64> {
    let entries = std::fs::read_dir(FD_DIR)?.count() as u64;
    Ok(entries.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_descriptors_as_they_open_and_close() {
        // Other tests open descriptors concurrently; two hundred is far beyond their noise.
        let before = count_open().unwrap();
        let files: Vec<File> = (0..200).map(|_| open_spare().unwrap()).collect();
        let during = count_open().unwrap();
        assert!(during >= before + 150, "{before} then {during}");
        let tight = FdBudget {
            limit: during + RESERVE_FDS / 2,
            short: AtomicBool::new(false),
            spare: Mutex::new(None),
        };
        assert!(matches!(tight.admit(), Err(Shortage::Low { .. })));
        drop(files);
        let roomy = FdBudget::new(during + 2 * RESERVE_FDS);
        roomy.check().unwrap();
        assert!(roomy.release_spare());
        assert!(!roomy.release_spare());
        roomy.rearm_spare();
        assert!(roomy.release_spare());
    }
}

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
use std::time::{Duration, Instant};

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tracing::{info, warn};

/// Descriptors kept free for work already admitted: the agent socket of a tunnel being
/// opened, a sandbox's start (pipes, its log, its socket), `/proc` reads, the database.
pub(super) const RESERVE_FDS: u64 = 64;
/// Descriptors an admitted request is assumed to take until the next count: a tunnel's client
/// and agent sockets.
const FDS_PER_REQUEST: u64 = 2;
/// How old a count may get before a request takes a new one. Counting lists `/proc/self/fd`,
/// about a microsecond per open descriptor, too dear for every request of a busy relay.
const RECOUNT_AFTER: Duration = Duration::from_millis(100);
/// How old a count may get before a request that the estimate would refuse takes a new one:
/// near the limit, counts are taken often, so closed descriptors are soon seen free again.
const RECOUNT_WHEN_SHORT: Duration = Duration::from_millis(1);
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
    /// The last count, plus what was admitted since.
    estimate: Mutex<Estimate>,
    /// Released when `accept` fails for want of a descriptor, re-opened when one is free.
    spare: Mutex<Option<File>>,
}

impl FdBudget {
    /// A budget for the process's current limit, holding its spare descriptor.
    pub(super) fn new(limit: u64) -> FdBudget {
        FdBudget {
            limit,
            short: AtomicBool::new(false),
            estimate: Mutex::new(Estimate::default()),
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

    /// Whether a new request may start: at least [`RESERVE_FDS`] descriptors are free. The
    /// answer comes from a recent count plus [`FDS_PER_REQUEST`] per request admitted since,
    /// which only overestimates; a fresh count is taken when the last is old, or when the
    /// estimate would refuse.
    pub(super) fn check(&self) -> Result<(), Shortage> {
        let mut estimate = self.estimate.lock().expect("fd estimate lock");
        let fits = |in_use: u64| in_use.saturating_add(RESERVE_FDS) <= self.limit;
        let age = estimate.counted_at.map(|at| at.elapsed());
        let stale = age.is_none_or(|age| {
            age >= RECOUNT_AFTER || (!fits(estimate.in_use) && age >= RECOUNT_WHEN_SHORT)
        });
        if stale {
            estimate.in_use = count_open().map_err(Shortage::Exhausted)?;
            estimate.counted_at = Some(Instant::now());
        }
        if !fits(estimate.in_use) {
            return Err(Shortage::Low {
                in_use: estimate.in_use,
                limit: self.limit,
            });
        }
        estimate.in_use += FDS_PER_REQUEST;
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

/// Descriptors in use as last counted, plus what was admitted since.
#[derive(Debug, Default)]
struct Estimate {
    in_use: u64,
    /// When the count was taken; `None` before the first.
    counted_at: Option<Instant>,
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
            estimate: Mutex::new(Estimate::default()),
            spare: Mutex::new(None),
        };
        assert!(matches!(tight.admit(), Err(Shortage::Low { .. })));
        drop(files);
        let roomy = FdBudget::new(during + 2 * RESERVE_FDS);
        roomy.check().unwrap();
        // Admitted requests count against the budget until the next count...
        let admitted = (0..)
            .take_while(|_| roomy.check().is_ok())
            .take(10_000)
            .count() as u64;
        assert!(admitted <= (2 * RESERVE_FDS) / FDS_PER_REQUEST + 200 / FDS_PER_REQUEST);
        // ...which, once the estimate refuses, is taken again and sees them free.
        std::thread::sleep(RECOUNT_WHEN_SHORT);
        roomy.check().unwrap();
        assert!(roomy.release_spare());
        assert!(!roomy.release_spare());
        roomy.rearm_spare();
        assert!(roomy.release_spare());
    }
}

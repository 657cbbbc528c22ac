//! The one place that waits for child processes: on every SIGCHLD it reaps all exited
//! children with `waitpid(-1)`, hands the statuses of the processes we started to their
//! owners and simply discards orphans (the agent may be PID 1, or a subreaper, so every
//! process whose parent died becomes its child).
//!
//! Nothing else in the agent may wait for a child (no `tokio::process`, no
//! `std::process::Child::wait`): it would race this reaper for the statuses.
//!
//! The spawn/exit race is closed by one lock: a spawner holds it from before the fork until
//! the new pid is registered, and the reaper holds it while it calls `waitpid`, so a status
//! can never arrive for a pid that is not registered yet. The same lock makes signalling a
//! single process safe: a pid is only signalled while it is registered, i.e. not yet reaped,
//! so it cannot have been reused.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;
use tracing::{debug, warn};

/// How a reaped child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this code.
    Code(i32),
    /// This signal killed it.
    Signal(i32),
}

type Table = HashMap<i32, oneshot::Sender<Ended>>;

/// Reaps children and routes their statuses.
#[derive(Debug)]
pub(crate) struct Reaper {
    /// Children we started and have not reaped yet.
    table: Mutex<Table>,
}

impl Reaper {
    /// Starts reaping: makes the agent the reaper of its orphaned descendants and installs the
    /// SIGCHLD handler. Must be called inside the tokio runtime, before any child exists.
    pub(crate) fn start() -> Arc<Reaper> {
        // Outside a container the agent is not PID 1; as a subreaper it still inherits (and
        // reaps) the orphans of its processes, so a killed process group leaves no zombies.
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            debug!("cannot become a child subreaper: {e}");
        }
        let reaper = Arc::new(Reaper {
            table: Mutex::new(HashMap::new()),
        });
        match signal(SignalKind::child()) {
            Ok(mut sigchld) => {
                let weak = Arc::downgrade(&reaper);
                tokio::spawn(async move {
                    loop {
                        // Children that ended before the handler existed (a PID 1 inherits
                        // some) are reaped on the first pass.
                        match weak.upgrade() {
                            Some(reaper) => reaper.reap_all(),
                            None => return,
                        }
                        if sigchld.recv().await.is_none() {
                            return;
                        }
                    }
                });
            }
            Err(e) => warn!("cannot watch SIGCHLD ({e}); exited processes will not be reported"),
        }
        reaper
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().expect("reaper table lock")
    }

    /// Runs `spawn` (which forks and returns the child's pid) with the table locked, and
    /// registers the pid before the lock is released. The receiver gets the child's status.
    pub(crate) fn spawn<E>(
        &self,
        spawn: impl FnOnce() -> Result<u32, E>,
    ) -> Result<(i32, oneshot::Receiver<Ended>), E> {
        let mut table = self.lock();
        let pid = spawn()? as i32;
        let (tx, rx) = oneshot::channel();
        table.insert(pid, tx);
        Ok((pid, rx))
    }

    /// Sends `sig` to process `pid` if it has not been reaped yet. False when it has.
    pub(crate) fn signal(&self, pid: i32, sig: Signal) -> bool {
        let table = self.lock();
        if !table.contains_key(&pid) {
            return false;
        }
        kill(Pid::from_raw(pid), sig).is_ok()
    }

    fn reap_all(&self) {
        let mut table = self.lock();
        loop {
            let (pid, ended) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, Ended::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, Ended::Signal(sig as i32)),
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(e) => {
                    warn!("waitpid failed: {e}");
                    return;
                }
            };
            match table.remove(&pid.as_raw()) {
                // The owner may have stopped caring; that is fine.
                Some(tx) => drop(tx.send(ended)),
                None => debug!("reaped orphan {pid}: {ended:?}"),
            }
        }
    }
}

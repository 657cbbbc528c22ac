//! Removing a sandbox completely, whatever state it is in: its processes (PID 1 first, which
//! takes its whole PID namespace and with it every mount of the sandbox; then anything left in
//! its cgroup), its cgroup directories, its disk (unmounted, loop device detached) and its
//! host directory. Every step accepts "already gone", so delete is idempotent and also cleans
//! up after a failed create.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::{umount2, MntFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::cgroup::SandboxCgroup;
use super::constants::{KILL_TIMEOUT, POLL_INTERVAL, RMDIR_TIMEOUT};
use super::disk;
use super::error::{IoContext, LocalError};
use super::freeze;
use super::layout::Layout;
use super::process::ProcessIdentity;
use tether_mountinfo as mountinfo;

/// How long the rest of the sandbox gets to die with its PID 1 before it is killed one by one.
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// Everything one sandbox may have left on the host.
#[derive(Clone, Debug)]
pub(super) struct Teardown {
    /// The sandbox id, for messages.
    pub id: String,
    /// Its host directory.
    pub layout: Layout,
    /// Its cgroup, when known.
    pub cgroup: Option<SandboxCgroup>,
    /// Its PID 1, when known.
    pub process: Option<ProcessIdentity>,
}

impl Teardown {
    /// Runs [`Teardown::run`] off the async runtime (it sleeps and may remove large trees).
    pub(super) async fn run_blocking(self) -> Result<(), LocalError> {
        tokio::task::spawn_blocking(move || self.run())
            .await
            .map_err(|e| LocalError::io("finish removing the sandbox", io::Error::other(e)))?
    }

    /// Kills, unmounts and removes everything; blocking.
    pub(super) fn run(&self) -> Result<(), LocalError> {
        self.end_processes()?;
        // After the processes: the last of them let go of the disk's file system.
        disk::release(&self.layout)?;
        remove_dir(self.layout.dir())
    }

    /// Kills every process and removes the cgroup; blocking. What is on disk stays (a stop
    /// ends here).
    pub(super) fn end_processes(&self) -> Result<(), LocalError> {
        if let Some(cgroup) = &self.cgroup {
            freeze::kill_paused(cgroup);
        }
        if let Some(process) = self.process.filter(ProcessIdentity::is_alive) {
            // SIGKILL to a PID namespace's init kills every process in the namespace.
            let _ = kill(Pid::from_raw(process.pid), Signal::SIGKILL);
            wait_until(KILL_TIMEOUT, || !process.is_alive());
        }
        if let Some(cgroup) = &self.cgroup {
            wait_until(DRAIN_GRACE, || cgroup.pids().is_empty());
            cgroup
                .kill_all(KILL_TIMEOUT)
                .map_err(|pids| LocalError::Unkillable {
                    id: self.id.clone(),
                    timeout: KILL_TIMEOUT,
                    pids,
                })?;
            cgroup.remove(RMDIR_TIMEOUT)?;
        }
        Ok(())
    }
}

/// Removes a sandbox directory after detaching anything mounted under it in the host's
/// namespace (the provider mounts nothing there, but a directory must never be emptied
/// through a mount).
fn remove_dir(dir: &Path) -> Result<(), LocalError> {
    for mount_point in mountinfo::under(&mountinfo::current(), dir) {
        umount2(&mount_point, MntFlags::MNT_DETACH)
            .map_err(io::Error::from)
            .context(|| format!("unmount {}", mount_point.display()))?;
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other.context(|| format!("remove {}", dir.display())),
    }
}

/// Undoes a half-made sandbox when a create fails, or, if the create is cancelled, on drop.
pub(super) struct CreateGuard(Option<Teardown>);

impl CreateGuard {
    /// Guards the sandbox `teardown` would remove.
    pub(super) fn new(teardown: Teardown) -> Self {
        CreateGuard(Some(teardown))
    }

    /// The create succeeded: keep everything.
    pub(super) fn disarm(mut self) {
        self.0 = None;
    }

    /// The create failed: remove everything before reporting the failure.
    pub(super) async fn undo(mut self) {
        if let Some(teardown) = self.0.take() {
            if let Err(e) = teardown.run_blocking().await {
                tracing::warn!("cleaning up after a failed create: {e}");
            }
        }
    }
}

impl Drop for CreateGuard {
    fn drop(&mut self) {
        let Some(teardown) = self.0.take() else {
            return;
        };
        let cleanup = move || {
            if let Err(e) = teardown.run() {
                tracing::warn!("cleaning up after a cancelled create: {e}");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(cleanup)),
            Err(_) => cleanup(),
        }
    }
}

fn wait_until(timeout: Duration, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() && start.elapsed() < timeout {
        std::thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tearing_down_nothing_succeeds_twice() {
        let data = std::env::temp_dir().join(format!("tether-teardown-{}", std::process::id()));
        let layout = Layout::new(&data, "sb-gone");
        layout.create().unwrap();
        let teardown = Teardown {
            id: "sb-gone".into(),
            layout: layout.clone(),
            cgroup: Some(SandboxCgroup::V2 {
                dir: "/nonexistent/tether/sb-gone".into(),
            }),
            process: Some(ProcessIdentity {
                pid: i32::MAX,
                start_time: 1,
            }),
        };
        teardown.run().unwrap();
        assert!(!layout.dir().exists());
        teardown.run().unwrap();
        std::fs::remove_dir_all(&data).unwrap();
    }
}

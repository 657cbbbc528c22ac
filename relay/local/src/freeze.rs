//! Pausing a local sandbox: every process in it but its agent moves into the sandbox's
//! `paused` child cgroup, which is frozen (v1's freezer, v2's `cgroup.freeze`); resuming
//! thaws it. Frozen processes keep their memory and use no CPU, and do not notice: no signal
//! reaches them, and their parents see no stop.
//!
//! The agent stays awake on purpose. Attached sessions keep their WebSockets (it answers their
//! pings, and the relay's splice hears it alive), and nothing is lost: frozen processes write
//! nothing, and what they wrote before is in the agent's replay buffers. Freezing the agent
//! too would end every session that outlasts the peers' liveness timeouts.
//!
//! The child is frozen before anything moves into it, so a process is frozen the moment it
//! arrives and never runs in between. A process that forks while the others move leaves its
//! child behind; the move repeats until only the agent is left outside, which terminates
//! because only processes still outside can fork (the pids limit bounds a fork bomb) and
//! is bounded by [`PAUSE_TIMEOUT`] regardless. Processes stay in the child after a resume;
//! the next pause moves only those started since.
//!
//! A freeze that does not settle within [`FREEZE_ATTEMPT`] is thawed and tried again, as
//! runc does: a shell waiting in `vfork` for a child that froze before its `exec` cannot
//! freeze until that child runs on, so the cgroup would stay FREEZING for good.

use std::path::Path;
use std::time::{Duration, Instant};

use super::cgroup::{read, read_pids, write, SandboxCgroup};
use super::constants::{FREEZE_ATTEMPT, FREEZE_POLL_INTERVAL, FREEZE_RETRY_PAUSE, PAUSE_TIMEOUT};
use super::error::{IoContext, LocalError};

/// Whether the sandbox is paused: its paused child is frozen (or freezing).
pub(super) fn is_paused(cgroup: &SandboxCgroup) -> bool {
    let Some(dir) = cgroup.paused_dir() else {
        return false;
    };
    match cgroup {
        // FREEZING counts: a pause that is still settling has been asked for.
        SandboxCgroup::V1 { .. } => {
            matches!(
                read(&dir.join("freezer.state")).trim(),
                "FROZEN" | "FREEZING"
            )
        }
        SandboxCgroup::V2 { .. } => read(&dir.join("cgroup.freeze")).trim() == "1",
    }
}

/// Freezes every process of sandbox `id` but its agent (`agent`, a host pid).
pub(super) fn pause(id: &str, cgroup: &SandboxCgroup, agent: i32) -> Result<(), LocalError> {
    let (Some(parent), Some(paused)) = (cgroup.freezer_dir(), cgroup.paused_dir()) else {
        return Err(LocalError::Unsupported(format!(
            "sandbox {id} cannot be paused: this host mounts no cgroup v1 freezer hierarchy \
             (mount one at /sys/fs/cgroup/freezer, or run the relay on a cgroup v2 host)"
        )));
    };
    if is_paused(cgroup) {
        return Err(LocalError::Conflict(format!(
            "sandbox {id} is already paused; `tether resume {id}` resumes it"
        )));
    }
    // Made by the first pause, kept until the sandbox's cgroup goes.
    match std::fs::create_dir(&paused) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        made => made.context(|| format!("create cgroup {}", paused.display()))?,
    }
    let start = Instant::now();
    loop {
        set_frozen(cgroup, &paused, true)?;
        let attempt = move_all_but(parent, &paused, agent, start)
            .map(|()| wait_frozen(cgroup, &paused, FREEZE_ATTEMPT));
        match attempt {
            Ok(true) => return Ok(()),
            // Some task cannot freeze right now, typically a shell waiting in vfork for a
            // child that froze before its exec: thawed for a moment, they get past it.
            Ok(false) if start.elapsed() < PAUSE_TIMEOUT => {
                set_frozen(cgroup, &paused, false)?;
                std::thread::sleep(FREEZE_RETRY_PAUSE);
            }
            failed => {
                // Half a pause is worse than none: whatever moved runs again.
                let _ = set_frozen(cgroup, &paused, false);
                return Err(failed.err().unwrap_or_else(|| {
                    LocalError::io(
                        format!("freeze {}", paused.display()),
                        std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("its processes were not all frozen within {PAUSE_TIMEOUT:?}"),
                        ),
                    )
                }));
            }
        }
    }
}

/// Thaws sandbox `id`'s paused processes.
pub(super) fn resume(id: &str, cgroup: &SandboxCgroup) -> Result<(), LocalError> {
    let paused = cgroup.paused_dir().filter(|_| is_paused(cgroup));
    let Some(paused) = paused else {
        return Err(LocalError::Conflict(format!(
            "sandbox {id} is not paused; `tether pause {id}` pauses it"
        )));
    };
    set_frozen(cgroup, &paused, false)
}

/// Asks the kernel to freeze (or thaw) the paused child.
fn set_frozen(cgroup: &SandboxCgroup, paused: &Path, frozen: bool) -> Result<(), LocalError> {
    match cgroup {
        SandboxCgroup::V1 { .. } => write(
            &paused.join("freezer.state"),
            if frozen { "FROZEN" } else { "THAWED" },
        ),
        SandboxCgroup::V2 { .. } => write(
            &paused.join("cgroup.freeze"),
            if frozen { "1" } else { "0" },
        ),
    }
}

/// Moves every process in `parent` but `agent` into `paused`, until none is left (or the
/// pause that began at `start` runs out of time).
fn move_all_but(
    parent: &Path,
    paused: &Path,
    agent: i32,
    start: Instant,
) -> Result<(), LocalError> {
    let target = paused.join("cgroup.procs");
    loop {
        let left: Vec<i32> = read_pids(&parent.join("cgroup.procs"))
            .into_iter()
            .filter(|&pid| pid != agent)
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if start.elapsed() > PAUSE_TIMEOUT {
            return Err(LocalError::io(
                format!("move {} processes into {}", left.len(), paused.display()),
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("processes kept forking for {PAUSE_TIMEOUT:?}; try again"),
                ),
            ));
        }
        for pid in left {
            match write(&target, &pid.to_string()) {
                Ok(()) => {}
                // It exited between the read and the move: nothing left to freeze.
                Err(LocalError::Io { ref source, .. })
                    if source.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether the kernel reports every task of `paused` frozen within `within`.
fn wait_frozen(cgroup: &SandboxCgroup, paused: &Path, within: Duration) -> bool {
    let start = Instant::now();
    let frozen = || match cgroup {
        SandboxCgroup::V1 { .. } => read(&paused.join("freezer.state")).trim() == "FROZEN",
        SandboxCgroup::V2 { .. } => read(&paused.join("cgroup.events")).contains("frozen 1"),
    };
    loop {
        if frozen() {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        std::thread::sleep(FREEZE_POLL_INTERVAL);
    }
}

/// Kills every paused process, then thaws them, so they die without running another
/// instruction of their own: a frozen task cannot die, and while one lives the sandbox's PID
/// 1 cannot finish dying either. For a delete or a stop of a paused sandbox; blocking.
pub(super) fn kill_paused(cgroup: &SandboxCgroup) {
    let Some(paused) = cgroup.paused_dir().filter(|d| d.exists()) else {
        return;
    };
    for pid in read_pids(&paused.join("cgroup.procs")) {
        // SIGKILL is pending once sent; it is acted on before the task returns to its code.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = set_frozen(cgroup, &paused, false);
}

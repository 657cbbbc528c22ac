//! Duties of a container's first process: forward SIGTERM to the processes we started and
//! shut down cleanly, and keep the agent alive when the sandbox runs out of memory.
//! (Zombies are reaped by [`crate::reaper`].)

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tracing::{info, warn};

use crate::agent::Agent;

/// How long processes get between SIGTERM and SIGKILL at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Makes the kernel's OOM killer pick any user process before the agent. Children reset
/// their own score before they exec (see the exec module), so they stay killable.
pub(crate) fn shield_from_oom() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        // Unprivileged agents cannot lower their score; that is fine outside a sandbox.
        tracing::debug!("could not lower the agent's OOM score: {e}");
    }
}

/// On SIGTERM or SIGINT: terminate every process, wait briefly, kill the rest, exit.
pub(crate) async fn shutdown_on_signal(agent: Arc<Agent>) {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        warn!("cannot install signal handlers; SIGTERM will kill the agent abruptly");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    info!("shutting down: terminating processes");
    agent
        .processes
        .signal_all(nix::sys::signal::Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    while agent.processes.any_running() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent
        .processes
        .signal_all(nix::sys::signal::Signal::SIGKILL);
    std::process::exit(0);
}

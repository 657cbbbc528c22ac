//! The reaper: at startup, forgets sandboxes their provider no longer has; then, every tick,
//! deletes sandboxes whose TTL ran out or that sat idle (no tunnel open) past their idle
//! timeout, and records open tunnels as activity.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use super::constants::ACTIVITY_INTERVAL;
use super::state::{now_ms, Relay};
use crate::provider::SandboxState;
use crate::registry::{SandboxId, SandboxRecord};

/// Runs until the relay shuts down.
pub(super) async fn run(relay: Arc<Relay>, interval: Duration) {
    tokio::select! {
        () = reconcile(&relay) => {}
        () = relay.shutdown.cancelled() => return,
    }
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_activity = Instant::now();
    // Sandboxes whose delete failed: warned about once, not every tick.
    let mut failing = HashSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = relay.shutdown.cancelled() => return,
        }
        if last_activity.elapsed() >= ACTIVITY_INTERVAL {
            last_activity = Instant::now();
            let open = relay.tunnels.open_ids();
            if let Err(e) = relay.registry.touch(open, now_ms()).await {
                warn!("cannot record tunnel activity: {e}");
            }
        }
        reap(&relay, &mut failing).await;
    }
}

/// Deletes every sandbox that is due.
async fn reap(relay: &Relay, failing: &mut HashSet<SandboxId>) {
    let now = now_ms();
    let due = match relay.registry.due(now).await {
        Ok(due) => due,
        Err(e) => {
            warn!("cannot look for expired sandboxes: {e}");
            return;
        }
    };
    // Forget failures of sandboxes no longer due (deleted by a client, renewed).
    failing.retain(|id| due.iter().any(|s| &s.id == id));
    let results = join_all(due.into_iter().map(|s| reap_one(relay, s))).await;
    for (id, result) in results.into_iter().flatten() {
        match result {
            Ok(()) => {
                failing.remove(&id);
            }
            Err(e) => {
                if failing.insert(id) {
                    warn!("{e}; the reaper will keep trying");
                }
            }
        }
    }
}

/// Deletes `sandbox` if it is still due; `None` when it no longer is.
async fn reap_one(
    relay: &Relay,
    sandbox: SandboxRecord,
) -> Option<(SandboxId, Result<(), String>)> {
    // Read it again: a renew or a new tunnel may have come in since the scan.
    let sandbox = relay
        .registry
        .get(&sandbox.tenant, &sandbox.id)
        .await
        .ok()??;
    let now = now_ms();
    let why = if sandbox.expired(now) {
        "its TTL ran out".to_string()
    } else if sandbox.state == SandboxState::Gone {
        "its provider no longer has it".to_string()
    } else if sandbox.idle(now) && !relay.tunnels.is_open(&sandbox.id) {
        let idle = sandbox.idle_timeout.unwrap_or_default();
        format!("no client connected for {idle:?}")
    } else {
        return None;
    };
    let result = match relay.provider_of(&sandbox) {
        Ok(provider) => relay.destroy(&*provider, &sandbox).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => {
            info!(
                "deleted sandbox {} of tenant {}: {why}",
                sandbox.id, sandbox.tenant
            );
            Some((sandbox.id, Ok(())))
        }
        Err(e) => Some((
            sandbox.id,
            Err(format!("cannot delete sandbox ({why}): {e}")),
        )),
    }
}

/// Asks each sandbox's provider for its state, forgetting those it no longer has: after a
/// host reboot, say, the registry may remember sandboxes that are gone.
async fn reconcile(relay: &Relay) {
    let all = match relay.registry.all().await {
        Ok(all) => all,
        Err(e) => {
            warn!("cannot read the registry to reconcile it: {e}");
            return;
        }
    };
    join_all(all.into_iter().map(|mut sandbox| async move {
        let provider = match relay.provider_of(&sandbox) {
            Ok(provider) => provider,
            Err(e) => return warn!("{e}"),
        };
        relay.refresh_state(&*provider, &mut sandbox).await;
        if sandbox.state == SandboxState::Gone {
            match relay.destroy(&*provider, &sandbox).await {
                Ok(()) => info!(
                    "forgot sandbox {}: its provider no longer has it",
                    sandbox.id
                ),
                Err(e) => warn!("cannot forget sandbox {}: {e}", sandbox.id),
            }
        }
    }))
    .await;
}

//! The reaper: at startup, forgets sandboxes their provider no longer has; then, every tick,
//! deletes sandboxes whose TTL ran out or that sat idle (no tunnel open) past their idle
//! timeout, asks again about sandboxes whose state is unknown, and records open tunnels as
//! activity.
//!
//! A sandbox is deleted for being gone only when its provider, asked again right before,
//! still positively says so; an `unknown` state (the provider could not be asked, the relay
//! could not read the evidence) is never acted on. Every delete the user did not ask for is
//! journaled with its evidence ([`crate::store::Destroyed`]) and logged.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use super::constants::{ACTIVITY_INTERVAL, UNKNOWN_RECHECK_INTERVAL};
use super::error::ApiError;
use super::state::{now_ms, Relay};
use crate::provider::{Provider, ProviderError, SandboxState};
use crate::store::{DestroyReason, Destroyed, SandboxId, SandboxRecord};

/// Runs until the relay shuts down.
pub(super) async fn run(relay: Arc<Relay>, interval: Duration) {
    tokio::select! {
        () = reconcile(&relay) => {}
        () = relay.shutdown.cancelled() => return,
    }
    // Its own task: a provider in an outage may take long to answer (or not answer), and
    // that must not hold up TTLs and idle timeouts.
    let recheck = interval.max(UNKNOWN_RECHECK_INTERVAL);
    relay
        .tasks
        .spawn(recheck_unknown_every(relay.clone(), recheck));
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

/// Every `interval`, until the relay shuts down, asks again about every sandbox whose state
/// could not be told.
async fn recheck_unknown_every(relay: Arc<Relay>, interval: Duration) {
    relay.every(interval, || recheck_unknown(&relay)).await;
}

/// Asks again about every sandbox whose state could not be told.
async fn recheck_unknown(relay: &Relay) {
    let unknown = match relay.registry.in_state(SandboxState::Unknown).await {
        Ok(unknown) => unknown,
        Err(e) => return warn!("cannot look for sandboxes of unknown state: {e}"),
    };
    join_all(unknown.into_iter().map(|mut sandbox| async move {
        if let Ok(provider) = relay.provider_of(&sandbox) {
            relay.refresh_state(&*provider, &mut sandbox).await;
            if sandbox.state != SandboxState::Unknown {
                info!(
                    "sandbox {} is {} again",
                    sandbox.id,
                    state_word(sandbox.state)
                );
            }
        }
    }))
    .await;
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
    let mut sandbox = relay
        .registry
        .get(&sandbox.tenant, &sandbox.id)
        .await
        .ok()??;
    let now = now_ms();
    let provider = match relay.provider_of(&sandbox) {
        Ok(provider) => provider,
        Err(e) => return Some((sandbox.id, Err(e.to_string()))),
    };
    let (reason, evidence) = if sandbox.expired(now) {
        let ttl = sandbox.ttl.unwrap_or_default();
        let at = sandbox.expires_ms.unwrap_or_default();
        let evidence = format!("its TTL of {ttl:?} ran out at {at} ms (now {now} ms)");
        (DestroyReason::Ttl, evidence)
    } else if sandbox.state == SandboxState::Gone {
        // Recorded as gone by an earlier call: make sure, right before deleting anything.
        relay.refresh_state(&*provider, &mut sandbox).await;
        if sandbox.state != SandboxState::Gone {
            warn!(
                "sandbox {} was recorded as gone, but its provider now reports it {}; keeping it",
                sandbox.id,
                state_word(sandbox.state)
            );
            return None;
        }
        let evidence = format!(
            "provider `{}` reported sandbox {} (its id there: {}) gone when asked again just \
             before the delete",
            sandbox.provider, sandbox.id, sandbox.provider_ref
        );
        (DestroyReason::Gone, evidence)
    } else if sandbox.idle(now) && !relay.tunnels.is_open(&sandbox.id) {
        let idle = sandbox.idle_timeout.unwrap_or_default();
        let evidence = format!(
            "no client connected since {} ms (now {now} ms), past its idle timeout of {idle:?}",
            sandbox.last_active_ms
        );
        (DestroyReason::Idle, evidence)
    } else {
        return None;
    };
    let entry = Destroyed::of(&sandbox, now, reason, evidence);
    let result = destroy_unasked(relay, &*provider, &sandbox, entry).await;
    Some((sandbox.id, result.map_err(|e| e.to_string())))
}

/// Deletes `sandbox` at its provider, then forgets it and journals `entry` in one step, and
/// logs it. A provider failure keeps the record, so the delete is retried.
async fn destroy_unasked(
    relay: &Relay,
    provider: &dyn Provider,
    sandbox: &SandboxRecord,
    entry: Destroyed,
) -> Result<(), ApiError> {
    let reason = entry.reason;
    match provider.delete(&sandbox.handle()).await {
        Ok(()) | Err(ProviderError::Gone(_)) => {}
        Err(e) => {
            let e = ApiError::provider(&sandbox.provider, Some(&sandbox.id), e);
            return Err(ApiError::Provider(format!(
                "cannot delete sandbox {} ({reason}: {}): {e}",
                sandbox.id, entry.evidence
            )));
        }
    }
    relay.egress.detach(&sandbox.id);
    let evidence = entry.evidence.clone();
    relay.registry.remove_journaled(entry, None).await?;
    info!(
        sandbox = %sandbox.id,
        tenant = %sandbox.tenant,
        reason = %reason,
        "deleted sandbox {} of tenant {} without a client asking ({reason}): {evidence}",
        sandbox.id, sandbox.tenant
    );
    Ok(())
}

/// Asks each sandbox's provider for its state, forgetting those it positively no longer has:
/// after a host reboot, say, the registry may remember sandboxes that are gone. Those whose
/// state cannot be told are kept, and asked about again on every tick.
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
            let evidence = format!(
                "provider `{}` reported sandbox {} (its id there: {}) gone when the relay \
                 started",
                sandbox.provider, sandbox.id, sandbox.provider_ref
            );
            let entry = Destroyed::of(&sandbox, now_ms(), DestroyReason::Gone, evidence);
            if let Err(e) = destroy_unasked(relay, &*provider, &sandbox, entry).await {
                warn!("cannot forget sandbox {}: {e}", sandbox.id);
            }
        }
    }))
    .await;
}

fn state_word(state: SandboxState) -> &'static str {
    crate::store::state_name(state)
}

//! The reaper: at startup, forgets sandboxes their provider no longer has; then, every tick,
//! deletes sandboxes whose TTL ran out or that sat idle (no tunnel open) past their idle
//! timeout (or pauses or stops those created with `on_idle: pause` or `stop`), asks again
//! about sandboxes whose state is unknown, and records open tunnels as activity.
//!
//! Relays sharing a database reap one at a time: each tick, a relay takes or renews the
//! reaper's lease (`leases` table, [`REAPER_LEASE_TTL`]), and only the holder reaps; another
//! takes over once a holder stops renewing. Before deleting, the holder claims the sandbox
//! under its lease, in one statement that also checks the sandbox is still due and the lease
//! still has [`REAPER_LEASE_MARGIN`] left; only the claim's holder may then journal the
//! delete. A holder that stalled past its lease (a paused process) finds its claim taken
//! over: it journals nothing, and a renew is refused while a claim stands, so no sandbox is
//! deleted twice or after it was renewed. A sandbox on another relay's host is deleted
//! through that relay; while it is down, the sandbox waits. Every relay records its own
//! tunnels as activity, and with a shared database a sandbox is idle only once no relay has
//! recorded any for [`CLUSTER_IDLE_QUIET`] as well.
//!
//! A sandbox is deleted for being gone only when its provider, asked again right before,
//! still positively says so; an `unknown` state (the provider could not be asked, the relay
//! could not read the evidence) is never acted on. Every delete the user did not ask for is
//! journaled with its evidence ([`tether_store::Destroyed`]) and logged.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use super::cluster::grant::Op;
use super::cluster::Place;
use super::constants::{
    ACTIVITY_INTERVAL, CLUSTER_ACTIVITY_INTERVAL, CLUSTER_IDLE_QUIET, REAPER_LEASE,
    REAPER_LEASE_MARGIN, REAPER_LEASE_TTL, UNKNOWN_RECHECK_INTERVAL,
};
use super::error::ApiError;
use super::power::state_after;
use super::state::{now_ms, Relay};
use tether_client::api::IdleAction;
use tether_relay_core::provider::{Provider, ProviderError, SandboxState};
use tether_store::{millis, DestroyReason, Destroyed, Due, Lease, SandboxId, SandboxRecord};

/// Runs until the relay shuts down.
pub(super) async fn run(relay: Arc<Relay>, interval: Duration) {
    let lease = acquire(&relay).await;
    tokio::select! {
        () = reconcile(&relay, lease.as_ref()) => {}
        () = relay.shutdown.cancelled() => return release(&relay, lease).await,
    }
    // Its own task: a provider in an outage may take long to answer (or not answer), and
    // that must not hold up TTLs and idle timeouts.
    let recheck = interval.max(UNKNOWN_RECHECK_INTERVAL);
    relay
        .tasks
        .spawn(recheck_unknown_every(relay.clone(), recheck));
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let activity_every = match relay.cluster.shared {
        true => CLUSTER_ACTIVITY_INTERVAL,
        false => ACTIVITY_INTERVAL,
    };
    let mut last_activity = Instant::now();
    // Sandboxes whose delete failed: warned about once, not every tick.
    let mut failing = HashSet::new();
    let mut lease = lease;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = relay.shutdown.cancelled() => return release(&relay, lease).await,
        }
        if last_activity.elapsed() >= activity_every {
            last_activity = Instant::now();
            let active = relay.tunnels.to_record();
            match relay.store.touch(active.clone(), now_ms()).await {
                Ok(()) => relay.tunnels.recorded(&active),
                Err(e) => warn!("cannot record tunnel activity: {e}"),
            }
        }
        lease = acquire(&relay).await;
        if let Some(lease) = &lease {
            reap(&relay, lease, &mut failing).await;
        }
    }
}

/// Takes or renews the reaper's lease; `None` while another relay holds it.
async fn acquire(relay: &Relay) -> Option<Lease> {
    let lease = relay
        .store
        .acquire_lease(REAPER_LEASE, &relay.node, REAPER_LEASE_TTL)
        .await;
    let lease = lease.unwrap_or_else(|e| {
        if relay.cluster.is_leader() {
            warn!("cannot renew the reaper's lease: {e}; another relay may take it over");
        }
        None
    });
    relay.cluster.set_leader(lease.is_some());
    lease
}

/// Lets go of the lease at shutdown, so another relay reaps at once.
async fn release(relay: &Relay, lease: Option<Lease>) {
    if let Some(lease) = lease {
        if let Err(e) = relay.store.release_lease(&lease).await {
            warn!(
                "cannot release the reaper's lease: {e}; another relay takes it when it runs out"
            );
        }
    }
}

/// Every `interval`, until the relay shuts down, asks again about every sandbox whose state
/// could not be told.
async fn recheck_unknown_every(relay: Arc<Relay>, interval: Duration) {
    relay.every(interval, || recheck_unknown(&relay)).await;
}

/// Asks again about every sandbox whose state could not be told that this relay should
/// ask about: those on its own host, and cloud ones while it runs the reaper.
async fn recheck_unknown(relay: &Relay) {
    let unknown = match relay.store.in_state(SandboxState::Unknown).await {
        Ok(unknown) => unknown,
        Err(e) => return warn!("cannot look for sandboxes of unknown state: {e}"),
    };
    join_all(unknown.into_iter().map(|mut sandbox| async move {
        if let Ok(provider) = relay.provider_of(&sandbox) {
            if !asks_about(relay, &*provider, &sandbox) {
                return;
            }
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

/// Whether this relay asks `sandbox`'s provider about it on its own: a sandbox on its host
/// always (no other relay can), a cloud one only while it runs the reaper (so relays sharing
/// a database do not each spend the provider's API calls on it).
fn asks_about(relay: &Relay, provider: &dyn Provider, sandbox: &SandboxRecord) -> bool {
    relay.is_here(sandbox) && (provider.host_bound() || relay.cluster.is_leader())
}

/// Deletes every sandbox that is due, under `lease`.
async fn reap(relay: &Relay, lease: &Lease, failing: &mut HashSet<SandboxId>) {
    let now = now_ms();
    let due = match relay.store.due(now).await {
        Ok(due) => due,
        Err(e) => {
            warn!("cannot look for expired sandboxes: {e}");
            return;
        }
    };
    // Forget failures of sandboxes no longer due (deleted by a client, renewed).
    failing.retain(|id| due.iter().any(|s| &s.id == id));
    let results = join_all(due.into_iter().map(|s| reap_one(relay, lease, s))).await;
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

/// Deletes `sandbox` if it is still due; `None` when it no longer is (or another relay took
/// it over).
async fn reap_one(
    relay: &Relay,
    lease: &Lease,
    sandbox: SandboxRecord,
) -> Option<(SandboxId, Result<(), String>)> {
    // Read it again: a renew or a new tunnel may have come in since the scan.
    let mut sandbox = relay.store.get(&sandbox.tenant, &sandbox.id).await.ok()??;
    let now = now_ms();
    let provider = match relay.provider_of(&sandbox) {
        Ok(provider) => provider,
        Err(e) => return Some((sandbox.id, Err(e.to_string()))),
    };
    if let Place::Away { node } = relay.place(&sandbox) {
        // Deleted through its relay once that is back; meanwhile it is `unavailable`.
        let why = format!(
            "cannot delete sandbox {}: it is on the host of relay {node}, which is down",
            sandbox.id
        );
        return Some((sandbox.id, Err(why)));
    }
    let quiet = match relay.cluster.shared {
        true => millis(CLUSTER_IDLE_QUIET),
        false => 0,
    };
    let (reason, evidence, due) = if sandbox.expired(now) {
        let ttl = sandbox.ttl.unwrap_or_default();
        let at = sandbox.expires_ms.unwrap_or_default();
        let evidence = format!("its TTL of {ttl:?} ran out at {at} ms (now {now} ms)");
        (DestroyReason::Ttl, evidence, Due::Expired(now))
    } else if sandbox.state == SandboxState::Gone {
        // Recorded as gone by an earlier call: make sure, right before deleting anything
        // (a sandbox on another relay's host is as its owner last recorded it).
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
        (DestroyReason::Gone, evidence, Due::Gone)
    } else if sandbox.idle(now)
        && sandbox.last_active_ms.saturating_add(quiet) <= now
        && !relay.tunnels.is_active(&sandbox.id)
    {
        if sandbox.spec.on_idle != IdleAction::Delete {
            return quiet_idle(relay, sandbox).await;
        }
        let idle = sandbox.idle_timeout.unwrap_or_default();
        let evidence = format!(
            "no client connected since {} ms (now {now} ms), past its idle timeout of {idle:?}",
            sandbox.last_active_ms
        );
        let due = Due::Idle {
            now_ms: now,
            quiet_ms: quiet,
        };
        (DestroyReason::Idle, evidence, due)
    } else {
        // Not due (any more): a claim an earlier reaper left on it is cleared.
        let _ = claim(relay, lease, &sandbox, Due::Expired(now)).await;
        return None;
    };
    match claim(relay, lease, &sandbox, due).await {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => return Some((sandbox.id, Err(e))),
    }
    let entry = Destroyed::of(&sandbox, now, reason, evidence);
    let result = destroy_unasked(relay, &*provider, &sandbox, entry, lease).await;
    Some((sandbox.id, result.map_err(|e| e.to_string())))
}

/// Pauses or stops an idle sandbox created with `on_idle: pause` or `stop`, unless it is
/// already (or cannot be: a dead one waits for its TTL or a client's `rm`).
async fn quiet_idle(
    relay: &Relay,
    sandbox: SandboxRecord,
) -> Option<(SandboxId, Result<(), String>)> {
    let op = match sandbox.spec.on_idle {
        IdleAction::Pause => Op::Pause,
        _ => Op::Stop,
    };
    if sandbox.state == state_after(op) || sandbox.state == SandboxState::Dead {
        return None;
    }
    let id = sandbox.id.clone();
    let idle = sandbox.idle_timeout.unwrap_or_default();
    let result = relay.change_power(op, sandbox).await.map(|_| {
        let verb = op.name();
        info!(sandbox = %id, "{verb} sandbox {id}: no client for its idle timeout of {idle:?}");
    });
    Some((id, result.map_err(|e| e.to_string())))
}

/// Claims `sandbox` for deletion under `lease` if it is still `due`.
async fn claim(
    relay: &Relay,
    lease: &Lease,
    sandbox: &SandboxRecord,
    due: Due,
) -> Result<bool, String> {
    relay
        .store
        .claim(&sandbox.id, lease, REAPER_LEASE_MARGIN, due)
        .await
        .map_err(|e| format!("cannot claim sandbox {} for deletion: {e}", sandbox.id))
}

/// Deletes `sandbox` at its provider (through its owner, for another relay's host), then
/// forgets it and journals `entry` in one step, and logs it, if `lease`'s claim on it still
/// holds. A provider failure keeps the record, so the delete is retried.
async fn destroy_unasked(
    relay: &Relay,
    provider: &dyn Provider,
    sandbox: &SandboxRecord,
    entry: Destroyed,
    lease: &Lease,
) -> Result<(), ApiError> {
    let reason = entry.reason;
    match relay.delete_at_provider(provider, sandbox).await {
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
    let claim = lease.claim();
    if relay
        .store
        .remove_journaled(entry, Some(&claim))
        .await?
        .is_none()
    {
        info!(
            sandbox = %sandbox.id,
            "another relay took over deleting sandbox {} (this one's reaper lease ran out)",
            sandbox.id
        );
        return Ok(());
    }
    info!(
        sandbox = %sandbox.id,
        tenant = %sandbox.tenant,
        reason = %reason,
        "deleted sandbox {} of tenant {} without a client asking ({reason}): {evidence}",
        sandbox.id, sandbox.tenant
    );
    Ok(())
}

/// Asks each sandbox's provider for its state (of those this relay asks about), forgetting
/// those it positively no longer has when this relay holds the reaper's `lease`: after a host
/// reboot, say, the store may remember sandboxes that are gone. Those whose state cannot
/// be told are kept, and asked about again on every tick; gone ones another relay reaps.
async fn reconcile(relay: &Relay, lease: Option<&Lease>) {
    let all = match relay.store.all().await {
        Ok(all) => all,
        Err(e) => {
            warn!("cannot read the store to reconcile it: {e}");
            return;
        }
    };
    join_all(all.into_iter().map(|mut sandbox| async move {
        let provider = match relay.provider_of(&sandbox) {
            Ok(provider) => provider,
            Err(e) => return warn!("{e}"),
        };
        if !asks_about(relay, &*provider, &sandbox) {
            return;
        }
        relay.refresh_state(&*provider, &mut sandbox).await;
        let Some(lease) = lease else {
            return;
        };
        if sandbox.state == SandboxState::Gone {
            if !matches!(claim(relay, lease, &sandbox, Due::Gone).await, Ok(true)) {
                return;
            }
            let evidence = format!(
                "provider `{}` reported sandbox {} (its id there: {}) gone when the relay \
                 started",
                sandbox.provider, sandbox.id, sandbox.provider_ref
            );
            let entry = Destroyed::of(&sandbox, now_ms(), DestroyReason::Gone, evidence);
            if let Err(e) = destroy_unasked(relay, &*provider, &sandbox, entry, lease).await {
                warn!("cannot forget sandbox {}: {e}", sandbox.id);
            }
        }
    }))
    .await;
}

fn state_word(state: SandboxState) -> &'static str {
    tether_store::state_name(state)
}

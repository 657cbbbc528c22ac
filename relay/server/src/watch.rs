//! The agent watch: every [`AGENT_WATCH_INTERVAL`], asks the provider of each running sandbox
//! on this host whether its agent still runs, so a sandbox whose agent died shows as `dead`
//! within seconds, with no client needing to ask first.
//!
//! Only sandboxes on this host (of this relay, among relays sharing a database) are watched: asking a cloud provider costs an API call, and
//! its sandboxes are asked about whenever a client reads them. The provider answers from
//! positive evidence only (see `provider::local::process`); a state it cannot tell becomes
//! `unknown`, which the reaper asks about again and never acts on. A dead sandbox is kept (its
//! files are still on the host) until a client removes it or its TTL or idle timeout runs out.

use std::sync::Arc;

use futures_util::future::join_all;
use tracing::{info, warn};

use super::constants::AGENT_WATCH_INTERVAL;
use super::state::Relay;
use tether_relay_core::provider::SandboxState;

/// Runs until the relay shuts down.
pub(super) async fn run(relay: Arc<Relay>) {
    relay.every(AGENT_WATCH_INTERVAL, || check(&relay)).await;
}

/// Refreshes the state of every running sandbox on this host, logging the agents found dead.
async fn check(relay: &Relay) {
    let running = match relay.store.in_state(SandboxState::Running).await {
        Ok(running) => running,
        Err(e) => return warn!("cannot list running sandboxes to watch their agents: {e}"),
    };
    join_all(running.into_iter().map(|mut sandbox| async move {
        let Ok(provider) = relay.provider_of(&sandbox) else {
            return;
        };
        // Another relay watches the sandboxes on its own host.
        if !provider.runs_here() || !relay.is_here(&sandbox) {
            return;
        }
        relay.refresh_state(&*provider, &mut sandbox).await;
        if sandbox.state == SandboxState::Dead {
            info!(
                sandbox = %sandbox.id,
                tenant = %sandbox.tenant,
                "the agent of sandbox {} has exited; it is dead until removed (`tether rm {}`)",
                sandbox.id,
                sandbox.id
            );
        }
    }))
    .await;
}

//! The relay-to-relay hop, and what keeps this relay known to its peers: where a sandbox is
//! reached from and reaching it there (`impl Relay` here), the heartbeat task, the entry
//! relay's side of the hop (`client`: a WebSocket, or a delete, pause, resume, stop or start,
//! to the owner) and the owner's (`routes`: `/v1/cluster/...`, which reuses the tunnel's
//! forwarding). Who the peers are and
//! what they trust is [`crate::cluster`]'s.

mod client;
mod routes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tracing::{info, warn};

pub(crate) use routes::routes;

use crate::cluster::grant::Op;
use crate::cluster::Place;
use crate::constants::{HEARTBEAT_INTERVAL, NODE_ALIVE_WITHIN};
use crate::state::Relay;
use tether_relay_core::provider::{AgentSocket, Provider, ProviderError};
use tether_store::{NodeId, SandboxRecord};

impl Relay {
    /// Where `sandbox` is reached from.
    pub(crate) fn place(&self, sandbox: &SandboxRecord) -> Place {
        let host_bound = self
            .providers
            .get(sandbox.provider.as_str())
            .is_some_and(|p| p.host_bound());
        self.cluster.place(sandbox.node.as_ref(), host_bound)
    }

    /// Whether this relay can act on `sandbox` itself (ask its provider, read its files).
    pub(crate) fn is_here(&self, sandbox: &SandboxRecord) -> bool {
        self.place(sandbox) == Place::Here
    }

    /// Opens an authenticated WebSocket to `sandbox`'s agent: directly, or through its owner.
    pub(crate) async fn connect_agent(
        &self,
        provider: &dyn Provider,
        sandbox: &SandboxRecord,
    ) -> Result<AgentSocket, ProviderError> {
        match self.place(sandbox) {
            Place::Here => provider.connect(&sandbox.handle()).await,
            Place::Peer { node, address } => client::session(self, &node, &address, sandbox).await,
            Place::Away { node } => Err(unavailable(sandbox, &node)),
        }
    }

    /// Deletes `sandbox` at its provider: directly, or through its owner.
    pub(crate) async fn delete_at_provider(
        &self,
        provider: &dyn Provider,
        sandbox: &SandboxRecord,
    ) -> Result<(), ProviderError> {
        match self.place(sandbox) {
            Place::Here => provider.delete(&sandbox.handle()).await,
            Place::Peer { node, address } => {
                client::act(self, Op::Delete, &node, &address, sandbox).await
            }
            Place::Away { node } => Err(unavailable(sandbox, &node)),
        }
    }

    /// Pauses, resumes, stops or starts (`op`) `sandbox` at its provider: directly, or
    /// through its owner. A start here also records what the provider now knows the sandbox
    /// by and attaches its egress proxy again ([`Relay::start_here`]).
    pub(crate) async fn act_at_provider(
        &self,
        op: Op,
        provider: &dyn Provider,
        sandbox: &mut SandboxRecord,
    ) -> Result<(), ProviderError> {
        match self.place(sandbox) {
            Place::Here => match op {
                Op::Pause => provider.pause(&sandbox.handle()).await,
                Op::Resume => provider.resume(&sandbox.handle()).await,
                Op::Stop => provider.stop(&sandbox.handle()).await,
                Op::Start => self.start_here(provider, sandbox).await,
                Op::Session | Op::Delete => unreachable!("not a change of a sandbox's state"),
            },
            Place::Peer { node, address } => client::act(self, op, &node, &address, sandbox).await,
            Place::Away { node } => Err(unavailable(sandbox, &node)),
        }
    }
}

/// The error for a sandbox whose owner is away.
fn unavailable(sandbox: &SandboxRecord, owner: &NodeId) -> ProviderError {
    ProviderError::Unavailable(format!(
        "sandbox {} lives on the host of relay {owner}, which has not been heard from for \
         {}s; it is unavailable (not deleted) until that relay is back",
        sandbox.id,
        NODE_ALIVE_WITHIN.as_secs()
    ))
}

/// Until the relay shuts down: records every [`HEARTBEAT_INTERVAL`] that this relay is alive
/// at its address, and reads where its peers are and whether they are alive.
pub(crate) async fn beat(relay: Arc<Relay>) {
    // Warned about once per outage, not every beat.
    let failing = AtomicBool::new(false);
    relay
        .every(HEARTBEAT_INTERVAL, || async {
            match refresh(&relay).await {
                Ok(()) => {
                    if failing.swap(false, Ordering::SeqCst) {
                        info!("the relay database answers heartbeats again");
                    }
                }
                Err(e) => {
                    if !failing.swap(true, Ordering::SeqCst) {
                        warn!("cannot record this relay's heartbeat or read its peers': {e}");
                    }
                }
            }
        })
        .await;
}

/// One heartbeat and one read of the peers.
pub(crate) async fn refresh(relay: &Relay) -> Result<(), tether_store::StoreError> {
    let cluster = &relay.cluster;
    relay
        .store
        .heartbeat(&cluster.node, &cluster.address)
        .await?;
    let nodes = relay.store.nodes(NODE_ALIVE_WITHIN).await?;
    cluster.update_peers(nodes);
    Ok(())
}

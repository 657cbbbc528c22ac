//! Relays as replicas of one another over a shared (PostgreSQL) database: any relay serves any
//! sandbox. Tokens, tenants, sandboxes, secrets and preview tokens are the database's, so every
//! relay knows them. A cloud sandbox is reached from whichever relay the client hits. A
//! sandbox on a relay's own host (local, docker) belongs to that relay, its node: another relay
//! that gets a session for it, or must delete it, asks the owner over the relay-to-relay hop,
//! with a grant ([`grant`]) saying which tenant it authorized. An owner not heard from for
//! [`NODE_ALIVE_WITHIN`] makes its sandboxes `unavailable` (never deleted) until it is back.
//!
//! A single relay on SQLite is the same code with one node, which owns every sandbox.
//!
//! # Layout
//! - this file: [`Cluster`] (this relay's view of its peers) and where a sandbox is reached
//!   from ([`Place`]); the heartbeat task;
//! - `node`: this relay's node id (`<data_dir>/node.id`);
//! - `grant`: signed grants between relays;
//! - `hop`: the entry relay's side of the hop (a WebSocket, or a delete, to the owner);
//! - `routes`: the owner's side (`/v1/cluster/...`), which reuses the tunnel's forwarding.

mod grant;
mod hop;
pub(super) mod node;
mod routes;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use tokio_rustls::rustls;
use tracing::{info, warn};

pub(super) use routes::routes;

use super::constants::{HEARTBEAT_INTERVAL, NODE_ALIVE_WITHIN};
use super::state::Relay;
use crate::provider::{AgentSocket, Provider, ProviderError};
use crate::store::{NodeId, NodeRow, SandboxRecord};
use grant::Grants;

/// What a relay derives its cluster key from the shared key for.
const GRANT_KEY_PURPOSE: &str = "cluster-grants";

/// This relay among its peers.
pub(super) struct Cluster {
    /// This relay's node id.
    pub node: NodeId,
    /// Where peers reach this relay (`--advertise`, else the address it listens on).
    pub address: String,
    /// Whether other relays may share the database (PostgreSQL): then activity is recorded
    /// more often, and idle sandboxes are given time for every relay to have said so.
    pub shared: bool,
    grants: Grants,
    /// The peers as last read from the database, by node id.
    nodes: RwLock<HashMap<NodeId, NodeRow>>,
    /// Whether this relay held the reaper's lease at its last tick.
    leader: AtomicBool,
    http: reqwest::Client,
    tls: Arc<rustls::ClientConfig>,
}

/// Where a sandbox is reached from, seen from this relay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// From here: a cloud sandbox, or one on this relay's host.
    Here,
    /// Through its owner, alive at `address`.
    Peer {
        /// The owner.
        node: NodeId,
        /// Where it is reached.
        address: String,
    },
    /// Its owner has not been heard from: unavailable until it is back.
    Away {
        /// The owner.
        node: NodeId,
    },
}

impl Cluster {
    /// This relay's cluster state; `grant_key` is derived from the shared key.
    pub(super) fn new(
        node: NodeId,
        address: String,
        shared: bool,
        grant_key: [u8; 32],
    ) -> anyhow::Result<Cluster> {
        let (http, tls) = hop::clients()?;
        Ok(Cluster {
            node,
            address,
            shared,
            grants: Grants::new(grant_key),
            nodes: RwLock::default(),
            leader: AtomicBool::new(false),
            http,
            tls,
        })
    }

    /// The purpose the grant key is derived for.
    pub(super) fn grant_key_purpose() -> &'static str {
        GRANT_KEY_PURPOSE
    }

    /// Records whether this relay holds the reaper's lease.
    pub(super) fn set_leader(&self, leader: bool) {
        if self.leader.swap(leader, Ordering::SeqCst) != leader {
            if leader {
                info!("this relay ({}) now runs the reaper", self.node);
            } else {
                info!("another relay runs the reaper now");
            }
        }
    }

    /// Whether this relay held the reaper's lease at its last tick.
    pub(super) fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    fn peer(&self, node: &NodeId) -> Option<NodeRow> {
        let nodes = self.nodes.read().unwrap_or_else(|p| p.into_inner());
        nodes.get(node).cloned()
    }
}

impl Relay {
    /// Where `sandbox` is reached from.
    pub(super) fn place(&self, sandbox: &SandboxRecord) -> Place {
        let host_bound = self
            .providers
            .get(sandbox.provider.as_str())
            .is_some_and(|p| p.host_bound());
        let owner = match &sandbox.node {
            Some(owner) if host_bound && *owner != self.node => owner,
            // Recorded before relays had ids: the only relay of its database made it.
            _ => return Place::Here,
        };
        match self.cluster.peer(owner) {
            Some(peer) if peer.alive => Place::Peer {
                node: owner.clone(),
                address: peer.address,
            },
            _ => Place::Away {
                node: owner.clone(),
            },
        }
    }

    /// Whether this relay can act on `sandbox` itself (ask its provider, read its files).
    pub(super) fn is_here(&self, sandbox: &SandboxRecord) -> bool {
        self.place(sandbox) == Place::Here
    }

    /// Opens an authenticated WebSocket to `sandbox`'s agent: directly, or through its owner.
    pub(super) async fn connect_agent(
        &self,
        provider: &dyn Provider,
        sandbox: &SandboxRecord,
    ) -> Result<AgentSocket, ProviderError> {
        match self.place(sandbox) {
            Place::Here => provider.connect(&sandbox.handle()).await,
            Place::Peer { node, address } => hop::session(self, &node, &address, sandbox).await,
            Place::Away { node } => Err(unavailable(sandbox, &node)),
        }
    }

    /// Deletes `sandbox` at its provider: directly, or through its owner.
    pub(super) async fn delete_at_provider(
        &self,
        provider: &dyn Provider,
        sandbox: &SandboxRecord,
    ) -> Result<(), ProviderError> {
        match self.place(sandbox) {
            Place::Here => provider.delete(&sandbox.handle()).await,
            Place::Peer { node, address } => hop::delete(self, &node, &address, sandbox).await,
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
pub(super) async fn beat(relay: Arc<Relay>) {
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
pub(super) async fn refresh(relay: &Relay) -> Result<(), crate::store::RegistryError> {
    let cluster = &relay.cluster;
    relay
        .registry
        .heartbeat(&cluster.node, &cluster.address)
        .await?;
    let nodes = relay.registry.nodes(NODE_ALIVE_WITHIN).await?;
    let mut seen = cluster.nodes.write().unwrap_or_else(|p| p.into_inner());
    for node in &nodes {
        let was = seen.get(&node.id).map(|n| n.alive);
        if node.id != cluster.node && was.is_some() && was != Some(node.alive) {
            if node.alive {
                info!("relay {} at {} is back", node.id, node.address);
            } else {
                warn!(
                    "relay {} at {} has not been heard from for {}s: its sandboxes are \
                     unavailable until it is back",
                    node.id,
                    node.address,
                    NODE_ALIVE_WITHIN.as_secs()
                );
            }
        }
    }
    *seen = nodes.into_iter().map(|n| (n.id.clone(), n)).collect();
    Ok(())
}

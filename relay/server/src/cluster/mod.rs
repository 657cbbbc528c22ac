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
//! - this file: [`Cluster`] (this relay's view of its peers, and the clients it reaches them
//!   with) and where a sandbox is reached from ([`Place`]);
//! - `node`: this relay's node id (`<data_dir>/node.id`);
//! - `grant`: signed grants between relays.
//!
//! What needs the relay itself (the heartbeat task, the hop to a peer and the routes that
//! serve it) is [`crate::hop`]'s.

pub(crate) mod grant;
pub(super) mod node;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use tokio_rustls::rustls;
use tracing::{info, warn};

use super::constants::{HOP_CONNECT_TIMEOUT, HOP_REQUEST_TIMEOUT, NODE_ALIVE_WITHIN};
use grant::Grants;
use tether_store::{NodeId, NodeRow};

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
    /// Signs and checks the grants of relay-to-relay requests.
    pub grants: Grants,
    /// The peers as last read from the database, by node id.
    nodes: RwLock<HashMap<NodeId, NodeRow>>,
    /// Whether this relay held the reaper's lease at its last tick.
    leader: AtomicBool,
    /// Deletes at peers.
    pub http: reqwest::Client,
    /// Sessions through peers that serve TLS.
    pub tls: Arc<rustls::ClientConfig>,
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
        let (http, tls) = clients()?;
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

    /// Where a sandbox recorded as made on `owner` is reached from; `host_bound`: its
    /// provider's sandboxes live on their relay's host.
    pub(super) fn place(&self, owner: Option<&NodeId>, host_bound: bool) -> Place {
        let owner = match owner {
            Some(owner) if host_bound && *owner != self.node => owner,
            // Recorded before relays had ids: the only relay of its database made it.
            _ => return Place::Here,
        };
        match self.peer(owner) {
            Some(peer) if peer.alive => Place::Peer {
                node: owner.clone(),
                address: peer.address,
            },
            _ => Place::Away {
                node: owner.clone(),
            },
        }
    }

    /// Takes the peers as just read from the database, saying which came back or went away.
    pub(super) fn update_peers(&self, nodes: Vec<NodeRow>) {
        let mut seen = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        for node in &nodes {
            let was = seen.get(&node.id).map(|n| n.alive);
            if node.id != self.node && was.is_some() && was != Some(node.alive) {
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
    }
}

/// The HTTP client (deletes) and the TLS configuration (sessions) for talking to peers.
fn clients() -> anyhow::Result<(reqwest::Client, Arc<rustls::ClientConfig>)> {
    let extra = match std::env::var_os(tether_client::tls::CA_CERT_VAR) {
        Some(path) => tether_client::tls::load_ca_file(std::path::Path::new(&path))?,
        None => Vec::new(),
    };
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let mut http = reqwest::Client::builder()
        .connect_timeout(HOP_CONNECT_TIMEOUT)
        .timeout(HOP_REQUEST_TIMEOUT);
    for cert in extra {
        http = http.add_root_certificate(reqwest::Certificate::from_der(cert.as_ref())?);
        roots.add(cert)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok((http.build()?, Arc::new(tls)))
}

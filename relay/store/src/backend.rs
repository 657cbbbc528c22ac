//! The one interface both databases implement ([`Backend`]): rows in and rows out, with the
//! sealed columns as opaque text. Sealing, JSON and the meaning of each row are the
//! store's ([`super::Store`]); a backend only stores them, with the same semantics in
//! SQLite (`sqlite`, one relay) and PostgreSQL (`postgres`, relays as replicas).
//!
//! The trait is split by concern (sandboxes and tokens, the two journals, secrets, the
//! cluster), so each backend keeps one file per concern.

use async_trait::async_trait;

use super::{Destroyed, PendingCreate, StoreError, StoredSecret};
use tether_relay_core::record::{NodeId, TokenRecord};

/// A sandbox row as stored: `spec`, `agent_token` and `meta` sealed, `labels` JSON.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct SandboxRow {
    pub id: String,
    pub tenant: String,
    pub provider: String,
    pub provider_ref: String,
    /// A JSON object with sorted keys: equal maps, equal text.
    pub labels: String,
    pub spec: String,
    pub agent_token: String,
    pub meta: String,
    pub created_ms: i64,
    pub last_active_ms: i64,
    pub ttl_ms: Option<i64>,
    pub expires_ms: Option<i64>,
    pub idle_timeout_ms: Option<i64>,
    pub state: String,
    /// The relay that created it (and, for a sandbox on a relay's own host, owns it).
    pub node: Option<String>,
}

/// Which sandboxes a listing returns, oldest first.
#[derive(Clone, Debug)]
pub(super) enum Select {
    /// Every sandbox of every tenant.
    All,
    /// The tenant's sandboxes.
    Tenant(String),
    /// Those whose TTL ran out or whose idle timeout passed at this time (ms), those known
    /// to be gone, and those a reaper has claimed.
    Due(i64),
    /// Those last seen in this state.
    State(String),
    /// The tenant's oldest sandbox, not gone or dead, whose labels are exactly this JSON.
    ExactLabels { tenant: String, labels: String },
}

/// A bound secret as stored: the value sealed, the hosts a JSON array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct BoundRow {
    pub name: String,
    pub placeholder: String,
    pub value: String,
    pub hosts: String,
}

/// A relay of the cluster as the database last heard from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRow {
    /// Its id.
    pub id: NodeId,
    /// Where its peers reach it.
    pub address: String,
    /// When it last said it was alive, ms since the Unix epoch (the database's clock).
    pub heartbeat_ms: i64,
    /// Whether that was recently enough for it to count as alive.
    pub alive: bool,
}

/// A lease held: its holder acts alone until `expires_ms` (the database's clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Which lease (e.g. `reaper`).
    pub name: String,
    /// Who holds it.
    pub holder: NodeId,
    /// Grows by one whenever the lease changes hands: what fences a holder that lost it.
    pub epoch: i64,
    /// When it runs out unless renewed.
    pub expires_ms: i64,
}

impl Lease {
    /// The claim a reaper acting under this lease stamps on a sandbox it deletes.
    pub fn claim(&self) -> String {
        format!("lease:{}:{}", self.name, self.epoch)
    }
}

/// What must still hold, in the same statement, for a reaper to claim a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Its TTL ran out at this time (ms).
    Expired(i64),
    /// It had no client activity for its idle timeout, nor for `quiet_ms`, at `now_ms`.
    Idle {
        /// When it was found idle (ms).
        now_ms: i64,
        /// The quiet time it also had (ms).
        quiet_ms: i64,
    },
    /// It is recorded as gone.
    Gone,
}

/// Held while a get-or-create runs; dropping it lets the next one with the same key go.
pub type LabelLock = Box<dyn Send + Sync>;

/// Sandboxes and API tokens.
#[async_trait]
pub(super) trait Sandboxes: Send + Sync + 'static {
    /// Stores a new sandbox and, in the same transaction, deletes its create-journal row.
    async fn insert(&self, row: SandboxRow) -> Result<(), StoreError>;
    /// Sandbox `id`, of `tenant` when one is given.
    async fn get(
        &self,
        tenant: Option<String>,
        id: String,
    ) -> Result<Option<SandboxRow>, StoreError>;
    /// The sandboxes `select` names, oldest first (by creation, then id).
    async fn select(&self, select: Select) -> Result<Vec<SandboxRow>, StoreError>;
    /// Every sandbox's id.
    async fn all_ids(&self) -> Result<Vec<String>, StoreError>;
    /// How many sandboxes the tenant has that are not gone.
    async fn count(&self, tenant: String) -> Result<u64, StoreError>;
    /// Deletes a sandbox (its bound secrets and CA with it); whether it was there.
    async fn remove(&self, id: String) -> Result<bool, StoreError>;
    /// Moves the last activity of `ids` to `now_ms`, never backwards.
    async fn touch(&self, ids: Vec<String>, now_ms: i64) -> Result<(), StoreError>;
    /// Records a state.
    async fn set_state(&self, id: String, state: String) -> Result<(), StoreError>;
    /// Replaces the provider's (sealed) metadata and records a state, in one statement.
    async fn set_meta(&self, id: String, meta: String, state: String) -> Result<(), StoreError>;
    /// Sets a new TTL; `false` (nothing changed) when a reaper has claimed the sandbox.
    async fn set_ttl(&self, id: String, ttl_ms: i64, expires_ms: i64) -> Result<bool, StoreError>;
    /// Stores a token's grant by its hash, replacing one with the same hash.
    async fn insert_token(
        &self,
        hash: String,
        token: TokenRecord,
        created_ms: i64,
    ) -> Result<(), StoreError>;
    /// The stored hash and grant of the token found by `hash` (the caller compares).
    async fn token(&self, hash: String) -> Result<Option<(String, TokenRecord)>, StoreError>;
}

/// The create journal and the destroy journal.
#[async_trait]
pub(super) trait Journals: Send + Sync + 'static {
    /// Journals a create; fails if the id is journaled already.
    async fn begin_create(&self, create: PendingCreate) -> Result<(), StoreError>;
    /// Records the provider's id of a journaled create.
    async fn create_made(&self, id: String, provider_ref: String) -> Result<(), StoreError>;
    /// The journaled creates, oldest first: all, or those of one relay.
    async fn pending_creates(&self, node: Option<NodeId>)
        -> Result<Vec<PendingCreate>, StoreError>;
    /// Forgets a journaled create, and the secrets and CA bound to it unless its sandbox is
    /// registered.
    async fn finish_create(&self, id: String) -> Result<(), StoreError>;
    /// Journals `entry` and deletes its sandbox in one transaction, if the sandbox still
    /// carries `claim` (when one is given); `None` when the claim was lost (nothing done),
    /// else whether the sandbox was there.
    async fn remove_journaled(
        &self,
        entry: Destroyed,
        claim: Option<String>,
    ) -> Result<Option<bool>, StoreError>;
    /// The latest destroy-journal entry of the tenant's sandbox `id`.
    async fn destroyed(&self, tenant: String, id: String) -> Result<Option<Destroyed>, StoreError>;
}

/// Tenants' secrets, sandboxes' bound secrets, and their egress CAs.
#[async_trait]
pub(super) trait Secrets: Send + Sync + 'static {
    /// Stores a sealed value, unless a new name would make the tenant hold more than `max`;
    /// the secret and whether it is new, `None` when the store is full.
    async fn put_secret(
        &self,
        tenant: String,
        name: String,
        sealed: String,
        now_ms: i64,
        max: usize,
    ) -> Result<Option<(StoredSecret, bool)>, StoreError>;
    /// The tenant's secrets by name, without values.
    async fn secrets(&self, tenant: String) -> Result<Vec<StoredSecret>, StoreError>;
    /// The sealed value of a tenant's secret.
    async fn secret_value(
        &self,
        tenant: String,
        name: String,
    ) -> Result<Option<String>, StoreError>;
    /// Deletes a tenant's secret; whether it was there.
    async fn remove_secret(&self, tenant: String, name: String) -> Result<bool, StoreError>;
    /// Replaces sandbox `id`'s bound secrets.
    async fn bind_secrets(&self, id: String, rows: Vec<BoundRow>) -> Result<(), StoreError>;
    /// Sandbox `id`'s bound secrets, in the order bound.
    async fn bound_secrets(&self, id: String) -> Result<Vec<BoundRow>, StoreError>;
    /// Forgets sandbox `id`'s bound secrets.
    async fn unbind_secrets(&self, id: String) -> Result<(), StoreError>;
    /// Forgets bound secrets of sandboxes neither registered nor journaled by another relay
    /// than `node`; how many.
    async fn sweep_unbound_secrets(&self, node: NodeId) -> Result<usize, StoreError>;
    /// Records sandbox `id`'s CA (the key sealed), replacing any.
    async fn put_egress_ca(
        &self,
        id: String,
        cert_pem: String,
        sealed_key: String,
    ) -> Result<(), StoreError>;
    /// Sandbox `id`'s CA certificate and sealed key.
    async fn egress_ca(&self, id: String) -> Result<Option<(String, String)>, StoreError>;
    /// Forgets sandbox `id`'s CA.
    async fn remove_egress_ca(&self, id: String) -> Result<(), StoreError>;
}

/// What relays sharing the database need of each other: who is alive and where, leases,
/// reapers' claims, get-or-create's lock, and settings every relay must agree on.
#[async_trait]
pub(super) trait Cluster: Send + Sync + 'static {
    /// Records that `node` is alive at `address`, now by the database's clock.
    async fn heartbeat(&self, node: NodeId, address: String) -> Result<(), StoreError>;
    /// Records that `node` stopped: its peers stop counting it alive at once.
    async fn leave(&self, node: NodeId) -> Result<(), StoreError>;
    /// Every relay that ever registered, alive when heard from within `alive_ms`.
    async fn nodes(&self, alive_ms: i64) -> Result<Vec<NodeRow>, StoreError>;
    /// Takes or renews lease `name` for `holder` for `ttl_ms`; `None` while another holds it.
    async fn acquire_lease(
        &self,
        name: String,
        holder: NodeId,
        ttl_ms: i64,
    ) -> Result<Option<Lease>, StoreError>;
    /// Lets go of a lease `holder` holds, so another may take it at once.
    async fn release_lease(&self, lease: Lease) -> Result<(), StoreError>;
    /// Stamps `lease`'s claim on sandbox `id` if the lease is still the one held and has at
    /// least `margin_ms` left, and the sandbox is still `due`; whether it did. Under a valid
    /// lease, a sandbox no longer due loses any claim an earlier holder left on it (so a
    /// renew is not refused for ever).
    async fn claim(
        &self,
        id: String,
        lease: Lease,
        margin_ms: i64,
        due: Due,
    ) -> Result<bool, StoreError>;
    /// Waits for the lock on `key` across every relay of the database.
    async fn lock_labels(&self, key: String) -> Result<LabelLock, StoreError>;
    /// The setting `name`, if the database has it.
    async fn setting(&self, name: String) -> Result<Option<String>, StoreError>;
    /// The setting `name`, storing `value` first if it has none; returns what is stored.
    async fn setting_or_insert(&self, name: String, value: String) -> Result<String, StoreError>;
}

/// A database the store can live in.
pub(super) trait Backend: Sandboxes + Journals + Secrets + Cluster {
    /// What kind, for messages: `SQLite` or `PostgreSQL`.
    fn kind(&self) -> &'static str;
    /// Where it is, for messages (never a password): `SQLite at PATH`, `PostgreSQL at ...`.
    fn location(&self) -> String;
}

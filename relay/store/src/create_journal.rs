//! The create journal (table `create_journal`): one row per create in progress, so a relay
//! killed mid-create finds, when it starts again, every sandbox it may have half made.
//!
//! The row is written before the provider is asked to make anything, given the provider's id
//! as soon as the provider answers, and deleted in the same transaction that registers the
//! sandbox ([`Store::insert`]) or once a failed create has been undone. A row found at
//! start is therefore a create that a crash interrupted: the relay removes whatever it made
//! (`server::recovery`), then [`Store::finish_create`] forgets it. Each row names the relay
//! running the create, so relays sharing a database each recover only their own. This is not the destroy
//! journal (`journal`, table `destroyed`), which is a history kept for users; this one is the
//! relay's own to-do list and is empty whenever no create runs.

use std::collections::BTreeMap;

use super::{NodeId, SandboxId, Store, StoreError, Tenant};

/// A create the relay began and has not finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingCreate {
    /// The id the relay gave the sandbox.
    pub id: SandboxId,
    /// Its owner.
    pub tenant: Tenant,
    /// The provider asked to make it.
    pub provider: String,
    /// The provider's id for it, once the provider answered.
    pub provider_ref: Option<String>,
    /// Its labels (cloud providers tag the sandbox with them too).
    pub labels: BTreeMap<String, String>,
    /// When the create began, in milliseconds since the Unix epoch.
    pub started_ms: i64,
    /// The relay running the create: only it may finish it after a crash, since another
    /// relay's journaled creates may be under way (`None`: journaled before relays had ids).
    pub node: Option<NodeId>,
}

impl Store {
    /// Journals a create before anything of it exists. Fails if the id is journaled already.
    pub async fn begin_create(&self, create: PendingCreate) -> Result<(), StoreError> {
        self.backend.begin_create(create).await
    }

    /// Records the provider's id for a journaled create, so a crash before the sandbox is
    /// registered still lets the relay delete it at the provider.
    pub async fn create_made(&self, id: &SandboxId, provider_ref: &str) -> Result<(), StoreError> {
        self.backend
            .create_made(id.to_string(), provider_ref.to_string())
            .await
    }

    /// The creates `node` journaled (with those journaled before relays had ids), oldest
    /// first; every relay's when `node` is `None`.
    pub async fn pending_creates(
        &self,
        node: Option<&NodeId>,
    ) -> Result<Vec<PendingCreate>, StoreError> {
        self.backend.pending_creates(node.cloned()).await
    }

    /// Forgets a journaled create that did not register its sandbox (it failed and was
    /// undone, or the relay removed what a crash left of it), with the secrets and egress CA
    /// bound to it, which no sandbox row will ever take away. A registered sandbox's rows are
    /// never touched: for it, this only drops a stale journal row.
    pub async fn finish_create(&self, id: &SandboxId) -> Result<(), StoreError> {
        self.backend.finish_create(id.to_string()).await
    }
}

//! The destroy journal: a durable, append-only record in the store (table `destroyed`) of
//! every sandbox the relay deleted without being asked to (its TTL ran out, it sat idle, its
//! provider proved it gone), with the evidence the relay acted on. Deletes a client asked for
//! are not journaled: the client knows.
//!
//! The entry is written in the same transaction that forgets the sandbox, after its provider
//! deleted it, so every sandbox the store stops knowing on its own has an entry. Read it
//! with `sqlite3 <data_dir>/relay.db 'SELECT * FROM destroyed'`; the API answers 410 with the
//! entry's reason for a sandbox it destroyed.

use std::collections::BTreeMap;
use std::fmt;

use super::{SandboxId, SandboxRecord, Store, StoreError, Tenant};

/// Why the relay destroyed a sandbox on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DestroyReason {
    /// Its TTL ran out.
    Ttl,
    /// No client was connected for its idle timeout.
    Idle,
    /// Its provider positively reported it gone.
    Gone,
}

impl DestroyReason {
    /// The name stored in the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            DestroyReason::Ttl => "ttl",
            DestroyReason::Idle => "idle",
            DestroyReason::Gone => "gone",
        }
    }

    /// The reason stored as `name`. Only this code writes them; an unknown name would be a
    /// newer relay's, read as `gone`.
    pub(super) fn parse_stored(name: &str) -> DestroyReason {
        match name {
            "ttl" => DestroyReason::Ttl,
            "idle" => DestroyReason::Idle,
            _ => DestroyReason::Gone,
        }
    }
}

impl fmt::Display for DestroyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One journal entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Destroyed {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The sandbox.
    pub id: SandboxId,
    /// Its owner.
    pub tenant: Tenant,
    /// Its provider, and the provider's id for it.
    pub provider: String,
    /// The provider's id.
    pub provider_ref: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Why.
    pub reason: DestroyReason,
    /// What the relay saw, in words.
    pub evidence: String,
}

impl Destroyed {
    /// An entry for `sandbox`, destroyed now.
    pub fn of(
        sandbox: &SandboxRecord,
        at_ms: i64,
        reason: DestroyReason,
        evidence: String,
    ) -> Destroyed {
        Destroyed {
            at_ms,
            id: sandbox.id.clone(),
            tenant: sandbox.tenant.clone(),
            provider: sandbox.provider.clone(),
            provider_ref: sandbox.provider_ref.clone(),
            labels: sandbox.labels.clone(),
            reason,
            evidence,
        }
    }
}

impl Store {
    /// Forgets the sandbox of `entry` and journals why, in one transaction. With a `claim`
    /// (a reaper's, see [`Store::claim`]), only if the sandbox still carries it: `None`
    /// then says another reaper took the sandbox over, and nothing was done. Otherwise,
    /// whether the sandbox was there.
    pub async fn remove_journaled(
        &self,
        entry: Destroyed,
        claim: Option<&str>,
    ) -> Result<Option<bool>, StoreError> {
        self.backend
            .remove_journaled(entry, claim.map(str::to_string))
            .await
    }

    /// The latest journal entry of the tenant's sandbox `id`, if the relay destroyed it.
    pub async fn destroyed(
        &self,
        tenant: &Tenant,
        id: &SandboxId,
    ) -> Result<Option<Destroyed>, StoreError> {
        self.backend
            .destroyed(tenant.to_string(), id.to_string())
            .await
    }
}

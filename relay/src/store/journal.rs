//! The destroy journal: a durable, append-only record in the registry (table `destroyed`) of
//! every sandbox the relay deleted without being asked to (its TTL ran out, it sat idle, its
//! provider proved it gone), with the evidence the relay acted on. Deletes a client asked for
//! are not journaled: the client knows.
//!
//! The entry is written in the same transaction that forgets the sandbox, after its provider
//! deleted it, so every sandbox the registry stops knowing on its own has an entry. Read it
//! with `sqlite3 <data_dir>/relay.db 'SELECT * FROM destroyed'`; the API answers 410 with the
//! entry's reason for a sandbox it destroyed.

use std::collections::BTreeMap;
use std::fmt;

use rusqlite::{params, OptionalExtension};

use super::{Registry, RegistryError, SandboxId, SandboxRecord, Tenant};

/// Why the relay destroyed a sandbox on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DestroyReason {
    /// Its TTL ran out.
    Ttl,
    /// No client was connected for its idle timeout.
    Idle,
    /// Its provider positively reported it gone.
    Gone,
}

impl DestroyReason {
    /// The name stored in the journal.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DestroyReason::Ttl => "ttl",
            DestroyReason::Idle => "idle",
            DestroyReason::Gone => "gone",
        }
    }

    fn parse(name: &str) -> Option<DestroyReason> {
        match name {
            "ttl" => Some(DestroyReason::Ttl),
            "idle" => Some(DestroyReason::Idle),
            "gone" => Some(DestroyReason::Gone),
            _ => None,
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
pub(crate) struct Destroyed {
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
    pub(crate) fn of(
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

impl Registry {
    /// Forgets the sandbox of `entry` and journals why, in one transaction. Returns whether
    /// the sandbox was there.
    pub(crate) async fn remove_journaled(&self, entry: Destroyed) -> Result<bool, RegistryError> {
        let labels = serde_json::to_string(&entry.labels)?;
        self.call(move |db| {
            let tx = db.transaction()?;
            tx.execute(
                "INSERT INTO destroyed (at_ms, sandbox_id, tenant, provider, provider_ref, \
                 labels, reason, evidence) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    entry.at_ms,
                    entry.id.as_str(),
                    entry.tenant.as_str(),
                    entry.provider,
                    entry.provider_ref,
                    labels,
                    entry.reason.as_str(),
                    entry.evidence,
                ],
            )?;
            let removed = tx.execute("DELETE FROM sandboxes WHERE id = ?1", [entry.id.as_str()])?;
            tx.commit()?;
            Ok(removed > 0)
        })
        .await
    }

    /// The latest journal entry of the tenant's sandbox `id`, if the relay destroyed it.
    pub(crate) async fn destroyed(
        &self,
        tenant: &Tenant,
        id: &SandboxId,
    ) -> Result<Option<Destroyed>, RegistryError> {
        let (tenant, id) = (tenant.clone(), id.clone());
        self.call(move |db| {
            let row = db
                .query_row(
                    "SELECT at_ms, provider, provider_ref, labels, reason, evidence \
                     FROM destroyed WHERE tenant = ?1 AND sandbox_id = ?2 \
                     ORDER BY seq DESC LIMIT 1",
                    params![tenant.as_str(), id.as_str()],
                    |row| {
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, String>(2)?,
                            row.get::<_, String>(3)?,
                            row.get::<_, String>(4)?,
                            row.get::<_, String>(5)?,
                        ))
                    },
                )
                .optional()?;
            let Some((at_ms, provider, provider_ref, labels, reason, evidence)) = row else {
                return Ok(None);
            };
            Ok(Some(Destroyed {
                at_ms,
                id,
                tenant,
                provider,
                provider_ref,
                labels: serde_json::from_str(&labels)?,
                // Written by this code only; an unknown name would be a newer relay's.
                reason: DestroyReason::parse(&reason).unwrap_or(DestroyReason::Gone),
                evidence,
            }))
        })
        .await
    }
}

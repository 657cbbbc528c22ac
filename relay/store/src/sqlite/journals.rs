//! The create journal and the destroy journal in SQLite.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::{json_text, SqliteBackend};
use crate::backend::Journals;
use crate::journal::DestroyReason;
use crate::{Destroyed, PendingCreate, StoreError};
use tether_relay_core::record::{NodeId, SandboxId, Tenant};

#[async_trait]
impl Journals for SqliteBackend {
    async fn begin_create(&self, create: PendingCreate) -> Result<(), StoreError> {
        let labels = serde_json::to_string(&create.labels)?;
        self.call(move |db| {
            db.execute(
                "INSERT INTO create_journal \
                 (sandbox_id, tenant, provider, provider_ref, labels, started_ms, node) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    create.id.as_str(),
                    create.tenant.as_str(),
                    create.provider,
                    create.provider_ref,
                    labels,
                    create.started_ms,
                    create.node.as_ref().map(NodeId::as_str),
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn create_made(&self, id: String, provider_ref: String) -> Result<(), StoreError> {
        self.call(move |db| {
            db.execute(
                "UPDATE create_journal SET provider_ref = ?2 WHERE sandbox_id = ?1",
                params![id, provider_ref],
            )?;
            Ok(())
        })
        .await
    }

    async fn pending_creates(
        &self,
        node: Option<NodeId>,
    ) -> Result<Vec<PendingCreate>, StoreError> {
        self.call(move |db| {
            // A row without a node was journaled before relays had ids: by the only relay
            // this file ever had, so by every one that asks.
            let mut stmt = db.prepare(
                "SELECT sandbox_id, tenant, provider, provider_ref, labels, started_ms, node \
                 FROM create_journal WHERE ?1 IS NULL OR node IS NULL OR node = ?1 \
                 ORDER BY started_ms, sandbox_id",
            )?;
            let rows = stmt.query_map([node.as_ref().map(NodeId::as_str)], |row| {
                Ok(PendingCreate {
                    id: SandboxId::from(row.get::<_, String>(0)?),
                    tenant: Tenant::from_stored(row.get(1)?),
                    provider: row.get(2)?,
                    provider_ref: row.get(3)?,
                    labels: json_text(4, &row.get::<_, String>(4)?)?,
                    started_ms: row.get(5)?,
                    node: row.get::<_, Option<String>>(6)?.map(NodeId::from_stored),
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn finish_create(&self, id: String) -> Result<(), StoreError> {
        self.call(move |db| {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let registered: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE id = ?1)",
                [&id],
                |row| row.get(0),
            )?;
            if !registered {
                tx.execute("DELETE FROM sandbox_secrets WHERE sandbox_id = ?1", [&id])?;
                tx.execute("DELETE FROM egress_ca WHERE sandbox_id = ?1", [&id])?;
            }
            tx.execute("DELETE FROM create_journal WHERE sandbox_id = ?1", [&id])?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn remove_journaled(
        &self,
        entry: Destroyed,
        claim: Option<String>,
    ) -> Result<Option<bool>, StoreError> {
        let labels = serde_json::to_string(&entry.labels)?;
        self.call(move |db| {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if let Some(claim) = &claim {
                let held: bool = tx.query_row(
                    "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE id = ?1 AND reaping = ?2)",
                    params![entry.id.as_str(), claim],
                    |row| row.get(0),
                )?;
                if !held {
                    return Ok(None);
                }
            }
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
            Ok(Some(removed > 0))
        })
        .await
    }

    async fn destroyed(&self, tenant: String, id: String) -> Result<Option<Destroyed>, StoreError> {
        self.call(move |db| {
            Ok(db
                .query_row(
                    "SELECT at_ms, provider, provider_ref, labels, reason, evidence \
                     FROM destroyed WHERE tenant = ?1 AND sandbox_id = ?2 \
                     ORDER BY seq DESC LIMIT 1",
                    params![tenant, id],
                    |row| {
                        Ok(Destroyed {
                            at_ms: row.get(0)?,
                            id: SandboxId::from(id.clone()),
                            tenant: Tenant::from_stored(tenant.clone()),
                            provider: row.get(1)?,
                            provider_ref: row.get(2)?,
                            labels: json_text(3, &row.get::<_, String>(3)?)?,
                            reason: DestroyReason::parse_stored(&row.get::<_, String>(4)?),
                            evidence: row.get(5)?,
                        })
                    },
                )
                .optional()?)
        })
        .await
    }
}

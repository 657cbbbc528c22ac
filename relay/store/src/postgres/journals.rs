//! The create journal and the destroy journal in PostgreSQL.

use async_trait::async_trait;

use super::{pg, PostgresBackend};
use crate::backend::Journals;
use crate::journal::DestroyReason;
use crate::{Destroyed, PendingCreate, StoreError};
use tether_relay_core::record::{NodeId, SandboxId, Tenant};

#[async_trait]
impl Journals for PostgresBackend {
    async fn begin_create(&self, create: PendingCreate) -> Result<(), StoreError> {
        let labels = serde_json::to_string(&create.labels)?;
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO create_journal \
                 (sandbox_id, tenant, provider, provider_ref, labels, started_ms, node) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &create.id.as_str(),
                    &create.tenant.as_str(),
                    &create.provider,
                    &create.provider_ref,
                    &labels,
                    &create.started_ms,
                    &create.node.as_ref().map(NodeId::as_str),
                ],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn create_made(&self, id: String, provider_ref: String) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE create_journal SET provider_ref = $2 WHERE sandbox_id = $1",
                &[&id, &provider_ref],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn pending_creates(
        &self,
        node: Option<NodeId>,
    ) -> Result<Vec<PendingCreate>, StoreError> {
        let client = self.client().await?;
        let node = node.as_ref().map(NodeId::as_str);
        let rows = client
            .query(
                "SELECT sandbox_id, tenant, provider, provider_ref, labels, started_ms, node \
                 FROM create_journal WHERE $1::text IS NULL OR node IS NULL OR node = $1 \
                 ORDER BY started_ms, sandbox_id",
                &[&node],
            )
            .await
            .map_err(pg)?;
        rows.iter()
            .map(|row| {
                let labels: String = row.try_get(4).map_err(pg)?;
                Ok(PendingCreate {
                    id: SandboxId::from(row.try_get::<_, String>(0).map_err(pg)?),
                    tenant: Tenant::from_stored(row.try_get(1).map_err(pg)?),
                    provider: row.try_get(2).map_err(pg)?,
                    provider_ref: row.try_get(3).map_err(pg)?,
                    labels: serde_json::from_str(&labels)?,
                    started_ms: row.try_get(5).map_err(pg)?,
                    node: row
                        .try_get::<_, Option<String>>(6)
                        .map_err(pg)?
                        .map(NodeId::from_stored),
                })
            })
            .collect()
    }

    async fn finish_create(&self, id: String) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        // Locks the sandbox's row, if any, so an insert cannot slip in between.
        let registered = tx
            .query_opt("SELECT 1 FROM sandboxes WHERE id = $1 FOR UPDATE", &[&id])
            .await
            .map_err(pg)?
            .is_some();
        if !registered {
            tx.execute("DELETE FROM sandbox_secrets WHERE sandbox_id = $1", &[&id])
                .await
                .map_err(pg)?;
            tx.execute("DELETE FROM egress_ca WHERE sandbox_id = $1", &[&id])
                .await
                .map_err(pg)?;
        }
        tx.execute("DELETE FROM create_journal WHERE sandbox_id = $1", &[&id])
            .await
            .map_err(pg)?;
        tx.commit().await.map_err(pg)
    }

    async fn remove_journaled(
        &self,
        entry: Destroyed,
        claim: Option<String>,
    ) -> Result<Option<bool>, StoreError> {
        let labels = serde_json::to_string(&entry.labels)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        if let Some(claim) = &claim {
            // The row stays locked until commit: no other reaper can claim it meanwhile.
            let held = tx
                .query_opt(
                    "SELECT 1 FROM sandboxes WHERE id = $1 AND reaping = $2 FOR UPDATE",
                    &[&entry.id.as_str(), claim],
                )
                .await
                .map_err(pg)?;
            if held.is_none() {
                return Ok(None);
            }
        }
        tx.execute(
            "INSERT INTO destroyed (at_ms, sandbox_id, tenant, provider, provider_ref, labels, \
             reason, evidence) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &entry.at_ms,
                &entry.id.as_str(),
                &entry.tenant.as_str(),
                &entry.provider,
                &entry.provider_ref,
                &labels,
                &entry.reason.as_str(),
                &entry.evidence,
            ],
        )
        .await
        .map_err(pg)?;
        let removed = tx
            .execute("DELETE FROM sandboxes WHERE id = $1", &[&entry.id.as_str()])
            .await
            .map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        Ok(Some(removed > 0))
    }

    async fn destroyed(&self, tenant: String, id: String) -> Result<Option<Destroyed>, StoreError> {
        let client = self.client().await?;
        let Some(row) = client
            .query_opt(
                "SELECT at_ms, provider, provider_ref, labels, reason, evidence \
                 FROM destroyed WHERE tenant = $1 AND sandbox_id = $2 \
                 ORDER BY seq DESC LIMIT 1",
                &[&tenant, &id],
            )
            .await
            .map_err(pg)?
        else {
            return Ok(None);
        };
        let labels: String = row.try_get(3).map_err(pg)?;
        let reason: String = row.try_get(4).map_err(pg)?;
        Ok(Some(Destroyed {
            at_ms: row.try_get(0).map_err(pg)?,
            id: SandboxId::from(id),
            tenant: Tenant::from_stored(tenant),
            provider: row.try_get(1).map_err(pg)?,
            provider_ref: row.try_get(2).map_err(pg)?,
            labels: serde_json::from_str(&labels)?,
            reason: DestroyReason::parse_stored(&reason),
            evidence: row.try_get(5).map_err(pg)?,
        }))
    }
}

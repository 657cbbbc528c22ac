//! Tenants' secrets, sandboxes' bound secrets and egress CAs in PostgreSQL.

use async_trait::async_trait;

use super::{lock_id, pg, PostgresBackend};
use crate::backend::{BoundRow, Secrets};
use crate::{StoreError, StoredSecret};
use tether_relay_core::record::NodeId;

#[async_trait]
impl Secrets for PostgresBackend {
    async fn put_secret(
        &self,
        tenant: String,
        name: String,
        sealed: String,
        now_ms: i64,
        max: usize,
    ) -> Result<Option<(StoredSecret, bool)>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        // One put per tenant at a time, on every relay, so two cannot both take the last
        // place; the lock goes with the transaction.
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&lock_id("secrets", &tenant)],
        )
        .await
        .map_err(pg)?;
        let created: Option<i64> = tx
            .query_opt(
                "SELECT created_ms FROM secrets WHERE tenant = $1 AND name = $2",
                &[&tenant, &name],
            )
            .await
            .map_err(pg)?
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(pg)?;
        if created.is_none() {
            let held: i64 = tx
                .query_one("SELECT count(*) FROM secrets WHERE tenant = $1", &[&tenant])
                .await
                .map_err(pg)?
                .try_get(0)
                .map_err(pg)?;
            if usize::try_from(held).unwrap_or(usize::MAX) >= max {
                return Ok(None);
            }
        }
        tx.execute(
            "INSERT INTO secrets (tenant, name, value, created_ms, updated_ms) \
             VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (tenant, name) DO UPDATE \
             SET value = excluded.value, updated_ms = excluded.updated_ms",
            &[&tenant, &name, &sealed, &now_ms],
        )
        .await
        .map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        let stored = StoredSecret {
            name,
            created_ms: created.unwrap_or(now_ms),
            updated_ms: now_ms,
        };
        Ok(Some((stored, created.is_none())))
    }

    async fn secrets(&self, tenant: String) -> Result<Vec<StoredSecret>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT name, created_ms, updated_ms FROM secrets WHERE tenant = $1 ORDER BY name",
                &[&tenant],
            )
            .await
            .map_err(pg)?;
        rows.iter()
            .map(|row| {
                Ok(StoredSecret {
                    name: row.try_get(0).map_err(pg)?,
                    created_ms: row.try_get(1).map_err(pg)?,
                    updated_ms: row.try_get(2).map_err(pg)?,
                })
            })
            .collect()
    }

    async fn secret_value(
        &self,
        tenant: String,
        name: String,
    ) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT value FROM secrets WHERE tenant = $1 AND name = $2",
                &[&tenant, &name],
            )
            .await
            .map_err(pg)?;
        row.map(|r| r.try_get(0)).transpose().map_err(pg)
    }

    async fn remove_secret(&self, tenant: String, name: String) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let removed = client
            .execute(
                "DELETE FROM secrets WHERE tenant = $1 AND name = $2",
                &[&tenant, &name],
            )
            .await
            .map_err(pg)?;
        Ok(removed > 0)
    }

    async fn bind_secrets(&self, id: String, rows: Vec<BoundRow>) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        tx.execute("DELETE FROM sandbox_secrets WHERE sandbox_id = $1", &[&id])
            .await
            .map_err(pg)?;
        for row in &rows {
            tx.execute(
                "INSERT INTO sandbox_secrets (sandbox_id, name, placeholder, value, hosts) \
                 VALUES ($1, $2, $3, $4, $5)",
                &[&id, &row.name, &row.placeholder, &row.value, &row.hosts],
            )
            .await
            .map_err(pg)?;
        }
        tx.commit().await.map_err(pg)
    }

    async fn bound_secrets(&self, id: String) -> Result<Vec<BoundRow>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT name, placeholder, value, hosts FROM sandbox_secrets \
                 WHERE sandbox_id = $1 ORDER BY seq",
                &[&id],
            )
            .await
            .map_err(pg)?;
        rows.iter()
            .map(|row| {
                Ok(BoundRow {
                    name: row.try_get(0).map_err(pg)?,
                    placeholder: row.try_get(1).map_err(pg)?,
                    value: row.try_get(2).map_err(pg)?,
                    hosts: row.try_get(3).map_err(pg)?,
                })
            })
            .collect()
    }

    async fn unbind_secrets(&self, id: String) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute("DELETE FROM sandbox_secrets WHERE sandbox_id = $1", &[&id])
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn sweep_unbound_secrets(&self, node: NodeId) -> Result<usize, StoreError> {
        let client = self.client().await?;
        let removed = client
            .execute(
                "DELETE FROM sandbox_secrets WHERE sandbox_id NOT IN (SELECT id FROM sandboxes) \
                 AND sandbox_id NOT IN (SELECT sandbox_id FROM create_journal \
                                        WHERE node IS NOT NULL AND node != $1)",
                &[&node.as_str()],
            )
            .await
            .map_err(pg)?;
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
    }

    async fn put_egress_ca(
        &self,
        id: String,
        cert_pem: String,
        sealed_key: String,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO egress_ca (sandbox_id, cert_pem, key_pem) VALUES ($1, $2, $3) \
                 ON CONFLICT (sandbox_id) DO UPDATE \
                 SET cert_pem = excluded.cert_pem, key_pem = excluded.key_pem",
                &[&id, &cert_pem, &sealed_key],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn egress_ca(&self, id: String) -> Result<Option<(String, String)>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT cert_pem, key_pem FROM egress_ca WHERE sandbox_id = $1",
                &[&id],
            )
            .await
            .map_err(pg)?;
        match row {
            Some(row) => Ok(Some((
                row.try_get(0).map_err(pg)?,
                row.try_get(1).map_err(pg)?,
            ))),
            None => Ok(None),
        }
    }

    async fn remove_egress_ca(&self, id: String) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute("DELETE FROM egress_ca WHERE sandbox_id = $1", &[&id])
            .await
            .map_err(pg)?;
        Ok(())
    }
}

//! Sandboxes and API tokens in PostgreSQL.

use async_trait::async_trait;
use tokio_postgres::types::ToSql;

use super::{pg, read_sandbox, PostgresBackend, SANDBOX_COLUMNS};
use crate::backend::{SandboxRow, Sandboxes, Select};
use crate::StoreError;
use tether_relay_core::record::{Role, Tenant, TokenRecord};

#[async_trait]
impl Sandboxes for PostgresBackend {
    async fn insert(&self, row: SandboxRow) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        tx.execute(
            &format!(
                "INSERT INTO sandboxes ({SANDBOX_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
            ),
            &[
                &row.id,
                &row.tenant,
                &row.provider,
                &row.provider_ref,
                &row.labels,
                &row.spec,
                &row.agent_token,
                &row.meta,
                &row.created_ms,
                &row.last_active_ms,
                &row.ttl_ms,
                &row.expires_ms,
                &row.idle_timeout_ms,
                &row.state,
                &row.node,
            ],
        )
        .await
        .map_err(pg)?;
        tx.execute(
            "DELETE FROM create_journal WHERE sandbox_id = $1",
            &[&row.id],
        )
        .await
        .map_err(pg)?;
        tx.commit().await.map_err(pg)
    }

    async fn get(
        &self,
        tenant: Option<String>,
        id: String,
    ) -> Result<Option<SandboxRow>, StoreError> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
             WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)"
        );
        let stmt = client.prepare_cached(&sql).await.map_err(pg)?;
        let row = client.query_opt(&stmt, &[&id, &tenant]).await.map_err(pg)?;
        row.as_ref().map(read_sandbox).transpose()
    }

    async fn select(&self, select: Select) -> Result<Vec<SandboxRow>, StoreError> {
        let client = self.client().await?;
        let (filter, args): (&str, Vec<Box<dyn ToSql + Sync + Send>>) = match select {
            Select::All => ("", vec![]),
            Select::Tenant(tenant) => ("WHERE tenant = $1", vec![Box::new(tenant)]),
            Select::Due(now) => (
                "WHERE expires_ms <= $1 OR last_active_ms + idle_timeout_ms <= $1 \
                 OR state = 'gone' OR reaping IS NOT NULL",
                vec![Box::new(now)],
            ),
            Select::State(state) => ("WHERE state = $1", vec![Box::new(state)]),
            Select::ExactLabels { tenant, labels } => (
                "WHERE tenant = $1 AND labels = $2 AND state NOT IN ('gone', 'dead')",
                vec![Box::new(tenant), Box::new(labels)],
            ),
        };
        let sql =
            format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes {filter} ORDER BY created_ms, id");
        let stmt = client.prepare_cached(&sql).await.map_err(pg)?;
        let params: Vec<&(dyn ToSql + Sync)> = args
            .iter()
            .map(|a| a.as_ref() as &(dyn ToSql + Sync))
            .collect();
        let rows = client.query(&stmt, &params).await.map_err(pg)?;
        rows.iter().map(read_sandbox).collect()
    }

    async fn all_ids(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT id FROM sandboxes", &[])
            .await
            .map_err(pg)?;
        rows.iter().map(|r| r.try_get(0).map_err(pg)).collect()
    }

    async fn count(&self, tenant: String) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM sandboxes WHERE tenant = $1 AND state != 'gone'",
                &[&tenant],
            )
            .await
            .map_err(pg)?;
        let count: i64 = row.try_get(0).map_err(pg)?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn remove(&self, id: String) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let removed = client
            .execute("DELETE FROM sandboxes WHERE id = $1", &[&id])
            .await
            .map_err(pg)?;
        Ok(removed > 0)
    }

    async fn touch(&self, ids: Vec<String>, now_ms: i64) -> Result<(), StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "UPDATE sandboxes SET last_active_ms = GREATEST(last_active_ms, $2) \
                 WHERE id = ANY($1)",
            )
            .await
            .map_err(pg)?;
        client.execute(&stmt, &[&ids, &now_ms]).await.map_err(pg)?;
        Ok(())
    }

    async fn set_state(&self, id: String, state: String) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE sandboxes SET state = $2 WHERE id = $1",
                &[&id, &state],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn set_meta(&self, id: String, meta: String, state: String) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE sandboxes SET meta = $2, state = $3 WHERE id = $1",
                &[&id, &meta, &state],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn set_ttl(&self, id: String, ttl_ms: i64, expires_ms: i64) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let changed = client
            .execute(
                "UPDATE sandboxes SET ttl_ms = $2, expires_ms = $3 \
                 WHERE id = $1 AND reaping IS NULL",
                &[&id, &ttl_ms, &expires_ms],
            )
            .await
            .map_err(pg)?;
        Ok(changed > 0)
    }

    async fn insert_token(
        &self,
        hash: String,
        token: TokenRecord,
        created_ms: i64,
    ) -> Result<(), StoreError> {
        let admin = token.role != Role::Member;
        let relay_admin = token.role == Role::RelayAdmin;
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO tokens (hash, tenant, admin, relay_admin, created_ms) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (hash) DO UPDATE SET tenant = excluded.tenant, \
                 admin = excluded.admin, relay_admin = excluded.relay_admin, \
                 created_ms = excluded.created_ms",
                &[
                    &hash,
                    &token.tenant.as_str(),
                    &admin,
                    &relay_admin,
                    &created_ms,
                ],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn token(&self, hash: String) -> Result<Option<(String, TokenRecord)>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT hash, tenant, admin, relay_admin FROM tokens WHERE hash = $1")
            .await
            .map_err(pg)?;
        let Some(row) = client.query_opt(&stmt, &[&hash]).await.map_err(pg)? else {
            return Ok(None);
        };
        let record = TokenRecord {
            tenant: Tenant::from_stored(row.try_get(1).map_err(pg)?),
            role: Role::from_flags(row.try_get(2).map_err(pg)?, row.try_get(3).map_err(pg)?),
        };
        Ok(Some((row.try_get(0).map_err(pg)?, record)))
    }
}

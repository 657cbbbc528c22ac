//! Tenants' secrets, sandboxes' bound secrets and egress CAs in SQLite.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::SqliteBackend;
use crate::backend::{BoundRow, Secrets};
use crate::{StoreError, StoredSecret};
use tether_relay_core::record::NodeId;

#[async_trait]
impl Secrets for SqliteBackend {
    async fn put_secret(
        &self,
        tenant: String,
        name: String,
        sealed: String,
        now_ms: i64,
        max: usize,
    ) -> Result<Option<(StoredSecret, bool)>, StoreError> {
        self.call(move |db| {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let created: Option<i64> = tx
                .query_row(
                    "SELECT created_ms FROM secrets WHERE tenant = ?1 AND name = ?2",
                    params![tenant, name],
                    |row| row.get(0),
                )
                .optional()?;
            if created.is_none() {
                // In the transaction, so two concurrent puts cannot both take the last place.
                let held: i64 = tx.query_row(
                    "SELECT count(*) FROM secrets WHERE tenant = ?1",
                    [&tenant],
                    |row| row.get(0),
                )?;
                if usize::try_from(held).unwrap_or(usize::MAX) >= max {
                    return Ok(None);
                }
            }
            tx.execute(
                "INSERT INTO secrets (tenant, name, value, created_ms, updated_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?4) \
                 ON CONFLICT (tenant, name) DO UPDATE \
                 SET value = excluded.value, updated_ms = excluded.updated_ms",
                params![tenant, name, sealed, now_ms],
            )?;
            tx.commit()?;
            let stored = StoredSecret {
                name,
                created_ms: created.unwrap_or(now_ms),
                updated_ms: now_ms,
            };
            Ok(Some((stored, created.is_none())))
        })
        .await
    }

    async fn secrets(&self, tenant: String) -> Result<Vec<StoredSecret>, StoreError> {
        self.call(move |db| {
            let mut stmt = db.prepare_cached(
                "SELECT name, created_ms, updated_ms FROM secrets WHERE tenant = ?1 ORDER BY name",
            )?;
            let rows = stmt.query_map([tenant], |row| {
                Ok(StoredSecret {
                    name: row.get(0)?,
                    created_ms: row.get(1)?,
                    updated_ms: row.get(2)?,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn secret_value(
        &self,
        tenant: String,
        name: String,
    ) -> Result<Option<String>, StoreError> {
        self.call(move |db| {
            Ok(db
                .query_row(
                    "SELECT value FROM secrets WHERE tenant = ?1 AND name = ?2",
                    params![tenant, name],
                    |row| row.get(0),
                )
                .optional()?)
        })
        .await
    }

    async fn remove_secret(&self, tenant: String, name: String) -> Result<bool, StoreError> {
        self.call(move |db| {
            Ok(db.execute(
                "DELETE FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )? > 0)
        })
        .await
    }

    async fn bind_secrets(&self, id: String, rows: Vec<BoundRow>) -> Result<(), StoreError> {
        self.call(move |db| {
            let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM sandbox_secrets WHERE sandbox_id = ?1", [&id])?;
            for row in &rows {
                tx.execute(
                    "INSERT INTO sandbox_secrets (sandbox_id, name, placeholder, value, hosts) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![id, row.name, row.placeholder, row.value, row.hosts],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn bound_secrets(&self, id: String) -> Result<Vec<BoundRow>, StoreError> {
        self.call(move |db| {
            let mut stmt = db.prepare_cached(
                "SELECT name, placeholder, value, hosts FROM sandbox_secrets \
                 WHERE sandbox_id = ?1 ORDER BY rowid",
            )?;
            let rows = stmt.query_map([id], |row| {
                Ok(BoundRow {
                    name: row.get(0)?,
                    placeholder: row.get(1)?,
                    value: row.get(2)?,
                    hosts: row.get(3)?,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn unbind_secrets(&self, id: String) -> Result<(), StoreError> {
        self.call(move |db| {
            db.execute("DELETE FROM sandbox_secrets WHERE sandbox_id = ?1", [id])?;
            Ok(())
        })
        .await
    }

    async fn sweep_unbound_secrets(&self, node: NodeId) -> Result<usize, StoreError> {
        self.call(move |db| {
            Ok(db.execute(
                "DELETE FROM sandbox_secrets WHERE sandbox_id NOT IN (SELECT id FROM sandboxes) \
                 AND sandbox_id NOT IN (SELECT sandbox_id FROM create_journal \
                                        WHERE node IS NOT NULL AND node != ?1)",
                [node.as_str()],
            )?)
        })
        .await
    }

    async fn put_egress_ca(
        &self,
        id: String,
        cert_pem: String,
        sealed_key: String,
    ) -> Result<(), StoreError> {
        self.call(move |db| {
            db.execute(
                "INSERT OR REPLACE INTO egress_ca (sandbox_id, cert_pem, key_pem) \
                 VALUES (?1, ?2, ?3)",
                params![id, cert_pem, sealed_key],
            )?;
            Ok(())
        })
        .await
    }

    async fn egress_ca(&self, id: String) -> Result<Option<(String, String)>, StoreError> {
        self.call(move |db| {
            Ok(db
                .query_row(
                    "SELECT cert_pem, key_pem FROM egress_ca WHERE sandbox_id = ?1",
                    [id],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?)
        })
        .await
    }

    async fn remove_egress_ca(&self, id: String) -> Result<(), StoreError> {
        self.call(move |db| {
            db.execute("DELETE FROM egress_ca WHERE sandbox_id = ?1", [id])?;
            Ok(())
        })
        .await
    }
}

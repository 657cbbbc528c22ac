//! Sandboxes and API tokens in SQLite.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension};

use super::{read_sandbox, SqliteBackend, SANDBOX_COLUMNS};
use crate::backend::{SandboxRow, Sandboxes, Select};
use crate::StoreError;
use tether_relay_core::record::{Role, Tenant, TokenRecord};

/// States a get-or-create never hands out.
const UNUSABLE: [&str; 2] = ["gone", "dead"];

#[async_trait]
impl Sandboxes for SqliteBackend {
    async fn insert(&self, row: SandboxRow) -> Result<(), StoreError> {
        self.call(move |db| {
            let tx = db.transaction()?;
            tx.execute(
                &format!(
                    "INSERT INTO sandboxes ({SANDBOX_COLUMNS}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
                ),
                params![
                    row.id,
                    row.tenant,
                    row.provider,
                    row.provider_ref,
                    row.labels,
                    row.spec,
                    row.agent_token,
                    row.meta,
                    row.created_ms,
                    row.last_active_ms,
                    row.ttl_ms,
                    row.expires_ms,
                    row.idle_timeout_ms,
                    row.state,
                    row.node,
                ],
            )?;
            tx.execute(
                "DELETE FROM create_journal WHERE sandbox_id = ?1",
                [&row.id],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn get(
        &self,
        tenant: Option<String>,
        id: String,
    ) -> Result<Option<SandboxRow>, StoreError> {
        self.call(move |db| {
            let sql = format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                 WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2)"
            );
            Ok(db
                .query_row(&sql, params![id, tenant], read_sandbox)
                .optional()?)
        })
        .await
    }

    async fn select(&self, select: Select) -> Result<Vec<SandboxRow>, StoreError> {
        self.call(move |db| {
            let order = "ORDER BY created_ms, id";
            let (filter, args): (&str, Vec<rusqlite::types::Value>) = match select {
                Select::All => ("", vec![]),
                Select::Tenant(tenant) => ("WHERE tenant = ?1", vec![tenant.into()]),
                Select::Due(now) => (
                    "WHERE expires_ms <= ?1 OR last_active_ms + idle_timeout_ms <= ?1 \
                     OR state = 'gone' OR reaping IS NOT NULL",
                    vec![now.into()],
                ),
                Select::State(state) => ("WHERE state = ?1", vec![state.into()]),
                Select::ExactLabels { tenant, labels } => (
                    "WHERE tenant = ?1 AND labels = ?2 AND state NOT IN (?3, ?4)",
                    vec![
                        tenant.into(),
                        labels.into(),
                        UNUSABLE[0].to_string().into(),
                        UNUSABLE[1].to_string().into(),
                    ],
                ),
            };
            let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes {filter} {order}");
            let mut stmt = db.prepare_cached(&sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args), read_sandbox)?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn all_ids(&self) -> Result<Vec<String>, StoreError> {
        self.call(|db| {
            let mut stmt = db.prepare("SELECT id FROM sandboxes")?;
            let ids = stmt.query_map([], |row| row.get::<_, String>(0))?;
            Ok(ids.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn count(&self, tenant: String) -> Result<u64, StoreError> {
        self.call(move |db| {
            Ok(db.query_row(
                "SELECT count(*) FROM sandboxes WHERE tenant = ?1 AND state != 'gone'",
                [tenant],
                |row| row.get(0),
            )?)
        })
        .await
    }

    async fn remove(&self, id: String) -> Result<bool, StoreError> {
        self.call(move |db| Ok(db.execute("DELETE FROM sandboxes WHERE id = ?1", [id])? > 0))
            .await
    }

    async fn touch(&self, ids: Vec<String>, now_ms: i64) -> Result<(), StoreError> {
        self.call(move |db| {
            let tx = db.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "UPDATE sandboxes SET last_active_ms = max(last_active_ms, ?2) WHERE id = ?1",
                )?;
                for id in &ids {
                    stmt.execute(params![id, now_ms])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn set_state(&self, id: String, state: String) -> Result<(), StoreError> {
        self.call(move |db| {
            db.execute(
                "UPDATE sandboxes SET state = ?2 WHERE id = ?1",
                params![id, state],
            )?;
            Ok(())
        })
        .await
    }

    async fn set_meta(&self, id: String, meta: String, state: String) -> Result<(), StoreError> {
        self.call(move |db| {
            db.execute(
                "UPDATE sandboxes SET meta = ?2, state = ?3 WHERE id = ?1",
                params![id, meta, state],
            )?;
            Ok(())
        })
        .await
    }

    async fn set_ttl(&self, id: String, ttl_ms: i64, expires_ms: i64) -> Result<bool, StoreError> {
        self.call(move |db| {
            let changed = db.execute(
                "UPDATE sandboxes SET ttl_ms = ?2, expires_ms = ?3 \
                 WHERE id = ?1 AND reaping IS NULL",
                params![id, ttl_ms, expires_ms],
            )?;
            Ok(changed > 0)
        })
        .await
    }

    async fn insert_token(
        &self,
        hash: String,
        token: TokenRecord,
        created_ms: i64,
    ) -> Result<(), StoreError> {
        let admin = token.role != Role::Member;
        let relay_admin = token.role == Role::RelayAdmin;
        self.call(move |db| {
            db.execute(
                "INSERT OR REPLACE INTO tokens (hash, tenant, admin, relay_admin, created_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![hash, token.tenant.as_str(), admin, relay_admin, created_ms],
            )?;
            Ok(())
        })
        .await
    }

    async fn token(&self, hash: String) -> Result<Option<(String, TokenRecord)>, StoreError> {
        self.call(move |db| {
            Ok(db
                .query_row(
                    "SELECT hash, tenant, admin, relay_admin FROM tokens WHERE hash = ?1",
                    [&hash],
                    |row| {
                        let record = TokenRecord {
                            tenant: Tenant::from_stored(row.get(1)?),
                            role: Role::from_flags(row.get(2)?, row.get(3)?),
                        };
                        Ok((row.get(0)?, record))
                    },
                )
                .optional()?)
        })
        .await
    }
}

//! Nodes, leases, reapers' claims, label locks and settings in SQLite. One relay uses a file,
//! so it is the only node and always gets the lease; the rows still behave as PostgreSQL's,
//! which the same store tests check. Times are this host's clock.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension};

use super::SqliteBackend;
use crate::backend::{Cluster, Due, LabelLock, Lease, NodeRow};
use crate::{wall_clock_ms, StoreError};
use tether_relay_core::record::NodeId;

/// Takes a free or expired lease, or renews the holder's; `epoch` grows on a change of hands.
const ACQUIRE: &str = "INSERT INTO leases (name, holder, epoch, expires_ms) VALUES (?1, ?2, 1, ?3 + ?4) \
     ON CONFLICT (name) DO UPDATE SET \
        epoch = CASE WHEN leases.holder = excluded.holder THEN leases.epoch ELSE leases.epoch + 1 END, \
        holder = excluded.holder, \
        expires_ms = excluded.expires_ms \
     WHERE leases.holder = excluded.holder OR leases.expires_ms <= ?3 \
     RETURNING epoch, expires_ms";

#[async_trait]
impl Cluster for SqliteBackend {
    async fn heartbeat(&self, node: NodeId, address: String) -> Result<(), StoreError> {
        self.call(move |db| {
            db.execute(
                "INSERT INTO nodes (id, address, heartbeat_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (id) DO UPDATE SET address = excluded.address, \
                 heartbeat_ms = excluded.heartbeat_ms",
                params![node.as_str(), address, wall_clock_ms()],
            )?;
            Ok(())
        })
        .await
    }

    async fn leave(&self, node: NodeId) -> Result<(), StoreError> {
        self.call(move |db| {
            db.execute(
                "UPDATE nodes SET heartbeat_ms = 0 WHERE id = ?1",
                [node.as_str()],
            )?;
            Ok(())
        })
        .await
    }

    async fn nodes(&self, alive_ms: i64) -> Result<Vec<NodeRow>, StoreError> {
        self.call(move |db| {
            let mut stmt =
                db.prepare_cached("SELECT id, address, heartbeat_ms FROM nodes ORDER BY id")?;
            let now = wall_clock_ms();
            let rows = stmt.query_map([], |row| {
                let heartbeat_ms: i64 = row.get(2)?;
                Ok(NodeRow {
                    id: NodeId::from_stored(row.get(0)?),
                    address: row.get(1)?,
                    heartbeat_ms,
                    alive: heartbeat_ms.saturating_add(alive_ms) > now,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn acquire_lease(
        &self,
        name: String,
        holder: NodeId,
        ttl_ms: i64,
    ) -> Result<Option<Lease>, StoreError> {
        self.call(move |db| {
            let got = db
                .query_row(
                    ACQUIRE,
                    params![name, holder.as_str(), wall_clock_ms(), ttl_ms],
                    |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)),
                )
                .optional()?;
            Ok(got.map(|(epoch, expires_ms)| Lease {
                name,
                holder,
                epoch,
                expires_ms,
            }))
        })
        .await
    }

    async fn release_lease(&self, lease: Lease) -> Result<(), StoreError> {
        self.call(move |db| {
            db.execute(
                "UPDATE leases SET expires_ms = 0 WHERE name = ?1 AND holder = ?2 AND epoch = ?3",
                params![lease.name, lease.holder.as_str(), lease.epoch],
            )?;
            Ok(())
        })
        .await
    }

    async fn claim(
        &self,
        id: String,
        lease: Lease,
        margin_ms: i64,
        due: Due,
    ) -> Result<bool, StoreError> {
        self.call(move |db| {
            let (condition, now, quiet) = match due {
                Due::Expired(now) => ("expires_ms IS NOT NULL AND expires_ms <= ?6", now, 0),
                Due::Idle { now_ms, quiet_ms } => (
                    "idle_timeout_ms IS NOT NULL AND last_active_ms + idle_timeout_ms <= ?6 \
                     AND last_active_ms + ?7 <= ?6",
                    now_ms,
                    quiet_ms,
                ),
                Due::Gone => ("state = 'gone'", 0, 0),
            };
            let claim = lease.claim();
            let sql = format!(
                "UPDATE sandboxes SET reaping = CASE WHEN {condition} THEN ?2 ELSE NULL END \
                 WHERE id = ?1 AND EXISTS (SELECT 1 FROM leases WHERE name = ?3 AND \
                 holder = ?4 AND epoch = ?5 AND expires_ms > ?8) RETURNING reaping"
            );
            let stamped: Option<Option<String>> = db
                .query_row(
                    &sql,
                    params![
                        id,
                        claim,
                        lease.name,
                        lease.holder.as_str(),
                        lease.epoch,
                        now,
                        quiet,
                        wall_clock_ms().saturating_add(margin_ms),
                    ],
                    |row| row.get(0),
                )
                .optional()?;
            Ok(stamped.flatten().as_deref() == Some(claim.as_str()))
        })
        .await
    }

    async fn lock_labels(&self, key: String) -> Result<LabelLock, StoreError> {
        Ok(Box::new(self.label_locks.lock(key).await))
    }

    async fn setting(&self, name: String) -> Result<Option<String>, StoreError> {
        self.call(move |db| {
            Ok(db
                .query_row(
                    "SELECT value FROM settings WHERE name = ?1",
                    [name],
                    |row| row.get(0),
                )
                .optional()?)
        })
        .await
    }

    async fn setting_or_insert(&self, name: String, value: String) -> Result<String, StoreError> {
        self.call(move |db| {
            db.execute(
                "INSERT OR IGNORE INTO settings (name, value) VALUES (?1, ?2)",
                params![name, value],
            )?;
            Ok(db.query_row(
                "SELECT value FROM settings WHERE name = ?1",
                [name],
                |row| row.get(0),
            )?)
        })
        .await
    }
}

//! Nodes, leases, reapers' claims, get-or-create's lock and settings in PostgreSQL, shared by
//! every relay of the database. Heartbeats and leases run on the database's clock.

use async_trait::async_trait;
use deadpool_postgres::Object;

use super::{lock_id, pg, PostgresBackend, NOW_MS};
use crate::backend::{Cluster, Due, LabelLock, Lease, NodeRow};
use crate::StoreError;
use tether_relay_core::record::NodeId;

/// The advisory-lock space of get-or-create's label sets.
const LABELS_SPACE: &str = "labels";

#[async_trait]
impl Cluster for PostgresBackend {
    async fn heartbeat(&self, node: NodeId, address: String) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                &format!(
                    "INSERT INTO nodes (id, address, heartbeat_ms) VALUES ($1, $2, {NOW_MS}) \
                     ON CONFLICT (id) DO UPDATE SET address = excluded.address, \
                     heartbeat_ms = excluded.heartbeat_ms"
                ),
                &[&node.as_str(), &address],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn leave(&self, node: NodeId) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE nodes SET heartbeat_ms = 0 WHERE id = $1",
                &[&node.as_str()],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn nodes(&self, alive_ms: i64) -> Result<Vec<NodeRow>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT id, address, heartbeat_ms, heartbeat_ms + $1 > {NOW_MS} FROM nodes \
                 ORDER BY id"
            ))
            .await
            .map_err(pg)?;
        let rows = client.query(&stmt, &[&alive_ms]).await.map_err(pg)?;
        rows.iter()
            .map(|row| {
                Ok(NodeRow {
                    id: NodeId::from_stored(row.try_get(0).map_err(pg)?),
                    address: row.try_get(1).map_err(pg)?,
                    heartbeat_ms: row.try_get(2).map_err(pg)?,
                    alive: row.try_get(3).map_err(pg)?,
                })
            })
            .collect()
    }

    async fn acquire_lease(
        &self,
        name: String,
        holder: NodeId,
        ttl_ms: i64,
    ) -> Result<Option<Lease>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "INSERT INTO leases (name, holder, epoch, expires_ms) \
                 VALUES ($1, $2, 1, {NOW_MS} + $3) \
                 ON CONFLICT (name) DO UPDATE SET \
                    epoch = CASE WHEN leases.holder = excluded.holder \
                            THEN leases.epoch ELSE leases.epoch + 1 END, \
                    holder = excluded.holder, \
                    expires_ms = excluded.expires_ms \
                 WHERE leases.holder = excluded.holder OR leases.expires_ms <= {NOW_MS} \
                 RETURNING epoch, expires_ms"
            ))
            .await
            .map_err(pg)?;
        let row = client
            .query_opt(&stmt, &[&name, &holder.as_str(), &ttl_ms])
            .await
            .map_err(pg)?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(Lease {
            epoch: row.try_get(0).map_err(pg)?,
            expires_ms: row.try_get(1).map_err(pg)?,
            name,
            holder,
        }))
    }

    async fn release_lease(&self, lease: Lease) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE leases SET expires_ms = 0 WHERE name = $1 AND holder = $2 AND epoch = $3",
                &[&lease.name, &lease.holder.as_str(), &lease.epoch],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn claim(
        &self,
        id: String,
        lease: Lease,
        margin_ms: i64,
        due: Due,
    ) -> Result<bool, StoreError> {
        let (condition, now, quiet) = match due {
            Due::Expired(now) => ("expires_ms IS NOT NULL AND expires_ms <= $6", now, 0),
            Due::Idle { now_ms, quiet_ms } => (
                "idle_timeout_ms IS NOT NULL AND last_active_ms + idle_timeout_ms <= $6 \
                 AND last_active_ms + $7 <= $6",
                now_ms,
                quiet_ms,
            ),
            Due::Gone => ("state = 'gone' AND $6::bigint IS NOT NULL", 0, 0),
        };
        let claim = lease.claim();
        // Every parameter appears in every form of the statement, so its types are known.
        let sql = format!(
            "UPDATE sandboxes SET reaping = CASE WHEN {condition} AND $7::bigint >= 0 \
             THEN $2 ELSE NULL END \
             WHERE id = $1 AND EXISTS (SELECT 1 FROM leases WHERE name = $3 AND holder = $4 \
             AND epoch = $5 AND expires_ms > {NOW_MS} + $8) RETURNING reaping"
        );
        let client = self.client().await?;
        let row = client
            .query_opt(
                &sql,
                &[
                    &id,
                    &claim,
                    &lease.name,
                    &lease.holder.as_str(),
                    &lease.epoch,
                    &now,
                    &quiet,
                    &margin_ms,
                ],
            )
            .await
            .map_err(pg)?;
        let stamped: Option<String> = match row {
            Some(row) => row.try_get(0).map_err(pg)?,
            None => None,
        };
        Ok(stamped.as_deref() == Some(claim.as_str()))
    }

    async fn lock_labels(&self, key: String) -> Result<LabelLock, StoreError> {
        // This relay's waiters queue here, holding no connection; the first takes the
        // database's lock, which the other relays' first waiters queue on.
        let local = self.label_locks.lock(key.clone()).await;
        let id = lock_id(LABELS_SPACE, &key);
        let mut acquiring = Acquiring(Some(self.client().await?));
        if let Some(client) = &acquiring.0 {
            client
                .execute("SELECT pg_advisory_lock($1)", &[&id])
                .await
                .map_err(pg)?;
        }
        Ok(Box::new((Unlocking(acquiring.0.take(), id), local)))
    }

    async fn setting(&self, name: String) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        client
            .query_opt("SELECT value FROM settings WHERE name = $1", &[&name])
            .await
            .map_err(pg)?
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(pg)
    }

    async fn setting_or_insert(&self, name: String, value: String) -> Result<String, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                &[&name, &value],
            )
            .await
            .map_err(pg)?;
        client
            .query_one("SELECT value FROM settings WHERE name = $1", &[&name])
            .await
            .map_err(pg)?
            .try_get(0)
            .map_err(pg)
    }
}

/// A connection asking for an advisory lock. Dropped before it got it (the call failed or was
/// cancelled), it leaves the pool and closes: the server may still grant the lock to it, and
/// a closed session holds none.
struct Acquiring(Option<Object>);

impl Drop for Acquiring {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(Object::take(client));
        }
    }
}

/// A connection holding the session-level advisory lock `.1`. Dropped, it unlocks and goes
/// back to the pool; if it cannot (the unlock failed, or no runtime is left), it leaves the
/// pool and closes, which releases the lock too: a pooled connection never keeps a lock
/// nobody holds.
struct Unlocking(Option<Object>, i64);

impl Drop for Unlocking {
    fn drop(&mut self) {
        let Some(client) = self.0.take() else {
            return;
        };
        let id = self.1;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let unlocked = client
                        .query_one("SELECT pg_advisory_unlock($1)", &[&id])
                        .await;
                    match unlocked.map(|row| row.try_get::<_, bool>(0)) {
                        Ok(Ok(true)) => {}
                        _ => drop(Object::take(client)),
                    }
                });
            }
            Err(_) => drop(Object::take(client)),
        }
    }
}

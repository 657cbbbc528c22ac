//! The relay's memory: every sandbox it created, every API token it minted, and the journal of
//! sandboxes it destroyed on its own (`journal`), in an embedded SQLite database
//! (`<data_dir>/relay.db`, WAL mode), so sandboxes outlive relay restarts.
//!
//! One connection sits behind a mutex; every call runs on tokio's blocking pool so a slow disk
//! never stalls the runtime. Only hashes of API tokens are stored. Agent tokens are stored as
//! they are (the relay must present them), which is why the file is created mode 0600.

mod journal;
mod record;
mod schema;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::de::DeserializeOwned;

pub use journal::{DestroyReason, Destroyed};
pub(crate) use record::{millis, state_name};
pub use record::{InvalidTenant, SandboxId, SandboxRecord, Tenant, TokenRecord};
pub use schema::SCHEMA_VERSION;

use crate::provider::SandboxState;

/// How long a statement waits for another connection's lock (a second process reading the
/// file, say) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The columns of a sandbox row, in the order [`read_sandbox`] reads them.
const SANDBOX_COLUMNS: &str = "id, tenant, provider, provider_ref, labels, spec, agent_token, \
     meta, created_ms, last_active_ms, ttl_ms, expires_ms, idle_timeout_ms, state";

/// Why a registry call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The database file cannot be opened or set up.
    #[error("cannot open the relay database {path}: {source}; check that the data directory is writable")]
    Open {
        /// The database file.
        path: PathBuf,
        /// What SQLite or the file system said.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database was written by a newer Tether.
    #[error(
        "the relay database has schema version {found}, but this tether knows only up to \
         {known}; run the newer tether that wrote it"
    )]
    TooNew {
        /// The file's version.
        found: u32,
        /// The newest version this build knows.
        known: u32,
    },
    /// A query failed.
    #[error("the relay database failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A value could not be encoded for storage.
    #[error("cannot store a value in the relay database: {0}")]
    Encode(#[from] serde_json::Error),
    /// The blocking task running a query panicked or was cancelled.
    #[error("a relay database task failed: {0}")]
    Task(String),
}

/// The registry: cheap to clone, shared by every request and background task.
#[derive(Clone)]
pub struct Registry {
    db: Arc<Mutex<Connection>>,
}

impl Registry {
    /// Opens (creating if needed, mode 0600) and migrates the database at `path`.
    pub fn open(path: &Path) -> Result<Registry, RegistryError> {
        let open_err = |source: Box<dyn std::error::Error + Send + Sync>| RegistryError::Open {
            path: path.to_path_buf(),
            source,
        };
        // Create it ourselves so it never exists with the umask's wider mode; SQLite gives the
        // -wal and -shm files the database's mode.
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| open_err(e.into()))?;
        let db = Connection::open(path).map_err(|e| open_err(e.into()))?;
        Self::setup(db).map_err(|e| match e {
            RegistryError::Sqlite(e) => open_err(e.into()),
            other => other,
        })
    }

    /// A registry that lives in memory only, for tests.
    #[cfg(test)]
    pub fn open_in_memory() -> Result<Registry, RegistryError> {
        Self::setup(Connection::open_in_memory()?)
    }

    fn setup(mut db: Connection) -> Result<Registry, RegistryError> {
        db.busy_timeout(BUSY_TIMEOUT)?;
        // `journal_mode` answers with the mode it set, so it must be read as a query.
        let _: String = db.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        // NORMAL is durable across application crashes in WAL mode; a power loss may drop the
        // last transactions, which costs at most a sandbox that the reaper will not find.
        db.execute_batch("PRAGMA synchronous = NORMAL;")?;
        schema::migrate(&mut db)?;
        Ok(Registry {
            db: Arc::new(Mutex::new(db)),
        })
    }

    /// Runs `f` on the connection on the blocking pool.
    async fn call<T, F>(&self, f: F) -> Result<T, RegistryError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, RegistryError> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            // A panic mid-call leaves no half-done work behind: an open transaction rolls back
            // when dropped. So a poisoned lock is safe to take over.
            let mut db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            f(&mut db)
        })
        .await
        .map_err(|e| RegistryError::Task(e.to_string()))?
    }

    /// Stores a new sandbox.
    pub async fn insert(&self, sandbox: SandboxRecord) -> Result<(), RegistryError> {
        let labels = serde_json::to_string(&sandbox.labels)?;
        let spec = serde_json::to_string(&sandbox.spec)?;
        let meta = serde_json::to_string(&sandbox.meta)?;
        self.call(move |db| {
            db.execute(
                &format!(
                    "INSERT INTO sandboxes ({SANDBOX_COLUMNS}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
                ),
                params![
                    sandbox.id.as_str(),
                    sandbox.tenant.as_str(),
                    sandbox.provider,
                    sandbox.provider_ref,
                    labels,
                    spec,
                    sandbox.agent_token,
                    meta,
                    sandbox.created_ms,
                    sandbox.last_active_ms,
                    sandbox.ttl.map(millis),
                    sandbox.expires_ms,
                    sandbox.idle_timeout.map(millis),
                    state_name(sandbox.state),
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// The tenant's sandbox `id`; another tenant's is reported as absent.
    pub async fn get(
        &self,
        tenant: &Tenant,
        id: &SandboxId,
    ) -> Result<Option<SandboxRecord>, RegistryError> {
        let (tenant, id) = (tenant.clone(), id.clone());
        self.call(move |db| {
            let sql =
                format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1 AND tenant = ?2");
            Ok(db
                .query_row(&sql, params![id.as_str(), tenant.as_str()], read_sandbox)
                .optional()?)
        })
        .await
    }

    /// The tenant's sandboxes carrying every label in `labels` (and maybe more), oldest first.
    pub async fn list(
        &self,
        tenant: &Tenant,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxRecord>, RegistryError> {
        let tenant = tenant.clone();
        let all = self
            .call(move |db| {
                let sql = format!(
                    "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE tenant = ?1 \
                     ORDER BY created_ms, id"
                );
                query_sandboxes(db, &sql, params![tenant.as_str()])
            })
            .await?;
        Ok(all
            .into_iter()
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect())
    }

    /// The tenant's oldest sandbox, not known to be gone, whose labels are exactly `labels`.
    pub async fn find_by_labels(
        &self,
        tenant: &Tenant,
        labels: &BTreeMap<String, String>,
    ) -> Result<Option<SandboxRecord>, RegistryError> {
        // A BTreeMap serializes with sorted keys and no spaces, so equal maps are equal text.
        let labels = serde_json::to_string(labels)?;
        let tenant = tenant.clone();
        self.call(move |db| {
            let sql = format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                 WHERE tenant = ?1 AND labels = ?2 AND state != ?3 \
                 ORDER BY created_ms, id LIMIT 1"
            );
            let args = params![tenant.as_str(), labels, state_name(SandboxState::Gone)];
            Ok(db.query_row(&sql, args, read_sandbox).optional()?)
        })
        .await
    }

    /// Every sandbox of every tenant.
    pub async fn all(&self) -> Result<Vec<SandboxRecord>, RegistryError> {
        self.call(|db| {
            let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes ORDER BY created_ms, id");
            query_sandboxes(db, &sql, [])
        })
        .await
    }

    /// Sandboxes whose TTL has run out, whose idle timeout has passed at `now_ms` (open
    /// tunnels are the caller's to check), or that are known to be gone.
    pub async fn due(&self, now_ms: i64) -> Result<Vec<SandboxRecord>, RegistryError> {
        self.call(move |db| {
            let sql = format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                 WHERE expires_ms <= ?1 OR last_active_ms + idle_timeout_ms <= ?1 OR state = ?2"
            );
            query_sandboxes(db, &sql, params![now_ms, state_name(SandboxState::Gone)])
        })
        .await
    }

    /// Every sandbox, of every tenant, last seen in `state`.
    pub async fn in_state(&self, state: SandboxState) -> Result<Vec<SandboxRecord>, RegistryError> {
        self.call(move |db| {
            let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE state = ?1");
            query_sandboxes(db, &sql, params![state_name(state)])
        })
        .await
    }

    /// Forgets a sandbox. Returns whether it was there.
    pub async fn remove(&self, id: &SandboxId) -> Result<bool, RegistryError> {
        let id = id.clone();
        self.call(move |db| {
            Ok(db.execute("DELETE FROM sandboxes WHERE id = ?1", [id.as_str()])? > 0)
        })
        .await
    }

    /// Records client activity on `ids` at `now_ms`.
    pub async fn touch(&self, ids: Vec<SandboxId>, now_ms: i64) -> Result<(), RegistryError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.call(move |db| {
            let tx = db.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "UPDATE sandboxes SET last_active_ms = max(last_active_ms, ?2) WHERE id = ?1",
                )?;
                for id in &ids {
                    stmt.execute(params![id.as_str(), now_ms])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Records the state a provider reported.
    pub async fn set_state(
        &self,
        id: &SandboxId,
        state: SandboxState,
    ) -> Result<(), RegistryError> {
        let id = id.clone();
        self.call(move |db| {
            db.execute(
                "UPDATE sandboxes SET state = ?2 WHERE id = ?1",
                params![id.as_str(), state_name(state)],
            )?;
            Ok(())
        })
        .await
    }

    /// Sets a new TTL, running out at `expires_ms`.
    pub async fn set_ttl(
        &self,
        id: &SandboxId,
        ttl: Duration,
        expires_ms: i64,
    ) -> Result<(), RegistryError> {
        let id = id.clone();
        self.call(move |db| {
            db.execute(
                "UPDATE sandboxes SET ttl_ms = ?2, expires_ms = ?3 WHERE id = ?1",
                params![id.as_str(), millis(ttl), expires_ms],
            )?;
            Ok(())
        })
        .await
    }

    /// Stores an API token by its hash.
    pub async fn insert_token(
        &self,
        hash: String,
        token: TokenRecord,
        created_ms: i64,
    ) -> Result<(), RegistryError> {
        self.call(move |db| {
            db.execute(
                "INSERT OR REPLACE INTO tokens (hash, tenant, admin, created_ms) \
                 VALUES (?1, ?2, ?3, ?4)",
                params![hash, token.tenant.as_str(), token.admin, created_ms],
            )?;
            Ok(())
        })
        .await
    }

    /// What the token with this hash grants, if it exists.
    pub async fn token(&self, hash: String) -> Result<Option<TokenRecord>, RegistryError> {
        self.call(move |db| {
            Ok(db
                .query_row(
                    "SELECT tenant, admin FROM tokens WHERE hash = ?1",
                    [hash],
                    |row| {
                        Ok(TokenRecord {
                            tenant: Tenant::from_stored(row.get(0)?),
                            admin: row.get(1)?,
                        })
                    },
                )
                .optional()?)
        })
        .await
    }
}

fn query_sandboxes(
    db: &Connection,
    sql: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<SandboxRecord>, RegistryError> {
    let mut stmt = db.prepare_cached(sql)?;
    let rows = stmt.query_map(args, read_sandbox)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn read_sandbox(row: &Row<'_>) -> rusqlite::Result<SandboxRecord> {
    let state: String = row.get(13)?;
    Ok(SandboxRecord {
        id: SandboxId::from(row.get::<_, String>(0)?),
        tenant: Tenant::from_stored(row.get(1)?),
        provider: row.get(2)?,
        provider_ref: row.get(3)?,
        labels: json_column(row, 4)?,
        spec: json_column(row, 5)?,
        agent_token: row.get(6)?,
        meta: json_column(row, 7)?,
        created_ms: row.get(8)?,
        last_active_ms: row.get(9)?,
        ttl: row.get::<_, Option<i64>>(10)?.map(from_millis),
        expires_ms: row.get(11)?,
        idle_timeout: row.get::<_, Option<i64>>(12)?.map(from_millis),
        state: record::parse_state(&state).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                13,
                Type::Text,
                format!("unknown sandbox state {state:?}").into(),
            )
        })?,
    })
}

fn json_column<T: DeserializeOwned>(row: &Row<'_>, idx: usize) -> rusqlite::Result<T> {
    let text: String = row.get(idx)?;
    serde_json::from_str(&text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
}

fn from_millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

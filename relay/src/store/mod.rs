//! The relay's memory: every sandbox it created, every API token it minted, the journal of
//! sandboxes it destroyed on its own (`journal`), the journal of creates in progress
//! (`create_journal`, what a crash may have half made), and the secret store (`secrets`: tenants'
//! secrets and those bound to sandboxes, sealed), in an embedded SQLite database
//! (`<data_dir>/relay.db`, WAL mode), so sandboxes outlive relay restarts.
//!
//! One connection sits behind a mutex; every call runs on tokio's blocking pool so a slow disk
//! never stalls the runtime. Only hashes of API tokens are stored. Agent tokens, which the
//! relay must present to each agent, are stored sealed under the relay's key (`secret`), as
//! are specs (users' environment variables) and provider metadata (providers' access
//! tokens); deleted rows are overwritten (`secure_delete`), so the file holds no secret in
//! plain text.

mod create_journal;
mod egress_ca;
mod journal;
mod record;
mod schema;
mod secret;
mod secrets;
#[cfg(test)]
mod secrets_tests;
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

pub(crate) use create_journal::PendingCreate;
pub(crate) use journal::{DestroyReason, Destroyed};
pub(crate) use record::{millis, state_name};
pub(crate) use record::{Role, SandboxId, SandboxRecord, Tenant, TokenRecord};
pub(crate) use secret::{SecretError, KEY_FILE};
pub(crate) use secrets::StoredSecret;

use secret::SecretKey;
use subtle::ConstantTimeEq;

use crate::provider::SandboxState;

/// How long a statement waits for another connection's lock (a second process reading the
/// file, say) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The columns of a sandbox row, in the order [`read_sandbox`] reads them.
const SANDBOX_COLUMNS: &str = "id, tenant, provider, provider_ref, labels, spec, agent_token, \
     meta, created_ms, last_active_ms, ttl_ms, expires_ms, idle_timeout_ms, state";

/// The columns sealed under the relay's key, with their index in [`SANDBOX_COLUMNS`]: the
/// agent token, and the spec and provider metadata, which carry users' environment variables
/// and providers' access tokens.
const SEALED_COLUMNS: [(&str, usize); 3] = [("spec", 5), ("agent_token", 6), ("meta", 7)];

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
    /// The relay's key is missing, damaged or not the one the database was sealed with.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The key file was lost but the database holds tokens sealed under it.
    #[error(
        "{path} holds agent tokens sealed under a key that is gone (a new {KEY_FILE} was just \
         made); restore the {KEY_FILE} that belongs with this database, then delete the new one"
    )]
    KeyLost {
        /// The database file.
        path: PathBuf,
    },
}

/// The registry: cheap to clone, shared by every request and background task.
#[derive(Clone)]
pub struct Registry {
    db: Arc<Mutex<Connection>>,
    key: Arc<SecretKey>,
}

impl Registry {
    /// Opens (creating if needed, mode 0600) and migrates the database at `path`, with the
    /// relay's key in `KEY_FILE` beside it (created if needed, mode 0600).
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
        let (key, new_key) = SecretKey::load_or_create(&path.with_file_name(KEY_FILE))?;
        let db = Connection::open(path).map_err(|e| open_err(e.into()))?;
        Self::setup(db, key, new_key).map_err(|e| match e {
            RegistryError::Sqlite(e) => open_err(e.into()),
            RegistryError::KeyLost { .. } => RegistryError::KeyLost {
                path: path.to_path_buf(),
            },
            other => other,
        })
    }

    /// A registry that lives in memory only, for tests.
    #[cfg(test)]
    pub(crate) fn open_in_memory() -> Result<Registry, RegistryError> {
        Self::setup(Connection::open_in_memory()?, SecretKey::random(), true)
    }

    /// Sets the connection up and migrates it; `new_key` says the key was just made, so no
    /// token may be sealed yet.
    fn setup(mut db: Connection, key: SecretKey, new_key: bool) -> Result<Registry, RegistryError> {
        db.busy_timeout(BUSY_TIMEOUT)?;
        // `journal_mode` answers with the mode it set, so it must be read as a query.
        let _: String = db.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        // NORMAL is durable across application crashes in WAL mode; a power loss may drop the
        // last transactions, which costs at most a sandbox that the reaper will not find.
        db.execute_batch("PRAGMA synchronous = NORMAL;")?;
        // Deleted and overwritten rows are zeroed, not left in free pages for a reader of
        // the file to find.
        db.execute_batch("PRAGMA secure_delete = ON;")?;
        schema::migrate(&mut db)?;
        if new_key && has_sealed_tokens(&db)? {
            return Err(RegistryError::KeyLost {
                path: PathBuf::from(db.path().unwrap_or(":memory:")),
            });
        }
        seal_plain_tokens(&mut db, &key)?;
        Ok(Registry {
            db: Arc::new(Mutex::new(db)),
            key: Arc::new(key),
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

    /// Stores a new sandbox and, in the same transaction, completes its create in the create
    /// journal: from then on the sandbox is the registry's, never a half-made create.
    pub(crate) async fn insert(&self, sandbox: SandboxRecord) -> Result<(), RegistryError> {
        let labels = serde_json::to_string(&sandbox.labels)?;
        let spec = serde_json::to_string(&sandbox.spec)?;
        let meta = serde_json::to_string(&sandbox.meta)?;
        let id = sandbox.id.as_str();
        let spec = self.key.seal(&seal_context(id, "spec"), &spec);
        let agent_token = self
            .key
            .seal(&seal_context(id, "agent_token"), &sandbox.agent_token);
        let meta = self.key.seal(&seal_context(id, "meta"), &meta);
        self.call(move |db| {
            let tx = db.transaction()?;
            tx.execute(
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
                    agent_token,
                    meta,
                    sandbox.created_ms,
                    sandbox.last_active_ms,
                    sandbox.ttl.map(millis),
                    sandbox.expires_ms,
                    sandbox.idle_timeout.map(millis),
                    state_name(sandbox.state),
                ],
            )?;
            create_journal::complete(&tx, &sandbox.id)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The tenant's sandbox `id`; another tenant's is reported as absent.
    pub(crate) async fn get(
        &self,
        tenant: &Tenant,
        id: &SandboxId,
    ) -> Result<Option<SandboxRecord>, RegistryError> {
        let (tenant, id) = (tenant.clone(), id.clone());
        let key = self.key.clone();
        self.call(move |db| {
            let sql =
                format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1 AND tenant = ?2");
            Ok(db
                .query_row(&sql, params![id.as_str(), tenant.as_str()], |row| {
                    read_sandbox(row, &key)
                })
                .optional()?)
        })
        .await
    }

    /// The tenant's sandboxes carrying every label in `labels` (and maybe more), oldest first.
    pub(crate) async fn list(
        &self,
        tenant: &Tenant,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxRecord>, RegistryError> {
        let tenant = tenant.clone();
        let key = self.key.clone();
        let all = self
            .call(move |db| {
                let sql = format!(
                    "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE tenant = ?1 \
                     ORDER BY created_ms, id"
                );
                query_sandboxes(db, &key, &sql, params![tenant.as_str()])
            })
            .await?;
        Ok(all
            .into_iter()
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect())
    }

    /// The tenant's oldest sandbox, not known to be gone or dead, whose labels are exactly
    /// `labels`.
    pub(crate) async fn find_by_labels(
        &self,
        tenant: &Tenant,
        labels: &BTreeMap<String, String>,
    ) -> Result<Option<SandboxRecord>, RegistryError> {
        // A BTreeMap serializes with sorted keys and no spaces, so equal maps are equal text.
        let labels = serde_json::to_string(labels)?;
        let tenant = tenant.clone();
        let key = self.key.clone();
        self.call(move |db| {
            let sql = format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                 WHERE tenant = ?1 AND labels = ?2 AND state NOT IN (?3, ?4) \
                 ORDER BY created_ms, id LIMIT 1"
            );
            let args = params![
                tenant.as_str(),
                labels,
                state_name(SandboxState::Gone),
                state_name(SandboxState::Dead)
            ];
            Ok(db
                .query_row(&sql, args, |row| read_sandbox(row, &key))
                .optional()?)
        })
        .await
    }

    /// Every sandbox of every tenant.
    pub async fn all(&self) -> Result<Vec<SandboxRecord>, RegistryError> {
        let key = self.key.clone();
        self.call(move |db| {
            let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes ORDER BY created_ms, id");
            query_sandboxes(db, &key, &sql, [])
        })
        .await
    }

    /// The id of every sandbox of every tenant (nothing is unsealed, so a row sealed under
    /// another key still counts).
    pub(crate) async fn all_ids(&self) -> Result<Vec<SandboxId>, RegistryError> {
        self.call(|db| {
            let mut stmt = db.prepare("SELECT id FROM sandboxes")?;
            let ids = stmt.query_map([], |row| row.get::<_, String>(0).map(SandboxId::from))?;
            Ok(ids.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// How many sandboxes `tenant` has that are not known to be gone.
    pub(crate) async fn count(&self, tenant: &Tenant) -> Result<u64, RegistryError> {
        let tenant = tenant.clone();
        self.call(move |db| {
            Ok(db.query_row(
                "SELECT count(*) FROM sandboxes WHERE tenant = ?1 AND state != ?2",
                params![tenant.as_str(), state_name(SandboxState::Gone)],
                |row| row.get(0),
            )?)
        })
        .await
    }

    /// Sandboxes whose TTL has run out, whose idle timeout has passed at `now_ms` (open
    /// tunnels are the caller's to check), or that are known to be gone.
    pub(crate) async fn due(&self, now_ms: i64) -> Result<Vec<SandboxRecord>, RegistryError> {
        let key = self.key.clone();
        self.call(move |db| {
            let sql = format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes \
                 WHERE expires_ms <= ?1 OR last_active_ms + idle_timeout_ms <= ?1 OR state = ?2"
            );
            let args = params![now_ms, state_name(SandboxState::Gone)];
            query_sandboxes(db, &key, &sql, args)
        })
        .await
    }

    /// Every sandbox, of every tenant, last seen in `state`.
    pub(crate) async fn in_state(
        &self,
        state: SandboxState,
    ) -> Result<Vec<SandboxRecord>, RegistryError> {
        let key = self.key.clone();
        self.call(move |db| {
            let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE state = ?1");
            query_sandboxes(db, &key, &sql, params![state_name(state)])
        })
        .await
    }

    /// Forgets a sandbox. Returns whether it was there.
    pub(crate) async fn remove(&self, id: &SandboxId) -> Result<bool, RegistryError> {
        let id = id.clone();
        self.call(move |db| {
            Ok(db.execute("DELETE FROM sandboxes WHERE id = ?1", [id.as_str()])? > 0)
        })
        .await
    }

    /// Records client activity on `ids` at `now_ms`.
    pub(crate) async fn touch(
        &self,
        ids: Vec<SandboxId>,
        now_ms: i64,
    ) -> Result<(), RegistryError> {
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
    pub(crate) async fn set_state(
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
    pub(crate) async fn set_ttl(
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

    /// Stores an API token by its hash (replacing the grant of a token with the same hash).
    pub(crate) async fn insert_token(
        &self,
        hash: String,
        token: TokenRecord,
        created_ms: i64,
    ) -> Result<(), RegistryError> {
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

    /// What the token with this hash grants, if it exists. The index finds the row; the hash
    /// is then compared in constant time, so no timing depends on how much of it matched.
    pub(crate) async fn token(&self, hash: String) -> Result<Option<TokenRecord>, RegistryError> {
        self.call(move |db| {
            let found = db
                .query_row(
                    "SELECT hash, tenant, admin, relay_admin FROM tokens WHERE hash = ?1",
                    [&hash],
                    |row| {
                        let stored: String = row.get(0)?;
                        let role = match (row.get::<_, bool>(2)?, row.get::<_, bool>(3)?) {
                            (_, true) => Role::RelayAdmin,
                            (true, false) => Role::Admin,
                            (false, false) => Role::Member,
                        };
                        let record = TokenRecord {
                            tenant: Tenant::from_stored(row.get(1)?),
                            role,
                        };
                        Ok((stored, record))
                    },
                )
                .optional()?;
            Ok(found.and_then(|(stored, record)| {
                bool::from(stored.as_bytes().ct_eq(hash.as_bytes())).then_some(record)
            }))
        })
        .await
    }
}

/// Whether any sandbox row holds a sealed agent token.
fn has_sealed_tokens(db: &Connection) -> Result<bool, RegistryError> {
    let pattern = format!("{}%", secret::SEALED_PREFIX);
    Ok(db.query_row(
        "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE agent_token LIKE ?1)",
        [pattern],
        |row| row.get(0),
    )?)
}

/// Seals every agent token stored before tokens were sealed, then compacts the file and
/// empties the write-ahead log, so no page of either still holds one in plain text.
fn seal_plain_tokens(db: &mut Connection, key: &SecretKey) -> Result<(), RegistryError> {
    let mut plain: Vec<(String, &str, String)> = Vec::new();
    {
        let mut stmt = db.prepare("SELECT id, spec, agent_token, meta FROM sandboxes")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let id: String = row.get(0)?;
            for (n, (column, _)) in SEALED_COLUMNS.iter().enumerate() {
                let value: String = row.get(n + 1)?;
                if !secret::is_sealed(&value) {
                    plain.push((id.clone(), column, value));
                }
            }
        }
    }
    if plain.is_empty() {
        return Ok(());
    }
    let tx = db.transaction()?;
    for (id, column, value) in &plain {
        // The column name is one of ours, never input.
        tx.execute(
            &format!("UPDATE sandboxes SET {column} = ?2 WHERE id = ?1"),
            params![id, key.seal(&seal_context(id, column), value)],
        )?;
    }
    tx.commit()?;
    // VACUUM rewrites every page; the checkpoint then truncates the log, which may still
    // hold pages written by an older relay.
    db.execute_batch("VACUUM;")?;
    let _: (i64, i64, i64) = db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
    })?;
    tracing::info!(
        "sealed {} values an older relay stored in plain text",
        plain.len()
    );
    Ok(())
}

/// What a sealed value is bound to: its sandbox and column, so it opens nowhere else.
fn seal_context(id: &str, column: &str) -> String {
    format!("{id}/{column}")
}

fn query_sandboxes(
    db: &Connection,
    key: &SecretKey,
    sql: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<SandboxRecord>, RegistryError> {
    let mut stmt = db.prepare_cached(sql)?;
    let rows = stmt.query_map(args, |row| read_sandbox(row, key))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn read_sandbox(row: &Row<'_>, key: &SecretKey) -> rusqlite::Result<SandboxRecord> {
    let state: String = row.get(13)?;
    let id: String = row.get(0)?;
    let [spec, agent_token, meta] = SEALED_COLUMNS.map(|(column, idx)| {
        let sealed: String = row.get(idx)?;
        key.open(&seal_context(&id, column), &sealed)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
    });
    let (agent_token, spec, meta) = (agent_token?, spec?, meta?);
    Ok(SandboxRecord {
        id: SandboxId::from(id),
        tenant: Tenant::from_stored(row.get(1)?),
        provider: row.get(2)?,
        provider_ref: row.get(3)?,
        labels: json_column(row, 4)?,
        spec: json_text(5, &spec)?,
        agent_token,
        meta: json_text(7, &meta)?,
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
    json_text(idx, &row.get::<_, String>(idx)?)
}

fn json_text<T: DeserializeOwned>(idx: usize, text: &str) -> rusqlite::Result<T> {
    serde_json::from_str(text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
}

fn from_millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

//! The SQLite backend: the store of a single relay, embedded in `<data_dir>/relay.db` (WAL
//! mode), the default.
//!
//! One connection sits behind a mutex; every call runs on tokio's blocking pool so a slow disk
//! never stalls the runtime. Deleted rows are overwritten (`secure_delete`), so the file holds
//! no secret in plain text. One file per concern: `sandboxes` (and tokens), `journals`,
//! `secrets`, `cluster`; `schema` holds the migrations.

mod cluster;
mod journals;
mod sandboxes;
pub(super) mod schema;
mod secrets;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::Type;
use rusqlite::{params, Connection, Row};

use super::backend::{Backend, SandboxRow};
use super::locks::KeyedLocks;
use super::seal::{self, SealKey};
use super::{StoreError, KEY_CHECK};

/// How long a statement waits for another connection's lock (a second process reading the
/// file, say) before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The columns of a sandbox row, in the order [`read_sandbox`] reads them.
pub(super) const SANDBOX_COLUMNS: &str = "id, tenant, provider, provider_ref, labels, spec, \
     agent_token, meta, created_ms, last_active_ms, ttl_ms, expires_ms, idle_timeout_ms, state, \
     node";

/// The sealed columns of a sandbox row: the agent token, and the spec and provider metadata,
/// which carry users' environment variables and providers' access tokens.
pub(super) const SEALED_COLUMNS: [&str; 3] = ["spec", "agent_token", "meta"];

/// The store in an SQLite file (or in memory, for tests).
pub(super) struct SqliteBackend {
    db: Arc<Mutex<Connection>>,
    /// Get-or-create's per-label locks: one relay per file, so in-process locks suffice.
    label_locks: Arc<KeyedLocks>,
    /// `SQLite at PATH`, for messages.
    location: String,
}

impl SqliteBackend {
    /// Sets `db` up and migrates it; `key` is the relay's, `new_key` whether it was just
    /// made (then no value may be sealed yet: the old key was lost).
    /// `key_file` names the key in messages.
    pub(super) fn setup(
        mut db: Connection,
        key: &SealKey,
        new_key: bool,
        key_file: &Path,
    ) -> Result<SqliteBackend, StoreError> {
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
            return Err(StoreError::KeyLost {
                path: PathBuf::from(db.path().unwrap_or(":memory:")),
            });
        }
        seal_plain_tokens(&mut db, key)?;
        db.execute(
            "INSERT OR IGNORE INTO settings (name, value) VALUES (?1, ?2)",
            params![KEY_CHECK, super::key_check(key)],
        )?;
        let stored: String = db.query_row(
            "SELECT value FROM settings WHERE name = ?1",
            [KEY_CHECK],
            |row| row.get(0),
        )?;
        super::verify_key_check(key, &stored, "SQLite", key_file)?;
        let location = match db.path().filter(|p| !p.is_empty()) {
            Some(path) => format!("SQLite at {path}"),
            None => "SQLite in memory".to_string(),
        };
        Ok(SqliteBackend {
            db: Arc::new(Mutex::new(db)),
            label_locks: Arc::default(),
            location,
        })
    }

    /// Opens the file at `path` (which must exist).
    pub(super) fn open(
        path: &Path,
        key: &SealKey,
        new_key: bool,
        key_file: &Path,
    ) -> Result<SqliteBackend, StoreError> {
        Self::setup(Connection::open(path)?, key, new_key, key_file)
    }

    /// Runs `f` on the connection on the blocking pool.
    pub(super) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            // A panic mid-call leaves no half-done work behind: an open transaction rolls back
            // when dropped. So a poisoned lock is safe to take over.
            let mut db = db.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            f(&mut db)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

impl Backend for SqliteBackend {
    fn kind(&self) -> &'static str {
        "SQLite"
    }

    fn location(&self) -> String {
        self.location.clone()
    }
}

/// Whether any sandbox row holds a sealed agent token.
fn has_sealed_tokens(db: &Connection) -> Result<bool, StoreError> {
    let pattern = format!("{}%", seal::SEALED_PREFIX);
    Ok(db.query_row(
        "SELECT EXISTS (SELECT 1 FROM sandboxes WHERE agent_token LIKE ?1)",
        [pattern],
        |row| row.get(0),
    )?)
}

/// Seals every agent token stored before tokens were sealed, then compacts the file and
/// empties the write-ahead log, so no page of either still holds one in plain text.
fn seal_plain_tokens(db: &mut Connection, key: &SealKey) -> Result<(), StoreError> {
    let mut plain: Vec<(String, &str, String)> = Vec::new();
    {
        let mut stmt = db.prepare("SELECT id, spec, agent_token, meta FROM sandboxes")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let id: String = row.get(0)?;
            for (n, column) in SEALED_COLUMNS.iter().enumerate() {
                let value: String = row.get(n + 1)?;
                if !seal::is_sealed(&value) {
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
            params![id, key.seal(&super::seal_context(id, column), value)],
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

/// Reads a row of [`SANDBOX_COLUMNS`].
pub(super) fn read_sandbox(row: &Row<'_>) -> rusqlite::Result<SandboxRow> {
    Ok(SandboxRow {
        id: row.get(0)?,
        tenant: row.get(1)?,
        provider: row.get(2)?,
        provider_ref: row.get(3)?,
        labels: row.get(4)?,
        spec: row.get(5)?,
        agent_token: row.get(6)?,
        meta: row.get(7)?,
        created_ms: row.get(8)?,
        last_active_ms: row.get(9)?,
        ttl_ms: row.get(10)?,
        expires_ms: row.get(11)?,
        idle_timeout_ms: row.get(12)?,
        state: row.get(13)?,
        node: row.get(14)?,
    })
}

/// A column that holds JSON, parsed.
pub(super) fn json_text<T: serde::de::DeserializeOwned>(
    idx: usize,
    text: &str,
) -> rusqlite::Result<T> {
    serde_json::from_str(text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
}

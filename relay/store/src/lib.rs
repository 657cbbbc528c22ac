//! The relay's memory: every sandbox it created, every API token it minted, the journal of
//! sandboxes it destroyed on its own (`journal`), the journal of creates in progress
//! (`create_journal`, what a crash may have half made), the secret store (`secrets`: tenants'
//! secrets and those bound to sandboxes, sealed), and what relays sharing a database need of
//! each other (nodes, leases), so sandboxes outlive relay restarts. `binding` ties a data
//! directory to the one store its sandboxes are registered in.
//!
//! [`Store`] is the one face of it; behind it a [`backend::Backend`] stores the rows: SQLite
//! (`sqlite`, `<data_dir>/relay.db`, one relay, the default) or PostgreSQL (`postgres`, any
//! number of relays as replicas). Only hashes of API tokens are stored. Agent tokens, which the
//! relay must present to each agent, are sealed under the relay's key (`seal`) here, before
//! any backend sees them, as are specs (users' environment variables), provider metadata
//! (providers' access tokens) and secrets; so neither database holds one in plain text, and
//! every relay sharing a database needs the same key.

#![warn(missing_docs)]

mod backend;
mod binding;
mod create_journal;
mod egress_ca;
mod journal;
mod locks;
#[cfg(feature = "postgres")]
mod postgres;
mod seal;
mod secrets;
mod sqlite;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use backend::{Due, LabelLock, Lease, NodeRow};
pub use binding::BindingError;
pub use create_journal::PendingCreate;
pub use journal::{DestroyReason, Destroyed};
pub use seal::{SealError, KEY_FILE};
// The records live in the core, which every part of the relay shares; the store is where
// other crates meet them.
pub use secrets::StoredSecret;
pub use tether_relay_core::record::{
    millis, parse_state, state_name, InvalidNodeId, NodeId, Role, SandboxId, SandboxRecord, Tenant,
    TokenRecord,
};

use backend::{Backend, SandboxRow, Select};
use seal::SealKey;
use subtle::ConstantTimeEq;

use tether_relay_core::provider::SandboxState;

/// The setting that proves every relay of a database seals with the same key: a known text
/// sealed under the key of the first relay that opened it.
const KEY_CHECK: &str = "key_check";
/// What [`KEY_CHECK`] seals.
const KEY_CHECK_TEXT: &str = "tether-key-check-v1";

/// Why a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file cannot be opened or set up.
    #[error("cannot open the relay database {path}: {source}; check that the data directory is writable and that its disk has free space")]
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
    #[error("the relay database failed: {0}{hint}", hint = disk_full_hint(.0))]
    Sqlite(#[from] rusqlite::Error),
    /// The PostgreSQL database cannot be reached.
    #[error(
        "cannot reach the relay database ({target}): {reason}; check that PostgreSQL runs \
         there and that the URL's user, password and database are right"
    )]
    Connect {
        /// Where (never the password).
        target: String,
        /// What the connection said.
        reason: String,
    },
    /// A PostgreSQL connection or query failed.
    #[error("the relay database (PostgreSQL) failed: {0}")]
    Postgres(String),
    /// A value could not be encoded for storage.
    #[error("cannot store a value in the relay database: {0}")]
    Encode(#[from] serde_json::Error),
    /// A stored value is not one this relay can read.
    #[error("the relay database holds a value this tether cannot read: {0}")]
    Corrupt(String),
    /// The blocking task running a query panicked or was cancelled.
    #[error("a relay database task failed: {0}")]
    Task(String),
    /// The relay's key is missing, damaged or not the one the database was sealed with.
    #[error(transparent)]
    Seal(#[from] SealError),
    /// The key file was lost but the database holds tokens sealed under it.
    #[error(
        "{path} holds agent tokens sealed under a key that is gone (a new {KEY_FILE} was just \
         made); restore the {KEY_FILE} that belongs with this database, then delete the new one"
    )]
    KeyLost {
        /// The database file.
        path: PathBuf,
    },
    /// The database's values were sealed under another key than this relay's.
    #[error("the relay database ({kind}) was sealed under another key than {key_file}: {hint}")]
    WrongKey {
        /// Which database.
        kind: &'static str,
        /// This relay's key file.
        key_file: PathBuf,
        /// What to do.
        hint: &'static str,
    },
}

impl StoreError {
    /// Whether the database could not be written because its disk is full: nothing the
    /// request did wrong, and over once space is freed.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StoreError::Sqlite(e) if sqlite_disk_full(e))
    }
}

fn sqlite_disk_full(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::DiskFull)
}

/// What to do about a full disk, said after SQLite's own words for it.
fn disk_full_hint(e: &rusqlite::Error) -> &'static str {
    match sqlite_disk_full(e) {
        true => {
            "; the disk holding the relay's data directory is full: free space on it, then retry"
        }
        false => "",
    }
}

/// The store: cheap to clone, shared by every request and background task.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    key: Arc<SealKey>,
}

impl Store {
    /// Opens (creating if needed, mode 0600) and migrates the SQLite database at `path`, with
    /// the relay's key in `KEY_FILE` beside it (created if needed, mode 0600).
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let open_err = |source: Box<dyn std::error::Error + Send + Sync>| StoreError::Open {
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
        let key_file = path.with_file_name(KEY_FILE);
        let (key, new_key) = SealKey::load_or_create(&key_file)?;
        let backend = sqlite::SqliteBackend::open(path, &key, new_key, &key_file);
        let backend = backend.map_err(|e| match e {
            StoreError::Sqlite(e) => open_err(e.into()),
            StoreError::KeyLost { .. } => StoreError::KeyLost {
                path: path.to_path_buf(),
            },
            other => other,
        })?;
        Ok(Store {
            backend: Arc::new(backend),
            key: Arc::new(key),
        })
    }

    /// Connects to the PostgreSQL database at `url` (`postgres://user:password@host/db`) and
    /// migrates it, sealing with the key in `key_file`: every relay sharing the database must
    /// have the same one. The first relay of an empty database creates the file when it is
    /// missing; a relay joining one that others use refuses to start without it.
    #[cfg(feature = "postgres")]
    pub async fn open_postgres(url: &str, key_file: &Path) -> Result<Store, StoreError> {
        let backend = postgres::PostgresBackend::connect(url).await?;
        Store::seal_postgres(backend, key_file).await
    }

    /// [`Store::open_postgres`] for a relay with the data directory `data_dir`, which must
    /// belong to this database ([`Store::bind_data_dir`]): checked before anything of the
    /// relay's (its key check) is written to the database.
    #[cfg(feature = "postgres")]
    pub async fn open_postgres_for(
        url: &str,
        key_file: &Path,
        data_dir: &Path,
    ) -> Result<Store, BindingError> {
        let backend = postgres::PostgresBackend::connect(url).await?;
        binding::bind(&backend, data_dir).await?;
        Ok(Store::seal_postgres(backend, key_file).await?)
    }

    /// Without the `postgres` feature: an error that says how to get a relay that has it.
    #[cfg(not(feature = "postgres"))]
    pub async fn open_postgres_for(
        _url: &str,
        _key_file: &Path,
        _data_dir: &Path,
    ) -> Result<Store, BindingError> {
        Err(StoreError::Postgres(
            "this relay was built without PostgreSQL support; build it with the `postgres` \
             feature (on by default) to use --database postgres://..."
                .into(),
        )
        .into())
    }

    /// A store on `backend`, sealing with the key in `key_file` (see [`Store::open_postgres`]).
    #[cfg(feature = "postgres")]
    async fn seal_postgres(
        backend: postgres::PostgresBackend,
        key_file: &Path,
    ) -> Result<Store, StoreError> {
        let key = match SealKey::load(key_file)? {
            Some(key) => key,
            None if backend.has_key_check().await? => {
                return Err(StoreError::WrongKey {
                    kind: "PostgreSQL",
                    key_file: key_file.to_path_buf(),
                    hint: "that file does not exist, and other relays already seal this \
                           database's values under theirs; copy their key file to it",
                })
            }
            None => SealKey::create(key_file)?,
        };
        let store = Store {
            backend: Arc::new(backend),
            key: Arc::new(key),
        };
        store.check_key(key_file).await?;
        Ok(store)
    }

    /// A store that lives in memory only, under a key of its own: for tests, here and in
    /// the crates built on the store.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let key = SealKey::random();
        let db = rusqlite::Connection::open_in_memory()?;
        let backend = sqlite::SqliteBackend::setup(db, &key, true, Path::new(":memory:"))?;
        Ok(Store {
            backend: Arc::new(backend),
            key: Arc::new(key),
        })
    }

    /// Which database this is, for messages: `SQLite` or `PostgreSQL`.
    pub fn kind(&self) -> &'static str {
        self.backend.kind()
    }

    /// Where the database is, for messages (never a password).
    pub fn location(&self) -> String {
        self.backend.location()
    }

    /// Makes sure the database's values were sealed under this relay's key, recording the
    /// check on first use.
    #[cfg(feature = "postgres")]
    async fn check_key(&self, key_file: &Path) -> Result<(), StoreError> {
        let stored = self
            .backend
            .setting_or_insert(KEY_CHECK.to_string(), key_check(&self.key))
            .await?;
        verify_key_check(&self.key, &stored, self.kind(), key_file)
    }

    /// A key for `purpose` derived from the relay's key, so every relay holding the key has
    /// it (how relays of one database authenticate to each other).
    pub fn derived_key(&self, purpose: &str) -> [u8; 32] {
        self.key.derive(purpose)
    }

    /// Stores a new sandbox and, in the same transaction, completes its create in the create
    /// journal: from then on the sandbox is the store's, never a half-made create.
    pub async fn insert(&self, sandbox: SandboxRecord) -> Result<(), StoreError> {
        let row = self.seal_row(&sandbox)?;
        self.backend.insert(row).await
    }

    /// The tenant's sandbox `id`; another tenant's is reported as absent.
    pub async fn get(
        &self,
        tenant: &Tenant,
        id: &SandboxId,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        let row = self
            .backend
            .get(Some(tenant.to_string()), id.to_string())
            .await?;
        row.map(|row| self.open_row(row)).transpose()
    }

    /// Sandbox `id` whoever owns it (for previews, whose token is the sandbox's own).
    pub async fn get_any(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, StoreError> {
        let row = self.backend.get(None, id.to_string()).await?;
        row.map(|row| self.open_row(row)).transpose()
    }

    /// The tenant's sandboxes carrying every label in `labels` (and maybe more), oldest first.
    pub async fn list(
        &self,
        tenant: &Tenant,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxRecord>, StoreError> {
        let all = self.select(Select::Tenant(tenant.to_string())).await?;
        Ok(all
            .into_iter()
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect())
    }

    /// The tenant's oldest sandbox, not known to be gone or dead, whose labels are exactly
    /// `labels`.
    pub async fn find_by_labels(
        &self,
        tenant: &Tenant,
        labels: &BTreeMap<String, String>,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        // A BTreeMap serializes with sorted keys and no spaces, so equal maps are equal text.
        let labels = serde_json::to_string(labels)?;
        let select = Select::ExactLabels {
            tenant: tenant.to_string(),
            labels,
        };
        Ok(self.select(select).await?.into_iter().next())
    }

    /// Every sandbox of every tenant.
    pub async fn all(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        self.select(Select::All).await
    }

    /// The id of every sandbox of every tenant (nothing is unsealed, so a row sealed under
    /// another key still counts).
    pub async fn all_ids(&self) -> Result<Vec<SandboxId>, StoreError> {
        let ids = self.backend.all_ids().await?;
        Ok(ids.into_iter().map(SandboxId::from).collect())
    }

    /// How many sandboxes `tenant` has that are not known to be gone.
    pub async fn count(&self, tenant: &Tenant) -> Result<u64, StoreError> {
        self.backend.count(tenant.to_string()).await
    }

    /// Sandboxes whose TTL has run out, whose idle timeout has passed at `now_ms` (open
    /// tunnels are the caller's to check), that are known to be gone, or that a reaper claimed.
    pub async fn due(&self, now_ms: i64) -> Result<Vec<SandboxRecord>, StoreError> {
        self.select(Select::Due(now_ms)).await
    }

    /// Every sandbox, of every tenant, last seen in `state`.
    pub async fn in_state(&self, state: SandboxState) -> Result<Vec<SandboxRecord>, StoreError> {
        self.select(Select::State(state_name(state).to_string()))
            .await
    }

    /// Forgets a sandbox. Returns whether it was there.
    pub async fn remove(&self, id: &SandboxId) -> Result<bool, StoreError> {
        self.backend.remove(id.to_string()).await
    }

    /// Records client activity on `ids` at `now_ms`.
    pub async fn touch(&self, ids: Vec<SandboxId>, now_ms: i64) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids = ids.into_iter().map(|id| id.to_string()).collect();
        self.backend.touch(ids, now_ms).await
    }

    /// Records the state a provider reported.
    pub async fn set_state(&self, id: &SandboxId, state: SandboxState) -> Result<(), StoreError> {
        self.backend
            .set_state(id.to_string(), state_name(state).to_string())
            .await
    }

    /// Records what the provider now knows the sandbox by (a stopped local sandbox started
    /// again has a new first process) and its state.
    pub async fn set_meta(
        &self,
        id: &SandboxId,
        meta: &serde_json::Value,
        state: SandboxState,
    ) -> Result<(), StoreError> {
        let sealed = self.key.seal(
            &seal_context(id.as_str(), "meta"),
            &serde_json::to_string(meta)?,
        );
        self.backend
            .set_meta(id.to_string(), sealed, state_name(state).to_string())
            .await
    }

    /// Sets a new TTL, running out at `expires_ms`; `false` (nothing changed) when the reaper
    /// is deleting the sandbox already.
    pub async fn set_ttl(
        &self,
        id: &SandboxId,
        ttl: Duration,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        self.backend
            .set_ttl(id.to_string(), millis(ttl), expires_ms)
            .await
    }

    /// Stores an API token by its hash (replacing the grant of a token with the same hash).
    pub async fn insert_token(
        &self,
        hash: String,
        token: TokenRecord,
        created_ms: i64,
    ) -> Result<(), StoreError> {
        self.backend.insert_token(hash, token, created_ms).await
    }

    /// What the token with this hash grants, if it exists. The index finds the row; the hash
    /// is then compared in constant time, so no timing depends on how much of it matched.
    pub async fn token(&self, hash: String) -> Result<Option<TokenRecord>, StoreError> {
        let found = self.backend.token(hash.clone()).await?;
        Ok(found.and_then(|(stored, record)| {
            bool::from(stored.as_bytes().ct_eq(hash.as_bytes())).then_some(record)
        }))
    }

    /// Records that `node` is alive and reached at `address`.
    pub async fn heartbeat(&self, node: &NodeId, address: &str) -> Result<(), StoreError> {
        self.backend
            .heartbeat(node.clone(), address.to_string())
            .await
    }

    /// Records that `node` stopped, so its peers stop counting it alive at once.
    pub async fn leave(&self, node: &NodeId) -> Result<(), StoreError> {
        self.backend.leave(node.clone()).await
    }

    /// Every relay that ever used the database; alive when heard from within `alive`.
    pub async fn nodes(&self, alive: Duration) -> Result<Vec<NodeRow>, StoreError> {
        self.backend.nodes(millis(alive)).await
    }

    /// Takes or renews lease `name` for `holder`; `None` while another relay holds it.
    pub async fn acquire_lease(
        &self,
        name: &str,
        holder: &NodeId,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        self.backend
            .acquire_lease(name.to_string(), holder.clone(), millis(ttl))
            .await
    }

    /// Lets go of a lease, so another relay may take it at once.
    pub async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        self.backend.release_lease(lease.clone()).await
    }

    /// Claims sandbox `id` for deletion under `lease` if it is still `due` and the lease still
    /// has `margin` left; whether it did. Only the claim's holder may then journal its delete
    /// ([`Store::remove_journaled`]).
    pub async fn claim(
        &self,
        id: &SandboxId,
        lease: &Lease,
        margin: Duration,
        due: Due,
    ) -> Result<bool, StoreError> {
        self.backend
            .claim(id.to_string(), lease.clone(), millis(margin), due)
            .await
    }

    /// Waits for the lock on `key` across every relay of the database (get-or-create by
    /// labels); it is held until the returned guard drops.
    pub async fn lock_labels(&self, key: &str) -> Result<LabelLock, StoreError> {
        self.backend.lock_labels(key.to_string()).await
    }

    async fn select(&self, select: Select) -> Result<Vec<SandboxRecord>, StoreError> {
        let rows = self.backend.select(select).await?;
        rows.into_iter().map(|row| self.open_row(row)).collect()
    }

    /// The row of `sandbox`, its secret columns sealed.
    fn seal_row(&self, sandbox: &SandboxRecord) -> Result<SandboxRow, StoreError> {
        let id = sandbox.id.as_str();
        let seal = |column: &str, value: &str| self.key.seal(&seal_context(id, column), value);
        Ok(SandboxRow {
            id: id.to_string(),
            tenant: sandbox.tenant.to_string(),
            provider: sandbox.provider.clone(),
            provider_ref: sandbox.provider_ref.clone(),
            labels: serde_json::to_string(&sandbox.labels)?,
            spec: seal("spec", &serde_json::to_string(&sandbox.spec)?),
            agent_token: seal("agent_token", &sandbox.agent_token),
            meta: seal("meta", &serde_json::to_string(&sandbox.meta)?),
            created_ms: sandbox.created_ms,
            last_active_ms: sandbox.last_active_ms,
            ttl_ms: sandbox.ttl.map(millis),
            expires_ms: sandbox.expires_ms,
            idle_timeout_ms: sandbox.idle_timeout.map(millis),
            state: state_name(sandbox.state).to_string(),
            node: sandbox.node.as_ref().map(|n| n.to_string()),
        })
    }

    /// The sandbox of `row`, its secret columns opened.
    fn open_row(&self, row: SandboxRow) -> Result<SandboxRecord, StoreError> {
        let open =
            |column: &str, sealed: &str| self.key.open(&seal_context(&row.id, column), sealed);
        let spec = open("spec", &row.spec)?;
        let agent_token = open("agent_token", &row.agent_token)?;
        let meta = open("meta", &row.meta)?;
        let state = parse_state(&row.state).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "sandbox {} has the unknown state {:?}",
                row.id, row.state
            ))
        })?;
        Ok(SandboxRecord {
            tenant: Tenant::from_stored(row.tenant),
            provider: row.provider,
            provider_ref: row.provider_ref,
            labels: serde_json::from_str(&row.labels)?,
            spec: serde_json::from_str(&spec)?,
            agent_token,
            meta: serde_json::from_str(&meta)?,
            created_ms: row.created_ms,
            last_active_ms: row.last_active_ms,
            ttl: row.ttl_ms.map(from_millis),
            expires_ms: row.expires_ms,
            idle_timeout: row.idle_timeout_ms.map(from_millis),
            state,
            node: row.node.map(NodeId::from_stored),
            id: SandboxId::from(row.id),
        })
    }
}

/// The value of the [`KEY_CHECK`] setting a relay with `key` would store.
fn key_check(key: &SealKey) -> String {
    key.seal(&format!("settings/{KEY_CHECK}"), KEY_CHECK_TEXT)
}

/// Whether `stored`, the database's [`KEY_CHECK`], was sealed under `key`.
fn verify_key_check(
    key: &SealKey,
    stored: &str,
    kind: &'static str,
    key_file: &Path,
) -> Result<(), StoreError> {
    match key.open(&format!("settings/{KEY_CHECK}"), stored) {
        Ok(text) if text == KEY_CHECK_TEXT => Ok(()),
        _ => Err(StoreError::WrongKey {
            kind,
            key_file: key_file.to_path_buf(),
            hint: "restore the key file that belongs with this database (every relay sharing \
                   a PostgreSQL database needs the same one)",
        }),
    }
}

/// What a sealed value is bound to: its sandbox and column, so it opens nowhere else.
fn seal_context(id: &str, column: &str) -> String {
    format!("{id}/{column}")
}

fn from_millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Now by this host's clock, in milliseconds since the Unix epoch.
pub fn wall_clock_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

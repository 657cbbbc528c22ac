//! The store's test suite, run against both backends: every test written once as
//! `async fn name(db: Db)` and listed in [`both!`], which makes `name::sqlite` (a file in a
//! temporary directory) and `name::postgres` (a fresh database on a private PostgreSQL
//! server the tests start, see `tests/src/postgres.rs`). Tests of one backend's own matters
//! (SQLite's file, its upgrades; PostgreSQL's migrations history) stand alone.

mod cluster;
mod journals;
mod sandboxes;
mod secrets;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::*;
use tether_relay_core::provider::{NetworkPolicy, SandboxSpec};

#[path = "../../../../tests/src/postgres.rs"]
#[allow(
    unreachable_pub,
    dead_code,
    reason = "shared with the end-to-end tests, which use all of it publicly"
)]
mod pg_server;

pub(super) use pg_server::PgServer;

/// Makes `$name::sqlite` and `$name::postgres` tests of each `async fn $name(db: Db)`.
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Db::sqlite()).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Db::postgres().await).await
            }
        }
    )*};
}
pub(super) use both;

/// Where a test's store lives, and raw access to it, as an operator (or an attacker with
/// the database but not the key) would have.
pub(super) struct Db {
    /// The store under test.
    pub reg: Store,
    /// The key file (beside the SQLite file; alone for PostgreSQL).
    pub key_file: PathBuf,
    place: Place,
    _dir: tempfile::TempDir,
}

enum Place {
    Sqlite(PathBuf),
    Postgres { url: String, db: String },
}

impl Db {
    /// A store in a new SQLite file.
    pub(super) fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db");
        Db {
            reg: Store::open(&path).unwrap(),
            key_file: dir.path().join(KEY_FILE),
            place: Place::Sqlite(path),
            _dir: dir,
        }
    }

    /// A store in a new database on the shared PostgreSQL server.
    pub(super) async fn postgres() -> Db {
        let url = tokio::task::spawn_blocking(|| PgServer::shared().fresh_database())
            .await
            .unwrap();
        let db = url.rsplit('/').next().unwrap().to_string();
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join(KEY_FILE);
        Db {
            reg: Store::open_postgres(&url, &key_file).await.unwrap(),
            key_file,
            place: Place::Postgres { url, db },
            _dir: dir,
        }
    }

    /// Which backend, for messages.
    pub(super) fn kind(&self) -> &'static str {
        self.reg.kind()
    }

    /// Another store on the same database and key, as another relay (or a restarted one)
    /// opens it.
    pub(super) async fn open_again(&self) -> Result<Store, StoreError> {
        self.open_with_key(&self.key_file).await
    }

    /// A store on the same database with the key in `key_file`.
    pub(super) async fn open_with_key(
        &self,
        key_file: &std::path::Path,
    ) -> Result<Store, StoreError> {
        match &self.place {
            Place::Sqlite(path) => {
                // The key file sits beside the SQLite file: put the wanted one there.
                let beside = path.with_file_name(KEY_FILE);
                if key_file != beside {
                    std::fs::copy(key_file, &beside).unwrap();
                }
                let path = path.clone();
                tokio::task::spawn_blocking(move || Store::open(&path))
                    .await
                    .unwrap()
            }
            Place::Postgres { url, .. } => Store::open_postgres(url, key_file).await,
        }
    }

    /// Runs `sql` on the database behind the store's back.
    pub(super) async fn exec(&self, sql: &str) {
        let sql = sql.to_string();
        match &self.place {
            Place::Sqlite(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || {
                    rusqlite::Connection::open(path)
                        .unwrap()
                        .execute_batch(&sql)
                        .unwrap()
                })
                .await
                .unwrap();
            }
            Place::Postgres { db, .. } => {
                let db = db.clone();
                tokio::task::spawn_blocking(move || PgServer::shared().psql(&db, &sql))
                    .await
                    .unwrap();
            }
        }
    }

    /// The one integer `sql` selects, read behind the store's back.
    pub(super) async fn count(&self, sql: &str) -> i64 {
        let sql = sql.to_string();
        match &self.place {
            Place::Sqlite(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || {
                    rusqlite::Connection::open(path)
                        .unwrap()
                        .query_row(&sql, [], |r| r.get(0))
                        .unwrap()
                })
                .await
                .unwrap()
            }
            Place::Postgres { db, .. } => {
                let db = db.clone();
                let out = tokio::task::spawn_blocking(move || PgServer::shared().psql(&db, &sql))
                    .await
                    .unwrap();
                out.parse().unwrap_or_else(|e| panic!("{e}: {out:?}"))
            }
        }
    }

    /// Every byte of the database as stored (SQLite: the file and its log; PostgreSQL: a
    /// dump of every table), to look for a value in plain text.
    pub(super) async fn raw_bytes(&self) -> Vec<u8> {
        match &self.place {
            Place::Sqlite(path) => {
                let mut bytes = std::fs::read(path).unwrap();
                bytes.extend(std::fs::read(path.with_extension("db-wal")).unwrap_or_default());
                bytes
            }
            Place::Postgres { db, .. } => {
                let db = db.clone();
                let sql = "SELECT string_agg(t::text, E'\\n') FROM (\
                           SELECT row_to_json(s)::text AS t FROM sandboxes s UNION ALL \
                           SELECT row_to_json(x)::text FROM secrets x UNION ALL \
                           SELECT row_to_json(b)::text FROM sandbox_secrets b UNION ALL \
                           SELECT row_to_json(e)::text FROM egress_ca e UNION ALL \
                           SELECT row_to_json(d)::text FROM destroyed d) all_rows";
                tokio::task::spawn_blocking(move || PgServer::shared().psql(&db, sql))
                    .await
                    .unwrap()
                    .into_bytes()
            }
        }
    }

    /// The PostgreSQL URL, for tests of that backend alone.
    pub(super) fn url(&self) -> Option<&str> {
        match &self.place {
            Place::Postgres { url, .. } => Some(url),
            Place::Sqlite(_) => None,
        }
    }
}

/// Whether `needle` appears in `haystack`.
pub(super) fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

pub(super) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn tenant(name: &str) -> Tenant {
    Tenant::parse(name).unwrap()
}

pub(super) fn node(name: &str) -> NodeId {
    NodeId::parse(name).unwrap()
}

/// A sandbox of `tenant` created at `created_ms` with labels `pairs`, every field set.
pub(super) fn record(tenant_name: &str, created_ms: i64, pairs: &[(&str, &str)]) -> SandboxRecord {
    let spec = SandboxSpec {
        image: Some("/images/base".into()),
        labels: labels(pairs),
        env: labels(&[("LANG", "C.UTF-8")]),
        ttl: Some(Duration::from_secs(60)),
        idle_timeout: Some(Duration::from_millis(1500)),
        cpus: Some(0.5),
        memory_bytes: Some(256 << 20),
        pids: None,
        disk_bytes: Some(1 << 30),
        network: NetworkPolicy::Host,
        seccomp_unconfined: false,
        ..SandboxSpec::default()
    };
    let id = SandboxId::generate();
    SandboxRecord {
        provider_ref: id.to_string(),
        id,
        tenant: tenant(tenant_name),
        provider: "local".into(),
        labels: spec.labels.clone(),
        spec,
        agent_token: "ab".repeat(32),
        meta: serde_json::json!({"pid": 42, "socket": "/run/x.sock"}),
        created_ms,
        last_active_ms: created_ms,
        ttl: Some(Duration::from_secs(60)),
        expires_ms: Some(created_ms + 60_000),
        idle_timeout: Some(Duration::from_millis(1500)),
        state: SandboxState::Running,
        node: Some(node("node-a")),
    }
}

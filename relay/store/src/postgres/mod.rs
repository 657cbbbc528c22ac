//! The PostgreSQL backend: one database shared by any number of relays, each a replica of the
//! others (`tether serve --database postgres://...`).
//!
//! Connections come from a pool (deadpool); TLS is rustls with the webpki and the system's
//! roots, used when the server offers it (`sslmode=prefer`, the default) or demanded
//! (`sslmode=require`). The schema is `migrations/` (refinery, history in
//! `tether_schema_history`), applied under an advisory lock so relays starting together
//! migrate once. Times that relays compare with each other (heartbeats, leases) are the
//! database's clock, so skew between relays' hosts does not move them. One file per concern:
//! `sandboxes` (and tokens), `journals`, `secrets`, `cluster`.

mod cluster;
mod journals;
mod sandboxes;
mod secrets;

use std::fmt::Display;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::Row;
use tokio_rustls::rustls;

use super::backend::{Backend, SandboxRow};
use super::locks::KeyedLocks;
use super::{StoreError, KEY_CHECK};

mod embedded {
    refinery::embed_migrations!("src/postgres/migrations");
}

/// Connections one relay keeps to the database at most.
const POOL_SIZE: usize = 16;
/// How long opening one connection may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a call waits for a free connection of the pool before failing.
const WAIT_TIMEOUT: Duration = Duration::from_secs(30);
/// The advisory lock relays take while migrating, so only one migrates at a time.
const MIGRATION_LOCK: i64 = 0x7465_7468_6572_0001; // "tether" and 1
/// Where refinery records the migrations it applied.
const HISTORY_TABLE: &str = "tether_schema_history";
/// Now by the database's clock, in milliseconds since the Unix epoch, as SQL.
pub(super) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The columns of a sandbox row, in the order [`read_sandbox`] reads them.
const SANDBOX_COLUMNS: &str = "id, tenant, provider, provider_ref, labels, spec, agent_token, \
     meta, created_ms, last_active_ms, ttl_ms, expires_ms, idle_timeout_ms, state, node";

/// The store in a PostgreSQL database.
pub(super) struct PostgresBackend {
    pool: Pool,
    /// Get-or-create's per-label locks within this relay, taken before the database's, so
    /// one relay's waiters hold no connection.
    label_locks: Arc<KeyedLocks>,
    /// `PostgreSQL at HOST:PORT, database DB` (never the password), for messages.
    location: String,
}

impl PostgresBackend {
    /// Connects to `url` and brings the schema up to date.
    pub(super) async fn connect(url: &str) -> Result<PostgresBackend, StoreError> {
        let config = tokio_postgres::Config::from_str(url).map_err(|e| StoreError::Connect {
            target: "the --database URL".into(),
            reason: format!("{e}; it must look like postgres://USER:PASSWORD@HOST:PORT/DATABASE"),
        })?;
        let target = describe(&config);
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(client_tls());
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(WAIT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Connect {
                target: target.clone(),
                reason: e.to_string(),
            })?;
        let backend = PostgresBackend {
            pool,
            label_locks: Arc::default(),
            location: target.clone(),
        };
        let client = backend.pool.get().await.map_err(|e| StoreError::Connect {
            target: target.clone(),
            reason: e.to_string(),
        })?;
        migrate(client).await?;
        Ok(backend)
    }

    /// A connection from the pool.
    pub(super) async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(pg)
    }

    /// Whether some relay has recorded its key check already.
    pub(super) async fn has_key_check(&self) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM settings WHERE name = $1)",
                &[&KEY_CHECK],
            )
            .await
            .map_err(pg)?;
        Ok(row.get(0))
    }
}

impl Backend for PostgresBackend {
    fn kind(&self) -> &'static str {
        "PostgreSQL"
    }

    fn location(&self) -> String {
        self.location.clone()
    }
}

/// Applies the migrations this build has and the database lacks, one relay at a time.
async fn migrate(mut client: Object) -> Result<(), StoreError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg)?;
    let conn: &mut tokio_postgres::Client = &mut client;
    let mut runner = embedded::migrations::runner();
    runner.set_migration_table_name(HISTORY_TABLE);
    let outcome = runner
        .set_abort_divergent(true)
        .set_abort_missing(true)
        .run_async(conn)
        .await;
    // Unlocked whatever happened; a connection that fails here closes, which unlocks too.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    if unlocked.is_err() {
        drop(Object::take(client));
    }
    outcome.map_err(|e| match e.kind() {
        refinery::error::Kind::MissingVersion(m) => StoreError::Postgres(format!(
            "the database has migration {m}, which this tether does not know: a newer tether \
             migrated it; run that version on every relay"
        )),
        _ => StoreError::Postgres(format!("cannot migrate the database: {e}")),
    })?;
    Ok(())
}

/// `host:port/database` of a connection config, never its password.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or("(the user's)");
    format!("PostgreSQL at {host}:{port}, database {db}")
}

/// Whom the relay trusts when the database speaks TLS: the webpki roots and the system's.
fn client_tls() -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    // A system store that cannot be read leaves the webpki roots, which is what most
    // hosted PostgreSQL services need.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// A failed PostgreSQL call, as a store error.
pub(super) fn pg(e: impl Display) -> StoreError {
    StoreError::Postgres(e.to_string())
}

/// Reads a row of [`SANDBOX_COLUMNS`].
fn read_sandbox(row: &Row) -> Result<SandboxRow, StoreError> {
    Ok(SandboxRow {
        id: row.try_get(0).map_err(pg)?,
        tenant: row.try_get(1).map_err(pg)?,
        provider: row.try_get(2).map_err(pg)?,
        provider_ref: row.try_get(3).map_err(pg)?,
        labels: row.try_get(4).map_err(pg)?,
        spec: row.try_get(5).map_err(pg)?,
        agent_token: row.try_get(6).map_err(pg)?,
        meta: row.try_get(7).map_err(pg)?,
        created_ms: row.try_get(8).map_err(pg)?,
        last_active_ms: row.try_get(9).map_err(pg)?,
        ttl_ms: row.try_get(10).map_err(pg)?,
        expires_ms: row.try_get(11).map_err(pg)?,
        idle_timeout_ms: row.try_get(12).map_err(pg)?,
        state: row.try_get(13).map_err(pg)?,
        node: row.try_get(14).map_err(pg)?,
    })
}

/// The lock id of `text` under `space`: the first 8 bytes of its SHA-256.
pub(super) fn lock_id(space: &str, text: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(space.as_bytes())
        .chain_update([0])
        .chain_update(text.as_bytes())
        .finalize();
    let mut first = [0; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

//! The store's SQLite schema and its migrations, tracked by `PRAGMA user_version`.

use rusqlite::Connection;

use crate::StoreError;

/// One SQL batch per schema version: `MIGRATIONS[n]` takes version `n` to `n + 1`. Append new
/// steps; never edit a released one, since databases in the field have already run it.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: sandboxes and API tokens.
    "CREATE TABLE sandboxes (
        id              TEXT PRIMARY KEY,
        tenant          TEXT NOT NULL,
        provider        TEXT NOT NULL,
        provider_ref    TEXT NOT NULL,
        labels          TEXT NOT NULL,  -- JSON object, keys sorted: equal maps, equal text
        spec            TEXT NOT NULL,  -- JSON SandboxSpec
        agent_token     TEXT NOT NULL,
        meta            TEXT NOT NULL,  -- JSON, the provider's
        created_ms      INTEGER NOT NULL,
        last_active_ms  INTEGER NOT NULL,
        ttl_ms          INTEGER,
        expires_ms      INTEGER,
        idle_timeout_ms INTEGER,
        state           TEXT NOT NULL
     ) STRICT;
     CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant, labels);
     CREATE TABLE tokens (
        hash       TEXT PRIMARY KEY,    -- SHA-256 of the token, lowercase hex
        tenant     TEXT NOT NULL,
        admin      INTEGER NOT NULL,
        created_ms INTEGER NOT NULL
     ) STRICT;",
    // 2: the relay's own admin token is marked apart from tenants' admin tokens; agent
    // tokens are sealed (by `Store::open`, which holds the key, not by SQL).
    "ALTER TABLE tokens ADD COLUMN relay_admin INTEGER NOT NULL DEFAULT 0;",
    // 3: the journal of sandboxes the relay destroyed on its own (TTL, idle, gone).
    "CREATE TABLE destroyed (
        seq          INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms        INTEGER NOT NULL,
        sandbox_id   TEXT NOT NULL,
        tenant       TEXT NOT NULL,
        provider     TEXT NOT NULL,
        provider_ref TEXT NOT NULL,
        labels       TEXT NOT NULL,  -- JSON object
        reason       TEXT NOT NULL,  -- ttl | idle | gone
        evidence     TEXT NOT NULL   -- what the relay saw, in words
     ) STRICT;
     CREATE INDEX destroyed_by_sandbox ON destroyed (tenant, sandbox_id);",
    // 4: tenants' named secrets, and the secrets bound to each sandbox (values sealed under
    // the relay's key); a sandbox's bound secrets go with its row, whichever path deletes it.
    "CREATE TABLE secrets (
        tenant     TEXT NOT NULL,
        name       TEXT NOT NULL,
        value      TEXT NOT NULL,    -- sealed; context: the tenant and the name
        created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL,
        PRIMARY KEY (tenant, name)
     ) STRICT;
     CREATE TABLE sandbox_secrets (
        sandbox_id  TEXT NOT NULL,
        name        TEXT NOT NULL,
        placeholder TEXT NOT NULL,
        value       TEXT NOT NULL,   -- sealed; context: the sandbox and the name
        hosts       TEXT NOT NULL,   -- JSON array of host patterns
        PRIMARY KEY (sandbox_id, name)
     ) STRICT;
     CREATE TRIGGER sandbox_secrets_go_with_their_sandbox AFTER DELETE ON sandboxes
     BEGIN
        DELETE FROM sandbox_secrets WHERE sandbox_id = OLD.id;
     END;",
    // 5: the CA of each sandbox with secrets (the egress proxy signs its interception
    // certificates with it); the key sealed under the relay's key, gone with the sandbox's row.
    "CREATE TABLE egress_ca (
        sandbox_id TEXT PRIMARY KEY,
        cert_pem   TEXT NOT NULL,
        key_pem    TEXT NOT NULL    -- sealed; context: the sandbox
     ) STRICT;
     CREATE TRIGGER egress_ca_goes_with_its_sandbox AFTER DELETE ON sandboxes
     BEGIN
        DELETE FROM egress_ca WHERE sandbox_id = OLD.id;
     END;",
    // 6: the create journal: a row per create in progress, written before the provider makes
    // anything and deleted in the transaction that registers the sandbox, so a row left at
    // start is a create a crash interrupted (see `create_journal`). Distinct from the
    // destroy journal (`destroyed`), which is an append-only history.
    "CREATE TABLE create_journal (
        sandbox_id   TEXT PRIMARY KEY,
        tenant       TEXT NOT NULL,
        provider     TEXT NOT NULL,
        provider_ref TEXT,            -- the provider's id once it answered, else NULL
        labels       TEXT NOT NULL,   -- JSON object
        started_ms   INTEGER NOT NULL
     ) STRICT;",
    // 7: what relays sharing a database need (the PostgreSQL schema has the same): the relay
    // that made each sandbox and each journaled create (a sandbox on a relay's own host is
    // reached through that relay), the relays and their heartbeats, leases (the reaper runs
    // on one relay at a time), the claim of the reaper deleting a sandbox (which fences a
    // reaper that lost its lease), and settings all relays must agree on (the key check).
    "ALTER TABLE sandboxes ADD COLUMN node TEXT;
     ALTER TABLE sandboxes ADD COLUMN reaping TEXT;
     ALTER TABLE create_journal ADD COLUMN node TEXT;
     CREATE TABLE nodes (
        id           TEXT PRIMARY KEY,
        address      TEXT NOT NULL,
        heartbeat_ms INTEGER NOT NULL
     ) STRICT;
     CREATE TABLE leases (
        name       TEXT PRIMARY KEY,
        holder     TEXT NOT NULL,
        epoch      INTEGER NOT NULL,
        expires_ms INTEGER NOT NULL
     ) STRICT;
     CREATE TABLE settings (
        name  TEXT PRIMARY KEY,
        value TEXT NOT NULL
     ) STRICT;",
];

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Brings `db` up to [`SCHEMA_VERSION`], each step in its own transaction.
pub(super) fn migrate(db: &mut Connection) -> Result<(), StoreError> {
    let found: u32 = db.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            found,
            known: SCHEMA_VERSION,
        });
    }
    for (version, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = db.transaction()?;
        tx.execute_batch(sql)?;
        // PRAGMA takes no bound parameters; the value is our own integer.
        tx.execute_batch(&format!("PRAGMA user_version = {}", version + 1))?;
        tx.commit()?;
    }
    Ok(())
}

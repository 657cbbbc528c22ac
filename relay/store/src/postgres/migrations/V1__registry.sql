-- The registry in PostgreSQL: the same tables, columns and rules as the SQLite schema at its
-- version 7 (relay/src/store/sqlite/schema.rs), which the same store tests check. Times are
-- milliseconds since the Unix epoch; sealed columns hold text sealed under the relays' key.
-- Append new migrations as new files; never edit one that was released.

CREATE TABLE sandboxes (
    id              TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL,
    provider        TEXT NOT NULL,
    provider_ref    TEXT NOT NULL,
    labels          TEXT NOT NULL,   -- JSON object, keys sorted: equal maps, equal text
    spec            TEXT NOT NULL,   -- sealed JSON SandboxSpec
    agent_token     TEXT NOT NULL,   -- sealed
    meta            TEXT NOT NULL,   -- sealed JSON, the provider's
    created_ms      BIGINT NOT NULL,
    last_active_ms  BIGINT NOT NULL,
    ttl_ms          BIGINT,
    expires_ms      BIGINT,
    idle_timeout_ms BIGINT,
    state           TEXT NOT NULL,
    node            TEXT,            -- the relay that made it (and owns it, on its host)
    reaping         TEXT             -- the claim of the reaper deleting it
);
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant, labels);

CREATE TABLE tokens (
    hash        TEXT PRIMARY KEY,    -- SHA-256 of the token, lowercase hex
    tenant      TEXT NOT NULL,
    admin       BOOLEAN NOT NULL,
    relay_admin BOOLEAN NOT NULL DEFAULT FALSE,
    created_ms  BIGINT NOT NULL
);

-- The destroy journal: sandboxes the relays deleted on their own (TTL, idle, gone).
CREATE TABLE destroyed (
    seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at_ms        BIGINT NOT NULL,
    sandbox_id   TEXT NOT NULL,
    tenant       TEXT NOT NULL,
    provider     TEXT NOT NULL,
    provider_ref TEXT NOT NULL,
    labels       TEXT NOT NULL,
    reason       TEXT NOT NULL,      -- ttl | idle | gone
    evidence     TEXT NOT NULL
);
CREATE INDEX destroyed_by_sandbox ON destroyed (tenant, sandbox_id);

CREATE TABLE secrets (
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,        -- sealed; context: the tenant and the name
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, name)
);

CREATE TABLE sandbox_secrets (
    sandbox_id  TEXT NOT NULL,
    name        TEXT NOT NULL,
    placeholder TEXT NOT NULL,
    value       TEXT NOT NULL,       -- sealed; context: the sandbox and the name
    hosts       TEXT NOT NULL,       -- JSON array of host patterns
    seq         BIGINT GENERATED ALWAYS AS IDENTITY,  -- the order they were bound in
    PRIMARY KEY (sandbox_id, name)
);

CREATE TABLE egress_ca (
    sandbox_id TEXT PRIMARY KEY,
    cert_pem   TEXT NOT NULL,
    key_pem    TEXT NOT NULL         -- sealed; context: the sandbox
);

-- A sandbox's bound secrets and CA go with its row, whichever path deletes it.
CREATE FUNCTION tether_forget_sandbox_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM sandbox_secrets WHERE sandbox_id = OLD.id;
    DELETE FROM egress_ca WHERE sandbox_id = OLD.id;
    RETURN OLD;
END
$$;
CREATE TRIGGER sandbox_rows_go_with_their_sandbox AFTER DELETE ON sandboxes
    FOR EACH ROW EXECUTE FUNCTION tether_forget_sandbox_rows();

-- The create journal: a row per create in progress, by the relay running it.
CREATE TABLE create_journal (
    sandbox_id   TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    provider     TEXT NOT NULL,
    provider_ref TEXT,
    labels       TEXT NOT NULL,
    started_ms   BIGINT NOT NULL,
    node         TEXT
);

-- The relays sharing the database, where their peers reach them, and when each last said it
-- was alive (the database's clock).
CREATE TABLE nodes (
    id           TEXT PRIMARY KEY,
    address      TEXT NOT NULL,
    heartbeat_ms BIGINT NOT NULL
);

-- Leases: what one relay at a time does (the reaper). `epoch` grows on every change of hands.
CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    epoch      BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL
);

-- Settings every relay must agree on (the key check).
CREATE TABLE settings (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

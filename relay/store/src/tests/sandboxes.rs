//! Sandboxes and tokens: round trips, listings, get-or-create's exact match, tenants, the
//! reaper's query, reopening; and each backend's own upgrades and version checks.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{both, labels, record, tenant, Db, PgServer};
use crate::sqlite::schema::{self, SCHEMA_VERSION};
use crate::*;
use tether_relay_core::provider::SandboxState;

both!(
    round_trips_every_field,
    filters_by_labels_and_matches_exactly_for_get_or_create,
    tenants_see_only_their_own,
    finds_sandboxes_due_for_reaping,
    tokens_are_found_by_hash,
    survives_reopening,
    a_database_sealed_under_another_key_is_refused,
);

async fn round_trips_every_field(db: Db) {
    let reg = db.reg;
    let sb = record("a", 1_000, &[("app", "web")]);
    reg.insert(sb.clone()).await.unwrap();
    assert_eq!(
        reg.get(&tenant("a"), &sb.id).await.unwrap(),
        Some(sb.clone())
    );

    reg.set_state(&sb.id, SandboxState::Stopped).await.unwrap();
    reg.set_ttl(&sb.id, Duration::from_secs(5), 9_000)
        .await
        .unwrap();
    reg.touch(vec![sb.id.clone()], 2_000).await.unwrap();
    // Activity never moves backwards.
    reg.touch(vec![sb.id.clone()], 1_500).await.unwrap();
    let got = reg.get(&tenant("a"), &sb.id).await.unwrap().unwrap();
    assert_eq!(got.state, SandboxState::Stopped);
    assert_eq!(
        (got.ttl, got.expires_ms),
        (Some(Duration::from_secs(5)), Some(9_000))
    );
    assert_eq!(got.last_active_ms, 2_000);

    // A started sandbox's new metadata replaces the old, sealed as at insert.
    let meta = serde_json::json!({"process": {"pid": 7, "start_time": 9}});
    reg.set_meta(&sb.id, &meta, SandboxState::Running)
        .await
        .unwrap();
    let got = reg.get(&tenant("a"), &sb.id).await.unwrap().unwrap();
    assert_eq!((got.meta, got.state), (meta, SandboxState::Running));

    assert!(reg.remove(&sb.id).await.unwrap());
    assert!(!reg.remove(&sb.id).await.unwrap());
    assert_eq!(reg.get(&tenant("a"), &sb.id).await.unwrap(), None);
}

async fn filters_by_labels_and_matches_exactly_for_get_or_create(db: Db) {
    let reg = db.reg;
    let web = record("a", 1, &[("app", "web"), ("env", "dev")]);
    let web_only = record("a", 2, &[("app", "web")]);
    let db = record("a", 3, &[("app", "db")]);
    for sb in [&web, &web_only, &db] {
        reg.insert(sb.clone()).await.unwrap();
    }
    let ids = |v: Vec<SandboxRecord>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    let a = tenant("a");

    let all = reg.list(&a, &BTreeMap::new()).await.unwrap();
    assert_eq!(
        ids(all),
        vec![web.id.clone(), web_only.id.clone(), db.id.clone()]
    );
    let app_web = reg.list(&a, &labels(&[("app", "web")])).await.unwrap();
    assert_eq!(ids(app_web), vec![web.id.clone(), web_only.id.clone()]);
    let both = reg
        .list(&a, &labels(&[("app", "web"), ("env", "dev")]))
        .await
        .unwrap();
    assert_eq!(ids(both), vec![web.id.clone()]);
    assert!(reg
        .list(&a, &labels(&[("app", "x")]))
        .await
        .unwrap()
        .is_empty());

    // Exact: {app: web} does not match the sandbox that also has env=dev.
    let found = reg
        .find_by_labels(&a, &labels(&[("app", "web")]))
        .await
        .unwrap();
    assert_eq!(found.map(|s| s.id), Some(web_only.id.clone()));
    let found = reg
        .find_by_labels(&a, &labels(&[("env", "dev"), ("app", "web")]))
        .await;
    assert_eq!(found.unwrap().map(|s| s.id), Some(web.id.clone()));
    assert_eq!(
        reg.find_by_labels(&a, &labels(&[("env", "dev")]))
            .await
            .unwrap(),
        None
    );
    // A sandbox known to be gone, or whose agent died, is not handed out again.
    for state in [SandboxState::Gone, SandboxState::Dead] {
        reg.set_state(&web_only.id, state).await.unwrap();
        assert_eq!(
            reg.find_by_labels(&a, &labels(&[("app", "web")]))
                .await
                .unwrap(),
            None,
            "{state:?}"
        );
    }
    // A dead sandbox is kept and shown as such, for its owner to remove.
    let kept = reg.get(&a, &web_only.id).await.unwrap().unwrap();
    assert_eq!(state_name(kept.state), "dead");
}

async fn tenants_see_only_their_own(db: Db) {
    let reg = db.reg;
    let mine = record("a", 1, &[("k", "v")]);
    let theirs = record("b", 2, &[("k", "v")]);
    reg.insert(mine.clone()).await.unwrap();
    reg.insert(theirs.clone()).await.unwrap();
    let (a, b) = (tenant("a"), tenant("b"));

    assert_eq!(reg.get(&a, &theirs.id).await.unwrap(), None);
    assert_eq!(reg.get(&b, &theirs.id).await.unwrap(), Some(theirs.clone()));
    let listed = reg.list(&a, &BTreeMap::new()).await.unwrap();
    assert_eq!(listed, vec![mine.clone()]);
    let found = reg
        .find_by_labels(&b, &labels(&[("k", "v")]))
        .await
        .unwrap();
    assert_eq!(found.map(|s| s.id), Some(theirs.id.clone()));
    assert_eq!(reg.all().await.unwrap().len(), 2);
}

async fn finds_sandboxes_due_for_reaping(db: Db) {
    let reg = db.reg;
    let mut ttl_only = record("a", 0, &[]);
    (ttl_only.idle_timeout, ttl_only.expires_ms) = (None, Some(10_000));
    let mut idle_only = record("a", 0, &[]);
    (idle_only.ttl, idle_only.expires_ms) = (None, None);
    idle_only.idle_timeout = Some(Duration::from_secs(5));
    let mut forever = record("a", 0, &[]);
    (forever.ttl, forever.expires_ms, forever.idle_timeout) = (None, None, None);
    for sb in [&ttl_only, &idle_only, &forever] {
        reg.insert(sb.clone()).await.unwrap();
    }

    let due = |now| {
        let reg = reg.clone();
        async move {
            let mut ids: Vec<_> = reg
                .due(now)
                .await
                .unwrap()
                .into_iter()
                .map(|s| s.id)
                .collect();
            ids.sort();
            ids
        }
    };
    assert!(due(4_999).await.is_empty());
    assert_eq!(due(5_000).await, vec![idle_only.id.clone()]);
    assert!(idle_only.idle(5_000) && !idle_only.expired(5_000));
    reg.touch(vec![idle_only.id.clone()], 6_000).await.unwrap();
    assert!(due(10_999).await == vec![ttl_only.id.clone()]);
    assert!(ttl_only.expired(10_000) && !ttl_only.idle(i64::MAX));
    assert_eq!(due(11_000).await.len(), 2);
    reg.set_state(&forever.id, SandboxState::Gone)
        .await
        .unwrap();
    assert_eq!(due(0).await, vec![forever.id.clone()]);
}

async fn tokens_are_found_by_hash(db: Db) {
    let reg = db.reg;
    let rec = TokenRecord {
        tenant: tenant("team-a"),
        role: Role::Member,
    };
    reg.insert_token("h1".into(), rec.clone(), 1).await.unwrap();
    assert_eq!(reg.token("h1".into()).await.unwrap(), Some(rec));
    assert_eq!(reg.token("h2".into()).await.unwrap(), None);
}

async fn survives_reopening(db: Db) {
    let sb = record("a", 7, &[("app", "web")]);
    db.reg.insert(sb.clone()).await.unwrap();
    let admin = TokenRecord {
        tenant: Tenant::default_tenant(),
        role: Role::RelayAdmin,
    };
    db.reg.insert_token("h".into(), admin, 7).await.unwrap();
    let reg = db.open_again().await.unwrap();
    assert_eq!(reg.get(&tenant("a"), &sb.id).await.unwrap(), Some(sb));
    assert_eq!(
        reg.token("h".into()).await.unwrap().unwrap().role,
        Role::RelayAdmin
    );
}

async fn a_database_sealed_under_another_key_is_refused(db: Db) {
    db.reg.insert(record("a", 1, &[])).await.unwrap();
    let other = tempfile::tempdir().unwrap();
    let other_key = other.path().join(KEY_FILE);
    // A key of its own, as a relay given the wrong file (or none) would make.
    drop(Store::open(&other.path().join("relay.db")).unwrap());
    let err = db
        .open_with_key(&other_key)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("sealed under another key"),
        "{}: {err}",
        db.kind()
    );
}

#[test]
fn the_sqlite_file_is_private() {
    let db = Db::sqlite();
    use std::os::unix::fs::PermissionsExt;
    let path = db.key_file.with_file_name("relay.db");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the database holds agent tokens");
}

#[tokio::test]
async fn postgres_refuses_a_database_a_newer_tether_migrated() {
    let db = Db::postgres().await;
    db.exec(
        "INSERT INTO tether_schema_history (version, name, applied_on, checksum) \
         VALUES (999, 'from_the_future', '2030-01-01T00:00:00Z', '1')",
    )
    .await;
    let err = db.open_again().await.err().unwrap().to_string();
    assert!(err.contains("a newer tether migrated it"), "{err}");
}

#[tokio::test]
async fn postgres_joins_a_database_only_with_its_key() {
    let db = Db::postgres().await;
    // Relays starting together on an empty database migrate it once.
    let url = PgServer::shared().fresh_database();
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("relay.key");
    let first = Store::open_postgres(&url, &key).await.unwrap();
    let together =
        futures_util::future::join_all((0..3).map(|_| Store::open_postgres(&url, &key))).await;
    assert!(together.iter().all(Result::is_ok));
    drop(first);
    // A relay without the key file may not join: it would seal under a key nobody else has.
    let missing = keys.path().join("absent.key");
    let err = Store::open_postgres(db.url().unwrap(), &missing)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("copy their key file"), "{err}");
    assert!(!missing.exists(), "no stray key file is left behind");
    // A bad URL names the problem, and a dead server too, without a password.
    let err = Store::open_postgres("mysql://x", &key).await.err().unwrap();
    assert!(
        err.to_string().contains("postgres://USER:PASSWORD@HOST"),
        "{err}"
    );
    let err = Store::open_postgres("postgres://u:hunter2@127.0.0.1:1/db", &key)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("cannot reach the relay database") && !err.contains("hunter2"),
        "{err}"
    );
}

#[test]
fn refuses_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.db");
    let db = rusqlite::Connection::open(&path).unwrap();
    db.execute_batch(&format!("PRAGMA user_version = {}", SCHEMA_VERSION + 1))
        .unwrap();
    drop(db);
    let err = Store::open(&path).err().unwrap().to_string();
    assert!(err.contains("newer tether"), "{err}");
}

#[test]
fn ids_and_tenants() {
    let id = SandboxId::generate();
    assert!(
        id.as_str().starts_with("sb-") && id.as_str().len() == 15,
        "{id}"
    );
    assert_ne!(id, SandboxId::generate());
    assert!(Tenant::parse("team_a.prod-1").is_ok());
    for bad in ["", "a b", "ä", "x/y", &"a".repeat(65)] {
        assert!(Tenant::parse(bad).is_err(), "{bad:?}");
    }
}

#[tokio::test]
async fn a_version_1_database_keeps_working_with_its_agent_tokens_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.db");
    let plain = "feedface".repeat(8);
    {
        let db = rusqlite::Connection::open(&path).unwrap();
        db.execute_batch(schema::MIGRATIONS[0]).unwrap();
        db.execute_batch("PRAGMA user_version = 1").unwrap();
        db.execute(
            "INSERT INTO sandboxes VALUES ('sb-old', 'a', 'local', 'sb-old', '{}', ?2, ?1, \
             ?3, 1, 1, NULL, NULL, NULL, 'running')",
            [
                plain.as_str(),
                r#"{"env": {"API_KEY": "spec-secret-value"}}"#,
                r#"{"envd_access_token": "meta-secret-value"}"#,
            ],
        )
        .unwrap();
        db.execute("INSERT INTO tokens VALUES ('h', 'team-a', 1, 1)", [])
            .unwrap();
    }
    let reg = Store::open(&path).unwrap();
    let old = reg
        .get(&tenant("a"), &"sb-old".to_string().into())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.agent_token, plain, "the running agent's token is kept");
    assert_eq!(old.spec.env["API_KEY"], "spec-secret-value");
    assert_eq!(old.meta["envd_access_token"], "meta-secret-value");
    let grant = reg.token("h".into()).await.unwrap().unwrap();
    assert_eq!(
        grant.role,
        Role::Admin,
        "an old admin token is its tenant's admin"
    );
    drop(reg);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend(std::fs::read(dir.path().join("relay.db-wal")).unwrap_or_default());
    for secret in [plain.as_str(), "spec-secret-value", "meta-secret-value"] {
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "relay.db still holds {secret} in plain text"
        );
    }

    // Without its key, the database refuses to open rather than lose every sandbox.
    std::fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
    let err = Store::open(&path).err().unwrap().to_string();
    assert!(err.contains("restore the relay.key"), "{err}");
}

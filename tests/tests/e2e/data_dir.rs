//! A data directory and the store its sandboxes are registered in, attacked as an operator's
//! slip would: the relay started again on a used data directory with a fresh SQLite file, or
//! with PostgreSQL after SQLite (and back). It must refuse to start, naming both stores, and
//! lose nothing: not the sandboxes' files, not the admin token. Moved to the new store on
//! purpose (the old one lost for good), it keeps the sandboxes it does not know, says so in
//! its log, lists them for its admin (`tether ls --orphans`) and removes one only when asked.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tether_e2e::postgres::PgServer;
use tether_e2e::{bin, require, wait_within, Relay};

/// How long a relay may take to refuse to start, or to start.
const START_LIMIT: Duration = Duration::from_secs(60);

/// `tether serve` on `data_dir` with `extra` arguments, its stderr collected.
fn serve(data_dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(bin("tether"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .env("TETHER_AGENT_BIN", bin("tether-agent"))
        .env("TETHER_LOG", "warn")
        .stdin(Stdio::null());
    cmd
}

/// Runs a `tether serve` that must refuse to start; its stderr. Fails the test (killing it)
/// if it runs instead.
fn refused(data_dir: &Path, extra: &[&str]) -> String {
    let mut child = serve(data_dir, extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_within(
        &mut child,
        START_LIMIT,
        "the relay started on a data directory of another store: it",
    );
    let mut said = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert!(!status.success(), "{said}");
    said
}

/// A relay started by hand on an existing data directory, its log kept in a file.
struct Started {
    child: Child,
    url: String,
    log: PathBuf,
    _log_dir: tempfile::TempDir,
}

impl Started {
    /// Starts `tether serve EXTRA` on `data_dir`; returns once it listens.
    fn on(data_dir: &Path, extra: &[&str]) -> Started {
        let log_dir = tempfile::tempdir().unwrap();
        let log = log_dir.path().join("relay.log");
        let mut child = serve(data_dir, extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("listening ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let Ok(url) = rx.recv_timeout(START_LIMIT) else {
            let _ = child.kill();
            panic!(
                "the relay did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        Started {
            child,
            url,
            log,
            _log_dir: log_dir,
        }
    }

    /// `tether ARGS` against it as its admin, `token`; stdout, failing the test if it fails.
    fn tether(&self, token: &str, args: &[&str]) -> String {
        let out = Command::new(bin("tether"))
            .env("TETHER_RELAY", &self.url)
            .env("TETHER_TOKEN", token)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tether {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The admin token file's bytes and inode: unchanged means neither rewritten nor replaced.
fn admin_token(data_dir: &Path) -> (Vec<u8>, u64) {
    use std::os::unix::fs::MetadataExt;
    let path = data_dir.join("admin.token");
    (
        std::fs::read(&path).unwrap(),
        std::fs::metadata(&path).unwrap().ino(),
    )
}

/// A local sandbox's directory under `data_dir`.
fn sandbox_dir(data_dir: &Path, id: &str) -> PathBuf {
    data_dir.join("local").join(id)
}

/// A relay on `data_dir` (its store: SQLite) with one running sandbox holding a file; the
/// relay is stopped (the sandbox keeps running) and the sandbox's id returned.
fn used(data_dir: &Path) -> String {
    let mut relay = Relay::start_on(data_dir);
    let id = relay.create(&[]);
    let out = relay.sh(&id, "echo kept > /workspace/kept");
    assert!(out.status.success(), "{out:?}");
    relay.stop();
    id
}

#[test]
fn a_fresh_sqlite_file_on_a_used_data_dir_is_refused_and_nothing_is_lost() {
    require::root("local sandboxes");
    let data = tempfile::tempdir().unwrap();
    let dir = data.path();
    let id = used(dir);
    let token = admin_token(dir);
    // The operator's slip: the database file is gone (deleted, or another path), and the
    // relay is started again on the same directory.
    for file in ["relay.db", "relay.db-wal", "relay.db-shm"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    let said = refused(dir, &[]);
    let bound = std::fs::read_to_string(dir.join("store.id")).unwrap();
    let bound = bound.lines().next().unwrap();
    for named in [
        dir.display().to_string(),
        bound.to_string(),
        format!("SQLite at {}", dir.join("relay.db").display()),
        "a new database".into(),
        "--database".into(),
        "--data-dir".into(),
    ] {
        assert!(said.contains(&named), "{named:?} not in: {said}");
    }
    assert!(sandbox_dir(dir, &id).join("disk.img").exists(), "{said}");
    assert_eq!(admin_token(dir), token, "the admin token file changed");

    // The old database is lost for good, and the operator moves the directory to the new
    // one as the message says: the sandbox is kept, logged by id and path, and listed.
    std::fs::rename(dir.join("store.id"), dir.join("store.id.old")).unwrap();
    let relay = Started::on(dir, &[]);
    assert_eq!(admin_token(dir), token, "the admin token file changed");
    let admin = String::from_utf8(token.0.clone()).unwrap();
    let admin = admin.trim();
    assert!(sandbox_dir(dir, &id).join("disk.img").exists());
    let log = std::fs::read_to_string(&relay.log).unwrap();
    let canonical = std::fs::canonicalize(dir).unwrap();
    assert!(
        log.lines().any(|l| l.contains(&id)
            && (l.contains(&sandbox_dir(dir, &id).display().to_string())
                || l.contains(&sandbox_dir(&canonical, &id).display().to_string()))
            && l.contains(&format!("tether rm {id}"))),
        "no line names {id}, its directory and how to remove it: {log}"
    );
    let orphans: serde_json::Value =
        serde_json::from_str(&relay.tether(admin, &["ls", "--orphans", "--json"])).unwrap();
    let listed: Vec<(&str, &str)> = orphans
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["id"].as_str().unwrap(), o["provider"].as_str().unwrap()))
        .collect();
    assert_eq!(listed, [(id.as_str(), "local")], "{orphans}");
    // Kept until the admin removes it; then nothing of it is left.
    relay.tether(admin, &["rm", &id]);
    assert!(!sandbox_dir(dir, &id).exists());
    assert_eq!(
        relay.tether(admin, &["ls", "--orphans", "--quiet"]).trim(),
        ""
    );
}

#[test]
fn a_data_dir_refuses_a_store_it_does_not_belong_to_naming_both() {
    require::root("local sandboxes");
    let pg = PgServer::start();
    let url = pg.fresh_database();
    let db = url.rsplit('/').next().unwrap().to_string();

    // Used with SQLite, started with PostgreSQL: refused before the database learns anything
    // of the directory (its admin token is no token there).
    let data = tempfile::tempdir().unwrap();
    let dir = data.path();
    let id = used(dir);
    let token = admin_token(dir);
    let said = refused(dir, &["--database", &url]);
    let bound = std::fs::read_to_string(dir.join("store.id")).unwrap();
    let bound = bound.lines().next().unwrap().to_string();
    for named in [
        bound.clone(),
        format!("SQLite at {}", dir.join("relay.db").display()),
        format!("PostgreSQL at 127.0.0.1:{}, database {db}", pg.port),
        "--database".into(),
        "--data-dir".into(),
    ] {
        assert!(said.contains(&named), "{named:?} not in: {said}");
    }
    assert!(!said.contains("postgres://"), "the URL was shown: {said}");
    assert_eq!(pg.psql(&db, "SELECT count(*) FROM tokens"), "0");
    // Nor sealed under the directory's key: the database's own relays start on it later.
    assert_eq!(pg.psql(&db, "SELECT count(*) FROM settings"), "0");
    assert!(sandbox_dir(dir, &id).join("disk.img").exists());
    assert_eq!(admin_token(dir), token, "the admin token file changed");
    // Its own store still takes it, with its sandbox.
    let relay = Relay::start_on(dir);
    let out = relay.sh(&id, "cat /workspace/kept");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n", "{out:?}");
    drop(relay);

    // Used with PostgreSQL, started without --database (a fresh SQLite file): refused.
    let replica = tempfile::tempdir().unwrap();
    drop(Started::on(replica.path(), &["--database", &url]));
    let token = admin_token(replica.path());
    let said = refused(replica.path(), &[]);
    for named in [
        format!("PostgreSQL at 127.0.0.1:{}, database {db}", pg.port),
        "a new database".into(),
    ] {
        assert!(said.contains(&named), "{named:?} not in: {said}");
    }
    assert_eq!(admin_token(replica.path()), token);
}

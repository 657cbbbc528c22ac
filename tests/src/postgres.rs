//! A private PostgreSQL server for tests: Debian's `postgresql` binaries, a fresh data
//! directory and socket directory of its own under the temporary directory, listening on a
//! free loopback port, trusting connections from loopback (it holds nothing but test data).
//! It is never the system's service.
//!
//! The server runs under a small shell that holds it on a leash: the shell reads its stdin,
//! a pipe this process keeps open, and when that pipe closes (the [`PgServer`] dropped, or
//! this process gone, however it ended) it stops the server and removes its directory. So no
//! server outlives its test run, and a shared one ([`PgServer::shared`]) needs no `Drop`.
//!
//! Shared by the relay's store tests (included there with `#[path]`) and the end-to-end tests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The role the tests connect as (the data directory's superuser).
const USER: &str = "tether";
/// The unprivileged account the server runs as when the tests run as root (PostgreSQL
/// refuses to run as root); Debian's package creates it.
const ACCOUNT: &str = "postgres";

/// A running private PostgreSQL server.
pub struct PgServer {
    /// Its loopback port.
    pub port: u16,
    /// The directory holding its data and socket; removed when the server stops.
    pub dir: PathBuf,
    bin: PathBuf,
    leash: Option<ChildStdin>,
    child: Child,
}

impl PgServer {
    /// Starts a server of its own, stopped (and its directory removed) on drop.
    #[track_caller]
    pub fn start() -> PgServer {
        let bin = bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("tether-pg-")
            .tempdir()
            .expect("a temporary directory for PostgreSQL")
            .keep();
        let account = run_as();
        if let Some((uid, gid)) = account {
            nix::unistd::chown(&dir, Some(uid), Some(gid)).expect("chown the PostgreSQL dir");
        }
        let data = dir.join("data");
        let mut initdb = as_account(&bin.join("initdb"), account);
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null());
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let setpriv = match account {
            Some((uid, gid)) => format!("setpriv --reuid={uid} --regid={gid} --clear-groups "),
            None => String::new(),
        };
        // Durability is off: a test's data need not survive a power loss, and fsyncs would
        // only slow every test on a shared disk.
        let server = format!(
            "{setpriv}{postgres} -D {data} -p {port} -k {dir} -c listen_addresses=127.0.0.1 \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
             -c max_connections=300",
            postgres = bin.join("postgres").display(),
            data = data.display(),
            dir = dir.display()
        );
        // The leash: the server in the background, stopped (fast shutdown) when stdin closes.
        let script = format!(
            "{server} >{log} 2>&1 & pg=$!\n\
             cat >/dev/null\n\
             kill -INT $pg 2>/dev/null; wait $pg\n\
             rm -rf {dir}\n",
            log = dir.join("server.log").display(),
            dir = dir.display(),
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the PostgreSQL leash");
        let leash = child.stdin.take();
        let server = PgServer {
            port,
            dir,
            bin,
            leash,
            child,
        };
        server.wait_ready();
        server
    }

    /// A server shared by every test of this process, started on first use and stopped when
    /// the process exits. Give each test a database of its own ([`PgServer::fresh_database`]).
    pub fn shared() -> &'static PgServer {
        static SHARED: OnceLock<PgServer> = OnceLock::new();
        SHARED.get_or_init(PgServer::start)
    }

    /// The URL of database `db` on it.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates a new, empty database with a unique name; returns its URL.
    #[track_caller]
    pub fn fresh_database(&self) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let out = Command::new(self.bin.join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                USER,
                &name,
            ])
            .output()
            .expect("run createdb");
        assert!(
            out.status.success(),
            "createdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.url(&name)
    }

    /// Runs `sql` in database `db` with `psql`; returns what it printed (tuples only,
    /// unaligned), failing the test if it fails.
    #[track_caller]
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .args(["-d", db, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql failed on {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    #[track_caller]
    fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                panic!("PostgreSQL did not start within {READY_TIMEOUT:?}; its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        drop(self.leash.take());
        let _ = self.child.wait();
    }
}

/// Debian's PostgreSQL binaries, newest version first; fails the test naming the package.
#[track_caller]
fn bin_dir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("postgres").is_file())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(Path::file_name)
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    match dirs.pop() {
        Some(dir) => dir,
        None => panic!(
            "PostgreSQL's server binaries (/usr/lib/postgresql/*/bin/initdb) not found: run \
             ./test (or apt-get install postgresql)"
        ),
    }
}

/// The account to run the server as: [`ACCOUNT`] when the tests run as root, else none.
#[track_caller]
fn run_as() -> Option<(nix::unistd::Uid, nix::unistd::Gid)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    match nix::unistd::User::from_name(ACCOUNT) {
        Ok(Some(user)) => Some((user.uid, user.gid)),
        _ => panic!(
            "no `{ACCOUNT}` account to run PostgreSQL as (it refuses to run as root): run \
             ./test (or apt-get install postgresql, which creates it)"
        ),
    }
}

/// A command running `program` as `account` (through `setpriv`, which execs it directly).
fn as_account(program: &Path, account: Option<(nix::unistd::Uid, nix::unistd::Gid)>) -> Command {
    match account {
        Some((uid, gid)) => {
            let mut cmd = Command::new("setpriv");
            cmd.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .arg("--clear-groups")
                .arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// A loopback port nothing listens on right now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("its address").port()
}

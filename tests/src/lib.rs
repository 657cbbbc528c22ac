//! Support for the end-to-end tests: start the real `tether-agent` and `tether` binaries on
//! ephemeral ports, wait for their readiness line, and stop them on drop.
//!
//! The binaries are found next to the test executable's `deps/` directory (cargo builds them
//! for `cargo test --workspace`), or at `TETHER_AGENT_BIN` / `TETHER_BIN`.
#![allow(
    clippy::unwrap_used,
    reason = "test support code; a panic fails the calling test"
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tether_client::{RelayClient, Session};

pub mod cloud;
pub mod images;
pub mod liar;
pub mod postgres;
pub mod require;
pub mod signals;

/// How long a binary may take to print its readiness line.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The path of a workspace binary built alongside the tests.
pub fn bin(name: &str) -> PathBuf {
    let var = match name {
        "tether-agent" => "TETHER_AGENT_BIN",
        _ => "TETHER_BIN",
    };
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} not found: run ./test (or cargo build --workspace), which builds it",
        path.display()
    );
    path
}

/// Waits for `child` to exit, at most `limit`; panics naming `what` (after killing and reaping
/// it) if it does not. The one bounded wait of the suite's spawned processes.
pub fn wait_within(
    child: &mut std::process::Child,
    limit: Duration,
    what: &str,
) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("poll a child process") {
            return status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A random hex token.
pub fn token() -> String {
    use rand::Rng;
    let bytes: [u8; 16] = rand::thread_rng().gen();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Spawns `cmd`, whose program may have just been written: while another test's child is
/// between fork and exec it still holds the writer's descriptor, and exec fails with
/// ETXTBSY until it lets go (milliseconds). Retried for up to 5 s; anything else panics.
fn spawn_fresh(cmd: &mut Command) -> Child {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match cmd.spawn() {
            Ok(child) => return child,
            Err(e)
                if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32)
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("cannot start {cmd:?}: {e}"),
        }
    }
}

/// Spawns `cmd` and waits for a stdout line starting with `prefix`; returns the child and
/// the rest of that line. Further stdout is drained in the background.
fn spawn_ready(mut cmd: Command, prefix: &str) -> (Child, String) {
    cmd.stdout(Stdio::piped()).stdin(Stdio::null());
    let mut child = spawn_fresh(&mut cmd);
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let want = prefix.to_string();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if !sent {
                if let Some(rest) = line.strip_prefix(&want) {
                    let _ = tx.send(rest.trim().to_string());
                    sent = true;
                }
            }
        }
    });
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(rest) => (child, rest),
        Err(_) => {
            let _ = child.kill();
            panic!("{cmd:?} did not print `{prefix}` within {READY_TIMEOUT:?}");
        }
    }
}

/// A real agent serving on an ephemeral loopback port.
pub struct Agent {
    child: Child,
    /// `ws://127.0.0.1:PORT`.
    pub url: String,
    /// Its token.
    pub token: String,
    /// Its working directory (a fresh temporary directory).
    pub dir: tempfile::TempDir,
}

impl Agent {
    /// Starts an agent with default settings.
    pub fn start() -> Agent {
        Agent::start_with(&[])
    }

    /// Starts an agent with extra `serve` arguments.
    pub fn start_with(extra: &[&str]) -> Agent {
        Agent::start_custom(extra, |_| {})
    }

    /// Starts an agent with extra `serve` arguments and `setup` applied to its command (an
    /// environment, a `pre_exec` hook).
    pub fn start_custom(extra: &[&str], setup: impl FnOnce(&mut Command)) -> Agent {
        let dir = tempfile::tempdir().expect("temp dir");
        let token = token();
        let mut cmd = Command::new(bin("tether-agent"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--workdir"])
            .arg(dir.path())
            .args(extra)
            .env("TETHER_AGENT_TOKEN", &token)
            .env(
                "TETHER_LOG",
                std::env::var("TETHER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .current_dir(dir.path());
        setup(&mut cmd);
        let (child, url) = spawn_ready(cmd, "listening ");
        Agent {
            child,
            url,
            token,
            dir,
        }
    }

    /// The agent's pid on this host.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The agent's resident memory in bytes (VmRSS).
    pub fn rss_bytes(&self) -> u64 {
        rss_of(self.pid())
    }

    /// A new protocol session.
    pub async fn session(&self) -> Session {
        Session::connect(&self.url, Some(&self.token))
            .await
            .expect("connect to agent")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VmRSS of a process, in bytes.
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// A real relay (`tether serve`) on an ephemeral port with its own data directory.
pub struct Relay {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT` (`https://` when it serves TLS).
    pub url: String,
    /// The admin token it wrote.
    pub admin_token: String,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// The `tether serve` arguments it was started with beyond address and data directory.
    extra: Vec<String>,
    /// The CA certificate its clients trust (`TETHER_CA_CERT`), for a relay serving TLS.
    ca_cert: Option<PathBuf>,
    _owned_dir: Option<tempfile::TempDir>,
}

impl Relay {
    /// Starts a relay on a fresh data directory.
    pub fn start() -> Relay {
        let dir = tempfile::tempdir().expect("temp dir");
        let data_dir = dir.path().to_path_buf();
        let mut relay = Relay::start_on(&data_dir);
        relay._owned_dir = Some(dir);
        relay
    }

    /// Starts a relay on a fresh data directory from `program` (a `tether` binary), with
    /// `setup` applied to its command (its stderr, a `pre_exec` hook).
    pub fn start_custom(program: &Path, setup: impl FnOnce(&mut Command)) -> Relay {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut relay = Relay::start_from(program, dir.path(), &[], setup);
        relay._owned_dir = Some(dir);
        relay
    }

    /// Starts a relay on a fresh data directory with more `tether serve` arguments (a
    /// policy file, image roots).
    pub fn start_with(extra: &[&str]) -> Relay {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut relay = Relay::start_from(&bin("tether"), dir.path(), extra, |_| {});
        relay._owned_dir = Some(dir);
        relay
    }

    /// Starts a relay on a fresh data directory serving HTTPS and WSS with `cert` and `key`
    /// (PEM files); its [`Relay::tether`] commands trust `ca` (`TETHER_CA_CERT`).
    pub fn start_tls(cert: &Path, key: &Path, ca: &Path) -> Relay {
        let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
        let mut relay = Relay::start_with(&["--tls-cert", cert, "--tls-key", key]);
        relay.ca_cert = Some(ca.to_path_buf());
        relay
    }

    /// This relay, with its [`Relay::tether`] commands trusting `ca` (`TETHER_CA_CERT`): for
    /// a relay started with TLS files among other arguments.
    pub fn trusting(mut self, ca: &Path) -> Relay {
        self.ca_cert = Some(ca.to_path_buf());
        self
    }

    /// The relay's pid on this host.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the relay runs").id()
    }

    /// Starts a relay on `data_dir`, an existing directory the caller keeps (on a file system
    /// of the test's own, say).
    pub fn start_on(data_dir: &Path) -> Relay {
        Relay::start_from(&bin("tether"), data_dir, &[], |_| {})
    }

    fn start_from(
        program: &Path,
        data_dir: &Path,
        extra: &[&str],
        setup: impl FnOnce(&mut Command),
    ) -> Relay {
        let mut cmd = Command::new(program);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .env("TETHER_AGENT_BIN", bin("tether-agent"))
            .env(
                "TETHER_LOG",
                std::env::var("TETHER_LOG").unwrap_or_else(|_| "warn".into()),
            );
        setup(&mut cmd);
        let (child, url) = spawn_ready(cmd, "listening ");
        let admin_token = std::fs::read_to_string(data_dir.join("admin.token"))
            .expect("relay wrote admin.token")
            .trim()
            .to_string();
        Relay {
            child: Some(child),
            url,
            admin_token,
            data_dir: data_dir.to_path_buf(),
            extra: extra.iter().map(|a| a.to_string()).collect(),
            ca_cert: None,
            _owned_dir: None,
        }
    }

    /// Starts a relay on a fresh data directory under a file descriptor limit of `nofile`,
    /// soft and hard alike, so the relay cannot raise it.
    pub fn start_with_nofile(nofile: u64) -> Relay {
        Relay::start_custom(&bin("tether"), |cmd| {
            signals::limit_descriptors(cmd, nofile)
        })
    }

    /// Stops the relay and starts a new one on the same data directory and the same address,
    /// as an operator's restart does: clients find it again at the same URL.
    pub fn restart(&mut self) {
        self.stop();
        let listen = self
            .url
            .split_once("://")
            .map_or(self.url.as_str(), |(_, addr)| addr)
            .to_string();
        let mut cmd = Command::new(bin("tether"));
        cmd.args(["serve", "--listen", &listen, "--data-dir"])
            .arg(&self.data_dir)
            .args(&self.extra)
            .env("TETHER_AGENT_BIN", bin("tether-agent"))
            .env(
                "TETHER_LOG",
                std::env::var("TETHER_LOG").unwrap_or_else(|_| "warn".into()),
            );
        let (child, url) = spawn_ready(cmd, "listening ");
        assert_eq!(url, self.url, "the restarted relay listens elsewhere");
        self.child = Some(child);
    }

    /// Kills the relay with SIGKILL, as a crash does: nothing of it runs its shutdown. A
    /// [`Relay::restart`] then starts a new one on the same data directory.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the relay process (sandboxes keep running) and returns its data directory's
    /// ownership so a new relay can start on it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix_kill(child.id(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `tether create EXTRA...` as the admin; the new sandbox's id. Panics with the CLI's
    /// error if the create fails.
    pub fn create(&self, extra: &[&str]) -> String {
        let out = self.tether().arg("create").args(extra).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// `tether ARGS` as the admin; its stdout. Panics with its stderr if it fails.
    pub fn tether_ok(&self, args: &[&str]) -> String {
        let out = self.tether().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "tether {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    }

    /// `tether ARGS` as the admin, its stdout parsed as JSON.
    pub fn tether_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.tether_ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("tether {args:?}: {e}: {out}"))
    }

    /// `tether exec ID -- sh -c SCRIPT` as the admin, whatever its outcome.
    pub fn sh(&self, id: &str, script: &str) -> std::process::Output {
        self.tether()
            .args(["exec", id, "--", "sh", "-c", script])
            .output()
            .unwrap()
    }

    /// A client with the admin token (of a plain HTTP relay: an in-process client cannot be
    /// given [`Relay::start_tls`]'s CA, which is read from the environment).
    pub fn client(&self) -> RelayClient {
        RelayClient::new(&self.url, Some(self.admin_token.clone())).expect("relay client")
    }

    /// A `tether` command pointed at this relay with the admin token.
    pub fn tether(&self) -> Command {
        let mut cmd = Command::new(bin("tether"));
        cmd.env("TETHER_RELAY", &self.url)
            .env("TETHER_TOKEN", &self.admin_token)
            .env("TETHER_AGENT_BIN", bin("tether-agent"));
        if let Some(ca) = &self.ca_cert {
            cmd.env("TETHER_CA_CERT", ca);
        }
        cmd
    }
}

impl Relay {
    /// The tenants that still have sandboxes, from the relay's registry. On a thread of its
    /// own, since the registry is async and a test may drop its relay inside a runtime.
    fn tenants_with_sandboxes(&self) -> Vec<String> {
        let db = self.data_dir.join("relay.db");
        std::thread::spawn(move || {
            let registry = tether_store::Store::open(&db).ok()?;
            let rt = tokio::runtime::Runtime::new().ok()?;
            let records = rt.block_on(registry.all()).ok()?;
            let mut tenants: Vec<String> = records
                .iter()
                .map(|r| r.tenant.as_str().to_string())
                .collect();
            tenants.sort();
            tenants.dedup();
            Some(tenants)
        })
        .join()
        .ok()
        .flatten()
        .unwrap_or_default()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Delete what the test left behind, then stop the relay. The admin's `rm --all` sees
        // its own tenant's sandboxes only; those of other tenants go with a token of theirs.
        if self.child.is_some() {
            let _ = self.tether().args(["rm", "--all"]).output();
            for tenant in self.tenants_with_sandboxes() {
                let minted = self
                    .tether()
                    .args(["token", "create", "--tenant", &tenant])
                    .output();
                if let Some(out) = minted.ok().filter(|o| o.status.success()) {
                    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
                    let _ = self
                        .tether()
                        .env("TETHER_TOKEN", token)
                        .args(["rm", "--all"])
                        .output();
                }
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A tmpfs of a given size mounted on a fresh directory, for tests of a full disk; unmounted
/// (lazily, should a loop device still hold a file on it) when dropped. Needs root.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as mount(8) takes it: `4m`) on a fresh directory.
    #[track_caller]
    pub fn mount(size: &str) -> Tmpfs {
        require::root("mounting a tmpfs");
        let dir = tempfile::tempdir().expect("temp dir");
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tether-e2e-full",
            ])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount a tmpfs on {}",
            dir.path().display()
        );
        Tmpfs { dir }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills it with a file named `name`, written until the disk refuses (ENOSPC).
    pub fn fill(&self, name: &str) -> PathBuf {
        self.fill_leaving(name, 0)
    }

    /// Fills it with a file named `name` until about `leave` bytes are free (4 KiB pages).
    pub fn fill_leaving(&self, name: &str, leave: u64) -> PathBuf {
        use std::io::Write;
        let path = self.path().join(name);
        let mut file = std::fs::File::create(&path).expect("create the filler");
        let stat = nix::sys::statvfs::statvfs(self.path()).expect("statvfs");
        let free = stat.blocks_available() * stat.fragment_size();
        let mut left = free.saturating_sub(leave);
        let chunk = vec![0x5a_u8; 64 << 10];
        while left > 0 {
            let n = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            match file.write(&chunk[..n]) {
                Ok(0) => break,
                Ok(n) => left -= n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("fill {}: {e}", path.display()),
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn nix_kill(pid: u32, sig: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
}

/// Polls `check` until it returns `Some`, or panics after `timeout` with `what`.
pub async fn eventually<T>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SHA-256 of `data`, hex.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

//! What the bench measures against: a relay (the one the caller named, or a private
//! `tether serve` started for the run) and a sandbox on it (the caller's, or a fresh one
//! deleted afterwards).
//!
//! A private relay is its own process, not one embedded in the bench: its memory is then its
//! own to measure, and it does not share a CPU-bound runtime with the client it serves.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::memory;
use tether_client::api::CreateRequest;
use tether_client::RelayClient;

/// How long a private relay may take to print its `listening` line.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a private relay may take to shut down after SIGTERM (it waits up to 10 s for
/// tunnels) before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Deleted by the relay's reaper if the bench dies without deleting it: 1 hour.
const SANDBOX_TTL: Duration = Duration::from_secs(3600);
/// The most cores the bench's sandbox asks for: the relay's built-in policy maximum. A relay
/// fills in one core for a sandbox that names none, which would measure that quota instead
/// of Tether's data path (the producer and the agent share the sandbox's cores).
const MAX_CPUS: f64 = 8.0;
/// The label marking the bench's sandboxes.
pub(super) const LABEL: (&str, &str) = ("purpose", "tether-bench");

/// A relay's address and the token to present.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    /// `http://host:port`.
    pub url: String,
    /// The API token, if the relay wants one.
    pub token: Option<String>,
}

/// Where the relay comes from.
#[derive(Clone, Debug)]
pub(crate) enum RelayChoice {
    /// One that is already running.
    At(Endpoint),
    /// A private `tether serve` for the run, on a free loopback port with a data directory
    /// that is removed afterwards.
    Private,
}

/// The relay the bench talks to.
pub(super) struct Relay {
    /// How to reach it.
    pub endpoint: Endpoint,
    /// Its REST client.
    pub rest: RelayClient,
    /// Its process, when it runs on this machine (so its memory can be read).
    pub pid: Option<u32>,
    private: Option<Private>,
}

struct Private {
    child: Child,
    /// Holds the data directory and the relay's log; removed on drop.
    dir: tempfile::TempDir,
}

impl Relay {
    /// Connects to, or starts, the relay `choice` names. `tether` is the `tether` binary.
    pub(super) async fn start(choice: RelayChoice, tether: &Path) -> anyhow::Result<Relay> {
        let (endpoint, pid, private) = match choice {
            RelayChoice::At(endpoint) => {
                let pid = memory::loopback_listener(&endpoint.url);
                (endpoint, pid, None)
            }
            RelayChoice::Private => {
                let (endpoint, private) = Private::start(tether).await?;
                (endpoint, private.child.id(), Some(private))
            }
        };
        let rest = RelayClient::new(&endpoint.url, endpoint.token.clone())?;
        Ok(Relay {
            endpoint,
            rest,
            pid,
            private,
        })
    }

    /// Whether the bench started this relay.
    pub(super) fn is_private(&self) -> bool {
        self.private.is_some()
    }

    /// The data directory of a relay the bench started.
    pub(super) fn data_dir(&self) -> Option<PathBuf> {
        self.private.as_ref().map(|p| p.dir.path().join("data"))
    }

    /// Stops a private relay (SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]) and removes its
    /// data directory. A relay the caller named is left alone.
    pub(super) async fn stop(self) {
        let Some(mut private) = self.private else {
            return;
        };
        if let Some(pid) = private.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        if tokio::time::timeout(STOP_TIMEOUT, private.child.wait())
            .await
            .is_err()
        {
            let _ = private.child.kill().await;
        }
        drop(private.dir);
    }
}

impl Private {
    async fn start(tether: &Path) -> anyhow::Result<(Endpoint, Private)> {
        let dir = tempfile::Builder::new()
            .prefix("tether-bench-")
            .tempdir()
            .context("cannot create a directory for the private relay")?;
        let data = dir.path().join("data");
        let log = dir.path().join("relay.log");
        let mut child = Command::new(tether)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            // Its own process group: a Ctrl-C at the terminal reaches the bench, which then
            // deletes its sandboxes through the relay before stopping it.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {} serve", tether.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(READY_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.strip_prefix("listening ") {
                    return Ok::<_, std::io::Error>(Some(url.trim().to_string()));
                }
            }
            Ok(None)
        })
        .await;
        let url = match ready {
            Ok(Ok(Some(url))) => url,
            _ => anyhow::bail!(
                "the private relay did not start: {}",
                last_lines(&log).unwrap_or_default()
            ),
        };
        // Keep draining stdout so the relay never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let token = std::fs::read_to_string(data.join("admin.token"))
            .context("the private relay wrote no admin token")?
            .trim()
            .to_string();
        Ok((
            Endpoint {
                url,
                token: Some(token),
            },
            Private { child, dir },
        ))
    }
}

fn last_lines(path: &PathBuf) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    Some(lines[lines.len().saturating_sub(5)..].join(" / "))
}

/// A sandbox the bench measures.
pub(super) struct Sandbox {
    /// Its id.
    pub id: String,
    /// The bench created it and deletes it.
    owned: bool,
}

impl Sandbox {
    /// The sandbox `id`, or a fresh one (with no limits beyond the provider's defaults).
    pub(super) async fn get_or_create(
        rest: &RelayClient,
        id: Option<String>,
    ) -> anyhow::Result<Sandbox> {
        match id {
            Some(id) => {
                rest.get(&id)
                    .await
                    .with_context(|| format!("cannot find sandbox {id}"))?;
                Ok(Sandbox { id, owned: false })
            }
            None => {
                let info = rest
                    .create(&request())
                    .await
                    .context("cannot create a sandbox to measure")?;
                Ok(Sandbox {
                    id: info.id,
                    owned: true,
                })
            }
        }
    }

    /// Deletes the sandbox if the bench created it.
    pub(super) async fn release(self, rest: &RelayClient) -> anyhow::Result<()> {
        if self.owned {
            rest.delete(&self.id)
                .await
                .with_context(|| format!("cannot delete sandbox {}", self.id))?;
        }
        Ok(())
    }
}

/// The memory limit of the bench's sandbox: the 1 GiB transfer file stays in its page cache
/// (under a relay's default limit it would not, and every download would read it back
/// through the sandbox's disk), with room to spare for the idle sessions.
const MEMORY_BYTES: u64 = 3 << 30;

/// The request for a sandbox the bench creates.
pub(super) fn request() -> CreateRequest {
    let mut req = CreateRequest::default();
    req.spec
        .labels
        .insert(LABEL.0.to_string(), LABEL.1.to_string());
    req.spec.ttl = Some(SANDBOX_TTL);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    req.spec.cpus = Some((cores as f64).min(MAX_CPUS));
    req.spec.memory_bytes = Some(MEMORY_BYTES);
    req
}

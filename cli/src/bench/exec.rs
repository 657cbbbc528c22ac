//! Exec figures: `true` over a warm connection (what a library caller pays per command), and
//! `tether exec ID -- true` as a whole new process (what a script calling the CLI pays:
//! process start, the tunnel's WebSocket handshake, the exec, the exit).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context;
use tether_proto::op::ExecSpec;

use super::stats::Latency;
use super::target::Endpoint;
use tether_client::Session;

/// Round trips done before timing starts.
const WARMUP: usize = 5;

/// Runs `true` `n` times on `session`, each to its exit.
pub(super) async fn warm(session: &Session, n: usize) -> anyhow::Result<Latency> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + WARMUP {
        let start = Instant::now();
        let out = session
            .exec(ExecSpec::argv(["true"]))
            .await?
            .output()
            .await?;
        let took = start.elapsed();
        anyhow::ensure!(
            out.status.code == Some(0),
            "`true` ended with {:?}",
            out.status
        );
        if i >= WARMUP {
            samples.push(took);
        }
    }
    Latency::of(samples).context("no samples")
}

/// Runs `tether exec ID -- true` `n` times, each as a new process of the `tether` binary.
pub(super) async fn cli(
    tether: &Path,
    relay: &Endpoint,
    id: &str,
    n: usize,
) -> anyhow::Result<Latency> {
    let mut cmd = Command::new(tether);
    cmd.args(["exec", id, "--", "true"])
        .env("TETHER_RELAY", &relay.url)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match &relay.token {
        Some(token) => cmd.env("TETHER_TOKEN", token),
        None => cmd.env_remove("TETHER_TOKEN"),
    };
    let id = id.to_string();
    tokio::task::spawn_blocking(move || {
        let mut samples = Vec::with_capacity(n);
        for i in 0..n + WARMUP {
            let start = Instant::now();
            let out = cmd.output().context("cannot run tether exec")?;
            let took = start.elapsed();
            anyhow::ensure!(
                out.status.success(),
                "`tether exec {id} -- true` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            if i >= WARMUP {
                samples.push(took);
            }
        }
        Latency::of(samples).context("no samples")
    })
    .await
    .context("the measuring thread panicked")?
}

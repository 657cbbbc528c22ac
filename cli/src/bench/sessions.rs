//! Many idle terminals through one relay: opens `n` sessions to one sandbox, each its own
//! tunnel with a PTY running `cat`, then, while all are open, types across them (one
//! keystroke per session in turn, so every session's path is exercised) and reads the
//! relay's and the agent's resident memory.

use std::sync::Arc;

use anyhow::Context;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::memory;
use super::pty::{echo_terminal, keystroke, KEYSTROKES, KEYSTROKE_WARMUP};
use super::stats::Latency;
use tether_client::{Process, RelayClient, Session};

/// Sessions being opened at once.
const OPENING: usize = 64;

/// What the crowd of sessions measured.
pub(super) struct Crowd {
    /// Keystroke echo while every session is open.
    pub keystroke: Latency,
    /// The relay's resident memory with every session open, when it runs on this machine.
    pub relay_rss: Option<u64>,
    /// The agent's resident memory with every session open.
    pub agent_rss: u64,
}

/// Opens `n` idle terminal sessions to sandbox `id` and types `keystrokes` keys across them.
pub(super) async fn crowd(
    rest: &RelayClient,
    relay_pid: Option<u32>,
    id: &str,
    n: usize,
    keystrokes: usize,
) -> anyhow::Result<Crowd> {
    let mut terminals = open(rest, id, n).await?;
    let relay_before = relay_pid.map(memory::rss).transpose()?;
    let agent_rss = memory::agent_rss(&terminals[0].0).await?;

    let mut samples = Vec::with_capacity(keystrokes);
    for i in 0..keystrokes + KEYSTROKE_WARMUP {
        let (_, terminal) = &mut terminals[i % n];
        // Each terminal alternates a letter and an erase, so its line never grows.
        let key = KEYSTROKES[(i / n) % KEYSTROKES.len()];
        let took = keystroke(terminal, key).await?;
        if i >= KEYSTROKE_WARMUP {
            samples.push(took);
        }
    }
    let relay_after = relay_pid.map(memory::rss).transpose()?;
    Ok(Crowd {
        keystroke: Latency::of(samples).context("no samples")?,
        relay_rss: relay_before.max(relay_after),
        agent_rss,
    })
}

/// Opens `n` sessions, each with an echo terminal, [`OPENING`] at a time.
async fn open(rest: &RelayClient, id: &str, n: usize) -> anyhow::Result<Vec<(Session, Process)>> {
    let permits = Arc::new(Semaphore::new(OPENING));
    let mut opening = JoinSet::new();
    for _ in 0..n {
        let (rest, id, permits) = (rest.clone(), id.to_string(), permits.clone());
        opening.spawn(async move {
            let _permit = permits.acquire_owned().await?;
            let session = rest.connect(&id).await?;
            let terminal = session.exec(echo_terminal()).await?;
            Ok::<_, anyhow::Error>((session, terminal))
        });
    }
    let mut open = Vec::with_capacity(n);
    while let Some(done) = opening.join_next().await {
        match done.context("a session task panicked")? {
            Ok(terminal) => open.push(terminal),
            Err(e) => {
                return Err(e.context(format!(
                    "opened {} of {n} sessions, then one failed",
                    open.len()
                )))
            }
        }
    }
    Ok(open)
}

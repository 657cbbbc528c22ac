//! Many idle terminals through one relay: opens `n` sessions, each its own tunnel with a PTY
//! running `cat`, spread over sandboxes of at most [`SESSIONS_PER_SANDBOX`] (a relay lets one
//! sandbox hold 1,024), then, while all are open, types across them (one keystroke per
//! session in turn, so every session's path is exercised) and reads the relay's and the
//! agents' resident memory, before and with the crowd open.

use std::sync::Arc;

use anyhow::Context;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::memory;
use super::pty::{echo_terminal, keystroke, KEYSTROKES, KEYSTROKE_WARMUP};
use super::stats::Latency;
use super::target::Sandbox;
use tether_client::{Process, RelayClient, Session};

/// Sessions being opened at once.
const OPENING: usize = 64;
/// The most sessions put on one sandbox: under the relay's cap of 1,024 per sandbox, with
/// room for the bench's own.
pub(super) const SESSIONS_PER_SANDBOX: usize = 1000;
/// PTYs a machine keeps for its initial devpts instance (`/proc/sys/kernel/pty/reserve`),
/// which sandboxes, each with a devpts of its own, cannot use.
const PTY_RESERVE_DEFAULT: u64 = 1024;

/// What the crowd of sessions measured.
pub(super) struct Crowd {
    /// Keystroke echo while every session is open.
    pub keystroke: Latency,
    /// The relay's resident memory with every session open, when it runs on this machine.
    pub relay_rss: Option<u64>,
    /// The agents' resident memory with every session open, summed over the crowd's
    /// sandboxes.
    pub agent_rss: u64,
    /// What the relay grew by per session, when it runs on this machine.
    pub relay_per_session: Option<u64>,
    /// What the agents grew by per session.
    pub agent_per_session: u64,
}

/// Opens `n` idle terminal sessions (to sandbox `id`, and to as many more fresh sandboxes as
/// they need) and types `keystrokes` keys across them.
pub(super) async fn crowd(
    rest: &RelayClient,
    relay_pid: Option<u32>,
    id: &str,
    n: usize,
    keystrokes: usize,
) -> anyhow::Result<Crowd> {
    if relay_pid.is_some() {
        ptys_for(n)?;
    }
    let mut extra = Vec::new();
    let measured = measure(rest, relay_pid, id, n, keystrokes, &mut extra).await;
    for sandbox in extra {
        if let Err(e) = sandbox.release(rest).await {
            tracing::warn!("{e:#}");
        }
    }
    measured
}

async fn measure(
    rest: &RelayClient,
    relay_pid: Option<u32>,
    id: &str,
    n: usize,
    keystrokes: usize,
    extra: &mut Vec<Sandbox>,
) -> anyhow::Result<Crowd> {
    let mut ids = vec![id.to_string()];
    for _ in 1..n.div_ceil(SESSIONS_PER_SANDBOX) {
        let sandbox = Sandbox::get_or_create(rest, None)
            .await
            .context("cannot create another sandbox for the crowd")?;
        ids.push(sandbox.id.clone());
        extra.push(sandbox);
    }
    // One session per sandbox, not counted, reads its agent's memory.
    let mut probes = Vec::with_capacity(ids.len());
    for id in &ids {
        probes.push(rest.connect(id).await?);
    }
    let relay_before = relay_pid.map(memory::rss).transpose()?;
    let agents_before = agents_rss(&probes).await?;

    let mut terminals = open(rest, &ids, n).await?;
    let relay_open = relay_pid.map(memory::rss).transpose()?;
    let agent_rss = agents_rss(&probes).await?;

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
    let relay_rss = relay_open.max(relay_after);
    let per = |after: u64, before: u64| after.saturating_sub(before) / n as u64;
    Ok(Crowd {
        keystroke: Latency::of(samples).context("no samples")?,
        relay_rss,
        agent_rss,
        relay_per_session: relay_rss.zip(relay_before).map(|(a, b)| per(a, b)),
        agent_per_session: per(agent_rss, agents_before),
    })
}

/// The resident memory of the agents behind `sessions`, summed.
async fn agents_rss(sessions: &[Session]) -> anyhow::Result<u64> {
    let mut total = 0;
    for session in sessions {
        total += memory::agent_rss(session).await?;
    }
    Ok(total)
}

/// Opens `n` sessions spread over sandboxes `ids`, each with an echo terminal, [`OPENING`]
/// at a time.
async fn open(
    rest: &RelayClient,
    ids: &[String],
    n: usize,
) -> anyhow::Result<Vec<(Session, Process)>> {
    let permits = Arc::new(Semaphore::new(OPENING));
    let mut opening = JoinSet::new();
    for i in 0..n {
        let (rest, id, permits) = (rest.clone(), ids[i % ids.len()].clone(), permits.clone());
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

/// Checks that this machine lets sandboxes open `n` more terminals: each has a devpts
/// instance of its own, and all of those share `kernel.pty.max` less the initial instance's
/// reserve.
fn ptys_for(n: usize) -> anyhow::Result<()> {
    let Some((max, reserve, open)) = pty_counters() else {
        return Ok(()); // not Linux's counters: let the sessions say what fails
    };
    let free = max.saturating_sub(reserve).saturating_sub(open);
    let wanted = n as u64;
    anyhow::ensure!(
        free >= wanted,
        "{n} idle terminal sessions need {n} PTYs, and sandboxes may open only {free} more \
         here (kernel.pty.max {max}, less {reserve} reserved for the host and {open} open): \
         raise it (`sysctl -w kernel.pty.max={}`) or measure fewer (`--sessions N`)",
        (open + reserve + wanted).next_power_of_two()
    );
    Ok(())
}

/// Linux's PTY counters: `kernel.pty.max`, the host's reserve, and how many are open.
fn pty_counters() -> Option<(u64, u64, u64)> {
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(format!("/proc/sys/kernel/pty/{name}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let reserve = read("reserve").unwrap_or(PTY_RESERVE_DEFAULT);
    Some((read("max")?, reserve, read("nr")?))
}

/// Descriptors a private relay holds per idle session (the client's socket and the agent's).
const RELAY_DESCRIPTORS_PER_SESSION: u64 = 2;
/// Descriptors the relay keeps beyond its sessions (its reserve, database, listeners).
const RELAY_DESCRIPTORS_SPARE: u64 = 1024;

/// When `wanted` idle sessions cannot all be opened here, the most that can (in whole
/// thousands, or hundreds below a thousand) and why: a private relay inherits `open_files`
/// and needs two descriptors a session, and each session needs a PTY.
pub(super) fn fitting(wanted: usize, open_files: Option<u64>) -> Option<(usize, String)> {
    fit(wanted, open_files, pty_counters())
}

fn fit(
    wanted: usize,
    open_files: Option<u64>,
    ptys: Option<(u64, u64, u64)>,
) -> Option<(usize, String)> {
    let mut most = wanted as u64;
    let mut why = Vec::new();
    if let Some(limit) = open_files {
        let fits = limit.saturating_sub(RELAY_DESCRIPTORS_SPARE) / RELAY_DESCRIPTORS_PER_SESSION;
        if fits < most {
            most = fits;
            why.push(format!(
                "the relay may open {limit} files (ulimit -n, not raisable here) and needs \
                 {RELAY_DESCRIPTORS_PER_SESSION} a session"
            ));
        }
    }
    if let Some((max, reserve, open)) = ptys {
        let free = max.saturating_sub(reserve).saturating_sub(open);
        if free < most {
            most = free;
            why.push(format!(
                "sandboxes may open {free} more PTYs (raise kernel.pty.max, now {max})"
            ));
        }
    }
    if why.is_empty() {
        return None;
    }
    let step = if most >= 1000 { 1000 } else { 100 };
    let fit = ((most / step) * step).max(1) as usize;
    Some((fit, why.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_crowd_shrinks_to_the_descriptors_and_ptys_there_are() {
        // Enough of both: nothing to say.
        assert_eq!(fit(10_000, Some(1 << 20), Some((1 << 20, 1024, 0))), None);
        assert_eq!(fit(10_000, None, None), None);
        // A hard limit of 20,000 descriptors: 9,000 sessions, named why.
        let (n, why) = fit(10_000, Some(20_000), None).unwrap();
        assert_eq!(n, 9000);
        assert!(why.contains("20000 files"), "{why}");
        // Debian's default kernel.pty.max of 4,096 less the reserve: 3,000, and both reasons.
        let (n, why) = fit(10_000, Some(20_000), Some((4096, 1024, 2))).unwrap();
        assert_eq!(n, 3000);
        assert!(
            why.contains("kernel.pty.max") && why.contains("files"),
            "{why}"
        );
        // Small numbers round to hundreds, and never to nothing.
        assert_eq!(fit(10_000, Some(1024 + 2 * 450), None).unwrap().0, 400);
        assert_eq!(fit(10_000, Some(100), None).unwrap().0, 1);
    }
}

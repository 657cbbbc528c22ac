//! Pause and resume: the REST calls as a client sees them, on the measured sandbox while a
//! shell in it keeps starting processes (so each pause has new ones to move and freeze).
//! Each pause is followed by a resume; the two are timed apart.

use std::time::{Duration, Instant};

use anyhow::Context;
use tether_proto::op::ExecSpec;

use super::stats::Latency;
use tether_client::{RelayClient, Session};

/// What the sandbox runs while it is paused and resumed: a new `sleep` every 10 ms.
const BUSY: &str = "while :; do sleep 0.01; done";

/// Pause and resume latencies.
pub(super) struct PauseResume {
    pub pause: Latency,
    pub resume: Latency,
}

/// Pauses and resumes sandbox `id` `n` times; `session` runs its busy shell.
pub(super) async fn pause_resume(
    rest: &RelayClient,
    session: &Session,
    id: &str,
    n: usize,
) -> anyhow::Result<PauseResume> {
    let sandbox = rest.get(id).await?;
    if !sandbox.capabilities.is_some_and(|c| c.pause) {
        anyhow::bail!(
            "sandbox {id} runs on provider `{}`, which cannot pause",
            sandbox.provider
        );
    }
    let busy = session
        .exec(ExecSpec::argv(["sh", "-c", BUSY]))
        .await
        .context("cannot start the busy shell")?;
    let measured = async {
        let (mut pauses, mut resumes) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let start = Instant::now();
            rest.pause(id).await.context("pause")?;
            pauses.push(start.elapsed());
            let start = Instant::now();
            rest.resume(id).await.context("resume")?;
            resumes.push(start.elapsed());
            // Let the shell start a process or two before the next pause.
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        anyhow::Ok(PauseResume {
            pause: Latency::of(pauses).context("no samples")?,
            resume: Latency::of(resumes).context("no samples")?,
        })
    }
    .await;
    if measured.is_err() {
        // Left paused by a failed resume, the sandbox would hold up the rest of the bench.
        let _ = rest.resume(id).await;
    }
    let _ = busy.signal("KILL", true).await;
    let _ = busy.output().await;
    measured
}

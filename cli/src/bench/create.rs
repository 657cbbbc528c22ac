//! Sandbox create to first output: the REST create, the tunnel to the new sandbox's agent,
//! an exec of `echo`, and its first byte of output; what `tether run` costs before the
//! command's own work. Each sandbox is deleted afterwards, untimed.

use std::time::Instant;

use anyhow::Context;
use tether_proto::op::ExecSpec;

use super::stats::Latency;
use super::target;
use tether_client::{ProcessEvent, RelayClient};

/// Creates `n` sandboxes one after another, timing each to its first output.
pub(super) async fn to_first_output(rest: &RelayClient, n: usize) -> anyhow::Result<Latency> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let sandbox = rest
            .create(&target::request())
            .await
            .context("cannot create a sandbox")?;
        let timed = async {
            let session = rest.connect(&sandbox.id).await?;
            let mut process = session.exec(ExecSpec::argv(["echo", "ready"])).await?;
            loop {
                match process.next().await {
                    Some(Ok(ProcessEvent::Stdout(_))) => return Ok(start.elapsed()),
                    Some(Ok(ProcessEvent::Exit(status))) => {
                        anyhow::bail!("`echo` exited with {status:?} before printing")
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                    None => anyhow::bail!("the exec stream ended"),
                }
            }
        }
        .await;
        let deleted = rest.delete(&sandbox.id).await;
        samples.push(timed?);
        deleted.with_context(|| format!("cannot delete sandbox {}", sandbox.id))?;
    }
    Latency::of(samples).context("no samples")
}

//! Images built here for a Daytona snapshot, exactly as `--target oci` builds them (base,
//! agent layer, overrides), in a temporary directory, then pushed to the registry Daytona
//! will pull from: `--base PATH --push REF`, or `--from REF --push REF` (the registry image
//! pulled here first, as the base). A broken base fails in the build, before anything is
//! pushed or sent to Daytona.

use std::path::Path;

use crate::image::{Event, RemoteBuild, TargetError};
use tether_oci::reference::Reference;
use tether_oci::{build, pull, push, BuildOptions, PullOptions, PushOptions};

/// Build steps waiting for the progress display (a build reports a handful).
const STEP_QUEUE: usize = 16;

/// Pulls `from`, builds `req` on it and pushes the result to `target`; returns the pushed
/// reference.
pub(super) async fn pull_build_and_push(
    req: &RemoteBuild,
    from: &Reference,
    target: &Reference,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<String, TargetError> {
    let scratch = scratch()?;
    events(Event::Step(format!("pulling {from}")));
    let opts = PullOptions {
        insecure: req.insecure,
    };
    let pulled = pull(from, &scratch.path().join("base"), &opts).await?;
    build_and_push(req, &pulled.layout, target, events).await
}

/// Builds `req` on `base` and pushes it to `target`; returns the pushed reference.
pub(super) async fn build_and_push(
    req: &RemoteBuild,
    base: &Path,
    target: &Reference,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<String, TargetError> {
    let scratch = scratch()?;
    let opts = BuildOptions {
        base: Some(base.to_path_buf()),
        agent: req.agent.clone(),
        output: scratch.path().join("image"),
        tag: target.target_str().to_string(),
        overrides: req.overrides.clone(),
        epoch: req.epoch,
    };
    // The build reads and writes files for a while: off the runtime, its steps sent back.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(STEP_QUEUE);
    let task = tokio::task::spawn_blocking(move || {
        build(&opts, &|step| {
            // The receiver outlives the build; a full queue only delays a progress line.
            let _ = tx.blocking_send(step.to_string());
        })
    });
    while let Some(step) = rx.recv().await {
        events(Event::Step(format!("building here: {step}")));
    }
    let built = task.await.expect("the image build does not panic")?;

    events(Event::Step(format!("pushing to {target}")));
    let opts = PushOptions {
        insecure: req.insecure,
        scratch: scratch.path().to_path_buf(),
        ..PushOptions::default()
    };
    // Per-blob progress would fight the build's spinner: the step line says what is happening.
    let pushed = push(&built.output, target, &opts, &|_| {}).await?;
    events(Event::Step(format!(
        "pushed {} ({})",
        pushed.reference, pushed.digest
    )));
    Ok(pushed.reference)
}

/// A temporary directory for one build, removed when dropped.
fn scratch() -> Result<tempfile::TempDir, TargetError> {
    tempfile::Builder::new()
        .prefix("tether-daytona-")
        .tempdir()
        .map_err(|e| {
            TargetError::Usage(format!(
                "cannot create a temporary directory to build in: {e}"
            ))
        })
}

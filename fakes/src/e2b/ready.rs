//! The end of a fake template build: the ready command run in a sandbox of the new image, as
//! E2B's builder checks a template before it snapshots it. E2B runs it with `/bin/bash -l -c`
//! on the distributions it provisions; the fake provisions nothing, so it uses `/bin/sh -c`,
//! which every image the fake can build on has. E2B retries a failing ready command for up to
//! ten minutes while a start command comes up; the fake runs no start command, so one run
//! decides.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tether_client::ProcessEvent;

use super::E2b;
use crate::sandboxes::random_id;

/// The build sandbox's id: like a sandbox's, so it is hostname-safe.
const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const ID_LEN: usize = 20;
/// How long the ready command may take.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The most of its output kept as log lines.
const MAX_OUTPUT: usize = 4096; // bytes

/// Runs `cmd` with `env` (the template's build variables) in a sandbox of `image`; its
/// output becomes log lines through `log`. Fails with E2B's kind of reason when it cannot run
/// or exits non-zero.
pub(super) async fn check(
    fake: &E2b,
    image: &Path,
    cmd: &str,
    env: BTreeMap<String, String>,
    log: &(dyn Fn(String) + Send + Sync),
) -> Result<(), String> {
    let id = random_id(ID_LEN, ID_ALPHABET);
    fake.sandboxes
        .create_from(&id, Some(image))
        .await
        .map_err(|e| format!("cannot start the template to run its ready command: {e:#}"))?;
    let outcome = tokio::time::timeout(READY_TIMEOUT, run(fake, &id, cmd, env, log)).await;
    if let Err(e) = fake.sandboxes.delete(&id).await {
        tracing::warn!("cannot remove the build sandbox {id}: {e}");
    }
    match outcome {
        Ok(Ok(0)) => Ok(()),
        Ok(Ok(code)) => Err(format!(
            "ready command '{cmd}' failed with exit code {code}"
        )),
        Ok(Err(e)) => Err(format!("ready command '{cmd}' could not run: {e}")),
        Err(_) => Err(format!(
            "ready command '{cmd}' did not finish within {READY_TIMEOUT:?}"
        )),
    }
}

/// Runs `cmd` to its end; returns its exit code.
async fn run(
    fake: &E2b,
    id: &str,
    cmd: &str,
    env: BTreeMap<String, String>,
    log: &(dyn Fn(String) + Send + Sync),
) -> Result<i32, String> {
    let argv = vec!["/bin/sh".to_string(), "-c".to_string(), cmd.to_string()];
    let mut process = fake
        .sandboxes
        .start(id, argv, env, None)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let mut output = Vec::new();
    let code = loop {
        match process.next().await {
            Some(Ok(ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b))) => {
                let room = MAX_OUTPUT.saturating_sub(output.len());
                output.extend_from_slice(&b[..b.len().min(room)]);
            }
            Some(Ok(ProcessEvent::Exit(status))) => break status.shell_code(),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("the process ended without an exit status".into()),
        }
    };
    for line in String::from_utf8_lossy(&output).lines() {
        log(line.to_string());
    }
    Ok(code)
}

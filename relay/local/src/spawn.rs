//! Starting a sandbox from the relay: spawning the sandbox init (the relay's own binary, never
//! a fork of the multi-threaded relay), handing it its configuration and waiting,
//! deterministically, for its reports until the status pipe closes.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use super::config::{InitConfig, Report};
use super::constants::{INIT_SUBCOMMAND, START_TIMEOUT};
use super::error::{IoContext, LocalError};
use super::own_binary::InitProgram;
use super::process::ProcessIdentity;

/// Starts the sandbox described by `config` with `program` (the relay binary) and returns its
/// first process once the agent is being exec'd. The sandbox's output goes to `log`.
pub(super) async fn start(
    program: &InitProgram,
    config: &InitConfig,
    log: &Path,
) -> Result<ProcessIdentity, LocalError> {
    let log_file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
        .context(|| format!("open the sandbox log {}", log.display()))?;
    let mut child = Command::new(&program.path)
        .arg0(&program.name)
        .arg(INIT_SUBCOMMAND)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .context(|| format!("start the sandbox init {}", program.name))?;

    let config = serde_json::to_vec(config)
        .map_err(|e| LocalError::io("encode the sandbox configuration", e.into()))?;
    let exchange = exchange(&mut child, &config);
    let output = match tokio::time::timeout(START_TIMEOUT, exchange).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => {
            reap_in_background(child, true);
            return Err(LocalError::io("talk to the sandbox init", e));
        }
        Err(_) => {
            reap_in_background(child, true);
            return Err(LocalError::StartTimeout(START_TIMEOUT, log.to_path_buf()));
        }
    };

    let mut started = None;
    for line in output.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        match serde_json::from_slice::<Report>(line) {
            Ok(Report::Started { pid, start_time }) => {
                started = Some(ProcessIdentity { pid, start_time })
            }
            Ok(Report::Failed {
                message,
                unavailable,
            }) => {
                reap_in_background(child, false);
                return Err(if unavailable {
                    LocalError::Unavailable(message)
                } else {
                    LocalError::InitFailed(message)
                });
            }
            Err(_) => {
                reap_in_background(child, true);
                return Err(LocalError::InitFailed(format!(
                    "the sandbox init wrote an unexpected line {:?}; see {}",
                    String::from_utf8_lossy(line),
                    log.display()
                )));
            }
        }
    }
    match started {
        Some(process) => {
            // The monitor lives as long as the sandbox; whoever is its parent must reap it.
            reap_in_background(child, false);
            Ok(process)
        }
        None => {
            let status = child
                .wait()
                .await
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string());
            Err(LocalError::InitFailed(format!(
                "the sandbox init ended ({status}) without reporting; see {} (does the relay's \
                 main call provider::local::run_if_sandbox_init first?)",
                log.display()
            )))
        }
    }
}

/// Writes the configuration (the init reads all of it before writing anything) and reads
/// every report until the pipe closes.
async fn exchange(child: &mut Child, config: &[u8]) -> io::Result<Vec<u8>> {
    let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(io::Error::other("the sandbox init's pipes are missing"));
    };
    stdin.write_all(config).await?;
    drop(stdin);
    let mut output = Vec::new();
    stdout.read_to_end(&mut output).await?;
    Ok(output)
}

/// Waits for the monitor in a task, so it never lingers as a zombie of the relay.
fn reap_in_background(mut child: Child, kill: bool) {
    if kill {
        let _ = child.start_kill();
    }
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
}

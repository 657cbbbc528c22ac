//! `exec`: a shell command run to completion, its output (stdout and stderr merged in the
//! order written) shown inline up to a limit; a longer output is kept whole in a file in
//! the sandbox, named in the answer, and shown as its head and tail.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use tether_proto::control::ExitStatus;
use tether_proto::op::ExecSpec;

use tether_client::ProcessEvent;

use super::constants::{
    EXEC_DEFAULT_TIMEOUT, EXEC_GRACE, EXEC_MAX_TIMEOUT, EXEC_OUTPUT_LIMIT, INLINE_OUTPUT_BYTES,
    OUTPUT_DIR,
};
use super::error::{invalid, ToolError};
use super::text::fold;
use super::Server;

/// Arguments of `exec`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ExecArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// A shell command line, run with `/bin/sh -c` (pipes, redirections and `&&` work).
    pub command: String,
    /// Working directory; the sandbox's default (usually /workspace or the image's WORKDIR)
    /// when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Kill the command (its whole process group) after this many seconds; default 120.
    /// A command killed this way reports `timed_out: true` and exit code 124.
    #[serde(default)]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: Option<u64>,
    /// Environment variables added for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A timeout from a call's seconds, checked against the bounds.
pub(super) fn timeout(
    seconds: Option<u64>,
    default: Option<Duration>,
) -> Result<Option<Duration>, ToolError> {
    match seconds {
        None => Ok(default),
        Some(0) => Err(invalid("timeout_seconds must be at least 1")),
        Some(s) if Duration::from_secs(s) > EXEC_MAX_TIMEOUT => Err(invalid(format!(
            "timeout_seconds {s} is above the maximum of {}; use exec_start for longer work",
            EXEC_MAX_TIMEOUT.as_secs()
        ))),
        Some(s) => Ok(Some(Duration::from_secs(s))),
    }
}

/// A command must be a non-empty string without NUL bytes (a shell cannot take them).
pub(super) fn check_command(command: &str) -> Result<(), ToolError> {
    if command.trim().is_empty() {
        return Err(invalid(
            "command is empty: give a shell command line such as `ls -la`",
        ));
    }
    if command.contains('\0') {
        return Err(invalid(
            "command contains a NUL byte, which a shell cannot take",
        ));
    }
    Ok(())
}

/// The exit as fields of an answer: the code a shell would report (the code, 128 + the
/// signal, 124 on timeout), computed wide so no number the sandbox sends can overflow it.
pub(super) fn exit_fields(status: &ExitStatus) -> Value {
    let code = match (status.timed_out, status.code, status.signal) {
        (true, _, _) => 124,
        (false, Some(code), _) => i64::from(code),
        (false, None, Some(signal)) => 128 + i64::from(signal),
        (false, None, None) => 255,
    };
    json!({
        "exit_code": code,
        "signal": status.signal,
        "timed_out": status.timed_out,
    })
}

pub(super) async fn run(server: &Server, args: ExecArgs) -> Result<Value, ToolError> {
    check_command(&args.command)?;
    let limit =
        timeout(args.timeout_seconds, Some(EXEC_DEFAULT_TIMEOUT))?.expect("a default is given");
    let session = server.connections.get(&args.sandbox_id).await?;
    let spec = ExecSpec {
        cwd: args.cwd.map(Into::into),
        env: args.env,
        merge_stderr: true,
        timeout_ms: Some(limit.as_millis() as u64),
        output_limit: Some(EXEC_OUTPUT_LIMIT),
        ..ExecSpec::shell(args.command)
    };
    let mut process = session.exec(spec).await?;
    let mut output = Vec::new();
    let collect = async {
        while let Some(ev) = process.next().await {
            match ev? {
                ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b) => {
                    // The agent enforces the limit; a hostile one that does not is cut here.
                    let room = (EXEC_OUTPUT_LIMIT as usize).saturating_sub(output.len());
                    output.extend_from_slice(&b[..b.len().min(room)]);
                }
                ProcessEvent::Dropped { .. } => {}
                ProcessEvent::Exit(status) => return Ok(status),
            }
        }
        Err(ToolError::Client(tether_client::ClientError::Disconnected))
    };
    let status = tokio::time::timeout(limit + EXEC_GRACE, collect)
        .await
        .map_err(|_| {
            ToolError::Timeout(format!(
                "the sandbox did not report the command's end within {} s of its timeout; \
                 the command may still run (see sandbox_info)",
                EXEC_GRACE.as_secs()
            ))
        })??;
    drop(process);

    let mut answer = exit_fields(&status);
    answer["output_bytes"] = json!(output.len());
    answer["output_limit_reached"] = json!(status.truncated);
    if output.len() <= INLINE_OUTPUT_BYTES {
        answer["output"] = json!(String::from_utf8_lossy(&output));
        answer["truncated"] = json!(status.truncated);
        return Ok(answer);
    }
    let file = output_file_name();
    let note = match session.write_file(&file, &output).await {
        Ok(_) => {
            answer["output_file"] = json!(file);
            format!("the whole output is in {file} in the sandbox (read_file, grep)")
        }
        Err(e) => {
            answer["output_file_error"] = json!(e.to_string());
            "the whole output could not be kept in the sandbox".to_string()
        }
    };
    let (text, _) = fold(&output, INLINE_OUTPUT_BYTES, &note);
    answer["output"] = json!(text);
    answer["truncated"] = json!(true);
    Ok(answer)
}

/// A fresh name for a kept output: time and a random part, so concurrent calls and several
/// servers never collide.
fn output_file_name() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("{OUTPUT_DIR}/exec-{ms}-{:08x}.log", rand::random::<u32>())
}

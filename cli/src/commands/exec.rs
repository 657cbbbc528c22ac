//! `tether exec`: one command in a sandbox, its I/O wired to this process, its exit status
//! ours. This is the latency-critical path: no REST call, no HTTP client, a single-threaded
//! runtime; the only network work is the tunnel's WebSocket handshake and the exec itself.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::Args;
use tether_proto::op::{Command, ExecSpec, PtySpec};
use tether_proto::ErrorCode;

use super::attach::{self, Wiring};
use super::remote::Remote;
use super::terminal::{self, RawMode};
use tether_client::escape::escape_os;
use tether_client::ClientError;

/// Exit status when the command exists but cannot be executed.
const NOT_EXECUTABLE: i32 = 126;
/// Exit status when the command does not exist.
const NOT_FOUND: i32 = 127;

/// How a process runs, whatever it runs (`exec` and `shell`).
#[derive(Debug, Clone, Args)]
pub(super) struct ProcessArgs {
    /// Set an environment variable; `-e KEY` passes this machine's value. Repeatable.
    #[arg(
        short = 'e',
        long = "env",
        value_name = "KEY=VALUE",
        value_parser = OsStringValueParser::new().try_map(env_var)
    )]
    env: Vec<(OsString, OsString)>,
    /// The working directory; the agent's when absent.
    #[arg(short = 'w', long = "workdir", value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// Run as this user (name or uid).
    #[arg(short = 'u', long, value_name = "USER")]
    user: Option<String>,
}

impl ProcessArgs {
    /// A foreground exec of `command` with these settings.
    pub(super) fn spec(&self, command: Command) -> ExecSpec {
        let mut spec = ExecSpec {
            command,
            cwd: self.workdir.clone().map(Into::into),
            user: self.user.clone(),
            ..ExecSpec::argv(Vec::<String>::new())
        };
        for (name, value) in &self.env {
            spec.set_env(name.as_os_str(), value.as_os_str());
        }
        spec
    }
}

/// `KEY=VALUE`, or `KEY` to pass on this machine's value; either may be any bytes but NUL,
/// as an environment is.
fn env_var(arg: OsString) -> Result<(OsString, OsString), String> {
    let bytes = arg.as_bytes();
    match bytes.iter().position(|&b| b == b'=') {
        Some(0) => Err(format!("expected KEY=VALUE, got `{}`", escape_os(&arg))),
        Some(at) => Ok((
            OsStr::from_bytes(&bytes[..at]).to_os_string(),
            OsStr::from_bytes(&bytes[at + 1..]).to_os_string(),
        )),
        None => match std::env::var_os(&arg) {
            Some(value) => Ok((arg, value)),
            None => {
                let name = escape_os(&arg);
                Err(format!("{name} is not set here: write {name}=VALUE"))
            }
        },
    }
}

/// A PTY the size of our terminal, with our `TERM`.
pub(super) fn pty() -> PtySpec {
    let (cols, rows) = terminal::size_or_default();
    PtySpec {
        cols,
        rows,
        term: std::env::var("TERM").ok().filter(|t| !t.is_empty()),
    }
}

/// `tether exec`.
#[derive(Debug, Args)]
pub(super) struct ExecArgs {
    /// Run under a pseudo-terminal (with -i: the local terminal goes raw, like ssh).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Pass stdin to the command (otherwise it reads /dev/null).
    #[arg(short = 'i', long)]
    pub interactive: bool,
    #[command(flatten)]
    process: ProcessArgs,
    /// Kill the command after this long and exit 124, e.g. 30s or 5m.
    #[arg(long, value_name = "DURATION", value_parser = super::duration)]
    timeout: Option<Duration>,
    /// Run SCRIPT with `/bin/sh -c` instead of a command.
    #[arg(
        short = 'c',
        long = "shell",
        value_name = "SCRIPT",
        conflicts_with = "command"
    )]
    script: Option<OsString>,
    /// The sandbox.
    #[arg(value_name = "ID")]
    pub id: String,
    /// The command and its arguments, run as they are (no shell).
    #[arg(
        value_name = "CMD",
        trailing_var_arg = true,
        required_unless_present = "script"
    )]
    pub command: Vec<OsString>,
}

pub(super) async fn run(remote: Remote, args: ExecArgs) -> anyhow::Result<i32> {
    let session = remote.connect(&args.id).await?;
    let command = match args.script {
        Some(script) => Command::Shell(script.into()),
        None => Command::Argv(args.command.into_iter().map(Into::into).collect()),
    };
    let mut spec = args.process.spec(command);
    spec.stdin = args.interactive;
    spec.timeout_ms = args.timeout.map(|t| t.as_millis().max(1) as u64);
    spec.pty = args.tty.then(pty);
    let _raw = match args.tty && args.interactive {
        true => RawMode::enter()?,
        false => None,
    };
    let process = session
        .exec(spec)
        .await
        .map_err(|e| remote.explain(e, Some(&args.id)))?;
    let wiring = Wiring {
        stdin: args.interactive,
        pty: args.tty,
    };
    Ok(attach::wire(process, wiring).await?.shell_code())
}

/// The exit status for an exec that failed before the command ran: 127 when it does not
/// exist, 126 when it cannot be executed; `None` for every other failure.
pub(super) fn failure_status(err: &anyhow::Error) -> Option<i32> {
    match err.downcast_ref::<ClientError>()?.code()? {
        ErrorCode::NotFound => Some(NOT_FOUND),
        ErrorCode::PermissionDenied | ErrorCode::IsDirectory => Some(NOT_EXECUTABLE),
        _ => None,
    }
}

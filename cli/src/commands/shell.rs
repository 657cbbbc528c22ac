//! `tether shell`: an interactive terminal in a sandbox, like ssh. A PTY exec of a login
//! shell (or the given command) with the local terminal in raw mode, so every key, Ctrl-C
//! and Ctrl-Z included, reaches the remote side and job control happens there.

use std::ffi::OsString;

use clap::Args;
use tether_proto::op::Command;

use super::attach::{self, Wiring};
use super::exec::{self, ProcessArgs};
use super::remote::Remote;
use super::terminal::RawMode;

/// Bash as a login shell where the sandbox has it, else the POSIX shell. One exec, no
/// round trip to look first.
const LOGIN_SHELL: &str = "if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh";

/// `tether shell`.
#[derive(Debug, Args)]
pub(super) struct ShellArgs {
    #[command(flatten)]
    process: ProcessArgs,
    /// The sandbox.
    #[arg(value_name = "ID")]
    id: String,
    /// A command to run instead of the login shell.
    #[arg(value_name = "CMD", trailing_var_arg = true)]
    command: Vec<OsString>,
}

pub(super) async fn run(remote: Remote, args: ShellArgs) -> anyhow::Result<i32> {
    let session = remote.connect(&args.id).await?;
    let command = match args.command.is_empty() {
        true => Command::Shell(LOGIN_SHELL.into()),
        false => Command::Argv(args.command.into_iter().map(Into::into).collect()),
    };
    let mut spec = args.process.spec(command);
    spec.stdin = true;
    spec.pty = Some(exec::pty());
    // Raw before the exec starts, so keys typed meanwhile are neither echoed nor edited here.
    let _raw = RawMode::enter()?;
    let process = session
        .exec(spec)
        .await
        .map_err(|e| remote.explain(e, Some(&args.id)))?;
    let wiring = Wiring {
        stdin: true,
        pty: true,
    };
    Ok(attach::wire(process, wiring).await?.shell_code())
}

//! `tether run`: a command in a sandbox made for it and deleted afterwards, also when the
//! command fails, `tether` fails, or the user interrupts. With no relay configured or
//! running, it embeds one (see `embedded`), so it works on a fresh machine.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::signal::unix::{signal, SignalKind};

use tether_proto::op::ExecSpec;

use super::attach::{self, Wiring};
use super::embedded::{self, Embedded, Source};
use super::exec;
use super::lifecycle::CreateArgs;
use super::remote::Remote;
use super::terminal::RawMode;

/// The idle timeout of a run's sandbox unless `--idle-timeout` says otherwise. A running
/// command keeps its tunnel open, which counts as activity; this only reclaims the sandbox
/// if `tether` dies without deleting it.
const RUN_IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Worker threads of the runtime that hosts an embedded relay and its client.
const EMBEDDED_WORKERS: usize = 2;

/// `tether run`.
#[derive(Debug, Args)]
pub(super) struct RunArgs {
    #[command(flatten)]
    create: CreateArgs,
    /// Run under a pseudo-terminal; the local terminal goes raw.
    #[arg(short = 't', long)]
    tty: bool,
    /// Pass stdin to the command even when it is a terminal. Piped or redirected stdin is
    /// always passed; a terminal is not by default, so `tether run ... &` is not stopped by
    /// reading it.
    #[arg(short = 'i', long)]
    interactive: bool,
    /// The working directory; the agent's when absent.
    #[arg(short = 'w', long = "workdir", value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// Kill the command after this long and exit 124, e.g. 30s or 5m.
    #[arg(long, value_name = "DURATION", value_parser = super::duration)]
    timeout: Option<Duration>,
    /// Always use a private relay inside this process, even if one is configured or running.
    #[arg(long)]
    embedded: bool,
    /// The command and its arguments, run as they are (no shell).
    #[arg(value_name = "CMD", trailing_var_arg = true, required = true)]
    command: Vec<OsString>,
}

pub(super) fn run(relay: Option<&str>, args: RunArgs) -> anyhow::Result<i32> {
    let env = std::env::var("TETHER_RELAY").ok();
    match embedded::choose(relay, env.as_deref(), args.embedded, embedded::answers)? {
        Source::Configured(url) | Source::Running(url) => {
            super::init_tracing(None);
            let remote = Remote::resolve(Some(&url))?;
            super::block_on(super::current_thread()?, ephemeral(&remote, args))
        }
        Source::Embedded => {
            super::init_tracing(Some("warn"));
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(EMBEDDED_WORKERS)
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            super::block_on(rt, async {
                let (relay, remote) = Embedded::start().await?;
                let outcome = ephemeral(&remote, args).await;
                relay.stop().await;
                outcome
            })
        }
    }
}

/// Creates the sandbox, runs the command in it, deletes it; returns the command's status.
async fn ephemeral(remote: &Remote, args: RunArgs) -> anyhow::Result<i32> {
    let rest = remote.rest()?;
    let mut req = args.create.request()?;
    req.spec.idle_timeout = req.spec.idle_timeout.or(Some(RUN_IDLE_TIMEOUT));

    // An interrupt (or a closed terminal) while the sandbox is being made must not leave it
    // behind: wait for the create to finish, delete, and exit as the signal would have.
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut hangup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    let create = rest.create(&req);
    tokio::pin!(create);
    let early = tokio::select! {
        created = &mut create => Err(created),
        _ = interrupt.recv() => Ok(libc::SIGINT),
        _ = terminate.recv() => Ok(libc::SIGTERM),
        _ = hangup.recv() => Ok(libc::SIGHUP),
    };
    let sandbox = match early {
        Err(created) => created.map_err(|e| remote.explain(e, None))?,
        Ok(sig) => {
            if let Ok(sandbox) = create.await {
                let _ = rest.delete(&sandbox.id).await;
            }
            return Ok(128 + sig);
        }
    };
    drop((interrupt, terminate, hangup));

    let outcome = run_in(remote, &sandbox.id, args).await;
    let deleted = rest.delete(&sandbox.id).await;
    match (outcome, deleted) {
        (outcome, Ok(())) => outcome,
        (Ok(_), Err(e)) => Err(remote.explain(e, Some(&sandbox.id))).with_context(|| {
            format!(
                "the command ran, but its sandbox {0} was not deleted: delete it with \
                 `tether rm {0}`",
                sandbox.id
            )
        }),
        (Err(e), Err(_)) => {
            eprintln!(
                "tether: the sandbox {0} was not deleted: delete it with `tether rm {0}`",
                sandbox.id
            );
            Err(e)
        }
    }
}

async fn run_in(remote: &Remote, id: &str, args: RunArgs) -> anyhow::Result<i32> {
    let session = remote.connect(id).await?;
    let stdin = args.interactive || args.tty || !std::io::stdin().is_terminal();
    let mut spec = ExecSpec::argv(args.command);
    spec.cwd = args.workdir.map(Into::into);
    spec.stdin = stdin;
    spec.pty = args.tty.then(exec::pty);
    spec.timeout_ms = args.timeout.map(|t| t.as_millis().max(1) as u64);
    let _raw = match args.tty {
        true => RawMode::enter()?,
        false => None,
    };
    let process = session
        .exec(spec)
        .await
        .map_err(|e| remote.explain(e, Some(id)))?;
    let wiring = Wiring {
        stdin,
        pty: args.tty,
    };
    Ok(attach::wire(process, wiring).await?.shell_code())
}

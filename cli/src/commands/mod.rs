//! The `tether` command line: the argument grammar, the dispatch to one module per command,
//! and how failures are printed and turned into exit statuses.
//!
//! # Layout
//! - [`remote`](self::remote): where the relay is, the token, and actionable error sentences;
//! - `serve`; `lifecycle` (create, ls, rm, info); `exec`; `shell`; `cp` and `sync` (both
//!   sides written as a [`location`](self::location)); `run` (and
//!   `embedded`, the in-process relay it falls back to); `token`; `secret` (the relay's
//!   secret store); `bench`;
//! - `attach`: a running remote process wired to this process's stdio, signals and terminal;
//!   `terminal`: raw mode and the window size; `output`: tables and `--json`.
//!
//! # Exit statuses
//! - `exec`, `shell` and `run` exit with the remote command's status: its code, 128 + the
//!   signal that killed it, or 124 when `--timeout` stopped it. When `tether` itself fails they
//!   exit 125, 126 if the command cannot be executed, 127 if it was not found (as `docker` does).
//! - Every other command exits 0 on success, 1 on failure, 2 on a usage error.

mod attach;
mod bench;
mod cp;
mod dev;
mod embedded;
mod exec;
mod forward;
mod image;
mod interrupt;
mod lifecycle;
mod location;
mod output;
mod power;

use tether_client::api::Power;
mod remote;
mod run;
mod secret;
mod serve;
mod shell;
mod sync;
mod terminal;
mod token;

use std::future::Future;
use std::io::Write;

use clap::{Parser, Subcommand};
use tether_client::ClientError;

use self::remote::Remote;

/// Exit status when `tether` itself fails in `exec`, `shell` or `run`.
const EXEC_FAILED: i32 = 125;
/// Exit status of a management command that failed.
const FAILED: i32 = 1;

/// Run AI agents' code in sandboxes.
#[derive(Debug, Parser)]
#[command(name = "tether", version, propagate_version = true)]
#[command(after_help = "Start with `tether run -- uname -a`: it needs no running relay.")]
pub(crate) struct Cli {
    /// The relay's URL [env: TETHER_RELAY] [default: http://127.0.0.1:7420].
    #[arg(long, global = true, value_name = "URL")]
    relay: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the relay until SIGINT or SIGTERM.
    Serve(serve::ServeArgs),
    /// Create a sandbox and print its id.
    Create(lifecycle::CreateCommand),
    /// List sandboxes.
    Ls(lifecycle::LsArgs),
    /// Delete sandboxes.
    Rm(lifecycle::RmArgs),
    /// Show a sandbox and what its agent reports.
    Info(lifecycle::InfoArgs),
    /// Pause sandboxes: processes frozen with their memory kept, sessions left open.
    Pause(power::PowerArgs),
    /// Resume paused sandboxes where they were.
    Resume(power::PowerArgs),
    /// Stop sandboxes: every process ends, the disk is kept.
    Stop(power::PowerArgs),
    /// Start stopped sandboxes again, their files as they were.
    Start(power::PowerArgs),
    /// Run a command in a sandbox.
    Exec(exec::ExecArgs),
    /// Open an interactive shell in a sandbox.
    Shell(shell::ShellArgs),
    /// Copy files or directories between this machine and a sandbox (`ID:/path`).
    Cp(cp::CpArgs),
    /// Run a command in a new sandbox that is deleted afterwards.
    Run(run::RunArgs),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Manage the relay's secret store: values sandboxes use by placeholder, never see.
    #[command(subcommand)]
    Secret(secret::SecretCommand),
    /// Mirror a local directory into a sandbox (`--watch` keeps it in sync), or pull one back.
    Sync(sync::SyncArgs),
    /// Carry local TCP ports to ports inside a sandbox.
    Forward(forward::ForwardArgs),
    /// Work on a local folder in its own sandbox: synced, ports forwarded, a shell.
    Dev(dev::DevArgs),
    /// Build and push sandbox images with the agent baked in.
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// Measure latency and throughput against a sandbox, next to this machine's floors.
    Bench(bench::BenchArgs),
    /// Serve sandboxes as MCP tools over stdio, or streamable HTTP with --listen.
    Mcp(crate::mcp::McpArgs),
}

/// Parses the arguments, runs the command, and returns the process's exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let code = dispatch(cli);
    let _ = std::io::stdout().flush();
    code
}

fn dispatch(cli: Cli) -> i32 {
    let relay = cli.relay.as_deref();
    match cli.command {
        Command::Serve(args) => done(serve::run(args)),
        Command::Create(args) => done(client(relay, |r| lifecycle::create(r, args))),
        Command::Ls(args) => done(client(relay, |r| lifecycle::ls(r, args))),
        Command::Rm(args) => done(client(relay, |r| lifecycle::rm(r, args))),
        Command::Info(args) => done(client(relay, |r| lifecycle::info(r, args))),
        Command::Pause(args) => done(client(relay, |r| power::run(r, args, Power::Pause))),
        Command::Resume(args) => done(client(relay, |r| power::run(r, args, Power::Resume))),
        Command::Stop(args) => done(client(relay, |r| power::run(r, args, Power::Stop))),
        Command::Start(args) => done(client(relay, |r| power::run(r, args, Power::Start))),
        Command::Token(cmd) => done(client(relay, |r| token::run(r, cmd))),
        Command::Secret(cmd) => done(client(relay, |r| secret::run(r, cmd))),
        Command::Cp(args) => done(client(relay, |r| interrupt::or_signal(cp::run(r, args)))),
        Command::Exec(args) => status(client(relay, |r| exec::run(r, args))),
        Command::Shell(args) => status(client(relay, |r| shell::run(r, args))),
        Command::Run(args) => status(run::run(relay, args)),
        Command::Sync(args) => done(client(relay, |r| sync::run(r, args))),
        Command::Forward(args) => done(client(relay, |r| forward::run(r, args))),
        Command::Dev(args) => status(client(relay, |r| dev::run(r, args))),
        Command::Image(cmd) => done(current_thread().and_then(|rt| block_on(rt, image::run(cmd)))),
        Command::Bench(args) => done(bench::run(relay, args)),
        Command::Mcp(args) => done(mcp(relay, args)),
    }
}

/// Runs a client command on a single-threaded runtime: a client does little at once, and
/// a multi-threaded runtime would cost a thread per core at startup.
fn client<T, F, Fut>(relay: Option<&str>, command: F) -> anyhow::Result<T>
where
    F: FnOnce(Remote) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    init_tracing(None);
    let remote = Remote::resolve(relay)?;
    block_on(current_thread()?, command(remote))
}

/// `tether mcp`: a server, on a multi-threaded runtime, logging to stderr (stdout may be
/// the MCP transport).
fn mcp(relay: Option<&str>, args: crate::mcp::McpArgs) -> anyhow::Result<()> {
    init_tracing(Some("warn"));
    let rest = Remote::resolve(relay)?.rest()?;
    let rt = tokio::runtime::Runtime::new()?;
    block_on(rt, crate::mcp::run(rest, args))
}

fn current_thread() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Runs `future` to completion, then abandons whatever is left (a stdin reader blocked in
/// `read`, a closing WebSocket) instead of waiting for it: the process is about to exit.
fn block_on<F: Future>(rt: tokio::runtime::Runtime, future: F) -> F::Output {
    let out = rt.block_on(future);
    rt.shutdown_background();
    out
}

/// Logging for commands that do not serve: silent unless `RUST_LOG` asks, or `default` is
/// given. Checking the variable first keeps the filter's setup off `exec`'s fast path.
fn init_tracing(default: Option<&str>) {
    let filter = match (std::env::var("RUST_LOG"), default) {
        (Ok(filter), _) => filter,
        (Err(_), Some(default)) => default.to_string(),
        (Err(_), None) => return,
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}

/// The exit status of a management command.
fn done(result: anyhow::Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            report(&e);
            match e.downcast_ref::<interrupt::Interrupted>() {
                Some(cut) => 128 + cut.signal,
                None => FAILED,
            }
        }
    }
}

/// The exit status of a command that runs a remote process (see the module docs).
fn status(result: anyhow::Result<i32>) -> i32 {
    match result {
        Ok(code) => code,
        Err(e) => {
            report(&e);
            exec::failure_status(&e).unwrap_or(EXEC_FAILED)
        }
    }
}

fn report(e: &anyhow::Error) {
    let _ = std::io::stdout().flush();
    // Errors carry sandbox text (agent messages, file names): escaped, never raw.
    eprintln!("tether: {}", tether_client::escape::escape_lines(&chain(e)));
}

/// The error and its causes on one line, each cause left out when the text before it
/// already says it (many errors quote their source), so nothing is said twice.
fn chain(e: &anyhow::Error) -> String {
    // A client error that reached here without a command's own explanation still gets the
    // CLI's advice.
    let said = |cause: &(dyn std::error::Error + 'static)| match cause.downcast_ref::<ClientError>()
    {
        Some(err) => crate::advice::sentence(err, None),
        None => cause.to_string(),
    };
    let mut text = said(e.as_ref());
    for cause in e.chain().skip(1) {
        let cause = said(cause);
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

/// Parses `KEY=VALUE`.
fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got `{s}`")),
    }
}

/// Parses a duration such as `30s`, `10m` or `1h30m`.
fn duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{e}: write a duration such as 30s, 10m or 2h"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_the_message_already_quotes_is_not_repeated() {
        let os = std::io::Error::from_raw_os_error(28);
        let inner = anyhow::anyhow!("{os}").context(format!("/w/big: {os}"));
        assert_eq!(chain(&inner), format!("/w/big: {os}"));
        let other = anyhow::anyhow!("disk full").context("writing /w/big");
        assert_eq!(chain(&other), "writing /w/big: disk full");
    }
    use clap::CommandFactory;

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn key_values_need_a_key() {
        assert_eq!(key_value("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert_eq!(key_value("a=").unwrap(), ("a".into(), String::new()));
        assert!(key_value("=b").is_err());
        assert!(key_value("ab").is_err());
    }

    #[test]
    fn exec_takes_the_command_after_the_id() {
        let cli = Cli::try_parse_from(["tether", "exec", "-i", "sb-1", "ls", "-la"]).unwrap();
        let Command::Exec(args) = cli.command else {
            panic!()
        };
        assert!(args.interactive);
        assert_eq!(args.id, "sb-1");
        assert_eq!(args.command, ["ls", "-la"]);
        let cli = Cli::try_parse_from(["tether", "exec", "sb-1", "--", "ls", "-t"]).unwrap();
        let Command::Exec(args) = cli.command else {
            panic!()
        };
        assert!(!args.tty);
        assert_eq!(args.command, ["ls", "-t"]);
    }
}

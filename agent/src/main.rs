//! `tether-agent`: runs inside every sandbox and serves command execution, terminals, files
//! and port forwarding to Tether clients over one WebSocket per connection.
//!
//! # Layout
//! - `serve`: where connections come from (TCP, inherited Unix socket, stdio, dial-out).
//! - `conn`: one connection: handshake and the frame multiplexer.
//! - `stream`: what an operation sees of its stream (credit-aware send, input, commands).
//! - `ops`: routes an opened stream to the module that owns its operation.
//! - `exec`, `pty`, `process`, `replay`, `reaper`: processes, terminals, replay rings, reaping.
//! - `files`: file operations, transfers, tar, search and watch.
//! - `forward`: TCP port forwarding and listening ports. `info`: facts about the machine.
//! - `pid1`: PID-1 duties (SIGTERM, OOM shield). `sys`: the only unsafe code. `users`: passwd.

/// The allocator of the static agent (see `Cargo.toml`): musl's maps and unmaps every buffer
/// over 128 KiB, so each data frame cost page faults and zeroing.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod agent;
mod budget;
mod conn;
mod exec;
mod files;
mod forward;
mod info;
mod mounts;
mod ops;
mod output;
mod pid1;
mod process;
mod pty;
mod reaper;
mod replay;
mod serve;
mod signal;
mod spawn;
mod stream;
mod sys;
mod users;
mod ws_out;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

/// The environment variable the token may come from; removed before any process starts.
const TOKEN_ENV: &str = "TETHER_AGENT_TOKEN";
/// [`TOKEN_ENV`] for libc.
const TOKEN_ENV_C: &std::ffi::CStr = c"TETHER_AGENT_TOKEN";

#[derive(Parser)]
#[command(name = "tether-agent", version, about = "Tether's in-sandbox agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[allow(
    clippy::large_enum_variant,
    reason = "parsed once at start and matched at once: boxing would save nothing"
)]
#[derive(Subcommand)]
enum Command {
    /// Serve the Tether protocol.
    Serve(ServeArgs),
    /// Print the agent and protocol versions.
    Version,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Listen for WebSocket connections on this TCP address (repeatable).
    #[arg(long, value_name = "ADDR")]
    listen: Vec<SocketAddr>,
    /// Listen for WebSocket connections on a Unix socket created at this path, readable and
    /// writable by the agent's user only (repeatable).
    #[arg(long, value_name = "PATH")]
    listen_unix: Vec<PathBuf>,
    /// Accept connections on this inherited, listening Unix socket descriptor.
    #[arg(long, value_name = "FD")]
    listen_fd: Option<i32>,
    /// Serve the one connection on this inherited, connected socket descriptor.
    #[arg(long, value_name = "FD")]
    conn_fd: Option<i32>,
    /// Serve one connection over stdin/stdout.
    #[arg(long)]
    stdio: bool,
    /// Dial out to a relay at this ws:// URL, reconnecting with backoff.
    #[arg(long, value_name = "URL")]
    connect: Option<String>,
    /// The sandbox token (prefer the TETHER_AGENT_TOKEN variable or --token-file: flags
    /// are visible in the process list).
    #[arg(long)]
    token: Option<String>,
    /// Read the token from this file.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Serve without a token. Refused unless every listener is on loopback.
    #[arg(long)]
    insecure_no_token: bool,
    /// Default working directory for processes and relative paths.
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// The user (name or uid) commands run as when their request names none, like an image's
    /// USER; the agent itself keeps running as root.
    #[arg(long, value_name = "USER")]
    user: Option<String>,
    /// Replay ring capacity per output channel of each process, in bytes.
    #[arg(long, default_value_t = tether_proto::limits::DEFAULT_RING)]
    ring_bytes: usize,
    /// Worker threads (0: one per CPU; 1: a single-threaded runtime, the lowest latency).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn main() -> anyhow::Result<()> {
    // Before any thread or child exists: no sandbox process may read this one's memory,
    // environment or descriptors, and the token leaves the environment block for good.
    if let Err(e) = sys::make_undumpable() {
        eprintln!("tether-agent: cannot make the agent undumpable: {e}");
    }
    let env_token = std::env::var(TOKEN_ENV).ok();
    sys::scrub_env(TOKEN_ENV_C);

    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!(
                "tether-agent {} (protocol {})",
                tether_proto::TETHER_VERSION,
                tether_proto::PROTOCOL_VERSION
            );
            Ok(())
        }
        Command::Serve(args) => serve(args, env_token),
    }
}

fn serve(args: ServeArgs, env_token: Option<String>) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TETHER_LOG")
                .unwrap_or_else(|_| "tether_agent=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let token = match (&args.token, &args.token_file, env_token) {
        (Some(t), _, _) => Some(t.clone()),
        (None, Some(path), _) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read token file {}", path.display()))?
                .trim()
                .to_string(),
        ),
        (None, None, Some(t)) => Some(t),
        (None, None, None) => None,
    };
    let token = match token {
        Some(t) if t.is_empty() => bail!("the token is empty; set {TOKEN_ENV} or pass --token-file"),
        Some(t) => Some(t),
        None if args.insecure_no_token => {
            let remote = args.listen.iter().any(|a| !a.ip().is_loopback())
                || args.connect.is_some()
                || args.listen_fd.is_some()
                || !args.listen_unix.is_empty()
                || args.conn_fd.is_some();
            if remote {
                bail!("--insecure-no-token is only allowed when every listener is on loopback (e.g. --listen 127.0.0.1:7421)");
            }
            None
        }
        None => bail!(
            "no token: set {TOKEN_ENV}, or pass --token-file PATH (or --insecure-no-token for a loopback-only development listener)"
        ),
    };
    if args.listen.is_empty()
        && args.listen_unix.is_empty()
        && args.listen_fd.is_none()
        && args.conn_fd.is_none()
        && !args.stdio
        && args.connect.is_none()
    {
        bail!("nothing to serve: pass --listen ADDR, --listen-unix PATH, --listen-fd FD, --conn-fd FD, --stdio or --connect URL");
    }

    let workdir = match args.workdir {
        Some(d) => d,
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
    };
    if let Some(user) = &args.user {
        if users::lookup(user).is_none() {
            bail!("--user {user}: no such user in /etc/passwd; give an existing name or a numeric uid");
        }
    }
    let listen_fd = args.listen_fd.map(sys::adopt_fd).transpose()?;
    let conn_fd = args.conn_fd.map(sys::adopt_fd).transpose()?;

    pid1::shield_from_oom();
    let mut builder = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if args.threads > 1 {
            b.worker_threads(args.threads);
        }
        b
    };
    let runtime = builder.enable_all().build()?;
    runtime.block_on(async move {
        let agent = Arc::new(agent::Agent {
            token,
            workdir,
            default_user: args.user,
            ring_bytes: args.ring_bytes.max(4096),
            processes: process::Processes::start(),
            budget: budget::Budget::for_this_process(),
        });
        tokio::spawn(pid1::shutdown_on_signal(agent.clone()));

        let mut tasks = tokio::task::JoinSet::new();
        for addr in args.listen {
            tasks.spawn(serve::tcp(addr, agent.clone()));
        }
        for path in args.listen_unix {
            tasks.spawn(serve::unix_path(path, agent.clone()));
        }
        if let Some(fd) = listen_fd {
            tasks.spawn(serve::unix_listener(fd, agent.clone()));
        }
        if let Some(url) = args.connect {
            tasks.spawn(serve::dial(url, agent.clone()));
        }
        // One-connection modes end the agent when their connection ends.
        if let Some(fd) = conn_fd {
            return serve::unix_conn(fd, agent).await;
        }
        if args.stdio {
            return serve::stdio(agent).await;
        }
        match tasks.join_next().await {
            Some(Ok(r)) => r,
            Some(Err(e)) => Err(e.into()),
            None => Ok(()),
        }
    })
}

//! `tether mcp`: an MCP server that gives any MCP host (Claude Code, Claude Desktop, Cursor,
//! an agent framework) sandboxes on whatever providers the relay serves, over stdio or
//! streamable HTTP, built on the official Rust SDK (`rmcp`).
//!
//! # Layout
//! - [`tools`]: the tool surface (names, descriptions, schemas) routed to the modules below;
//!   `args`: arguments the schema refuses become tool errors the model can read;
//! - `sandboxes`: create, list, delete, info; `exec`: a command to completion;
//! - `sessions`: exec sessions on the agent's background processes (start, poll by cursor,
//!   stdin, signals); `exec_session`: one of them, its reading task and re-attaching; its
//!   output held in a `buffer` that loses nothing;
//! - `files`: read by lines, write, edit, ls, glob, grep; `transfer`: upload and download
//!   under the allowed host directories (`allow`);
//! - `connections`: one protocol session per sandbox, shared; `text`: bytes from a sandbox
//!   made into bounded text; `error`: typed tool errors; `http`: the HTTP transport and its
//!   token; `constants`: the tunables.
//!
//! The CLI calls [`run`]; nothing else here is used from outside.

mod allow;
mod args;
mod buffer;
mod connections;
mod constants;
mod error;
mod exec;
mod exec_session;
mod files;
mod http;
mod sandboxes;
mod sessions;
mod text;
pub(crate) mod tools;
mod transfer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use tether_client::RelayClient;

use self::allow::AllowedDirs;
use self::connections::Connections;
use self::sessions::ExecSessions;

/// How long stopping may take to kill the exec sessions' processes.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

/// `tether mcp`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct McpArgs {
    /// Serve streamable HTTP on this address (e.g. 127.0.0.1:7421) at /mcp instead of
    /// stdio. Clients must send `Authorization: Bearer TOKEN`: the token is the content of
    /// --token-file, else TETHER_MCP_TOKEN, else generated and written to mcp.token in the
    /// relay's data directory.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// A file holding the HTTP bearer token (with --listen).
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub token_file: Option<PathBuf>,
    /// A host directory that `upload` may read from and `download` may write to
    /// (repeatable). Without one, those two tools are refused.
    #[arg(long = "allow-dir", value_name = "DIR")]
    pub allow_dirs: Vec<PathBuf>,
}

/// What every MCP connection of this process shares: the relay, one protocol session per
/// sandbox, the exec sessions, and the allowed host directories.
#[derive(Debug)]
pub(crate) struct Server {
    connections: Arc<Connections>,
    sessions: ExecSessions,
    allowed: AllowedDirs,
}

/// Serves MCP until the client goes (stdio) or SIGINT/SIGTERM (both), then kills the exec
/// sessions' processes that still run, since nobody could follow them any more.
pub(crate) async fn run(relay: RelayClient, args: McpArgs) -> anyhow::Result<()> {
    let allowed = AllowedDirs::new(&args.allow_dirs)?;
    let connections = Arc::new(Connections::new(relay));
    connections.sweep_idle();
    let server = Arc::new(Server {
        sessions: ExecSessions::new(connections.clone()),
        connections,
        allowed,
    });
    let stop = CancellationToken::new();
    tokio::spawn(stop_on_signal(stop.clone()));
    let served = match args.listen {
        Some(listen) => {
            let (token, source) = http::resolve_token(args.token_file.as_deref())?;
            http::serve(server.clone(), listen, token, &source, stop).await
        }
        None => serve_stdio(server.clone(), stop).await,
    };
    server.sessions.shutdown(SHUTDOWN_LIMIT).await;
    served
}

async fn serve_stdio(server: Arc<Server>, stop: CancellationToken) -> anyhow::Result<()> {
    let running = tools::Tools::new(server)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("the MCP client did not complete the handshake: {e}"))?;
    let cancel = running.cancellation_token();
    tokio::select! {
        done = running.waiting() => { done?; }
        () = stop.cancelled() => cancel.cancel(),
    }
    Ok(())
}

async fn stop_on_signal(stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    stop.cancel();
}

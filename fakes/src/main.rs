//! `tether-fake`: runs one fake provider on this machine, so a provider flow can be tried
//! without an account. See `fakes/README.md`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tether_fakes::sandboxes::Sandboxes;

/// The API key the fake E2B accepts unless told otherwise.
const DEFAULT_E2B_KEY: &str = "e2b_fake_key";
/// The API key the fake Daytona accepts unless told otherwise.
const DEFAULT_DAYTONA_KEY: &str = "dtn_fake_key";
/// The API key the fake Runloop accepts unless told otherwise.
const DEFAULT_RUNLOOP_KEY: &str = "ak_fake_key";

#[derive(Parser)]
#[command(
    name = "tether-fake",
    about = "Local fakes of E2B, Daytona, Modal and Runloop for Tether"
)]
struct Cli {
    #[command(subcommand)]
    provider: Fake,
}

#[derive(Subcommand)]
enum Fake {
    /// A fake E2B: control plane, envd and edge on one address.
    E2b {
        #[command(flatten)]
        common: Common,
        /// The only API key accepted [env: E2B_API_KEY] [default: e2b_fake_key].
        #[arg(long)]
        api_key: Option<String>,
        /// The `domain` reported for sandboxes (by default none: clients use E2B_DOMAIN).
        #[arg(long)]
        domain: Option<String>,
        /// Serve the older route set of E2B's public infra (self-hosted): no
        /// `POST /v2/sandboxes`, no `connect`.
        #[arg(long)]
        legacy_routes: bool,
        /// The most sandboxes one list page holds (E2B's largest `limit` is 100).
        #[arg(long, default_value_t = 100)]
        page_size: usize,
    },
    /// A fake Daytona: REST API under /api, preview listeners per sandbox port.
    Daytona {
        #[command(flatten)]
        common: Common,
        /// The only API key accepted [env: DAYTONA_API_KEY] [default: dtn_fake_key].
        #[arg(long)]
        api_key: Option<String>,
        /// The exec-form ENTRYPOINT of every named snapshot.
        #[arg(long, num_args = 1.., default_values_t = ["tether-agent".to_string(), "serve".to_string(), "--listen".to_string(), "0.0.0.0:7421".to_string()])]
        entrypoint: Vec<String>,
        /// Refused credentials (API or preview proxy) within a minute that get the caller
        /// answered 429 for a minute, as Daytona's failed-auth limiter does; 0 turns it off.
        #[arg(long, default_value_t = tether_fakes::daytona::limiter::DEFAULT_LIMIT)]
        failed_auth_limit: u32,
        /// Serve the older route set of Daytona's last public server (self-hosted): no TTL
        /// route.
        #[arg(long)]
        legacy_routes: bool,
        /// The most sandboxes one list page holds (Daytona's largest `limit` is 200).
        #[arg(long, default_value_t = 200)]
        page_size: usize,
    },
    /// A fake Modal: gRPC (h2c) and /__fake controls on one address, a listener per tunnel.
    Modal {
        #[command(flatten)]
        common: Common,
        /// The only token id accepted [env: MODAL_TOKEN_ID] [default: ak-fake].
        #[arg(long)]
        token_id: Option<String>,
        /// Its secret [env: MODAL_TOKEN_SECRET] [default: as-fake].
        #[arg(long)]
        token_secret: Option<String>,
        /// Blobs larger than this many bytes are uploaded in parts of this size.
        #[arg(long, default_value_t = tether_fakes::modal::DEFAULT_BLOB_PART_BYTES)]
        blob_part_bytes: u64,
        /// The most sandboxes one SandboxList answer holds.
        #[arg(long, default_value_t = tether_fakes::modal::DEFAULT_PAGE_SIZE)]
        page_size: usize,
    },
    /// A fake Runloop: REST API under /v1 and every V2 tunnel (by Host) on one address.
    Runloop {
        #[command(flatten)]
        common: Common,
        /// The only API key accepted [env: RUNLOOP_API_KEY] [default: ak_fake_key].
        #[arg(long)]
        api_key: Option<String>,
    },
}

#[derive(clap::Args)]
struct Common {
    /// Where to serve (port 0 picks one; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where the local sandboxes live.
    #[arg(long)]
    data_dir: PathBuf,
    /// The `tether-agent` binary to run in sandboxes [env: TETHER_AGENT_BIN] [default: next
    /// to this binary].
    #[arg(long)]
    agent_bin: Option<PathBuf>,
    /// An address on this host every sandbox reaches at its own 127.0.0.1, same port (a
    /// relay's egress listener, for tests); repeatable. Sandboxes have no other network.
    #[arg(long = "sandbox-reach", value_name = "ADDR")]
    sandbox_reach: Vec<SocketAddr>,
}

impl Common {
    fn sandboxes(&self) -> anyhow::Result<Arc<Sandboxes>> {
        let agent = match self
            .agent_bin
            .clone()
            .or_else(|| std::env::var_os("TETHER_AGENT_BIN").map(PathBuf::from))
        {
            Some(path) => path,
            None => std::env::current_exe()
                .context("cannot find this binary")?
                .with_file_name("tether-agent"),
        };
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("cannot create {}", self.data_dir.display()))?;
        Ok(Arc::new(Sandboxes::reaching(
            self.data_dir.clone(),
            agent,
            self.sandbox_reach.clone(),
        )))
    }
}

fn main() -> anyhow::Result<()> {
    // The local provider re-executes this binary to build each sandbox.
    tether_local::run_if_sandbox_init();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TETHER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        match cli.provider {
            Fake::E2b {
                common,
                api_key,
                domain,
                legacy_routes,
                page_size,
            } => {
                let api_key = api_key
                    .or_else(|| std::env::var("E2B_API_KEY").ok())
                    .unwrap_or_else(|| DEFAULT_E2B_KEY.to_string());
                let config = tether_fakes::e2b::Config {
                    api_key,
                    domain,
                    legacy_routes,
                    page_size: page_size.max(1),
                };
                let sandboxes = common.sandboxes()?;
                let fake = tether_fakes::e2b::E2b::new(config, sandboxes.clone());
                tether_fakes::serve::run(common.listen, fake.router(), sandboxes).await
            }
            Fake::Modal {
                common,
                token_id,
                token_secret,
                blob_part_bytes,
                page_size,
            } => {
                let env = |var: &str, default: &str| {
                    std::env::var(var).unwrap_or_else(|_| default.to_string())
                };
                let mut config = tether_fakes::modal::Config::new(
                    token_id.unwrap_or_else(|| env("MODAL_TOKEN_ID", "ak-fake")),
                    token_secret.unwrap_or_else(|| env("MODAL_TOKEN_SECRET", "as-fake")),
                );
                if blob_part_bytes == 0 {
                    anyhow::bail!("--blob-part-bytes must be at least 1");
                }
                config.blob_part_bytes = blob_part_bytes;
                config.page_size = page_size.max(1);
                let sandboxes = common.sandboxes()?;
                let fake = tether_fakes::modal::Modal::new(config, sandboxes.clone());
                tether_fakes::serve::run(common.listen, fake.router(), sandboxes).await
            }
            Fake::Runloop { common, api_key } => {
                let api_key = api_key
                    .or_else(|| std::env::var("RUNLOOP_API_KEY").ok())
                    .unwrap_or_else(|| DEFAULT_RUNLOOP_KEY.to_string());
                let config = tether_fakes::runloop::Config { api_key };
                let sandboxes = common.sandboxes()?;
                let fake = tether_fakes::runloop::Runloop::new(config, sandboxes.clone());
                tether_fakes::serve::run(common.listen, fake.router(), sandboxes).await
            }
            Fake::Daytona {
                common,
                api_key,
                entrypoint,
                failed_auth_limit,
                legacy_routes,
                page_size,
            } => {
                let api_key = api_key
                    .or_else(|| std::env::var("DAYTONA_API_KEY").ok())
                    .unwrap_or_else(|| DEFAULT_DAYTONA_KEY.to_string());
                let config = tether_fakes::daytona::Config {
                    api_key,
                    entrypoint,
                    failed_auth_limit,
                    legacy_routes,
                    page_size: page_size.max(1),
                };
                let sandboxes = common.sandboxes()?;
                let fake = tether_fakes::daytona::Daytona::new(config, sandboxes.clone());
                tether_fakes::serve::run(common.listen, fake.router(), sandboxes).await
            }
        }
    })
}

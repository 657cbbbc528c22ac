//! `tether bench`: measures a sandbox through a relay next to this machine's floors, and
//! prints the figures as tables or as JSON (the measuring is in [`crate::bench`]).
//!
//! The relay is chosen as `tether run` chooses it: the configured one, else the local one if
//! it answers, else a private one started for the run.

use std::io::Write;

use anyhow::Context;
use clap::Args;

use super::embedded::{self, Source};
use super::serve;
use crate::bench::{self, Endpoint, Options, RelayChoice};
use tether_client::local::data_dir as default_data_dir;

/// The file, in the local relay's data directory, holding its admin token.
const ADMIN_TOKEN_FILE: &str = "admin.token";

/// `tether bench`.
#[derive(Debug, Args)]
pub(super) struct BenchArgs {
    /// The sandbox to measure; a fresh local one, deleted afterwards, when absent.
    #[arg(value_name = "ID")]
    id: Option<String>,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    json: bool,
    /// Small sizes and few iterations: checks that every figure can be measured, in well
    /// under a minute; its timings mean little.
    #[arg(long)]
    quick: bool,
    /// Always start a private relay for the run, even if one is configured or running.
    #[arg(long)]
    embedded: bool,
    /// Idle terminal sessions to open for the figures marked 7 (default: 10,000, or 100 with
    /// --quick). They are spread over sandboxes of 1,000, and need as many PTYs.
    #[arg(long, value_name = "N")]
    sessions: Option<usize>,
    /// Measure the data path (exec, keystrokes, stdout, transfers) a second time straight to
    /// an agent in the same sandbox, so that what the relay costs is a figure of its own.
    /// Needs the bench's own relay (a fresh local sandbox).
    #[arg(long)]
    direct: bool,
}

/// Runs the bench and prints its report. Fails when a figure could not be measured; a
/// missed target is printed, never a failure.
pub(super) fn run(relay: Option<&str>, args: BenchArgs) -> anyhow::Result<()> {
    let env = std::env::var("TETHER_RELAY").ok();
    let relay = match embedded::choose(relay, env.as_deref(), args.embedded, embedded::answers)? {
        Source::Configured(url) | Source::Running(url) => RelayChoice::At(Endpoint {
            url: url.trim_end_matches('/').to_string(),
            token: token(),
        }),
        Source::Embedded if args.id.is_some() => anyhow::bail!(
            "no relay is configured or running, so sandbox {} cannot be reached: start the \
             relay that holds it, or run `tether bench` without an id to measure a fresh one",
            args.id.unwrap_or_default()
        ),
        Source::Embedded => RelayChoice::Private,
    };
    super::init_tracing(None);
    let options = Options {
        relay,
        sandbox: args.id,
        quick: args.quick,
        tether: std::env::current_exe().context("cannot find the tether executable's path")?,
        agent_binary: serve::agent_binary().ok(),
        sessions: args.sessions,
        direct: args.direct,
    };
    let progress = |step: &str| eprintln!("tether bench: {step}");
    let report = super::block_on(super::current_thread()?, bench::run(options, &progress))?;

    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &report)?;
        writeln!(stdout)?;
    } else {
        write!(stdout, "{}", report.text())?;
    }
    stdout.flush()?;
    let failed: Vec<&str> = report.failures().map(|f| f.key).collect();
    anyhow::ensure!(
        failed.is_empty(),
        "{} could not be measured (see above)",
        failed.join(", ")
    );
    Ok(())
}

/// `TETHER_TOKEN`, else the local relay's admin token, as every client command finds it.
fn token() -> Option<String> {
    std::env::var("TETHER_TOKEN").ok().or_else(|| {
        std::fs::read_to_string(default_data_dir().join(ADMIN_TOKEN_FILE))
            .ok()
            .map(|t| t.trim().to_string())
    })
}

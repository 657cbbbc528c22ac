//! `tether sync`: a local directory mirrored into a sandbox, once or (`--watch`) as it
//! changes, or a sandbox directory pulled here once. The engine is [`crate::sync`]; this
//! file checks the two sides ([`super::location`]), chooses compression, and wires Ctrl-C.

use std::sync::Arc;

use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;

use super::location::Location;
use super::remote::Remote;
use crate::sync::{self, Format, Reporter, SyncSpec};
use tether_client::hostfs::ModePolicy;
use tether_client::RelayClient;

/// `tether sync`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  tether sync . sb-1a2b:/workspace --watch\n  \
                        tether sync ./site sb-1a2b:/srv/site --exclude '*.psd'\n  \
                        tether sync sb-1a2b:/workspace/out ./out\n\n\
                        The local side wins: the sandbox ends up holding the local tree. A file \
                        changed in the sandbox since the last sync is kept beside it as \
                        NAME.tether-conflict-TIME instead of being overwritten or deleted. \
                        Paths ignored by .gitignore or --exclude (and .git) are left alone on \
                        both sides."
)]
pub(super) struct SyncArgs {
    /// From: a local directory, or ID:/path in a sandbox (a pull).
    #[arg(value_name = "SRC")]
    src: String,
    /// To: ID:/path in a sandbox, or a local directory (a pull).
    #[arg(value_name = "DST")]
    dst: String,
    /// Keep pushing local changes as they happen, until Ctrl-C.
    #[arg(long, short)]
    watch: bool,
    /// Leave paths matching this gitignore-style pattern alone; repeatable. `!PATTERN`
    /// syncs what a .gitignore excludes.
    #[arg(long = "exclude", short = 'x', value_name = "PATTERN")]
    excludes: Vec<String>,
    /// Gzip pushes: `auto` does unless the relay is on this machine.
    #[arg(long, value_enum, default_value_t = Compress::Auto)]
    compress: Compress,
    /// Print status as JSON lines on stdout.
    #[arg(long)]
    json: bool,
    /// On a pull, keep the setuid, setgid and sticky bits of files from the sandbox
    /// (dropped by default).
    #[arg(long)]
    preserve_mode: bool,
}

/// Whether pushes are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Compress {
    /// Gzip unless the relay is on a loopback address (bandwidth there is free, CPU is not).
    Auto,
    /// Always gzip.
    Always,
    /// Never.
    Never,
}

pub(super) async fn run(remote: Remote, args: SyncArgs) -> anyhow::Result<()> {
    let reporter = Reporter::new(if args.json {
        Format::Json
    } else {
        Format::Human
    });
    let rest = remote.rest()?;
    match (Location::parse(&args.src), Location::parse(&args.dst)) {
        (Location::Local(local), Location::Remote { id, path }) => {
            let spec = SyncSpec {
                sandbox: id.clone(),
                local,
                remote: path,
                excludes: args.excludes,
                gzip: gzip(args.compress, &rest),
                modes: ModePolicy::from_flag(args.preserve_mode),
            };
            if args.watch {
                let stop = CancellationToken::new();
                let on_signal = stop.clone();
                tokio::spawn(async move {
                    let _ = tokio::signal::ctrl_c().await;
                    on_signal.cancel();
                });
                sync::watch(connector(rest, id), spec, reporter, stop).await?;
            } else {
                let session = remote.connect(&id).await?;
                sync::push(&session, &spec, &reporter).await?;
            }
            Ok(())
        }
        (Location::Remote { id, path }, Location::Local(local)) => {
            anyhow::ensure!(
                !args.watch,
                "--watch pushes local changes; a pull is one-shot"
            );
            let spec = SyncSpec {
                sandbox: id.clone(),
                local,
                remote: path,
                excludes: args.excludes,
                gzip: false,
                modes: ModePolicy::from_flag(args.preserve_mode),
            };
            let session = remote.connect(&id).await?;
            let pull = async { Ok(sync::pull(&session, &spec, &reporter).await.map(drop)?) };
            super::interrupt::or_signal(pull).await
        }
        (Location::Remote { .. }, Location::Remote { .. }) => {
            anyhow::bail!("both sides are in sandboxes: one side of a sync is a local directory")
        }
        (Location::Local(_), Location::Local(_)) => anyhow::bail!(
            "neither side is in a sandbox: write one side as ID:/path (see `tether ls`)"
        ),
    }
}

/// Opens sessions to sandbox `id`, now and after every lost connection.
pub(super) fn connector(rest: RelayClient, id: String) -> sync::Connect {
    Arc::new(move || {
        let (rest, id) = (rest.clone(), id.clone());
        Box::pin(async move { rest.connect(&id).await })
    })
}

/// Whether to gzip pushes to the relay `rest` talks to.
pub(super) fn gzip(choice: Compress, rest: &RelayClient) -> bool {
    match choice {
        Compress::Always => true,
        Compress::Never => false,
        Compress::Auto => !is_loopback(rest.base()),
    }
}

/// Whether the URL's host is this machine.
fn is_loopback(url: &str) -> bool {
    let host = url.split("://").nth(1).unwrap_or(url);
    let host = host.split('/').next().unwrap_or(host);
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    host == "localhost"
        || host.ends_with(".localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_relays_are_recognised() {
        assert!(is_loopback("http://127.0.0.1:7420"));
        assert!(is_loopback("http://localhost:7420/"));
        assert!(is_loopback("http://[::1]:7420"));
        assert!(!is_loopback("https://relay.example.com"));
        assert!(!is_loopback("http://10.0.0.2:7420"));
    }
}

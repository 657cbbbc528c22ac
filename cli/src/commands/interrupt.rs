//! Transfers cut by a signal. SIGINT, SIGTERM or SIGHUP during `tether cp` or a `tether
//! sync` pull ends the transfer at once, removes the temporary files of what had not
//! landed yet ([`hostfs::landing::abandon`]), and exits with 128 + the signal, like a shell.
//! The default action would kill the process before any guard could clean up.

use std::future::Future;

use anyhow::Context;
use tether_client::hostfs;
use tokio::signal::unix::{signal, SignalKind};

/// The transfer was ended by a signal; nothing partial was left behind.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by {name}; files not yet complete were removed")]
pub(super) struct Interrupted {
    /// The signal's number.
    pub(super) signal: i32,
    name: &'static str,
}

/// Runs `transfer` until it ends or a SIGINT, SIGTERM or SIGHUP arrives.
pub(super) async fn or_signal<T>(
    transfer: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let watch = |kind: SignalKind| signal(kind).context("cannot install a signal handler");
    let (mut int, mut term, mut hup) = (
        watch(SignalKind::interrupt())?,
        watch(SignalKind::terminate())?,
        watch(SignalKind::hangup())?,
    );
    let (signal, name) = tokio::select! {
        done = transfer => return done,
        _ = int.recv() => (libc::SIGINT, "SIGINT"),
        _ = term.recv() => (libc::SIGTERM, "SIGTERM"),
        _ = hup.recv() => (libc::SIGHUP, "SIGHUP"),
    };
    // The transfer future is dropped here; its writer may still be running on a blocking
    // thread, so its temporary files are removed (and new ones refused) explicitly.
    hostfs::landing::abandon();
    Err(Interrupted { signal, name }.into())
}

//! The listener a fake runs on, and its readiness line: `listening http://ADDR` on stdout
//! once it accepts connections, so scripts and tests wait on a line, not a sleep.

use std::net::SocketAddr;

use anyhow::Context;
use axum::Router;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::sandboxes::Sandboxes;

/// Serves `router` on `listen` (port 0 picks one) until SIGINT or SIGTERM, then removes
/// every sandbox in `sandboxes`.
pub async fn run(
    listen: SocketAddr,
    router: Router,
    sandboxes: Arc<Sandboxes>,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    println!("listening http://{addr}");
    let served = tokio::select! {
        served = axum::serve(listener, router) => served.context("the fake's server failed"),
        signal = stop_signal() => signal,
    };
    sandboxes.delete_all().await;
    served
}

async fn stop_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    tokio::select! {
        ctrl_c = tokio::signal::ctrl_c() => ctrl_c.context("cannot watch for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}

/// Now as RFC 3339 with seconds, as the providers write times.
pub(crate) fn rfc3339(at: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

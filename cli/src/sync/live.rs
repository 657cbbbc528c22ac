//! `--watch`: keeps the sandbox mirroring the local tree until stopped. An initial
//! converge, then one push per batch of local changes; when the connection drops, it
//! reconnects with exponential backoff and converges again, so changes made while
//! disconnected are not lost (the rescan finds them, whatever the notifications said).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::constants::{BASELINE_SAVE_INTERVAL, RECONNECT_MAX, RECONNECT_MIN};
use super::engine::Engine;
use super::error::SyncError;
use super::report::{Phase, Reporter};
use super::watch::Watcher;
use super::SyncSpec;
use tether_client::{ClientError, Session};

/// Opens a new session to the sandbox; called again after every lost connection.
pub(crate) type Connect = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<Session, ClientError>> + Send>> + Send + Sync,
>;

/// Mirrors `spec` until `stop` fires. Fails only if the first sync cannot be done, or the
/// sandbox is gone.
pub(crate) async fn watch(
    connect: Connect,
    spec: SyncSpec,
    reporter: Reporter,
    stop: CancellationToken,
) -> Result<(), SyncError> {
    let mut engine = Engine::new(&spec, reporter.clone())?;
    // Watching starts before the first scan, so nothing changed meanwhile is missed.
    let mut watcher = Watcher::start(engine.local())?;
    engine.watch_with(watcher.dirs());
    let mut session = connect()
        .await
        .map_err(SyncError::remote("connecting to the sandbox"))?;
    let mut due = Some(Phase::Initial);
    let mut saved = Instant::now();
    loop {
        let phase = due.take();
        let result = tokio::select! {
            _ = stop.cancelled() => break,
            result = async {
                match phase {
                    Some(phase) => engine.converge(&session, phase).await,
                    None => match watcher.next().await {
                        Some(changes) => engine.apply(&session, changes).await,
                        None => Err(SyncError::Watch {
                            path: engine.local().to_path_buf(),
                            reason: "the watcher stopped".into(),
                        }),
                    },
                }
            } => result,
        };
        for problem in watcher.take_problems() {
            reporter.problem(&problem);
        }
        match result {
            Ok(_) if phase == Some(Phase::Initial) => {
                engine.save();
                let remote = format!("{}:{}", spec.sandbox, spec.remote);
                reporter.watching(&engine.local().display().to_string(), &remote);
            }
            Ok(_) => {}
            Err(e) if e.is_disconnect() => {
                let Some(back) = reconnect(&connect, &reporter, &stop, &e).await? else {
                    break;
                };
                session = back;
                watcher.drain();
                due = Some(if phase == Some(Phase::Initial) {
                    Phase::Initial
                } else {
                    Phase::Rescan
                });
            }
            Err(e) if phase == Some(Phase::Initial) => return Err(e),
            Err(e) => reporter.problem(&e.to_string()),
        }
        if engine.unsaved() && saved.elapsed() >= BASELINE_SAVE_INTERVAL {
            engine.save();
            saved = Instant::now();
        }
    }
    engine.save();
    Ok(())
}

/// Reconnects with exponential backoff; `None` if stopped meanwhile. A sandbox that is
/// gone, or a token that is refused, ends the sync.
async fn reconnect(
    connect: &Connect,
    reporter: &Reporter,
    stop: &CancellationToken,
    cause: &SyncError,
) -> Result<Option<Session>, SyncError> {
    let mut delay = RECONNECT_MIN;
    let mut reason = cause.to_string();
    loop {
        reporter.disconnected(&reason, delay);
        tokio::select! {
            _ = stop.cancelled() => return Ok(None),
            _ = tokio::time::sleep(delay) => {}
        }
        match connect().await {
            Ok(session) => {
                reporter.reconnected();
                return Ok(Some(session));
            }
            Err(
                e @ ClientError::Http {
                    status: 401 | 403 | 404,
                    ..
                },
            ) => return Err(SyncError::remote("reconnecting to the sandbox")(e)),
            Err(e) => reason = e.to_string(),
        }
        delay = (delay * 2).min(RECONNECT_MAX);
    }
}

//! Serving HTTP/1.1 connections so that slow or silent clients cannot crowd out the rest
//! (slowloris): every request head must arrive within the header timeout (`tether serve
//! --header-timeout`; an idle keep-alive connection waits for its next head under the same
//! timeout), and at most `--max-connections` connections are served at once. At the cap, the
//! oldest connection that has not yet sent a complete request head is closed to make room,
//! so a flood of half-open requests delays a real one by one eviction, not by a timeout. When
//! every connection is busy with a request, new ones wait in the kernel's backlog.
//!
//! A connection upgraded to a WebSocket leaves this count when hyper hands it over: tunnels
//! are bounded by the descriptor budget and the per-sandbox cap instead.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

/// How the relay bounds its connections and their peers.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// A tunnel's client or agent silent this long (not even answering pings) is taken for
    /// dead and its tunnel closed.
    pub peer_timeout: Duration,
    /// How long a client may take to send a request head, or a TLS handshake.
    pub header_timeout: Duration,
    /// How long an API request's body may take to arrive once its head has (see `bodies`).
    pub body_timeout: Duration,
    /// HTTP connections served at once; `None` derives it from the descriptor limit.
    pub max_connections: Option<usize>,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            peer_timeout: super::constants::DEFAULT_PEER_TIMEOUT,
            header_timeout: super::constants::DEFAULT_HEADER_TIMEOUT,
            body_timeout: super::constants::DEFAULT_BODY_TIMEOUT,
            max_connections: None,
        }
    }
}

/// The connection cap for a process that may open `fd_limit` descriptors: each connection
/// may become a tunnel, which holds two (the client's and the agent's), and the budget's
/// reserve stays free.
pub(super) fn default_max_connections(fd_limit: u64) -> usize {
    let usable = fd_limit.saturating_sub(super::fds::RESERVE_FDS) / 2;
    usize::try_from(usable).unwrap_or(usize::MAX).max(1)
}

/// One connection, as the accept loop sees it.
struct Slot {
    /// Set when its first request head has arrived: from then on it is never evicted.
    served: AtomicBool,
    /// Fired to close it.
    evict: CancellationToken,
}

/// The connections being served.
#[derive(Default)]
struct Connections {
    state: Mutex<Open>,
    /// Notified whenever a connection ends.
    ended: Notify,
}

#[derive(Default)]
struct Open {
    count: usize,
    /// Connections that may still be pending, oldest first (served ones are dropped lazily).
    pending: VecDeque<Arc<Slot>>,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // Every update leaves the state consistent, so a poisoned lock is safe to use.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until fewer than `max` connections are open, closing the oldest pending one when
    /// at the cap.
    async fn room(&self, max: usize) {
        loop {
            let ended = self.ended.notified();
            {
                let mut open = self.lock();
                if open.count < max {
                    return;
                }
                while let Some(oldest) = open.pending.pop_front() {
                    if !oldest.served.load(Ordering::Acquire) && !oldest.evict.is_cancelled() {
                        debug!("at the connection cap ({max}): closing the oldest connection that has sent no request");
                        oldest.evict.cancel();
                        break;
                    }
                }
            }
            ended.await;
        }
    }

    fn add(&self) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            served: AtomicBool::new(false),
            evict: CancellationToken::new(),
        });
        let mut open = self.lock();
        open.count += 1;
        // Served slots are only ever dropped from the front; bound the queue by pruning
        // them whenever it outgrows the open connections.
        if open.pending.len() >= open.count {
            open.pending
                .retain(|s| !s.served.load(Ordering::Acquire) && !s.evict.is_cancelled());
        }
        open.pending.push_back(slot.clone());
        slot
    }

    fn remove(&self, slot: &Slot) {
        slot.evict.cancel();
        self.lock().count -= 1;
        self.ended.notify_waiters();
    }
}

/// Serves `app` on the connections `listener` yields until `shutdown` fires, then lets each
/// connection finish its request (hyper's graceful shutdown) and waits for them all.
pub(super) async fn serve<L>(
    mut listener: L,
    app: Router,
    header_timeout: Duration,
    max_connections: usize,
    shutdown: CancellationToken,
) where
    L: Listener,
{
    let connections = Arc::new(Connections::default());
    let tasks = TaskTracker::new();
    let app = TowerToHyperService::new(app);
    loop {
        let accepted = tokio::select! {
            accepted = async {
                connections.room(max_connections).await;
                listener.accept().await
            } => accepted,
            () = shutdown.cancelled() => break,
        };
        let (io, _addr) = accepted;
        let slot = connections.add();
        let app = app.clone();
        let connections = connections.clone();
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            let marker = slot.clone();
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                marker.served.store(true, Ordering::Release);
                app.call(request)
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(io), service)
                .with_upgrades();
            tokio::pin!(conn);
            let mut closing = false;
            loop {
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            debug!("connection ended: {e}");
                        }
                        break;
                    }
                    // A pending connection only: served ones are never evicted.
                    () = slot.evict.cancelled(), if !slot.served.load(Ordering::Acquire) => break,
                    () = shutdown.cancelled(), if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            connections.remove(&slot);
        });
    }
    tasks.close();
    tasks.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_the_reserve_and_two_descriptors_per_connection() {
        assert_eq!(default_max_connections(1024), 480);
        assert_eq!(default_max_connections(10), 1);
    }

    #[tokio::test]
    async fn at_the_cap_the_oldest_pending_connection_is_evicted_and_served_ones_kept() {
        let connections = Connections::default();
        let served = connections.add();
        served.served.store(true, Ordering::Release);
        let old = connections.add();
        let young = connections.add();
        // Room is made by evicting `old` (the served one is skipped); its task would then
        // remove it, which is what lets `room` return.
        let room = connections.room(3);
        tokio::pin!(room);
        assert!(futures_util::FutureExt::now_or_never(room.as_mut()).is_none());
        assert!(old.evict.is_cancelled());
        assert!(!served.evict.is_cancelled() && !young.evict.is_cancelled());
        connections.remove(&old);
        room.await;
        assert_eq!(connections.lock().count, 2);
    }
}

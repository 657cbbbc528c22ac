//! Daytona's failed-auth limiter: every refused credential (an API key or JWT the API does
//! not know, a `Bearer` the preview proxy tries as one) counts against the caller's IP; at
//! the limit the IP is blocked for the window and every call from it, API and proxy alike,
//! is answered 429. The fake's callers all come from loopback, so it keeps one count.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals within [`WINDOW`] that block the caller, unless `--failed-auth-limit` says.
pub const DEFAULT_LIMIT: u32 = 10;
/// How long refusals are counted, and how long a block lasts.
const WINDOW: Duration = Duration::from_secs(60);

/// The limiter's state.
pub(super) struct FailedAuth {
    limit: u32,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    hits: u32,
    window_ends: Option<Instant>,
    blocked_until: Option<Instant>,
}

impl FailedAuth {
    /// A limiter blocking after `limit` refusals in the window (0: never).
    pub(super) fn new(limit: u32) -> FailedAuth {
        FailedAuth {
            limit,
            state: Mutex::new(State::default()),
        }
    }

    /// How much longer the caller is blocked, if it is.
    pub(super) fn blocked(&self) -> Option<Duration> {
        let state = self.state.lock().expect("failed-auth state");
        let until = state.blocked_until?;
        until.checked_duration_since(Instant::now())
    }

    /// Counts one refusal; `Some(block)` when it reaches the limit.
    pub(super) fn fail(&self) -> Option<Duration> {
        if self.limit == 0 {
            return None;
        }
        let now = Instant::now();
        let mut state = self.state.lock().expect("failed-auth state");
        if state.window_ends.is_none_or(|ends| ends <= now) {
            state.hits = 0;
            state.window_ends = Some(now + WINDOW);
        }
        state.hits += 1;
        if state.hits >= self.limit {
            state.blocked_until = Some(now + WINDOW);
            return Some(WINDOW);
        }
        None
    }
}

/// Daytona's answer to a blocked caller: 429 with the throttler's headers.
pub(super) fn too_many(path: &str, retry: Duration) -> axum::response::Response {
    let mut resp = super::error(
        axum::http::StatusCode::TOO_MANY_REQUESTS,
        path,
        "ThrottlerException: Too Many Requests",
    );
    let secs = retry.as_secs().max(1);
    let headers = resp.headers_mut();
    headers.insert("retry-after-failed-auth", secs.into());
    headers.insert("x-ratelimit-remaining-failed-auth", 0.into());
    resp
}

//! A fake Runloop: the REST API under `/v1` (`Authorization: Bearer <key>`, snake_case JSON
//! bodies as Runloop's SDK reads them, `{"message"}` error bodies, cursor-paged lists):
//! devboxes and their lifecycle ([`devboxes`]), V2 tunnels ([`tunnel`]), network policies
//! ([`policies`]), objects with a presigned upload URL ([`objects`]) and blueprints built from
//! a Dockerfile ([`blueprints`]).
//!
//! Devboxes are real local sandboxes. Create answers `provisioning` and boots in the
//! background: `initializing` (the local sandbox made, `launch_commands` run), then `running`
//! with the `entrypoint` started through `sh -c` with the devbox's `environment_variables`;
//! the devbox shuts down (`entrypoint_exit`) when it exits. `suspend` discards the local
//! sandbox (the fake keeps no disk), `resume` makes a new one and runs the launch commands
//! again but, as Runloop says of a resume, restarts no process: `execute_async` does. Runloop's
//! timers are enforced: `keep_alive_time_seconds` (default an hour) from create or the last
//! `keep_alive`, and `after_idle` from the last activity (API calls on the devbox, tunnel
//! traffic with `http_keep_alive`).
//!
//! One address serves the API and every tunnel: a request whose `Host` is
//! `{port}-{tunnel_key}.tunnel.{anything}` goes to that port of the tunnel's devbox, as
//! `https://{port}-{tunnel_key}.tunnel.runloop.ai` does.
//!
//! Controls (no key): `/__fake/faults` (as every fake), and `POST /__fake/hostile` with
//! `{"lie": "devbox_id" | "tunnel_key" | "none"}` to make later devbox answers carry an id or
//! tunnel key that is not one, for the relay's attack tests.

mod blueprints;
mod devboxes;
mod objects;
mod policies;
mod tunnel;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;
use tower::ServiceExt;

use crate::faults::{Fault, Faults};
use crate::images::Images;
use crate::sandboxes::Sandboxes;

/// How often Runloop's timers are checked.
const REAP_INTERVAL: Duration = Duration::from_secs(1);
/// The largest control request read.
const MAX_CONTROL_BODY: usize = 1 << 16; // 64 KiB

/// How the fake is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// The only API key accepted.
    pub api_key: String,
}

/// What later devbox answers lie about (`POST /__fake/hostile`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Lie {
    /// Nothing.
    #[default]
    None,
    /// The devbox's id is a path.
    DevboxId,
    /// The tunnel key is a host name of someone else's.
    TunnelKey,
}

/// The fake's state.
pub struct Runloop {
    config: Config,
    sandboxes: Arc<Sandboxes>,
    faults: Faults,
    devboxes: Mutex<BTreeMap<String, devboxes::Devbox>>,
    policies: Mutex<BTreeMap<String, policies::Policy>>,
    objects: Mutex<BTreeMap<String, objects::Object>>,
    blueprints: Mutex<BTreeMap<String, blueprints::Blueprint>>,
    executions: Mutex<BTreeMap<String, devboxes::Execution>>,
    /// Registry images pulled for blueprints.
    images: Images,
    /// Creation order, for lists and cursors.
    sequence: AtomicU64,
    lie: Mutex<Lie>,
}

impl Runloop {
    /// A fake running its devboxes in `sandboxes`.
    pub fn new(config: Config, sandboxes: Arc<Sandboxes>) -> Arc<Runloop> {
        Arc::new(Runloop {
            images: Images::new(sandboxes.data_dir()),
            config,
            sandboxes,
            faults: Faults::default(),
            devboxes: Mutex::new(BTreeMap::new()),
            policies: Mutex::new(BTreeMap::new()),
            objects: Mutex::new(BTreeMap::new()),
            blueprints: Mutex::new(BTreeMap::new()),
            executions: Mutex::new(BTreeMap::new()),
            sequence: AtomicU64::new(0),
            lie: Mutex::new(Lie::None),
        })
    }

    /// The fake's HTTP service, and its enforcer of Runloop's timers.
    pub fn router(self: &Arc<Self>) -> Router {
        tokio::spawn(devboxes::reap(Arc::downgrade(self), REAP_INTERVAL));
        Router::new().fallback(dispatch).with_state(self.clone())
    }

    fn next_sequence(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::Relaxed)
    }

    fn lie(&self) -> Lie {
        *self.lie.lock().expect("lie")
    }
}

/// Every request: a tunnel's, the fake's controls, an injected failure, or the API.
async fn dispatch(State(fake): State<Arc<Runloop>>, req: Request) -> Response {
    if let Some(route) = tunnel::route(req.headers()) {
        return tunnel::serve(&fake, route, req).await;
    }
    let path = req.uri().path().to_string();
    if path == "/__fake/hostile" {
        return hostile(&fake, req).await;
    }
    if let Some(id) = path.strip_prefix("/__fake/uploads/") {
        return objects::upload(&fake, id.to_string(), req).await;
    }
    if path.starts_with("/__fake/") {
        return fake.faults.control(req).await;
    }
    if let Some(fault) = fake.faults.take(&path) {
        return fault_response(&fault);
    }
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|a| a.to_str().ok())
        .and_then(|a| a.strip_prefix("Bearer "));
    if bearer != Some(fake.config.api_key.as_str()) {
        return error(StatusCode::UNAUTHORIZED, "Invalid API key");
    }
    let router = Router::new()
        .merge(devboxes::routes())
        .merge(policies::routes())
        .merge(objects::routes())
        .merge(blueprints::routes())
        .fallback(|req: Request| async move {
            error(
                StatusCode::NOT_FOUND,
                &format!("No route for {} {}", req.method(), req.uri().path()),
            )
        })
        .with_state(fake);
    match router.oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

async fn hostile(fake: &Runloop, req: Request) -> Response {
    #[derive(serde::Deserialize)]
    struct Hostile {
        lie: Lie,
    }
    let bytes = axum::body::to_bytes(req.into_body(), MAX_CONTROL_BODY)
        .await
        .unwrap_or_default();
    match serde_json::from_slice::<Hostile>(&bytes) {
        Ok(h) => {
            *fake.lie.lock().expect("lie") = h.lie;
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("bad control: {e}\n")).into_response(),
    }
}

/// An injected failure in Runloop's format, with `Retry-After` when asked.
fn fault_response(fault: &Fault) -> Response {
    let status = StatusCode::from_u16(fault.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = match fault.status {
        429 => "Rate limit exceeded",
        503 => "Service Unavailable",
        _ => "injected failure",
    };
    let mut resp = error(status, message);
    if let Some(secs) = fault.retry_after {
        resp.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, secs.into());
    }
    resp
}

/// Runloop's error answer: the status and a JSON body with its `message`.
fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "message": message }))).into_response()
}

/// Milliseconds since the epoch, as Runloop writes times.
fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A Runloop-style id: `prefix` and 21 random letters and digits.
fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    format!("{prefix}_{}", crate::sandboxes::random_id(21, ALPHABET))
}

/// One page of `items` (newest first) after the item with id `after`: Runloop's cursor
/// paging (`limit`, default 20, at most 5000; `starting_after`; `has_more`).
fn page<T: Clone>(
    items: Vec<(u64, String, T)>,
    limit: Option<usize>,
    after: Option<&str>,
) -> (Vec<T>, bool, usize) {
    let mut items = items;
    items.sort_by_key(|(seq, _, _)| std::cmp::Reverse(*seq));
    let total = items.len();
    let start = match after {
        Some(after) => items
            .iter()
            .position(|(_, id, _)| id == after)
            .map_or(total, |i| i + 1),
        None => 0,
    };
    let limit = limit.unwrap_or(20).clamp(1, 5000);
    let rest: Vec<T> = items
        .into_iter()
        .skip(start)
        .map(|(_, _, item)| item)
        .collect();
    let more = rest.len() > limit;
    (rest.into_iter().take(limit).collect(), more, total)
}

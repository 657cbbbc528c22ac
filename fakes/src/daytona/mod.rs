//! A fake Daytona: the REST API under `/api` (`Authorization: Bearer <key>`, NestJS error
//! bodies, 200 on POSTs, `{items, nextCursor}` lists, JSON `labels` filters, 409 on a taken
//! name, 400 for resources with a snapshot), snapshots made from registry images
//! (`snapshot_api`, `snapshots`), and the preview proxy (`preview`): one local listener per
//! sandbox port, trying a `Bearer` as a Daytona credential first, then
//! `X-Daytona-Preview-Token`, and answering 401 without a valid one, like Daytona's proxy.
//! Refused credentials count in the failed-auth limiter (`limiter`), which then blocks the
//! caller (429) on the API and the proxy alike.
//!
//! A snapshot's entrypoint is started as Daytona's daemon does, with the sandbox's `env`: the
//! default snapshot (none given) runs `sleep infinity` on a host-like root file system; a
//! snapshot created through `POST /snapshots` runs its pulled image and entrypoint (and is
//! refused, with Daytona's message, until `active` or once deleted); any other name is taken
//! to be a Tether image added through the Dashboard, whose exec-form ENTRYPOINT is
//! `--entrypoint` (by default `tether-agent serve --listen 0.0.0.0:7421`). Stopping removes
//! the local sandbox (its files are not kept); starting makes a new one and a new preview
//! token. `ttlMinutes` is enforced. `POST /__fake/error/{id}` puts a sandbox in a recoverable
//! `error` (its process gone, as after a runner failure), which `recover` undoes.

mod api;
mod egress;
pub mod limiter;
mod preview;
mod snapshot_api;
mod snapshots;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;
use tower::ServiceExt;

use crate::faults::{Fault, Faults};
use crate::images::Images;
use crate::sandboxes::Sandboxes;
use crate::serve::rfc3339;

/// How often expired sandboxes are looked for.
const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// How the fake is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// The only API key accepted.
    pub api_key: String,
    /// The ENTRYPOINT of every named snapshot.
    pub entrypoint: Vec<String>,
    /// Refused credentials that get the caller blocked (429) for a minute; 0: never.
    pub failed_auth_limit: u32,
    /// Serve the older route set of Daytona's last public server (self-hosted): no
    /// `POST /sandbox/{id}/ttl/{minutes}`.
    pub legacy_routes: bool,
    /// The most sandboxes one list page holds, whatever `limit` asks (Daytona's largest is
    /// 200); smaller ones make clients page.
    pub page_size: usize,
}

/// One fake sandbox.
#[derive(Clone, Debug)]
struct Sandbox {
    id: String,
    name: String,
    snapshot: Option<String>,
    /// What the snapshot runs, fixed at create (a later delete of the snapshot does not
    /// change a sandbox made from it).
    boot: snapshots::Boot,
    user: String,
    env: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    public: bool,
    network_block_all: bool,
    network_allow_list: Option<String>,
    domain_allow_list: Option<String>,
    auto_stop_interval: i64,
    auto_archive_interval: i64,
    auto_delete_interval: i64,
    ttl_minutes: Option<i64>,
    state: &'static str,
    error_reason: Option<String>,
    /// Whether `POST /sandbox/{id}/recover` can bring it back from `error`.
    recoverable: bool,
    /// The preview token; a new one at every start.
    auth_token: String,
    created_at: SystemTime,
    updated_at: SystemTime,
}

/// The fake's state.
pub struct Daytona {
    config: Config,
    sandboxes: Arc<Sandboxes>,
    faults: Faults,
    table: Mutex<BTreeMap<String, Sandbox>>,
    /// Registry images pulled for snapshots.
    images: Images,
    snapshots: snapshots::Snapshots,
    /// Preview listeners by (sandbox id, port): their URL and task.
    previews: Mutex<HashMap<(String, u16), crate::edge::PortListener>>,
    /// Refused credentials, API and proxy alike.
    failed_auth: limiter::FailedAuth,
}

impl Daytona {
    /// A fake running its sandboxes in `sandboxes`.
    pub fn new(config: Config, sandboxes: Arc<Sandboxes>) -> Arc<Daytona> {
        let images = Images::new(sandboxes.data_dir());
        Arc::new(Daytona {
            sandboxes,
            faults: Faults::default(),
            table: Mutex::new(BTreeMap::new()),
            images,
            snapshots: snapshots::Snapshots::default(),
            previews: Mutex::new(HashMap::new()),
            failed_auth: limiter::FailedAuth::new(config.failed_auth_limit),
            config,
        })
    }

    /// The fake's HTTP service, and its reaper of sandboxes past their TTL.
    pub fn router(self: &Arc<Self>) -> Router {
        tokio::spawn(reap(Arc::downgrade(self)));
        Router::new().fallback(dispatch).with_state(self.clone())
    }

    /// The sandbox with this id or name.
    fn find(&self, id_or_name: &str) -> Option<Sandbox> {
        let table = self.table.lock().expect("sandbox table");
        table
            .get(id_or_name)
            .or_else(|| table.values().find(|s| s.name == id_or_name))
            .cloned()
    }

    fn update(&self, id: &str, change: impl FnOnce(&mut Sandbox)) -> Option<Sandbox> {
        let mut table = self.table.lock().expect("sandbox table");
        let s = table.get_mut(id)?;
        change(s);
        s.updated_at = SystemTime::now();
        Some(s.clone())
    }

    /// Makes the local sandbox and starts the snapshot's ENTRYPOINT in it.
    async fn boot(&self, s: &Sandbox) -> anyhow::Result<()> {
        self.sandboxes
            .create_from(&s.id, s.boot.image.as_deref())
            .await?;
        let entrypoint = s.boot.entrypoint.clone();
        let mut env = s.env.clone();
        env.insert("DAYTONA_SANDBOX_ID".into(), s.id.clone());
        env.insert(
            "DAYTONA_SANDBOX_SNAPSHOT".into(),
            s.snapshot.clone().unwrap_or_default(),
        );
        env.insert("DAYTONA_SANDBOX_USER".into(), s.user.clone());
        drop(self.sandboxes.start(&s.id, entrypoint, env, None).await?);
        Ok(())
    }
}

/// Every request: the fake's controls, an injected failure, or the API.
async fn dispatch(State(fake): State<Arc<Daytona>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    if let Some(id) = path.strip_prefix("/__fake/error/") {
        return api::fail(&fake, id).await;
    }
    if path.starts_with("/__fake/") {
        return fake.faults.control(req).await;
    }
    if let Some(fault) = fake.faults.take(&path) {
        return fault_response(&fault, &path);
    }
    if let Some(retry) = fake.failed_auth.blocked() {
        return limiter::too_many(&path, retry);
    }
    // The SDK tries Daytona's event gateway (socket.io, authenticated in its own handshake,
    // not by the API's guard); the fake has none, and a route that is not there is a 404
    // before any guard runs, as in NestJS: no refused credential is counted.
    if path.starts_with("/api/socket.io") {
        return error(StatusCode::NOT_FOUND, &path, &format!("Cannot GET {path}"));
    }
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|a| a.to_str().ok())
        .and_then(|a| a.strip_prefix("Bearer "));
    if bearer != Some(fake.config.api_key.as_str()) {
        tracing::info!("refused credentials for {} {path}", req.method());
        if let Some(retry) = fake.failed_auth.fail() {
            return limiter::too_many(&path, retry);
        }
        return error(StatusCode::UNAUTHORIZED, &path, "Invalid credentials");
    }
    match api::router(fake).oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

/// An injected failure in Daytona's format; 429 carries the per-throttler headers.
fn fault_response(fault: &Fault, path: &str) -> Response {
    let status = StatusCode::from_u16(fault.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = match fault.status {
        429 => "ThrottlerException: Too Many Requests",
        503 => "Service Unavailable",
        _ => "injected failure",
    };
    let mut resp = error(status, path, message);
    if let Some(secs) = fault.retry_after {
        let throttler = if path == "/api/sandbox" {
            "sandbox-create"
        } else {
            "authenticated"
        };
        let headers = resp.headers_mut();
        headers.insert(
            axum::http::HeaderName::try_from(format!("retry-after-{throttler}"))
                .expect("a valid name"),
            secs.into(),
        );
        headers.insert(
            axum::http::HeaderName::try_from(format!("x-ratelimit-remaining-{throttler}"))
                .expect("a valid name"),
            0.into(),
        );
    }
    resp
}

/// NestJS's error body: `{path, timestamp, statusCode, error, message}`.
fn error(status: StatusCode, path: &str, message: &str) -> Response {
    let body = json!({
        "path": path,
        "timestamp": rfc3339(SystemTime::now()),
        "statusCode": status.as_u16(),
        "error": status.canonical_reason().unwrap_or(""),
        "message": message,
    });
    (status, Json(body)).into_response()
}

/// Destroys sandboxes past their `ttlMinutes`, until the fake is dropped.
async fn reap(fake: std::sync::Weak<Daytona>) {
    loop {
        tokio::time::sleep(REAP_INTERVAL).await;
        let Some(fake) = fake.upgrade() else { return };
        let now = SystemTime::now();
        let expired: Vec<String> = fake
            .table
            .lock()
            .expect("sandbox table")
            .values()
            .filter(|s| {
                s.ttl_minutes.is_some_and(|m| m > 0)
                    && s.created_at + Duration::from_secs(60 * s.ttl_minutes.unwrap_or(0) as u64)
                        <= now
            })
            .map(|s| s.id.clone())
            .collect();
        for id in expired {
            tracing::info!("sandbox {id} reached its TTL; destroying it");
            api::destroy(&fake, &id).await;
        }
    }
}

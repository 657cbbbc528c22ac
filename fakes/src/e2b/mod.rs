//! A fake E2B: the control plane (`X-API-Key`; `/sandboxes`, `/v2/sandboxes` and their
//! sub-resources), envd's process API on port 49983, and the edge that routes by
//! `{port}-{sandboxID}.{domain}` Host or by `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers —
//! all on one listener, told apart per request as E2B's proxy does.
//!
//! Templates are built as E2B's v2 build system builds them (`templates`, `template_api`,
//! `storage`, `builder`): the base pulled from a registry, the COPY steps' files uploaded
//! to a storage URL the fake serves, ENV, WORKDIR and USER applied, the status and log
//! polled.
//!
//! Sandboxes are local sandboxes ([`crate::sandboxes`]): a built template's sandboxes run its
//! image; any other template name is accepted as is and runs on the host-like default root
//! file system. Timeouts are enforced: a running sandbox is killed when its `endAt` passes.
//! A paused sandbox answers nothing (envd and the edge answer 502, as E2B's proxy does for a
//! sandbox it cannot route to) and its processes are frozen with their memory and files (the
//! local sandbox's pause), until a connect or resume thaws it.

mod api;
mod builder;
mod egress;
mod envd;
mod pause;
mod ready;
mod storage;
mod template_api;
mod templates;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;
use tower::ServiceExt;

use crate::edge::{self, ProxyError};
use crate::faults::{Fault, Faults};
use crate::images::Images;
use crate::sandboxes::Sandboxes;

/// envd's port inside every sandbox.
pub(crate) const ENVD_PORT: u16 = 49983;
/// Where uploaded COPY files (and build scratch space) live, under the data directory.
const FILES_DIR: &str = "e2b-files";
/// How often expired sandboxes are looked for.
const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// How the fake is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// The only API key accepted.
    pub api_key: String,
    /// The `domain` reported for sandboxes (`None`: clients use their own `E2B_DOMAIN`).
    pub domain: Option<String>,
    /// Serve only the older route set of E2B's public (self-hosted) infra: no
    /// `POST /v2/sandboxes` and no `/connect`; unknown routes answer 404 as the API does.
    pub legacy_routes: bool,
    /// The most sandboxes one `GET /v2/sandboxes` page holds, whatever `limit` asks (E2B's
    /// largest is 100); smaller ones make clients page.
    pub page_size: usize,
}

/// One fake sandbox.
#[derive(Clone, Debug)]
struct Sandbox {
    /// The template's id (the name asked for, when the fake built no such template).
    template_id: String,
    /// The name the sandbox was created with.
    alias: String,
    metadata: BTreeMap<String, String>,
    env_vars: BTreeMap<String, String>,
    started_at: SystemTime,
    end_at: SystemTime,
    paused: bool,
    envd_access_token: String,
    traffic_access_token: Option<String>,
    allow_internet_access: bool,
    /// `network.allowOut` and `network.denyOut`, as given.
    allow_out: Vec<String>,
    deny_out: Vec<String>,
}

/// The fake's state.
pub struct E2b {
    config: Config,
    sandboxes: Arc<Sandboxes>,
    faults: Faults,
    table: Mutex<BTreeMap<String, Sandbox>>,
    /// `Idempotency-Key` → sandbox id.
    idempotency: Mutex<HashMap<String, String>>,
    /// Registry images pulled for templates, and the templates' images.
    images: Images,
    /// Templates, their builds and the uploaded files of COPY steps.
    templates: Mutex<templates::Table>,
    /// Where uploaded files are kept.
    files_dir: PathBuf,
}

impl E2b {
    /// A fake running its sandboxes in `sandboxes`.
    pub fn new(config: Config, sandboxes: Arc<Sandboxes>) -> Arc<E2b> {
        let data_dir = sandboxes.data_dir().to_path_buf();
        Arc::new(E2b {
            config,
            sandboxes,
            faults: Faults::default(),
            table: Mutex::new(BTreeMap::new()),
            idempotency: Mutex::new(HashMap::new()),
            images: Images::new(&data_dir),
            templates: Mutex::new(templates::Table::default()),
            files_dir: data_dir.join(FILES_DIR),
        })
    }

    /// The fake's HTTP service, and its reaper of expired sandboxes.
    pub fn router(self: &Arc<Self>) -> Router {
        tokio::spawn(reap(Arc::downgrade(self)));
        Router::new().fallback(dispatch).with_state(self.clone())
    }

    fn sandbox(&self, id: &str) -> Option<Sandbox> {
        self.table.lock().expect("sandbox table").get(id).cloned()
    }
}

/// Every request: to a sandbox port (edge or envd), to the fake's controls, or to the API.
async fn dispatch(State(fake): State<Arc<E2b>>, req: Request) -> Response {
    if let Some((id, port)) = target(req.headers()) {
        return if port == ENVD_PORT {
            envd::serve(fake, id, req).await
        } else {
            edge_request(&fake, &id, port, req).await
        };
    }
    let path = req.uri().path().to_string();
    if path.starts_with("/__fake/") {
        return fake.faults.control(req).await;
    }
    // The storage "bucket": its URLs carry their own authorization, not the API key.
    if path.starts_with(storage::STORAGE_PREFIX) {
        return storage::upload(fake, req).await;
    }
    if let Some(fault) = fake.faults.take(&path) {
        return fault_response(&fault);
    }
    if req.headers().get("x-api-key").and_then(|k| k.to_str().ok())
        != Some(fake.config.api_key.as_str())
    {
        return error(StatusCode::UNAUTHORIZED, "Invalid API key");
    }
    match api::router(fake).oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

/// The sandbox and port a request is for: `{port}-{id}.{domain}` in Host, else the
/// `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers.
fn target(headers: &HeaderMap) -> Option<(String, u16)> {
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if let Some((label, _domain)) = host.split_once('.') {
        if let Some((port, id)) = label.split_once('-') {
            if let (Ok(port), false) = (port.parse::<u16>(), id.is_empty()) {
                return Some((id.to_string(), port));
            }
        }
    }
    let id = headers.get("e2b-sandbox-id")?.to_str().ok()?;
    let port = headers
        .get("e2b-sandbox-port")?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some((id.to_string(), port))
}

/// A request for a port other than envd's, proxied into the sandbox.
async fn edge_request(fake: &E2b, id: &str, port: u16, req: Request) -> Response {
    let proxy_error = |message: &str| {
        let body = json!({ "sandboxId": id, "message": message, "port": port, "code": 502 });
        (StatusCode::BAD_GATEWAY, Json(body)).into_response()
    };
    // Paused: not routable, and E2B's edge says so as for a missing sandbox.
    let Some(sandbox) = fake.sandbox(id).filter(|s| !s.paused) else {
        return proxy_error("The sandbox was not found");
    };
    if let Some(expected) = &sandbox.traffic_access_token {
        let given = req
            .headers()
            .get("e2b-traffic-access-token")
            .and_then(|t| t.to_str().ok());
        if given != Some(expected.as_str()) {
            let body = json!({
                "sandboxId": id,
                "message": "Sandbox is secured with traffic access token. Provide a valid token in e2b-traffic-access-token header.",
                "code": 403,
            });
            return (StatusCode::FORBIDDEN, Json(body)).into_response();
        }
    }
    match edge::proxy(&fake.sandboxes, id, port, req).await {
        Ok(resp) => resp,
        Err(ProxyError::Dial(e)) => {
            tracing::debug!("edge: {e}");
            proxy_error("The sandbox is running but port is not open")
        }
        Err(e) => proxy_error(&e.to_string()),
    }
}

/// An injected failure in E2B's format (the per-route limiter's body for 429).
fn fault_response(fault: &Fault) -> Response {
    let status = StatusCode::from_u16(fault.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = match fault.status {
        429 => "Rate limit exceeded".to_string(),
        503 => "Service is temporarily unavailable".to_string(),
        _ => format!("injected failure {}", fault.status),
    };
    let mut resp = error(status, &message);
    if let Some(secs) = fault.retry_after {
        resp.headers_mut().insert("retry-after", secs.into());
    }
    resp
}

/// E2B's error body: `{"code": <status>, "message": "..."}`.
fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        Json(json!({ "code": status.as_u16(), "message": message })),
    )
        .into_response()
}

/// Kills sandboxes whose timeout has passed, until the fake is dropped.
async fn reap(fake: std::sync::Weak<E2b>) {
    loop {
        tokio::time::sleep(REAP_INTERVAL).await;
        let Some(fake) = fake.upgrade() else { return };
        let now = SystemTime::now();
        let expired: Vec<String> = {
            let mut table = fake.table.lock().expect("sandbox table");
            let ids: Vec<String> = table
                .iter()
                // A paused sandbox is a snapshot, kept until resumed or killed: its
                // timeout starts again on resume.
                .filter(|(_, s)| !s.paused && s.end_at <= now)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                table.remove(id);
            }
            ids
        };
        for id in expired {
            tracing::info!("sandbox {id} timed out; killing it");
            if let Err(e) = fake.sandboxes.delete(&id).await {
                tracing::warn!("cannot remove the local sandbox behind {id}: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_routed_by_host_or_by_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "7421-abc123.localhost:8080".parse().unwrap());
        assert_eq!(target(&headers), Some(("abc123".to_string(), 7421)));
        headers.insert("host", "127.0.0.1:8080".parse().unwrap());
        assert_eq!(target(&headers), None);
        headers.insert("e2b-sandbox-id", "abc123".parse().unwrap());
        headers.insert("e2b-sandbox-port", "49983".parse().unwrap());
        assert_eq!(target(&headers), Some(("abc123".to_string(), ENVD_PORT)));
        headers.insert("host", "api.localhost".parse().unwrap());
        headers.remove("e2b-sandbox-id");
        assert_eq!(target(&headers), None);
    }
}

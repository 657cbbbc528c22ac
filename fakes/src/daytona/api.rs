//! The fake Daytona API's routes (under `/api`), with Daytona's field names and statuses.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::snapshot_api;
use super::snapshots::Boot;
use super::{error, preview, Daytona, Sandbox};
use crate::sandboxes::{random_id, uuid};
use crate::serve::rfc3339;

/// The organization every sandbox belongs to.
pub(super) const ORGANIZATION: &str = "00000000-0000-4000-8000-00000000fa4e";
/// Daytona's defaults for a sandbox's intervals (minutes).
const AUTO_STOP: i64 = 15;
const AUTO_ARCHIVE: i64 = 10_080;
const AUTO_DELETE: i64 = -1;
/// A list page's size when `limit` is not given.
const DEFAULT_LIST_LIMIT: usize = 100;
/// The largest `limit` of a list page Daytona takes.
const MAX_LIST_LIMIT: usize = 200;

/// The routes (without the TTL route for `legacy_routes`, as Daytona's last public server).
pub(super) fn router(fake: Arc<Daytona>) -> Router {
    let mut routes = Router::new();
    if !fake.config.legacy_routes {
        routes = routes.route("/api/sandbox/{id}/ttl/{minutes}", post(set_ttl));
    }
    routes
        .route("/api/sandbox", post(create).get(list))
        .route("/api/sandbox/{id}", get(detail).delete(remove))
        .route("/api/sandbox/{id}/start", post(start))
        .route("/api/sandbox/{id}/stop", post(stop))
        .route("/api/sandbox/{id}/recover", post(recover))
        .route("/api/sandbox/{id}/labels", put(labels))
        .route("/api/sandbox/{id}/autostop/{minutes}", post(set_autostop))
        .route(
            "/api/sandbox/{id}/ports/{port}/preview-url",
            get(preview_url),
        )
        .route(
            "/api/sandbox/{id}/toolbox-proxy-url",
            get(toolbox_proxy_url),
        )
        .merge(snapshot_api::routes())
        .fallback(|uri: Uri| async move {
            error(
                StatusCode::NOT_FOUND,
                uri.path(),
                &format!("Cannot GET {}", uri.path()),
            )
        })
        .with_state(fake)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateSandbox {
    name: Option<String>,
    snapshot: Option<String>,
    user: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    public: bool,
    #[serde(default)]
    network_block_all: bool,
    network_allow_list: Option<String>,
    domain_allow_list: Option<String>,
    cpu: Option<i64>,
    memory: Option<i64>,
    disk: Option<i64>,
    gpu: Option<i64>,
    auto_stop_interval: Option<i64>,
    auto_archive_interval: Option<i64>,
    auto_delete_interval: Option<i64>,
    ttl_minutes: Option<i64>,
    build_info: Option<Value>,
}

async fn create(State(fake): State<Arc<Daytona>>, body: axum::body::Bytes) -> Response {
    const PATH: &str = "/api/sandbox";
    let req: CreateSandbox = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, PATH, &e.to_string()),
    };
    let resources = [req.cpu, req.memory, req.disk, req.gpu]
        .iter()
        .any(Option::is_some);
    if req.build_info.is_some() {
        if req.snapshot.is_some() {
            return error(
                StatusCode::BAD_REQUEST,
                PATH,
                "Cannot specify a snapshot when using a build info entry",
            );
        }
        return error(
            StatusCode::BAD_REQUEST,
            PATH,
            "this fake builds no images: create from a snapshot",
        );
    }
    if resources && req.snapshot.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            PATH,
            "Cannot specify Sandbox resources when using a snapshot",
        );
    }
    if let Err(message) = super::egress::validate(
        req.network_block_all,
        req.network_allow_list.as_deref(),
        req.domain_allow_list.as_deref(),
    ) {
        return error(StatusCode::BAD_REQUEST, PATH, &message);
    }
    let snapshot = req.snapshot.filter(|s| !s.is_empty());
    let boot = match snapshot.as_deref() {
        None => Boot::default_snapshot(),
        Some(name) => match fake.snapshots.boot(name, &fake.config.entrypoint) {
            Ok(boot) => boot,
            Err(message) => return error(StatusCode::BAD_REQUEST, PATH, &message),
        },
    };
    let id = uuid();
    let name = req.name.clone().unwrap_or_else(|| id.clone());
    if fake.find(&name).is_some() {
        return error(
            StatusCode::CONFLICT,
            PATH,
            &format!("Sandbox with name {name} already exists"),
        );
    }
    let now = SystemTime::now();
    let sandbox = Sandbox {
        id: id.clone(),
        name,
        snapshot,
        boot,
        user: req.user.unwrap_or_else(|| "daytona".into()),
        env: req.env,
        labels: req.labels,
        public: req.public,
        network_block_all: req.network_block_all,
        network_allow_list: req.network_allow_list,
        domain_allow_list: req.domain_allow_list,
        auto_stop_interval: req.auto_stop_interval.unwrap_or(AUTO_STOP),
        auto_archive_interval: req.auto_archive_interval.unwrap_or(AUTO_ARCHIVE),
        auto_delete_interval: req.auto_delete_interval.unwrap_or(AUTO_DELETE),
        ttl_minutes: req.ttl_minutes,
        state: "creating",
        error_reason: None,
        recoverable: false,
        auth_token: random_id(
            32,
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
        ),
        created_at: now,
        updated_at: now,
    };
    fake.table
        .lock()
        .expect("sandbox table")
        .insert(id.clone(), sandbox.clone());
    // Daytona waits (up to 30 s) for `started` before answering; so does the fake.
    let state = match fake.boot(&sandbox).await {
        Ok(()) => ("started", None),
        Err(e) => ("error", Some(format!("{e:#}"))),
    };
    let Some(s) = fake.update(&id, |s| (s.state, s.error_reason) = state.clone()) else {
        return error(
            StatusCode::NOT_FOUND,
            PATH,
            "the sandbox vanished while starting",
        );
    };
    if let Some(reason) = &s.error_reason {
        return error(
            StatusCode::BAD_REQUEST,
            PATH,
            &format!("Sandbox failed to start: {reason}"),
        );
    }
    Json(sandbox_json(&s, true)).into_response()
}

/// A `Sandbox` (or, without `full`, a `SandboxListItem`).
fn sandbox_json(s: &Sandbox, full: bool) -> Value {
    let mut v = json!({
        "id": s.id,
        "organizationId": ORGANIZATION,
        "name": s.name,
        "snapshot": s.snapshot,
        "user": s.user,
        "labels": s.labels,
        "public": s.public,
        "networkBlockAll": s.network_block_all,
        "networkAllowList": s.network_allow_list,
        "domainAllowList": s.domain_allow_list,
        "kvm": false,
        "target": "us",
        "cpu": 1, "gpu": 0, "memory": 1, "disk": 3,
        "state": s.state,
        "desiredState": if s.state == "stopped" { "stopped" } else { "started" },
        "errorReason": s.error_reason,
        "recoverable": s.recoverable,
        "backupState": "None",
        "autoStopInterval": s.auto_stop_interval,
        "autoArchiveInterval": s.auto_archive_interval,
        "autoDeleteInterval": s.auto_delete_interval,
        "autoDestroyAt": s.ttl_minutes.map(|m| {
            rfc3339(s.created_at + Duration::from_secs(u64::try_from(m).unwrap_or(0) * 60))
        }),
        "createdAt": rfc3339(s.created_at),
        "updatedAt": rfc3339(s.updated_at),
        "lastActivityAt": rfc3339(s.updated_at),
        "sandboxClass": "container",
        "daemonVersion": "0.190.0",
        "toolboxProxyUrl": "http://127.0.0.1/toolbox",
    });
    if full {
        v["env"] = json!(s.env);
        v["volumes"] = json!([]);
    }
    v
}

/// `GET /api/sandbox?labels={"k":"v"}&limit=N&cursor=C`: `{items, nextCursor}`, newest first,
/// at most `limit` (1 to 200, default 100; at most the fake's page size) a page; `nextCursor`
/// names the next page, `null` after the last.
async fn list(State(fake): State<Arc<Daytona>>, RawQuery(query): RawQuery) -> Response {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query.as_deref().unwrap_or("")).unwrap_or_default();
    let mut wanted = BTreeMap::new();
    let mut limit = DEFAULT_LIST_LIMIT;
    let mut after: Option<(u128, String)> = None;
    for (key, value) in pairs {
        match key.as_str() {
            "labels" => match serde_json::from_str::<BTreeMap<String, String>>(&value) {
                Ok(labels) => wanted.extend(labels),
                Err(_) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "/api/sandbox",
                        "labels must be a JSON object",
                    )
                }
            },
            "limit" => match value.parse::<usize>() {
                Ok(n) if (1..=MAX_LIST_LIMIT).contains(&n) => limit = n,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "/api/sandbox",
                        &format!("limit must not be greater than {MAX_LIST_LIMIT}"),
                    )
                }
            },
            "cursor" => match decode_cursor(&value) {
                Some(cursor) => after = Some(cursor),
                None => return error(StatusCode::BAD_REQUEST, "/api/sandbox", "Invalid cursor"),
            },
            _ => {}
        }
    }
    let limit = limit.min(fake.config.page_size.max(1));
    let table = fake.table.lock().expect("sandbox table");
    let mut matching: Vec<((u128, String), &Sandbox)> = table
        .values()
        .filter(|s| wanted.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| ((nanos(s.created_at), s.id.clone()), s))
        .collect();
    matching.sort_by(|a, b| b.0.cmp(&a.0));
    let rest: Vec<_> = matching
        .into_iter()
        .filter(|(key, _)| after.as_ref().is_none_or(|after| key < after))
        .collect();
    let page = &rest[..rest.len().min(limit)];
    let items: Vec<Value> = page.iter().map(|(_, s)| sandbox_json(s, false)).collect();
    let next = (rest.len() > page.len())
        .then(|| page.last().map(|(key, _)| encode_cursor(key)))
        .flatten();
    Json(json!({ "items": items, "nextCursor": next })).into_response()
}

fn nanos(at: SystemTime) -> u128 {
    at.duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// An opaque cursor: the last sandbox served (creation time and id), base64.
fn encode_cursor((at, id): &(u128, String)) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{at}/{id}"))
}

fn decode_cursor(cursor: &str) -> Option<(u128, String)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()?;
    let (at, id) = std::str::from_utf8(&raw).ok()?.split_once('/')?;
    Some((at.parse().ok()?, id.to_string()))
}

fn not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("/api/sandbox/{id}"),
        &format!("Sandbox with ID or name {id} not found"),
    )
}

async fn detail(State(fake): State<Arc<Daytona>>, Path(id): Path<String>) -> Response {
    match fake.find(&id) {
        Some(s) => Json(sandbox_json(&s, true)).into_response(),
        None => not_found(&id),
    }
}

/// Removes a sandbox everywhere.
pub(super) async fn destroy(fake: &Arc<Daytona>, id: &str) {
    fake.table.lock().expect("sandbox table").remove(id);
    preview::close(fake, id);
    if let Err(e) = fake.sandboxes.delete(id).await {
        tracing::warn!("cannot remove the local sandbox behind {id}: {e}");
    }
}

/// `DELETE /api/sandbox/{idOrName}`: 200 with the sandbox, `destroying`.
async fn remove(State(fake): State<Arc<Daytona>>, Path(id): Path<String>) -> Response {
    let Some(mut s) = fake.find(&id) else {
        return not_found(&id);
    };
    destroy(&fake, &s.id).await;
    s.state = "destroying";
    Json(sandbox_json(&s, true)).into_response()
}

/// `POST /api/sandbox/{id}/start`: a new local sandbox and a new preview token.
async fn start(State(fake): State<Arc<Daytona>>, Path(id): Path<String>) -> Response {
    let Some(s) = fake.find(&id) else {
        return not_found(&id);
    };
    if s.state == "started" {
        return Json(sandbox_json(&s, true)).into_response();
    }
    let token = random_id(
        32,
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    );
    let Some(s) = fake.update(&s.id, |s| {
        s.state = "starting";
        s.auth_token = token;
    }) else {
        return not_found(&id);
    };
    let state = match fake.boot(&s).await {
        Ok(()) => ("started", None),
        Err(e) => ("error", Some(format!("{e:#}"))),
    };
    match fake.update(&s.id, |s| (s.state, s.error_reason) = state) {
        Some(s) => Json(sandbox_json(&s, true)).into_response(),
        None => not_found(&id),
    }
}

/// `POST /api/sandbox/{id}/recover`: boots a sandbox in a recoverable `error` again (with a
/// new preview token, as a start); 400 for any other state.
async fn recover(State(fake): State<Arc<Daytona>>, Path(id): Path<String>) -> Response {
    let Some(s) = fake.find(&id) else {
        return not_found(&id);
    };
    if s.state != "error" || !s.recoverable {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("/api/sandbox/{id}/recover"),
            "Sandbox is not in a recoverable error state",
        );
    }
    // Recovery boots it again, as a start does.
    fake.update(&s.id, |s| {
        s.state = "stopped";
        s.error_reason = None;
        s.recoverable = false;
    });
    start(State(fake), Path(id)).await
}

/// `POST /__fake/error/{id}`: the sandbox fails as after a runner failure: its process is
/// gone and it is in `error`, recoverable.
pub(super) async fn fail(fake: &Arc<Daytona>, id: &str) -> Response {
    let Some(s) = fake.find(id) else {
        return not_found(id);
    };
    if let Err(e) = fake.sandboxes.delete(&s.id).await {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "/__fake/error",
            &e.to_string(),
        );
    }
    match fake.update(&s.id, |s| {
        s.state = "error";
        s.error_reason = Some("runner failure (injected)".into());
        s.recoverable = true;
    }) {
        Some(s) => Json(sandbox_json(&s, true)).into_response(),
        None => not_found(id),
    }
}

/// `POST /api/sandbox/{id}/stop`: the local sandbox goes away (the fake keeps no files).
async fn stop(State(fake): State<Arc<Daytona>>, Path(id): Path<String>) -> Response {
    let Some(s) = fake.find(&id) else {
        return not_found(&id);
    };
    if let Err(e) = fake.sandboxes.delete(&s.id).await {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("/api/sandbox/{id}/stop"),
            &e.to_string(),
        );
    }
    match fake.update(&s.id, |s| s.state = "stopped") {
        Some(s) => Json(sandbox_json(&s, true)).into_response(),
        None => not_found(&id),
    }
}

#[derive(Debug, Deserialize)]
struct Labels {
    labels: BTreeMap<String, String>,
}

async fn labels(
    State(fake): State<Arc<Daytona>>,
    Path(id): Path<String>,
    Json(body): Json<Labels>,
) -> Response {
    let Some(s) = fake.find(&id) else {
        return not_found(&id);
    };
    match fake.update(&s.id, |s| s.labels = body.labels) {
        Some(s) => Json(json!({ "labels": s.labels })).into_response(),
        None => not_found(&id),
    }
}

/// `POST /api/sandbox/{id}/ttl/{minutes}`: re-anchored from now.
async fn set_ttl(
    State(fake): State<Arc<Daytona>>,
    Path((id, minutes)): Path<(String, i64)>,
) -> Response {
    let Some(s) = fake.find(&id) else {
        return not_found(&id);
    };
    let elapsed = SystemTime::now()
        .duration_since(s.created_at)
        .unwrap_or_default()
        .as_secs() as i64
        / 60;
    match fake.update(&s.id, |s| {
        s.ttl_minutes = (minutes > 0).then_some(minutes + elapsed)
    }) {
        Some(s) => Json(sandbox_json(&s, true)).into_response(),
        None => not_found(&id),
    }
}

async fn set_autostop(
    State(fake): State<Arc<Daytona>>,
    Path((id, minutes)): Path<(String, i64)>,
) -> Response {
    let Some(s) = fake.find(&id) else {
        return not_found(&id);
    };
    // Daytona answers with the sandbox, as for the TTL.
    match fake.update(&s.id, |s| s.auto_stop_interval = minutes) {
        Some(s) => Json(sandbox_json(&s, true)).into_response(),
        None => not_found(&id),
    }
}

/// `GET /api/sandbox/{id}/ports/{port}/preview-url` → `{sandboxId, url, token}`.
async fn preview_url(
    State(fake): State<Arc<Daytona>>,
    Path((id, port)): Path<(String, u16)>,
) -> Response {
    let Some(s) = fake.find(&id) else {
        return not_found(&id);
    };
    match preview::url(&fake, &s.id, port).await {
        Ok(url) => {
            Json(json!({ "sandboxId": s.id, "url": url, "token": s.auth_token })).into_response()
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "/api/sandbox",
            &e.to_string(),
        ),
    }
}

async fn toolbox_proxy_url(State(fake): State<Arc<Daytona>>, Path(id): Path<String>) -> Response {
    match fake.find(&id) {
        Some(_) => Json(json!({ "url": "http://127.0.0.1/toolbox" })).into_response(),
        None => not_found(&id),
    }
}

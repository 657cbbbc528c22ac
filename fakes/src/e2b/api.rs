//! The fake E2B control plane's routes, with E2B's field names, statuses and error bodies.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::templates::Lookup;
use super::{error, pause, E2b, Sandbox};
use crate::sandboxes::{random_hex, random_id};
use crate::serve::rfc3339;

/// Sandbox ids: 20 characters of `[a-z0-9]`, as E2B makes them.
const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const ID_LEN: usize = 20;
/// The timeout when a create gives none (the server's default).
pub(super) const DEFAULT_TIMEOUT_SECS: i64 = 15;
/// The longest timeout the fake's "plan" allows (E2B Pro: 24 hours).
const MAX_TIMEOUT_SECS: i64 = 24 * 3600;
/// The envd version reported: what the SDKs check features against.
pub(super) const ENVD_VERSION: &str = "0.6.13";
/// The resources every fake template has.
const CPU_COUNT: u32 = 2;
const MEMORY_MB: u32 = 1024;
pub(super) const DISK_SIZE_MB: u32 = 4096;
/// The largest `limit` of a list page (E2B's API allows 1 to 100).
const MAX_LIST_LIMIT: usize = 100;

/// The routes: E2B's current set, or (`legacy_routes`) the older one of its public infra,
/// which has v1 create (secured only with `"secure": true`) and `resume`, but neither
/// `POST /v2/sandboxes` nor `connect`. A route that is not there answers 404 with the same
/// JSON error body as a sandbox that is not there: only a read of the sandbox tells them
/// apart.
pub(super) fn router(fake: Arc<E2b>) -> Router {
    let legacy = fake.config.legacy_routes;
    let mut routes = Router::new()
        .route("/sandboxes", post(create_v1).get(list_v1))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause::pause))
        .route("/sandboxes/{id}/resume", post(pause::resume));
    if !legacy {
        routes = routes
            .route("/v2/sandboxes", post(create_v2).get(list_v2))
            .route("/sandboxes/{id}/connect", post(pause::connect))
            .route("/v2/sandboxes/{id}/connect", post(pause::connect));
    }
    routes
        .merge(super::template_api::routes())
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no matching operation was found") })
        .with_state(fake)
}

/// `NewSandbox` / `NewSandboxV2`.
#[derive(Debug, Deserialize)]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<i64>,
    #[serde(default)]
    secure: Option<bool>,
    #[serde(default)]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    network: Option<Network>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(rename = "envVars", default)]
    env_vars: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Network {
    #[serde(default)]
    allow_public_traffic: Option<bool>,
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    #[serde(default)]
    deny_out: Option<Vec<String>>,
}

async fn create_v1(
    State(fake): State<Arc<E2b>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    create(fake, headers, body, false).await
}

async fn create_v2(
    State(fake): State<Arc<E2b>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    create(fake, headers, body, true).await
}

async fn create(fake: Arc<E2b>, headers: HeaderMap, body: axum::body::Bytes, v2: bool) -> Response {
    let req: NewSandbox = match serde_json::from_slice(&body) {
        Ok(req) => req,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("Error when parsing request: {e}"),
            )
        }
    };
    let Some(template_id) = req.template_id.filter(|t| !t.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "templateID is required");
    };
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if timeout <= 0 {
        return error(StatusCode::BAD_REQUEST, "Timeout must be greater than 0");
    }
    if timeout > MAX_TIMEOUT_SECS {
        return error(
            StatusCode::BAD_REQUEST,
            "Timeout cannot be greater than 24 hours",
        );
    }
    let secure = v2 || req.secure.unwrap_or(false);
    let public = req
        .network
        .as_ref()
        .and_then(|n| n.allow_public_traffic)
        .unwrap_or(true);
    if !public && !secure {
        return error(StatusCode::BAD_REQUEST, "You cannot create a sandbox without public access unless you enable secure envd access via 'secure' flag.");
    }
    let allow_out = req
        .network
        .as_ref()
        .and_then(|n| n.allow_out.clone())
        .unwrap_or_default();
    let deny_out = req
        .network
        .as_ref()
        .and_then(|n| n.deny_out.clone())
        .unwrap_or_default();
    if let Err(message) = super::egress::validate(&allow_out, &deny_out) {
        return error(StatusCode::BAD_REQUEST, &message);
    }
    let key = headers
        .get("idempotency-key")
        .and_then(|k| k.to_str().ok())
        .map(str::to_string);
    if let Some(key) = &key {
        if !key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            || key.len() > 255
        {
            return error(
                StatusCode::BAD_REQUEST,
                "Idempotency-Key must match [a-z0-9-]{1,255}",
            );
        }
        let existing = fake
            .idempotency
            .lock()
            .expect("idempotency")
            .get(key)
            .cloned();
        if let Some(id) = existing {
            if let Some(sandbox) = fake.sandbox(&id) {
                return (
                    StatusCode::CREATED,
                    Json(sandbox_json(&fake, &id, &sandbox)),
                )
                    .into_response();
            }
        }
    }

    // A built template runs its image; an unknown name, the host-like default.
    let found = fake
        .templates
        .lock()
        .expect("template table")
        .lookup(&template_id, true);
    let (template_id, alias, image) = match found {
        Lookup::Ready(id, image) => (id, template_id, Some(image)),
        Lookup::NotReady(message) => return error(StatusCode::BAD_REQUEST, &message),
        Lookup::Unknown => (template_id.clone(), template_id, None),
    };
    let id = random_id(ID_LEN, ID_ALPHABET);
    if let Err(e) = fake.sandboxes.create_from(&id, image.as_deref()).await {
        let body = json!({
            "code": 500,
            "message": format!("Failed to create sandbox: {e:#}"),
            "error_code": "sandbox_create_failed",
        });
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response();
    }
    let now = SystemTime::now();
    let sandbox = Sandbox {
        template_id,
        alias,
        metadata: req.metadata.unwrap_or_default(),
        env_vars: req.env_vars.unwrap_or_default(),
        started_at: now,
        end_at: now + Duration::from_secs(timeout as u64),
        paused: false,
        envd_access_token: random_hex(16),
        traffic_access_token: (!public).then(|| random_hex(16)),
        allow_internet_access: req.allow_internet_access.unwrap_or(true),
        allow_out,
        deny_out,
    };
    // Unsecured (v1 without `secure`) sandboxes have no envd token in E2B; the fake keeps one
    // internally but reports none, and envd then accepts requests without it.
    let mut reported = sandbox.clone();
    if !secure {
        reported.envd_access_token.clear();
    }
    fake.table
        .lock()
        .expect("sandbox table")
        .insert(id.clone(), reported.clone());
    if let Some(key) = key {
        fake.idempotency
            .lock()
            .expect("idempotency")
            .insert(key, id.clone());
    }
    (
        StatusCode::CREATED,
        Json(sandbox_json(&fake, &id, &reported)),
    )
        .into_response()
}

/// The `Sandbox` answer of create and connect.
pub(super) fn sandbox_json(fake: &E2b, id: &str, s: &Sandbox) -> Value {
    json!({
        "templateID": s.template_id,
        "sandboxID": id,
        "alias": s.alias,
        "clientID": "6532622b",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": (!s.envd_access_token.is_empty()).then_some(&s.envd_access_token),
        "trafficAccessToken": s.traffic_access_token,
        "domain": fake.config.domain,
    })
}

/// A `ListedSandbox`; `SandboxDetail` adds a few fields.
fn listed_json(id: &str, s: &Sandbox) -> Value {
    json!({
        "templateID": s.template_id,
        "alias": s.alias,
        "sandboxID": id,
        "clientID": "6532622b",
        "startedAt": rfc3339(s.started_at),
        "endAt": rfc3339(s.end_at),
        "cpuCount": CPU_COUNT,
        "memoryMB": MEMORY_MB,
        "diskSizeMB": DISK_SIZE_MB,
        "metadata": s.metadata,
        "state": if s.paused { "paused" } else { "running" },
        "envdVersion": ENVD_VERSION,
        "volumeMounts": [],
    })
}

/// `GET /sandboxes` (v1: every running sandbox, in one answer).
async fn list_v1(State(fake): State<Arc<E2b>>, RawQuery(query): RawQuery) -> Response {
    let (wanted_meta, _) = list_filters(query.as_deref());
    let table = fake.table.lock().expect("sandbox table");
    let items: Vec<Value> = table
        .iter()
        .filter(|(_, s)| !s.paused && matches_meta(s, &wanted_meta))
        .map(|(id, s)| listed_json(id, s))
        .collect();
    Json(items).into_response()
}

/// `GET /v2/sandboxes?metadata=k%3Dv&state=running&limit=N&nextToken=T`: a page of at most
/// `limit` (1 to 100, default 100; at most the fake's page size) sandboxes, newest first,
/// and `x-next-token` when more follow.
async fn list_v2(State(fake): State<Arc<E2b>>, RawQuery(query): RawQuery) -> Response {
    let (wanted_meta, pairs) = list_filters(query.as_deref());
    let mut states: Vec<String> = Vec::new();
    let mut limit = MAX_LIST_LIMIT;
    let mut after: Option<(u128, String)> = None;
    for (key, value) in pairs {
        match key.as_str() {
            "state" => states.extend(value.split(',').map(str::to_string)),
            "limit" => match value.parse::<usize>() {
                Ok(n) if (1..=MAX_LIST_LIMIT).contains(&n) => limit = n,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        &format!("limit must be between 1 and {MAX_LIST_LIMIT}"),
                    )
                }
            },
            "nextToken" => match decode_token(&value) {
                Some(cursor) => after = Some(cursor),
                None => return error(StatusCode::BAD_REQUEST, "Invalid next token"),
            },
            _ => {}
        }
    }
    let limit = limit.min(fake.config.page_size.max(1));
    let table = fake.table.lock().expect("sandbox table");
    let mut matching: Vec<((u128, String), &Sandbox)> = table
        .iter()
        .filter(|(_, s)| matches_meta(s, &wanted_meta))
        .filter(|(_, s)| {
            let state = if s.paused { "paused" } else { "running" };
            states.is_empty() || states.iter().any(|w| w == state)
        })
        .map(|(id, s)| ((nanos(s.started_at), id.clone()), s))
        .collect();
    // Newest first; the token is the last key served, the next page what comes after it.
    matching.sort_by(|a, b| b.0.cmp(&a.0));
    let rest: Vec<_> = matching
        .into_iter()
        .filter(|(key, _)| after.as_ref().is_none_or(|after| key < after))
        .collect();
    let page = &rest[..rest.len().min(limit)];
    let items: Vec<Value> = page.iter().map(|((_, id), s)| listed_json(id, s)).collect();
    let running = table.values().filter(|s| !s.paused).count();
    let mut resp = Json(items).into_response();
    resp.headers_mut().insert("x-total-running", running.into());
    if rest.len() > page.len() {
        if let Some((key, _)) = page.last() {
            let token = encode_token(key);
            resp.headers_mut().insert(
                "x-next-token",
                token.parse().expect("base64 is a header value"),
            );
        }
    }
    resp
}

/// The `metadata` filter (itself a URL-encoded query of URL-encoded keys and values) and
/// every query pair.
fn list_filters(query: Option<&str>) -> (BTreeMap<String, String>, Vec<(String, String)>) {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query.unwrap_or("")).unwrap_or_default();
    let mut wanted = BTreeMap::new();
    for (key, value) in &pairs {
        if key == "metadata" {
            let inner: Vec<(String, String)> =
                serde_urlencoded::from_str(value).unwrap_or_default();
            wanted.extend(inner);
        }
    }
    (wanted, pairs)
}

fn matches_meta(s: &Sandbox, wanted: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| s.metadata.get(k) == Some(v))
}

fn nanos(at: SystemTime) -> u128 {
    at.duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// An opaque page token: the last sandbox served (start time and id), base64.
fn encode_token((at, id): &(u128, String)) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{at}/{id}"))
}

fn decode_token(token: &str) -> Option<(u128, String)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let (at, id) = std::str::from_utf8(&raw).ok()?.split_once('/')?;
    Some((at.parse().ok()?, id.to_string()))
}

/// `GET /sandboxes/{id}`.
async fn detail(State(fake): State<Arc<E2b>>, Path(id): Path<String>) -> Response {
    let Some(s) = fake.sandbox(&id) else {
        return not_found(&id);
    };
    let mut body = listed_json(&id, &s);
    body["envdAccessToken"] =
        json!((!s.envd_access_token.is_empty()).then_some(&s.envd_access_token));
    body["domain"] = json!(fake.config.domain);
    body["allowInternetAccess"] = json!(s.allow_internet_access);
    body["network"] = json!({
        "allowPublicTraffic": s.traffic_access_token.is_none(),
        "allowOut": s.allow_out,
        "denyOut": s.deny_out,
    });
    body["lifecycle"] = json!({ "autoResume": false, "onTimeout": "kill" });
    Json(body).into_response()
}

/// `DELETE /sandboxes/{id}`.
async fn kill(State(fake): State<Arc<E2b>>, Path(id): Path<String>) -> Response {
    if fake
        .table
        .lock()
        .expect("sandbox table")
        .remove(&id)
        .is_none()
    {
        return not_found(&id);
    }
    if let Err(e) = fake.sandboxes.delete(&id).await {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("Error killing sandbox: {e}"),
        );
    }
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Debug, Deserialize)]
struct Timeout {
    timeout: Option<i64>,
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now.
async fn set_timeout(
    State(fake): State<Arc<E2b>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let Some(timeout) = serde_json::from_slice::<Timeout>(&body)
        .ok()
        .and_then(|t| t.timeout)
    else {
        return error(StatusCode::BAD_REQUEST, "timeout is required");
    };
    if timeout <= 0 {
        return error(StatusCode::BAD_REQUEST, "Timeout must be greater than 0");
    }
    let mut table = fake.table.lock().expect("sandbox table");
    let Some(s) = table.get_mut(&id) else {
        return not_found(&id);
    };
    s.end_at = SystemTime::now() + Duration::from_secs(timeout as u64);
    StatusCode::NO_CONTENT.into_response()
}

pub(super) fn not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("Sandbox \"{id}\" doesn't exist or you don't have access to it"),
    )
}

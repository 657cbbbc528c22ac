//! The fake E2B's template routes (the v2 build system, behind the API key): requesting a
//! build (`POST /v3/templates`), starting it (`POST /v2/templates/{id}/builds/{build}`), its
//! status and log (`GET /templates/{id}/builds/{build}/status?logsOffset=N`), and the list
//! (`GET /templates`), with E2B's field names, statuses and error bodies.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::builder::{self, BuildStart};
use super::templates::{clean, new_id, parse_name, Build, LogEntry, Status, Template, DEFAULT_TAG};
use super::{error, E2b};
use crate::sandboxes::uuid;
use crate::serve::rfc3339;

/// A template's size when the request gives none (`e2b template create`'s defaults).
const DEFAULT_CPU_COUNT: u32 = 2;
const DEFAULT_MEMORY_MB: u32 = 1024;
/// The most log entries one status call returns, and its default.
const MAX_LOGS_LIMIT: usize = 100;

/// The template routes (behind the API key).
pub(super) fn routes() -> Router<Arc<E2b>> {
    Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates", get(list))
        .route(
            "/templates/{id}/files/{hash}",
            get(super::storage::file_upload_link),
        )
        .route("/v2/templates/{id}/builds/{build}", post(start_build))
        .route("/templates/{id}/builds/{build}/status", get(build_status))
}

/// `TemplateBuildRequestV3`.
#[derive(Debug, Deserialize)]
struct NewTemplate {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    alias: Option<String>,
    #[serde(default)]
    tags: Option<Vec<String>>,
    #[serde(rename = "cpuCount", default)]
    cpu_count: Option<i64>,
    #[serde(rename = "memoryMB", default)]
    memory_mb: Option<i64>,
}

/// `POST /v3/templates`: a build of a new template, or of the one with that name.
async fn request_build(State(fake): State<Arc<E2b>>, body: axum::body::Bytes) -> Response {
    let req: NewTemplate = match serde_json::from_slice(&body) {
        Ok(req) => req,
        Err(e) => return bad_request(&format!("Error when parsing request: {e}")),
    };
    let Some(raw) = req.name.or(req.alias) else {
        return bad_request("name is required");
    };
    let (name, mut tags) = match parse_name(&raw) {
        Ok(parsed) => parsed,
        Err(message) => return bad_request(&message),
    };
    for tag in req.tags.unwrap_or_default() {
        match clean(&tag, "tag", b".") {
            Ok(tag) => tags.push(tag),
            Err(message) => return bad_request(&message),
        }
    }
    if tags.is_empty() {
        tags.push(DEFAULT_TAG.into());
    }
    let cpu_count = req.cpu_count.unwrap_or(i64::from(DEFAULT_CPU_COUNT));
    let memory_mb = req.memory_mb.unwrap_or(i64::from(DEFAULT_MEMORY_MB));
    if cpu_count < 1 {
        return bad_request("CPU count must be at least 1");
    }
    if memory_mb < 128 || memory_mb % 2 != 0 {
        return bad_request("Memory must be an even number of MiB, at least 128");
    }
    let now = SystemTime::now();
    let build = Build {
        id: uuid(),
        tags: tags.clone(),
        status: Status::Waiting,
        log: Vec::new(),
        reason: None,
        image: None,
        updated_at: now,
    };
    let build_id = build.id.clone();
    let mut table = fake.templates.lock().expect("template table");
    let id = match table.find(&name) {
        Some(existing) => existing.id.clone(),
        None => {
            let id = new_id();
            table.templates.insert(
                id.clone(),
                Template {
                    id: id.clone(),
                    name: name.clone(),
                    cpu_count: 0,
                    memory_mb: 0,
                    created_at: now,
                    builds: Vec::new(),
                    spawn_count: 0,
                },
            );
            id
        }
    };
    let template = table.templates.get_mut(&id).expect("inserted above");
    template.cpu_count = cpu_count as u32;
    template.memory_mb = memory_mb as u32;
    template.builds.push(build);
    let body = json!({
        "templateID": id,
        "buildID": build_id,
        "public": false,
        "aliases": [name],
        "names": [name],
        "tags": tags,
    });
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// `POST /v2/templates/{id}/builds/{build}`: 202, and the build runs.
async fn start_build(
    State(fake): State<Arc<E2b>>,
    Path((id, build_id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let start: BuildStart = match serde_json::from_slice(&body) {
        Ok(start) => start,
        Err(e) => return bad_request(&format!("Error when parsing request: {e}")),
    };
    if let Err(message) = start.check() {
        return bad_request(&message);
    }
    {
        let mut table = fake.templates.lock().expect("template table");
        if !table.templates.contains_key(&id) {
            return template_not_found(&id);
        }
        let Some(build) = table.build_mut(&id, &build_id) else {
            return error(
                StatusCode::NOT_FOUND,
                &format!("Build '{build_id}' of template '{id}' not found"),
            );
        };
        if build.status != Status::Waiting {
            return bad_request(&format!(
                "Build '{build_id}' is {}, not waiting to start",
                build.status.as_str()
            ));
        }
        build.status = Status::Building;
        build.updated_at = SystemTime::now();
    }
    tokio::spawn(builder::run(fake, id, build_id, start));
    StatusCode::ACCEPTED.into_response()
}

#[derive(Debug, Deserialize)]
struct StatusQuery {
    #[serde(rename = "logsOffset", default)]
    logs_offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    level: Option<String>,
}

/// `GET /templates/{id}/builds/{build}/status`: `TemplateBuildInfo`.
async fn build_status(
    State(fake): State<Arc<E2b>>,
    Path((id, build_id)): Path<(String, String)>,
    Query(query): Query<StatusQuery>,
) -> Response {
    let limit = query.limit.unwrap_or(MAX_LOGS_LIMIT);
    if limit > MAX_LOGS_LIMIT {
        return bad_request("limit must be at most 100");
    }
    let min_level = level_rank(query.level.as_deref().unwrap_or("debug"));
    let mut table = fake.templates.lock().expect("template table");
    if !table.templates.contains_key(&id) {
        return template_not_found(&id);
    }
    let Some(build) = table.build_mut(&id, &build_id) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("Build '{build_id}' of template '{id}' not found"),
        );
    };
    let entries: Vec<&LogEntry> = build
        .log
        .iter()
        .filter(|e| level_rank(e.level) >= min_level)
        .skip(query.logs_offset.unwrap_or(0))
        .take(limit)
        .collect();
    let mut body = json!({
        "templateID": id,
        "buildID": build_id,
        "status": build.status.as_str(),
        "logs": entries.iter().map(|e| format!("[{}] {}", rfc3339(e.at), e.message)).collect::<Vec<_>>(),
        "logEntries": entries.iter().map(|e| log_json(e)).collect::<Vec<_>>(),
    });
    if let Some((message, step)) = &build.reason {
        body["reason"] = json!({ "message": message, "step": step, "logEntries": [] });
    }
    Json(body).into_response()
}

/// `GET /templates`: every template, with its last build's state.
async fn list(State(fake): State<Arc<E2b>>) -> Response {
    let table = fake.templates.lock().expect("template table");
    let items: Vec<Value> = table
        .templates
        .values()
        .map(|t| {
            let last = t.builds.last();
            let last_ready = t.builds.iter().rev().find(|b| b.status == Status::Ready);
            json!({
                "templateID": t.id,
                "buildID": last_ready.map(|b| b.id.as_str()).unwrap_or(""),
                "cpuCount": t.cpu_count,
                "memoryMB": t.memory_mb,
                "diskSizeMB": super::api::DISK_SIZE_MB,
                "public": false,
                "aliases": [t.name],
                "names": [t.name],
                "createdAt": rfc3339(t.created_at),
                "updatedAt": rfc3339(last.map_or(t.created_at, |b| b.updated_at)),
                "createdBy": null,
                "lastSpawnedAt": null,
                "spawnCount": t.spawn_count,
                "buildCount": t.builds.len(),
                "envdVersion": super::api::ENVD_VERSION,
                "buildStatus": last.map_or("waiting", |b| b.status.as_str()),
            })
        })
        .collect();
    Json(items).into_response()
}

fn log_json(e: &LogEntry) -> Value {
    json!({ "timestamp": rfc3339(e.at), "level": e.level, "message": e.message, "step": e.step })
}

fn level_rank(level: &str) -> u8 {
    match level {
        "debug" => 0,
        "info" => 1,
        "warn" => 2,
        _ => 3,
    }
}

pub(super) fn bad_request(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

pub(super) fn template_not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("template '{id}' not found or you don't have access to it"),
    )
}

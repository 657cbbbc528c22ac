//! The fake's snapshot API (`/api/snapshots`), as Daytona's snapshot controller and service
//! answer: `POST` from a registry image (`imageName`, with a tag other than `latest` or a
//! digest) or a Dockerfile (`buildInfo`, without `imageName` or `entrypoint`; its
//! `contextHashes` must be empty, as the fake has no object storage for build contexts), 409
//! on a taken name; `GET` by id or name, paged lists, and `DELETE` by id. The snapshots
//! themselves are [`super::snapshots`].
//!
//! Build logs exist only for snapshots built from a Dockerfile: `build-logs` (`follow=true`
//! streams until the build ends) and `build-logs-url` (where to read them); pulled snapshots
//! answer 404 "has no build info", as Daytona does.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::ORGANIZATION;
use super::snapshots::{build, pull, BuildInfo, Snapshot, SnapshotState};
use super::{error, Daytona};
use crate::sandboxes::uuid;
use crate::serve::rfc3339;

/// Daytona's resources for a snapshot that names none (vCPU, GiB, GiB).
const DEFAULT_CPU: i64 = 1;
const DEFAULT_MEMORY: i64 = 1;
const DEFAULT_DISK: i64 = 3;
/// `GET /snapshots` page size when `limit` is not given.
const DEFAULT_PAGE_LIMIT: usize = 10;

/// The snapshot routes (under `/api`).
pub(super) fn routes() -> Router<Arc<Daytona>> {
    Router::new()
        .route("/api/snapshots", get(list).post(create))
        .route("/api/snapshots/{id}", get(detail).delete(remove))
        .route("/api/snapshots/{id}/build-logs", get(build_logs))
        .route("/api/snapshots/{id}/build-logs-url", get(build_logs_url))
}

/// `CreateSnapshotDto`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateSnapshot {
    name: Option<String>,
    image_name: Option<String>,
    entrypoint: Option<Vec<String>>,
    cpu: Option<i64>,
    gpu: Option<i64>,
    memory: Option<i64>,
    disk: Option<i64>,
    build_info: Option<CreateBuildInfo>,
}

/// `CreateBuildInfoDto`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBuildInfo {
    dockerfile_content: String,
    #[serde(default)]
    context_hashes: Vec<String>,
}

const PATH: &str = "/api/snapshots";

fn bad_request(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, PATH, message)
}

async fn create(State(fake): State<Arc<Daytona>>, body: axum::body::Bytes) -> Response {
    let req: CreateSnapshot = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&e.to_string()),
    };
    let Some(name) = req.name.clone() else {
        return bad_request("name must be a string");
    };
    // The controller's checks, then the service's, in Daytona's order.
    let source = match (req.build_info, req.image_name.clone()) {
        (Some(_), Some(_)) => {
            return bad_request("Cannot specify an image name when using a build info entry")
        }
        (Some(_), None) if req.entrypoint.is_some() => {
            return bad_request("Cannot specify an entrypoint when using a build info entry")
        }
        (Some(info), None) if !info.context_hashes.is_empty() => {
            return bad_request(
                "this fake has no object storage for build contexts: build from an Image \
                 without local files (contextHashes must be empty)",
            );
        }
        (Some(info), None) => {
            if info.dockerfile_content.trim().is_empty() {
                return bad_request("dockerfileContent must not be empty");
            }
            Source::Dockerfile(info.dockerfile_content)
        }
        (None, None) => {
            return bad_request("Must specify an image name when not using a build info entry")
        }
        (None, Some(image)) => {
            if let Some(reason) = invalid_image(&image) {
                return bad_request(reason);
            }
            Source::Image(image)
        }
    };
    if !valid_name(&name) {
        return bad_request(
            "Invalid snapshot name format. May contain letters, digits, dots, colons, and dashes",
        );
    }
    let now = SystemTime::now();
    let (image_name, build_info) = match &source {
        Source::Image(image) => (image.clone(), None),
        // Daytona names a built snapshot's image after its Dockerfile.
        Source::Dockerfile(dockerfile) => {
            use sha2::Digest;
            let digest = hex::encode(sha2::Sha256::digest(dockerfile.as_bytes()));
            let info = BuildInfo {
                dockerfile: dockerfile.clone(),
                created_at: now,
                log: Vec::new(),
            };
            (format!("daytona-{}:daytona", &digest[..16]), Some(info))
        }
    };
    let snapshot = Snapshot {
        id: uuid(),
        name: name.clone(),
        image_name: image_name.clone(),
        build_info,
        // Daytona drops empty arguments, and an entrypoint left with none.
        entrypoint: req
            .entrypoint
            .map(|e| {
                e.into_iter()
                    .filter(|a| !a.trim().is_empty())
                    .collect::<Vec<_>>()
            })
            .filter(|e| !e.is_empty()),
        cpu: req.cpu.unwrap_or(DEFAULT_CPU),
        gpu: req.gpu.unwrap_or(0),
        mem: req.memory.unwrap_or(DEFAULT_MEMORY),
        disk: req.disk.unwrap_or(DEFAULT_DISK),
        state: SnapshotState::Pending,
        error_reason: None,
        layout: None,
        created_at: now,
        updated_at: now,
    };
    {
        let mut table = fake.snapshots.table.lock().expect("snapshot table");
        if table.values().any(|s| s.name == name) {
            return error(
                StatusCode::CONFLICT,
                PATH,
                &format!("Snapshot with name \"{name}\" already exists for this organization"),
            );
        }
        table.insert(snapshot.id.clone(), snapshot.clone());
    }
    fake.snapshots
        .removed
        .lock()
        .expect("removed")
        .remove(&name);
    match source {
        Source::Image(image) => {
            tokio::spawn(pull(Arc::downgrade(&fake), snapshot.id.clone(), image));
        }
        Source::Dockerfile(dockerfile) => {
            tokio::spawn(build(
                Arc::downgrade(&fake),
                snapshot.id.clone(),
                dockerfile,
            ));
        }
    }
    Json(snapshot_json(&snapshot)).into_response()
}

/// Where a snapshot's image comes from.
enum Source {
    /// Pulled from a registry.
    Image(String),
    /// Built from this Dockerfile.
    Dockerfile(String),
}

/// Daytona's `IMAGE_NAME_REGEX`, which snapshot names must match too: `/`-separated
/// components of letters, digits, `_ . - :`, and an optional `@sha256:` digest.
fn valid_name(name: &str) -> bool {
    let path = match name.split_once("@sha256:") {
        Some((path, hex)) if is_sha256_hex(hex) => path,
        Some(_) => return false,
        None => name,
    };
    path.split('/').all(|part| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-:".contains(c))
    })
}

fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Daytona's `validateImageName`: why `image` is refused, if it is.
fn invalid_image(image: &str) -> Option<&'static str> {
    if let Some((name, digest)) = image.split_once("@sha256:") {
        return (name.is_empty() || !is_sha256_hex(digest))
            .then_some("Invalid digest format. Must be image@sha256:64_hex_characters");
    }
    if !image.contains(':') || image.trim_end().ends_with(':') {
        return Some("Image name must include a tag (e.g., ubuntu:22.04) or digest (@sha256:...)");
    }
    if image.ends_with(":latest") {
        return Some("Images with tag \":latest\" are not allowed");
    }
    (!valid_name(image)).then_some(
        "Invalid image name format. Must be lowercase, may contain digits, dots, dashes, and \
         single slashes between components",
    )
}

/// A `SnapshotDto`.
fn snapshot_json(s: &Snapshot) -> Value {
    json!({
        "id": s.id,
        "organizationId": ORGANIZATION,
        "general": false,
        "name": s.name,
        "imageName": s.image_name,
        "state": s.state.as_str(),
        "size": null,
        "entrypoint": s.entrypoint,
        "cpu": s.cpu,
        "gpu": s.gpu,
        "gpuType": null,
        "mem": s.mem,
        "disk": s.disk,
        "errorReason": s.error_reason,
        "createdAt": rfc3339(s.created_at),
        "updatedAt": rfc3339(s.updated_at),
        "lastUsedAt": null,
        "buildInfo": s.build_info.as_ref().map(|b| json!({
            "dockerfileContent": b.dockerfile,
            "contextHashes": [],
            "createdAt": rfc3339(b.created_at),
            "updatedAt": rfc3339(s.updated_at),
            "snapshotRef": s.image_name,
        })),
        "regionIds": ["us"],
        "initialRunnerId": null,
        "ref": null,
        "sourceSandboxId": null,
        "sandboxClass": "container",
    })
}

#[derive(Debug, Deserialize)]
struct Page {
    page: Option<usize>,
    limit: Option<usize>,
}

/// `GET /api/snapshots?page&limit`: `{items, total, page, totalPages}`, newest first.
async fn list(State(fake): State<Arc<Daytona>>, Query(q): Query<Page>) -> Response {
    let page = q.page.unwrap_or(1).max(1);
    let limit = q.limit.unwrap_or(DEFAULT_PAGE_LIMIT).max(1);
    let mut all: Vec<Snapshot> = fake
        .snapshots
        .table
        .lock()
        .expect("snapshot table")
        .values()
        .cloned()
        .collect();
    all.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let total = all.len();
    let items: Vec<Value> = all
        .iter()
        .skip((page - 1) * limit)
        .take(limit)
        .map(snapshot_json)
        .collect();
    Json(json!({
        "items": items,
        "total": total,
        "page": page,
        "totalPages": total.div_ceil(limit),
    }))
    .into_response()
}

/// `GET /api/snapshots/{idOrName}`.
async fn detail(State(fake): State<Arc<Daytona>>, Path(id): Path<String>) -> Response {
    match fake.snapshots.by_id_or_name(&id) {
        Some(s) => Json(snapshot_json(&s)).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            &format!("{PATH}/{id}"),
            &format!("Snapshot with name {id} not found"),
        ),
    }
}

/// `DELETE /api/snapshots/{id}` (by id only): 200, no body. Sandboxes made from it keep
/// running; new ones are refused.
async fn remove(State(fake): State<Arc<Daytona>>, Path(id): Path<String>) -> Response {
    let removed = fake
        .snapshots
        .table
        .lock()
        .expect("snapshot table")
        .remove(&id);
    match removed {
        Some(s) => {
            fake.snapshots
                .removed
                .lock()
                .expect("removed")
                .insert(s.name);
            StatusCode::OK.into_response()
        }
        None => error(
            StatusCode::NOT_FOUND,
            &format!("{PATH}/{id}"),
            &format!("Snapshot {id} not found"),
        ),
    }
}

#[derive(Debug, Deserialize)]
struct Follow {
    #[serde(default)]
    follow: Option<bool>,
}

/// How often a followed build log is looked at again.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// `GET /api/snapshots/{id}/build-logs[?follow=true]` (by id only): the build log as text, a
/// line each; followed, it streams until the build ends. Pulled snapshots have none.
async fn build_logs(
    State(fake): State<Arc<Daytona>>,
    Path(id): Path<String>,
    Query(q): Query<Follow>,
) -> Response {
    if let Some(refused) = no_build_info(&fake, &id) {
        return refused;
    }
    let follow = q.follow.unwrap_or(false);
    let stream = futures_util::stream::unfold(
        (fake, id, 0_usize, false),
        move |(fake, id, next, done)| async move {
            if done {
                return None;
            }
            loop {
                let (lines, finished) = match fake.snapshots.by_id_or_name(&id) {
                    Some(s) => (
                        s.build_info.map(|b| b.log).unwrap_or_default(),
                        s.state.is_final(),
                    ),
                    None => (Vec::new(), true),
                };
                if lines.len() > next {
                    let text: String = lines[next..].iter().map(|l| format!("{l}\n")).collect();
                    let total = lines.len();
                    return Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from(text)),
                        (fake, id, total, false),
                    ));
                }
                if finished || !follow {
                    return None;
                }
                tokio::time::sleep(FOLLOW_POLL).await;
            }
        },
    );
    (
        [("content-type", "text/plain; charset=utf-8")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

/// `GET /api/snapshots/{id}/build-logs-url`: where to read the build log.
async fn build_logs_url(
    State(fake): State<Arc<Daytona>>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Response {
    if let Some(refused) = no_build_info(&fake, &id) {
        return refused;
    }
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    Json(json!({ "url": format!("http://{host}{PATH}/{id}/build-logs") })).into_response()
}

/// The 404 for a snapshot that is not there, or was pulled (no build info); `None` for one
/// that was built.
fn no_build_info(fake: &Daytona, id: &str) -> Option<Response> {
    let path = format!("{PATH}/{id}/build-logs");
    let table = fake.snapshots.table.lock().expect("snapshot table");
    match table.get(id) {
        Some(s) if s.build_info.is_some() => None,
        Some(_) => Some(error(
            StatusCode::NOT_FOUND,
            &path,
            &format!("Snapshot {id} has no build info"),
        )),
        None => Some(error(
            StatusCode::NOT_FOUND,
            &path,
            &format!("Snapshot {id} not found"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_are_checked_as_daytona_checks_them() {
        assert_eq!(invalid_image("127.0.0.1:5000/sandbox:v1"), None);
        assert_eq!(invalid_image("ghcr.io/acme/sandbox:1.2"), None);
        assert!(invalid_image("ubuntu:latest").unwrap().contains("latest"));
        assert!(invalid_image("ubuntu")
            .unwrap()
            .contains("must include a tag"));
        assert!(invalid_image("ubuntu@sha256:abc")
            .unwrap()
            .contains("digest"));
        let digest = format!("ubuntu@sha256:{}", "a".repeat(64));
        assert_eq!(invalid_image(&digest), None);
        assert!(valid_name("tether-sandbox-1"));
        assert!(!valid_name("bad name"));
        assert!(!valid_name("a//b"));
    }
}

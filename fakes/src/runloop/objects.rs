//! The fake's objects (`/v1/objects`): create answers an `ObjectView` in `UPLOADING` with a
//! presigned `upload_url` (on the fake's own address, its signature in the query, no API key
//! needed), a `PUT` there stores the content, `complete` makes it `READ_ONLY`; `delete`
//! removes it. Blueprints read their build context from a `READ_ONLY` object.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{error, millis, new_id, Runloop};

/// The largest upload taken.
const MAX_OBJECT: usize = 256 << 20; // 256 MiB
/// Content types Runloop takes.
const CONTENT_TYPES: [&str; 6] = ["unspecified", "text", "binary", "gzip", "tar", "tgz"];

/// One object.
#[derive(Clone, Debug)]
pub(super) struct Object {
    id: String,
    name: String,
    pub(super) content_type: String,
    pub(super) state: &'static str,
    signature: String,
    size: Option<usize>,
    created: SystemTime,
}

impl Runloop {
    /// Where object `id`'s content is kept.
    pub(super) fn object_path(&self, id: &str) -> PathBuf {
        self.sandboxes.data_dir().join("runloop-objects").join(id)
    }

    /// Object `id`, if it exists.
    pub(super) fn object(&self, id: &str) -> Option<Object> {
        self.objects.lock().expect("objects").get(id).cloned()
    }
}

/// The object routes.
pub(super) fn routes() -> Router<Arc<Runloop>> {
    Router::new()
        .route("/v1/objects", post(create))
        .route("/v1/objects/{id}", get(detail))
        .route("/v1/objects/{id}/complete", post(complete))
        .route("/v1/objects/{id}/delete", post(remove))
}

#[derive(Debug, Deserialize)]
struct CreateObject {
    name: Option<String>,
    content_type: Option<String>,
}

fn view(o: &Object, upload_url: Option<String>) -> Value {
    json!({
        "id": o.id,
        "name": o.name,
        "content_type": o.content_type,
        "state": o.state,
        "create_time_ms": millis(o.created),
        "size_bytes": o.size,
        "upload_url": upload_url,
        "upload_headers": null,
    })
}

async fn create(State(fake): State<Arc<Runloop>>, req: Request) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string();
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let req: CreateObject = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("invalid request body: {e}"),
            )
        }
    };
    let (Some(name), Some(content_type)) = (req.name, req.content_type) else {
        return error(
            StatusCode::BAD_REQUEST,
            "name and content_type are required",
        );
    };
    if !CONTENT_TYPES.contains(&content_type.as_str()) {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("unknown content_type {content_type}"),
        );
    }
    let object = Object {
        id: new_id("obj"),
        name,
        content_type,
        state: "UPLOADING",
        signature: crate::sandboxes::random_hex(16),
        size: None,
        created: SystemTime::now(),
    };
    let url = format!(
        "http://{host}/__fake/uploads/{}?X-Signature={}",
        object.id, object.signature
    );
    fake.objects
        .lock()
        .expect("objects")
        .insert(object.id.clone(), object.clone());
    Json(view(&object, Some(url))).into_response()
}

/// `PUT /__fake/uploads/{id}?X-Signature=...`: the presigned upload.
pub(super) async fn upload(fake: &Arc<Runloop>, id: String, req: Request) -> Response {
    let signed = req
        .uri()
        .query()
        .and_then(|q| serde_urlencoded::from_str::<Vec<(String, String)>>(q).ok())
        .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == "X-Signature"))
        .map(|(_, v)| v);
    let Some(object) = fake.object(&id) else {
        return (StatusCode::NOT_FOUND, "NoSuchKey\n").into_response();
    };
    if req.method() != axum::http::Method::PUT || signed.as_deref() != Some(&object.signature) {
        return (StatusCode::FORBIDDEN, "SignatureDoesNotMatch\n").into_response();
    }
    if object.state != "UPLOADING" {
        return (StatusCode::FORBIDDEN, "the upload is closed\n").into_response();
    }
    let bytes = match axum::body::to_bytes(req.into_body(), MAX_OBJECT).await {
        Ok(b) => b,
        Err(_) => return (StatusCode::PAYLOAD_TOO_LARGE, "EntityTooLarge\n").into_response(),
    };
    let path = fake.object_path(&id);
    let written = async {
        tokio::fs::create_dir_all(path.parent().unwrap_or(&path)).await?;
        let tmp = path.with_extension("part");
        tokio::fs::write(&tmp, &bytes).await?;
        tokio::fs::rename(&tmp, &path).await
    };
    if let Err(e) = written.await {
        return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response();
    }
    if let Some(o) = fake.objects.lock().expect("objects").get_mut(&id) {
        o.size = Some(bytes.len());
    }
    StatusCode::OK.into_response()
}

fn not_found(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, &format!("Object {id} not found"))
}

async fn detail(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    match fake.object(&id) {
        Some(o) => Json(view(&o, None)).into_response(),
        None => not_found(&id),
    }
}

/// `POST /v1/objects/{id}/complete`: `UPLOADING` → `READ_ONLY`, once content was uploaded.
async fn complete(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    let mut objects = fake.objects.lock().expect("objects");
    let Some(o) = objects.get_mut(&id) else {
        return not_found(&id);
    };
    if o.state != "UPLOADING" {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("Object {id} is {}", o.state),
        );
    }
    if o.size.is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            &format!("Object {id} has no content uploaded"),
        );
    }
    o.state = "READ_ONLY";
    Json(view(o, None)).into_response()
}

async fn remove(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    let removed = fake.objects.lock().expect("objects").remove(&id);
    match removed {
        Some(mut o) => {
            let _ = tokio::fs::remove_file(fake.object_path(&id)).await;
            o.state = "DELETED";
            Json(view(&o, None)).into_response()
        }
        None => not_found(&id),
    }
}

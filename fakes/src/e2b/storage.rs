//! The fake E2B's storage for the files of COPY steps: `GET /templates/{id}/files/{hash}`
//! says whether files with that hash are present and, if not, where to upload their tar. E2B
//! hands out a presigned bucket URL; the fake serves the "bucket" itself, at
//! [`STORAGE_PREFIX`], authorized (as a presigned URL is) by the token in the URL alone.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::template_api::{bad_request, template_not_found};
use super::{error, E2b};
use crate::sandboxes::random_hex;

/// Where the fake's "bucket" takes uploads: `PUT {STORAGE_PREFIX}{hash}?token=...`.
pub(super) const STORAGE_PREFIX: &str = "/__storage/files/";
/// The largest upload the storage takes.
const MAX_UPLOAD: usize = 1 << 30; // 1 GiB
/// Random bytes in an upload URL's token.
const TOKEN_BYTES: usize = 16;

/// `GET /templates/{id}/files/{hash}`: 201 with `present`, and an upload URL when absent.
pub(super) async fn file_upload_link(
    State(fake): State<Arc<E2b>>,
    Path((id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if hash.is_empty() || hash.len() > 128 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return bad_request(&format!("invalid files hash: {hash}"));
    }
    let mut table = fake.templates.lock().expect("template table");
    if !table.templates.contains_key(&id) {
        return template_not_found(&id);
    }
    if table.files.contains_key(&hash) {
        return (StatusCode::CREATED, Json(json!({ "present": true }))).into_response();
    }
    let Some(host) = headers.get("host").and_then(|h| h.to_str().ok()) else {
        return error(StatusCode::BAD_REQUEST, "the request has no Host header");
    };
    let token = table
        .uploads
        .entry(hash.clone())
        .or_insert_with(|| random_hex(TOKEN_BYTES))
        .clone();
    let url = format!("http://{host}{STORAGE_PREFIX}{hash}?token={token}");
    (
        StatusCode::CREATED,
        Json(json!({ "present": false, "url": url })),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct UploadQuery {
    #[serde(default)]
    token: Option<String>,
}

/// `PUT {STORAGE_PREFIX}{hash}?token=...`: the "bucket", authorized by the URL's token only
/// (as a presigned URL is), storing the tar under the fake's data directory.
pub(super) async fn upload(fake: Arc<E2b>, req: Request) -> Response {
    let hash = req.uri().path()[STORAGE_PREFIX.len()..].to_string();
    let query: UploadQuery = serde_urlencoded::from_str(req.uri().query().unwrap_or(""))
        .unwrap_or(UploadQuery { token: None });
    if req.method() != "PUT" {
        return storage_error(StatusCode::METHOD_NOT_ALLOWED, "upload with PUT");
    }
    let expected = fake
        .templates
        .lock()
        .expect("template table")
        .uploads
        .get(&hash)
        .cloned();
    if expected.is_none() || expected != query.token {
        return storage_error(
            StatusCode::FORBIDDEN,
            "SignatureDoesNotMatch: the upload URL is not valid",
        );
    }
    let body = match axum::body::to_bytes(req.into_body(), MAX_UPLOAD).await {
        Ok(body) => body,
        Err(e) => return storage_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let path = fake.files_dir.join(format!("{hash}.tar.gz"));
    let stored = std::fs::create_dir_all(&fake.files_dir).and_then(|()| {
        let partial = path.with_extension("partial");
        std::fs::write(&partial, &body)?;
        std::fs::rename(&partial, &path)
    });
    if let Err(e) = stored {
        return storage_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
    }
    let mut table = fake.templates.lock().expect("template table");
    table.uploads.remove(&hash);
    table.files.insert(hash, path);
    StatusCode::OK.into_response()
}

/// A storage error, as a bucket answers it (XML-less here: one line of text).
fn storage_error(status: StatusCode, message: &str) -> Response {
    Response::builder()
        .status(status)
        .body(Body::from(message.to_string()))
        .expect("a valid response")
}

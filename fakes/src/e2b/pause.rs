//! The fake E2B's pause and its two ways back, with E2B's statuses and words: `POST
//! /sandboxes/{id}/pause` (204; 409 when paused), `POST /[v2/]sandboxes/{id}/connect` (201
//! when it resumed the sandbox, 200 when it ran) and the deprecated `POST
//! /sandboxes/{id}/resume` (201; 409 when it runs). A paused sandbox is unroutable (see
//! [`super::envd`] and the edge) and its processes are frozen, files and memory kept, through
//! the local sandbox's own pause.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::api::{not_found, sandbox_json, DEFAULT_TIMEOUT_SECS};
use super::{error, E2b, Sandbox};

/// `ConnectSandbox` / `ConnectSandboxV2` (`memory: false` asks a paused sandbox to reboot),
/// and the `timeout` of the older `ResumedSandbox`.
#[derive(Debug, Deserialize)]
struct Connect {
    timeout: Option<i64>,
    #[serde(default)]
    memory: Option<bool>,
}

/// `POST /[v2/]sandboxes/{id}/connect`: 200 when running (the timeout only grows), 201 after
/// resuming a paused sandbox.
pub(super) async fn connect(
    State(fake): State<Arc<E2b>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let req = serde_json::from_slice::<Connect>(&body).ok();
    if req.as_ref().and_then(|r| r.memory) == Some(false) {
        return memory_only();
    }
    let timeout = req.and_then(|r| r.timeout).unwrap_or(DEFAULT_TIMEOUT_SECS);
    if timeout <= 0 {
        return error(StatusCode::BAD_REQUEST, "Timeout must be greater than 0");
    }
    let running = {
        let mut table = fake.table.lock().expect("sandbox table");
        let Some(s) = table.get_mut(&id) else {
            return not_found(&id);
        };
        if s.paused {
            None
        } else {
            let until = SystemTime::now() + Duration::from_secs(timeout as u64);
            s.end_at = s.end_at.max(until);
            Some(s.clone())
        }
    };
    let (status, s) = match running {
        Some(s) => (StatusCode::OK, s),
        None => match wake(&fake, &id, timeout).await {
            Ok(s) => (StatusCode::CREATED, s),
            Err(resp) => return resp,
        },
    };
    (status, Json(sandbox_json(&fake, &id, &s))).into_response()
}

/// `POST /sandboxes/{id}/resume` (the older API): resumes a paused sandbox for `timeout`
/// seconds; 409 when it is running.
pub(super) async fn resume(
    State(fake): State<Arc<E2b>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let timeout = serde_json::from_slice::<Connect>(&body)
        .ok()
        .and_then(|t| t.timeout)
        .unwrap_or(DEFAULT_TIMEOUT_SECS);
    if timeout <= 0 {
        return error(StatusCode::BAD_REQUEST, "Timeout must be greater than 0");
    }
    match fake.sandbox(&id) {
        None => return not_found(&id),
        Some(s) if !s.paused => {
            return error(
                StatusCode::CONFLICT,
                &format!("Sandbox {id} is already running"),
            )
        }
        Some(_) => {}
    }
    match wake(&fake, &id, timeout).await {
        Ok(s) => (StatusCode::CREATED, Json(sandbox_json(&fake, &id, &s))).into_response(),
        Err(resp) => resp,
    }
}

/// `SandboxPauseRequest` (optional), the part the fake reads: `memory` (default true). Its
/// `requireHealthyGuest` needs nothing: every fake guest is healthy.
#[derive(Debug, Default, Deserialize)]
struct PauseRequest {
    #[serde(default)]
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204; 409 when already paused. Only E2B's default, a full
/// snapshot (memory and processes kept), is modelled: `"memory": false` (a filesystem-only
/// snapshot that reboots on resume) is refused, so a client relying on it learns the fake
/// cannot check it.
pub(super) async fn pause(
    State(fake): State<Arc<E2b>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    // The body is optional, as callers before `memory` send none.
    let req = if body.iter().all(u8::is_ascii_whitespace) {
        PauseRequest::default()
    } else {
        match serde_json::from_slice::<PauseRequest>(&body) {
            Ok(req) => req,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("Error when parsing request: {e}"),
                )
            }
        }
    };
    if req.memory == Some(false) {
        return memory_only();
    }
    {
        let mut table = fake.table.lock().expect("sandbox table");
        let Some(s) = table.get_mut(&id) else {
            return not_found(&id);
        };
        if s.paused {
            return error(
                StatusCode::CONFLICT,
                &format!("Error pausing sandbox - sandbox '{id}' is already paused"),
            );
        }
        // Unroutable first, frozen next: no request reaches a half-paused sandbox.
        s.paused = true;
    }
    if let Err(e) = fake.sandboxes.freeze(&id).await {
        tracing::warn!("cannot freeze the local sandbox behind {id}: {e}");
        set_paused(&fake, &id, false);
        return error(StatusCode::INTERNAL_SERVER_ERROR, "Error pausing sandbox");
    }
    StatusCode::NO_CONTENT.into_response()
}

fn set_paused(fake: &E2b, id: &str, paused: bool) {
    if let Some(s) = fake.table.lock().expect("sandbox table").get_mut(id) {
        s.paused = paused;
    }
}

/// Thaws paused sandbox `id` and makes it routable, to end `timeout` seconds from now; `Err`
/// is the answer to give.
async fn wake(fake: &E2b, id: &str, timeout: i64) -> Result<Sandbox, Response> {
    if let Err(e) = fake.sandboxes.thaw(id).await {
        tracing::warn!("cannot thaw the local sandbox behind {id}: {e}");
        return Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Error resuming sandbox",
        ));
    }
    let mut table = fake.table.lock().expect("sandbox table");
    let Some(s) = table.get_mut(id) else {
        return Err(not_found(id));
    };
    s.paused = false;
    s.end_at = SystemTime::now() + Duration::from_secs(timeout as u64);
    Ok(s.clone())
}

/// The fake's refusal of `"memory": false` (pause) and of a reboot on resume (connect).
fn memory_only() -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "this fake E2B pauses and resumes with memory only: filesystem-only snapshots and \
         reboots (\"memory\": false) are not modelled",
    )
}

//! The fake envd (port 49983 of every sandbox): `GET /health`, `GET /files` (a file's bytes,
//! as `sandbox.files.read` asks) and `process.Process/Start` over the Connect protocol with the
//! JSON codec, as E2B's SDKs call it. The process runs in the local sandbox through its agent,
//! in the background, so it outlives the stream as it does under envd; its output is streamed
//! while the client listens. Its environment is envd's: the sandbox's envVars, then the
//! request's envs, over the sandbox's base (`PATH`); a template's ENV steps are not in it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tether_client::{ClientError, Process, ProcessEvent};
use tether_proto::ErrorCode;

use super::{error, E2b};

/// Connect's end-of-stream envelope flag.
const END_STREAM: u8 = 0x02;
/// The largest request envd reads.
const MAX_REQUEST: usize = 1 << 20; // 1 MiB

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: Option<ProcessConfig>,
}

#[derive(Debug, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// A request to envd in sandbox `id`.
pub(super) async fn serve(fake: Arc<E2b>, id: String, req: Request) -> Response {
    // A paused sandbox is not routable: E2B's edge answers as for a missing one (it resumes
    // on traffic only with auto-resume, which the fake does not offer).
    let Some(sandbox) = fake.sandbox(&id).filter(|s| !s.paused) else {
        let body = json!({ "sandboxId": id, "message": "The sandbox was not found", "code": 502 });
        return (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response();
    };
    let path = req.uri().path().to_string();
    if req.method() == "GET" && path == "/health" {
        return StatusCode::NO_CONTENT.into_response();
    }
    if req.method() == "GET" && path == "/files" {
        let given = req
            .headers()
            .get("x-access-token")
            .and_then(|t| t.to_str().ok())
            .map(str::to_string);
        let query = req.uri().query().unwrap_or("").to_string();
        return read_file(&fake, &id, &sandbox.envd_access_token, given, &query).await;
    }
    if !sandbox.envd_access_token.is_empty() {
        let given = req
            .headers()
            .get("x-access-token")
            .and_then(|t| t.to_str().ok());
        if given != Some(sandbox.envd_access_token.as_str()) {
            return error(StatusCode::UNAUTHORIZED, "unauthorized access, please provide a valid access token or method signing if supported");
        }
    }
    if req.method() != "POST" || path != "/process.Process/Start" {
        return connect_error(
            StatusCode::NOT_FOUND,
            "unimplemented",
            &format!("{path} is not served by this fake envd"),
        );
    }
    let json_codec = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.starts_with("application/connect+json"));
    if !json_codec {
        return connect_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unimplemented",
            "this fake envd speaks application/connect+json only",
        );
    }
    let body = match axum::body::to_bytes(req.into_body(), MAX_REQUEST).await {
        Ok(b) => b,
        Err(e) => {
            return connect_error(StatusCode::BAD_REQUEST, "invalid_argument", &e.to_string())
        }
    };
    let Some(message) = body.get(5..).filter(|_| body.len() >= 5) else {
        return connect_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "the request is not a Connect envelope",
        );
    };
    let start: StartRequest = match serde_json::from_slice(message) {
        Ok(s) => s,
        Err(e) => {
            return connect_error(StatusCode::BAD_REQUEST, "invalid_argument", &e.to_string())
        }
    };
    let Some(config) = start.process else {
        return connect_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "process is required",
        );
    };
    // envd's environment: the create-time envVars, then the request's.
    let mut env = sandbox.env_vars.clone();
    env.extend(config.envs);
    let argv: Vec<String> = std::iter::once(config.cmd).chain(config.args).collect();
    let events: Vec<Bytes> = match fake.sandboxes.start(&id, argv, env, config.cwd).await {
        Ok(process) => return stream_response(process),
        Err(e) => vec![envelope(
            END_STREAM,
            &json!({ "error": { "code": "internal", "message": format!("error starting process: {e:#}") } }),
        )],
    };
    streaming(futures_util::stream::iter(
        events.into_iter().map(Ok::<_, std::io::Error>),
    ))
}

#[derive(Debug, Deserialize)]
struct FilesQuery {
    #[serde(default)]
    path: String,
    #[serde(default)]
    signature: Option<String>,
}

/// `GET /files?path=&username=`: the file's bytes. Exempt from envd's general token check,
/// it takes the token in `X-Access-Token` or a signature (which this fake does not make, so
/// it refuses them); a missing file is 404, a directory 400, in envd's words.
async fn read_file(
    fake: &E2b,
    id: &str,
    token: &str,
    given: Option<String>,
    query: &str,
) -> Response {
    let query: FilesQuery = serde_urlencoded::from_str(query).unwrap_or(FilesQuery {
        path: String::new(),
        signature: None,
    });
    if !token.is_empty() {
        let refused = match (given.as_deref(), &query.signature) {
            (Some(given), _) if given == token => None,
            (Some(_), _) => Some("access token present in header but does not match"),
            (None, None) => Some("missing signature query parameter"),
            (None, Some(_)) => Some("invalid signature"),
        };
        if let Some(why) = refused {
            return error(StatusCode::UNAUTHORIZED, why);
        }
    }
    // Relative paths are the default user's home, as envd resolves them.
    let path = if query.path.starts_with('/') {
        query.path.clone()
    } else {
        format!("/home/user/{}", query.path)
    };
    let read = async {
        let session = fake.sandboxes.session(id).await?;
        session
            .read_file(path.as_str())
            .await
            .map_err(anyhow::Error::new)
    };
    match read.await {
        Ok(bytes) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response(),
        Err(e) => {
            let code = e.downcast_ref::<ClientError>().and_then(|e| match e {
                ClientError::Remote { code, .. } => Some(*code),
                _ => None,
            });
            match code {
                Some(ErrorCode::NotFound) => error(
                    StatusCode::NOT_FOUND,
                    &format!("path '{path}' does not exist"),
                ),
                Some(ErrorCode::IsDirectory) => error(
                    StatusCode::BAD_REQUEST,
                    &format!("path '{path}' is a directory"),
                ),
                _ => error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("error opening file '{path}': {e:#}"),
                ),
            }
        }
    }
}

/// The `StartResponse` stream of a running process: start, data, end, then end-of-stream.
fn stream_response(process: Process) -> Response {
    let first = envelope(0, &json!({ "event": { "start": { "pid": process.pid } } }));
    let rest = futures_util::stream::unfold(Some(process), |state| async move {
        let mut process = state?;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let frame = match process.next().await {
            Some(Ok(ProcessEvent::Stdout(b))) => {
                envelope(0, &json!({ "event": { "data": { "stdout": b64(&b) } } }))
            }
            Some(Ok(ProcessEvent::Stderr(b))) => {
                envelope(0, &json!({ "event": { "data": { "stderr": b64(&b) } } }))
            }
            Some(Ok(ProcessEvent::Dropped { .. })) => {
                envelope(0, &json!({ "event": { "keepalive": {} } }))
            }
            Some(Ok(ProcessEvent::Exit(status))) => {
                let code = status.shell_code();
                let end = envelope(
                    0,
                    &json!({ "event": { "end": {
                    "exitCode": code, "exited": status.signal.is_none(), "status": format!("exit status {code}"),
                } } }),
                );
                let mut both = end.to_vec();
                both.extend_from_slice(&envelope(END_STREAM, &json!({})));
                return Some((Ok::<_, std::io::Error>(Bytes::from(both)), None));
            }
            Some(Err(e)) => {
                let end = envelope(
                    END_STREAM,
                    &json!({ "error": { "code": "unavailable", "message": e.to_string() } }),
                );
                return Some((Ok(end), None));
            }
            None => return None,
        };
        Some((Ok(frame), Some(process)))
    });
    streaming(futures_util::stream::once(async move { Ok(first) }).chain(rest))
}

fn streaming<S>(stream: S) -> Response
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/connect+json")
        .body(Body::from_stream(stream))
        .expect("a valid response")
}

/// A Connect envelope around `message`.
fn envelope(flags: u8, message: &serde_json::Value) -> Bytes {
    let json = serde_json::to_vec(message).expect("JSON values serialize");
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    Bytes::from(out)
}

/// A Connect error answered before any stream: `{"code", "message"}` with an HTTP status.
fn connect_error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({ "code": code, "message": message })),
    )
        .into_response()
}

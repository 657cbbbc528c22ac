//! E2B's template-build API (the v2 build system, as E2B's SDKs call it), with E2B's exact
//! paths, field names and statuses: request a build (`POST /v3/templates`), ask where a COPY
//! step's files go (`GET /templates/{id}/files/{hash}`), upload them there, start the build
//! (`POST /v2/templates/{id}/builds/{build}`) and read its status and log
//! (`GET /templates/{id}/builds/{build}/status?logsOffset=N`).

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::cloud::http::{message_of, CallError, ControlPlane};
use crate::image::TargetError;

/// The provider's name in errors.
const PROVIDER: &str = "e2b";
/// The most log entries one status call returns (the API's maximum `limit`).
pub(super) const LOGS_LIMIT: usize = 100;
/// How long the upload of the agent may take (the SDK allows an hour for whole contexts).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// `TemplateBuildRequestV3`: the template's name (`alias[:tag]`) and its sandboxes' size.
#[derive(Debug, Serialize)]
pub(super) struct NewTemplate<'a> {
    /// The name sandboxes are created with.
    pub name: &'a str,
    /// CPU cores of each sandbox.
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    /// Memory of each sandbox, MiB.
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
}

/// `TemplateRequestResponseV3` (the part we use).
#[derive(Debug, Deserialize)]
pub(super) struct Requested {
    /// The template's id.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// The build to start.
    #[serde(rename = "buildID")]
    pub build_id: String,
}

/// `TemplateBuildFileUpload`.
#[derive(Debug, Deserialize)]
pub(super) struct FileUpload {
    /// E2B already has files with this hash: nothing to upload.
    pub present: bool,
    /// Where to PUT the tar (a presigned storage URL), when not present.
    #[serde(default)]
    pub url: Option<String>,
    /// Headers the upload must carry (the presigned URL's signed headers).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// `TemplateBuildStartV2`: the base, the steps on top of it, and the commands.
#[derive(Debug, Serialize)]
pub(super) struct BuildStart {
    /// A registry image to start from.
    #[serde(rename = "fromImage", skip_serializing_if = "Option::is_none")]
    pub from_image: Option<String>,
    /// Rebuild every layer, whatever the cache holds.
    pub force: bool,
    /// What to do on top of the base, in order.
    pub steps: Vec<Step>,
    /// Checked at the end of the build until it succeeds.
    #[serde(rename = "readyCmd", skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
}

/// `TemplateStep`, as the SDK encodes each instruction.
#[derive(Debug, Serialize)]
pub(super) struct Step {
    /// `COPY`, `ENV`, `WORKDIR` or `USER` (Tether sends no `RUN`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// COPY: source, destination, owner, octal mode; ENV: key, value, key, value...;
    /// WORKDIR: the directory; USER: the user.
    pub args: Vec<String>,
    /// COPY only: the hash the files were uploaded under.
    #[serde(rename = "filesHash", skip_serializing_if = "Option::is_none")]
    pub files_hash: Option<String>,
    /// Run the step even when cached.
    pub force: bool,
}

/// `TemplateBuildStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum BuildStatus {
    /// Running.
    Building,
    /// Queued.
    Waiting,
    /// Done: sandboxes can be created from it.
    Ready,
    /// Failed; `reason` says why.
    Error,
}

/// `BuildLogEntry`.
#[derive(Debug, Deserialize)]
pub(super) struct LogEntry {
    /// The line.
    pub message: String,
    /// `debug`, `info`, `warn` or `error`.
    #[serde(default)]
    pub level: String,
}

/// `BuildStatusReason`.
#[derive(Debug, Deserialize)]
pub(super) struct Reason {
    /// What went wrong.
    pub message: String,
    /// The step that failed: `base`, `finalize` or a step's index.
    #[serde(default)]
    pub step: Option<String>,
}

/// `TemplateBuildInfo` (the part we use).
#[derive(Debug, Deserialize)]
pub(super) struct BuildInfo {
    /// Where the build is.
    pub status: BuildStatus,
    /// Log entries from the offset asked for.
    #[serde(rename = "logEntries", default)]
    pub log_entries: Vec<LogEntry>,
    /// Why it failed, for `error`.
    #[serde(default)]
    pub reason: Option<Reason>,
}

/// `POST /v3/templates`: a new template (or a new build of an existing name).
pub(super) async fn request_build(
    api: &ControlPlane,
    body: &NewTemplate<'_>,
) -> Result<Requested, TargetError> {
    let what = format!("the request to build template {}", body.name);
    let body = serde_json::to_value(body).expect("plain structs serialize");
    let answer = api
        .call(Method::POST, "/v3/templates", Some(&body), &what)
        .await
        .map_err(failure)?;
    parse(&answer.body, &what)
}

/// `GET /templates/{id}/files/{hash}`: whether E2B has the files, else where to upload them.
pub(super) async fn file_upload_link(
    api: &ControlPlane,
    template_id: &str,
    hash: &str,
) -> Result<FileUpload, TargetError> {
    let what = "the upload link for the agent".to_string();
    let path = format!("/templates/{template_id}/files/{hash}");
    let answer = api
        .call(Method::GET, &path, None, &what)
        .await
        .map_err(failure)?;
    parse(&answer.body, &what)
}

/// PUTs `tar_gz` to the presigned `url` with the `headers` E2B asked for. Without E2B's key:
/// the URL carries its own authorization, and storage has no business seeing the key.
pub(super) async fn upload(
    http: &reqwest::Client,
    url: &str,
    headers: &BTreeMap<String, String>,
    tar_gz: Vec<u8>,
) -> Result<(), TargetError> {
    let failed = |message: String| TargetError::Api {
        provider: PROVIDER,
        message: format!("uploading the agent to E2B's storage failed: {message}"),
    };
    let mut req = http.put(url).timeout(UPLOAD_TIMEOUT);
    // The length is ours to set (a presigned URL refuses chunked bodies); the rest is E2B's.
    for (name, value) in headers
        .iter()
        .filter(|(n, _)| !n.eq_ignore_ascii_case("content-length"))
    {
        req = req.header(name.as_str(), value.as_str());
    }
    let resp = req
        .body(tar_gz)
        .send()
        .await
        .map_err(|e| failed(format!("cannot reach {url}: {e}")))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.bytes().await.unwrap_or_default();
        return Err(failed(format!("HTTP {status}: {}", message_of(&body))));
    }
    Ok(())
}

/// `POST /v2/templates/{id}/builds/{build}`: starts the build.
pub(super) async fn start_build(
    api: &ControlPlane,
    template_id: &str,
    build_id: &str,
    body: &BuildStart,
) -> Result<(), TargetError> {
    let what = format!("the start of build {build_id}");
    let path = format!("/v2/templates/{template_id}/builds/{build_id}");
    let body = serde_json::to_value(body).expect("plain structs serialize");
    api.call(Method::POST, &path, Some(&body), &what)
        .await
        .map_err(failure)?;
    Ok(())
}

/// `GET /templates/{id}/builds/{build}/status`: the status and the log entries from
/// `logs_offset` on (at most [`LOGS_LIMIT`]).
pub(super) async fn build_status(
    api: &ControlPlane,
    template_id: &str,
    build_id: &str,
    logs_offset: usize,
) -> Result<BuildInfo, TargetError> {
    let what = format!("the status of build {build_id}");
    let path = format!(
        "/templates/{template_id}/builds/{build_id}/status?logsOffset={logs_offset}&limit={LOGS_LIMIT}"
    );
    let answer = api
        .call(Method::GET, &path, None, &what)
        .await
        .map_err(failure)?;
    parse(&answer.body, &what)
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, TargetError> {
    serde_json::from_slice(body).map_err(|e| TargetError::Api {
        provider: PROVIDER,
        message: format!(
            "unexpected answer to {what}: {e} (body: {})",
            crate::cloud::http::quote(body)
        ),
    })
}

/// A failed call: a refused key is a settings problem, anything else E2B's answer.
fn failure(e: CallError) -> TargetError {
    match e {
        CallError::Status {
            status: status @ (401 | 403),
            message,
            key_var,
            ..
        } => TargetError::Settings(format!(
            "E2B refused the key in {key_var} (HTTP {status}: {message}); set {key_var} to a \
             valid E2B API key"
        )),
        e => TargetError::Api {
            provider: PROVIDER,
            message: e.to_string(),
        },
    }
}

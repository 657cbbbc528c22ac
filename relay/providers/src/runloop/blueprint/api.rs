//! Runloop's object and blueprint API (`/v1/objects`, `/v1/blueprints`): the bodies `tether
//! image build --target runloop` sends and reads, with Runloop's field names (its SDK's
//! `ObjectCreateParams`, `ObjectView`, `BlueprintCreateParams`, `BlueprintView`,
//! `BlueprintBuildLogsListView`), one function per call, and Runloop's refusals turned into
//! [`TargetError`]s.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::cloud::http::{quote, CallError, ControlPlane};
use crate::image::TargetError;
use crate::runloop::api::check_id;
use crate::runloop::KEY_VAR;

const PROVIDER: &str = "runloop";

/// `POST /v1/objects`: an object the build context is uploaded to.
#[derive(Debug, Serialize)]
pub(super) struct NewObject<'a> {
    /// Its name.
    pub name: &'a str,
    /// `tgz`: a gzipped tar.
    pub content_type: &'a str,
    /// Deleted by Runloop this long after its creation, in milliseconds.
    pub ttl_ms: u64,
}

/// An `ObjectView` as a create answers it (the part we read).
#[derive(Debug, Deserialize)]
pub(super) struct Object {
    /// `obj_...`.
    pub id: String,
    /// Where to `PUT` the content (present on create).
    #[serde(default)]
    pub upload_url: Option<String>,
    /// Headers the upload must carry.
    #[serde(default)]
    pub upload_headers: Option<BTreeMap<String, String>>,
}

/// `POST /v1/blueprints`.
#[derive(Debug, Serialize)]
pub(super) struct NewBlueprint<'a> {
    /// What `tether create --provider runloop --image NAME` takes.
    pub name: &'a str,
    /// `FROM` the base, `COPY` the agent, the overrides.
    pub dockerfile: &'a str,
    /// The uploaded context.
    pub build_context: BuildContext<'a>,
    /// Says what made it.
    pub metadata: BTreeMap<&'a str, &'a str>,
}

/// `build_context`.
#[derive(Debug, Serialize)]
pub(super) struct BuildContext<'a> {
    /// `object`.
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// The object holding the context.
    pub object_id: &'a str,
}

/// A `BlueprintView` (the part we read).
#[derive(Debug, Deserialize)]
pub(super) struct Blueprint {
    /// `bpt_...`.
    pub id: String,
    /// `queued`, `provisioning`, `building`, `failed`, `build_complete`.
    pub status: String,
    /// Why a build failed.
    #[serde(default)]
    pub failure_reason: Option<String>,
}

/// One line of `GET /v1/blueprints/{id}/logs`.
#[derive(Debug, Deserialize)]
pub(super) struct LogLine {
    /// Its severity.
    #[serde(default)]
    pub level: String,
    /// The line.
    pub message: String,
}

/// `POST /v1/objects`.
pub(super) async fn create_object(
    api: &ControlPlane,
    body: &NewObject<'_>,
) -> Result<Object, TargetError> {
    let json = serde_json::to_value(body).map_err(|e| api_error(e.to_string()))?;
    let what = "the creation of the build context's object";
    let object: Object = api
        .call(Method::POST, "/v1/objects", Some(&json), what)
        .await
        .map_err(refused)?
        .json(what)
        .map_err(|e| api_error(e.to_string()))?;
    check_id("object id", &object.id).map_err(|e| api_error(e.to_string()))?;
    Ok(object)
}

/// `PUT` of `content` to an object's upload URL, with the headers Runloop asked for and
/// nothing of ours (the URL is its own credential).
pub(super) async fn upload(
    http: &reqwest::Client,
    object: &Object,
    content: Vec<u8>,
) -> Result<(), TargetError> {
    let Some(url) = object.upload_url.as_deref() else {
        return Err(api_error(
            "Runloop gave no upload URL for the build context".into(),
        ));
    };
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(api_error(format!(
            "Runloop's upload URL for the build context is not an HTTP URL: {}",
            quote(url.as_bytes())
        )));
    }
    let mut req = http.put(url).body(content);
    for (name, value) in object.upload_headers.iter().flatten() {
        req = req.header(name, value);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| api_error(format!("uploading the build context failed: {e}")))?;
    let status = resp.status();
    if !status.is_success() {
        // The URL is a credential: its storage's answer is quoted, the URL is not.
        let body = resp.bytes().await.unwrap_or_default();
        return Err(api_error(format!(
            "the storage refused the build context's upload (HTTP {}): {}",
            status.as_u16(),
            quote(&body)
        )));
    }
    Ok(())
}

/// `POST /v1/objects/{id}/complete`.
pub(super) async fn complete_object(api: &ControlPlane, id: &str) -> Result<(), TargetError> {
    let what = "completing the build context's upload";
    api.call(
        Method::POST,
        &format!("/v1/objects/{id}/complete"),
        None,
        what,
    )
    .await
    .map(drop)
    .map_err(refused)
}

/// `POST /v1/objects/{id}/delete`.
pub(super) async fn delete_object(api: &ControlPlane, id: &str) -> Result<(), TargetError> {
    let what = "deleting the build context's object";
    api.call(
        Method::POST,
        &format!("/v1/objects/{id}/delete"),
        None,
        what,
    )
    .await
    .map(drop)
    .map_err(refused)
}

/// `POST /v1/blueprints`.
pub(super) async fn create(
    api: &ControlPlane,
    body: &NewBlueprint<'_>,
) -> Result<Blueprint, TargetError> {
    let json = serde_json::to_value(body).map_err(|e| api_error(e.to_string()))?;
    let what = format!("the creation of blueprint {}", body.name);
    let blueprint: Blueprint = api
        .call(Method::POST, "/v1/blueprints", Some(&json), &what)
        .await
        .map_err(refused)?
        .json(&what)
        .map_err(|e| api_error(e.to_string()))?;
    check_id("blueprint id", &blueprint.id).map_err(|e| api_error(e.to_string()))?;
    Ok(blueprint)
}

/// `GET /v1/blueprints/{id}`.
pub(super) async fn get(api: &ControlPlane, id: &str) -> Result<Blueprint, TargetError> {
    let what = format!("a lookup of blueprint {id}");
    api.call(Method::GET, &format!("/v1/blueprints/{id}"), None, &what)
        .await
        .map_err(refused)?
        .json(&what)
        .map_err(|e| api_error(e.to_string()))
}

/// `GET /v1/blueprints/{id}/logs`: every line so far.
pub(super) async fn logs(api: &ControlPlane, id: &str) -> Result<Vec<LogLine>, TargetError> {
    #[derive(Deserialize)]
    struct Logs {
        logs: Vec<LogLine>,
    }
    let what = format!("the build log of blueprint {id}");
    let logs: Logs = api
        .call(
            Method::GET,
            &format!("/v1/blueprints/{id}/logs"),
            None,
            &what,
        )
        .await
        .map_err(refused)?
        .json(&what)
        .map_err(|e| api_error(e.to_string()))?;
    Ok(logs.logs)
}

fn api_error(message: String) -> TargetError {
    TargetError::Api {
        provider: PROVIDER,
        message,
    }
}

/// A refused key says which setting to fix; anything else is Runloop's own message.
fn refused(e: CallError) -> TargetError {
    match e.status() {
        Some(401 | 403) => TargetError::Settings(format!(
            "{e}; set {KEY_VAR} (in the environment, or `api_key` under [runloop] in the relay's \
             config.toml) to a valid Runloop API key"
        )),
        _ => api_error(e.to_string()),
    }
}

//! Daytona's snapshot API (`{DAYTONA_API_URL}/snapshots...`, `Authorization: Bearer <key>`):
//! the bodies `tether image build --target daytona` sends and reads, with Daytona's field
//! names, one function per call, and Daytona's refusals turned into [`TargetError`]s.

use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::cloud::http::{CallError, ControlPlane};
use crate::daytona::KEY_VAR;
use crate::image::TargetError;

const PROVIDER: &str = "daytona";

/// `POST /snapshots` from a registry image.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CreateSnapshot<'a> {
    /// The snapshot's name: what `tether create --provider daytona --image` takes.
    pub name: &'a str,
    /// The registry image Daytona pulls (a tag other than `latest`, or a digest).
    pub image_name: &'a str,
    /// What Daytona's daemon starts in every sandbox (it replaces the image's ENTRYPOINT with
    /// itself and runs this; the image's CMD is dropped).
    pub entrypoint: &'a [&'a str],
}

/// A `SnapshotDto` (the part we read).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Snapshot {
    /// Daytona's id (a UUID).
    pub id: String,
    /// `pending`, `pulling`, `active`, `error`, `build_failed`, ...
    pub state: String,
    /// Why it is in `error` or `build_failed`.
    #[serde(default)]
    pub error_reason: Option<String>,
}

/// `POST /snapshots`.
pub(super) async fn create(
    api: &ControlPlane,
    body: &CreateSnapshot<'_>,
) -> Result<Snapshot, TargetError> {
    let json = serde_json::to_value(body).map_err(|e| api_error(e.to_string()))?;
    let what = format!("the creation of snapshot {}", body.name);
    match api
        .call(Method::POST, "/snapshots", Some(&json), &what)
        .await
    {
        Ok(answer) => answer.json(&what).map_err(|e| api_error(e.to_string())),
        Err(e) if e.status() == Some(409) => Err(api_error(format!(
            "{e}; pick another --name, or delete the existing snapshot on Daytona first"
        ))),
        Err(e) => Err(refused(e)),
    }
}

/// `GET /snapshots/{id}`.
pub(super) async fn get(api: &ControlPlane, id: &str) -> Result<Snapshot, TargetError> {
    let what = format!("a lookup of snapshot {id}");
    api.call(Method::GET, &format!("/snapshots/{id}"), None, &what)
        .await
        .map_err(refused)?
        .json(&what)
        .map_err(|e| api_error(e.to_string()))
}

/// `DELETE /snapshots/{id}`.
pub(super) async fn delete(api: &ControlPlane, id: &str) -> Result<(), TargetError> {
    let what = format!("the deletion of snapshot {id}");
    api.call(Method::DELETE, &format!("/snapshots/{id}"), None, &what)
        .await
        .map(drop)
        .map_err(refused)
}

fn api_error(message: String) -> TargetError {
    TargetError::Api {
        provider: PROVIDER,
        message,
    }
}

/// A refused key says which setting to fix; anything else is Daytona's own message.
fn refused(e: CallError) -> TargetError {
    match e.status() {
        Some(401 | 403) => TargetError::Settings(format!(
            "{e}; set {KEY_VAR} (in the environment, or `api_key` under [daytona] in the relay's \
             config.toml) to a valid Daytona API key"
        )),
        _ => api_error(e.to_string()),
    }
}

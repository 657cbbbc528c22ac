//! E2B's control plane (`https://api.{domain}`, key in `X-API-Key`): the request and answer
//! bodies we use, with E2B's exact field names, and one function per call.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::provider::cloud::http::{CallError, ControlPlane};
use crate::provider::ProviderError;

/// `POST /v2/sandboxes` (always secured: envd demands its access token).
#[derive(Debug, Serialize)]
pub(super) struct NewSandbox<'a> {
    /// The template: an id or a name.
    #[serde(rename = "templateID")]
    pub template_id: &'a str,
    /// Seconds until E2B kills the sandbox, unless extended.
    pub timeout: u64,
    /// Our labels, plus the relay's id.
    pub metadata: &'a BTreeMap<String, String>,
    /// Environment of every process envd starts.
    #[serde(rename = "envVars")]
    pub env_vars: &'a BTreeMap<String, String>,
    /// Outbound internet access (E2B spells this one in snake case).
    pub allow_internet_access: bool,
    /// Inbound and outbound traffic rules.
    pub network: Network,
}

/// `network` of a new sandbox (E2B's `SandboxNetworkConfig`).
#[derive(Debug, Serialize)]
pub(super) struct Network {
    /// `false`: the edge demands the traffic access token for every port but envd's.
    #[serde(rename = "allowPublicTraffic")]
    pub allow_public_traffic: bool,
    /// Destinations allowed out: addresses, CIDRs, host names; wins over `denyOut`.
    #[serde(rename = "allowOut", skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    /// Destinations denied out: addresses and CIDRs only.
    #[serde(rename = "denyOut", skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
}

/// What `create` and `connect` answer.
#[derive(Debug, Deserialize)]
pub(super) struct Sandbox {
    /// E2B's id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// The token envd demands in `X-Access-Token`.
    #[serde(rename = "envdAccessToken", default)]
    pub envd_access_token: Option<String>,
    /// The token the edge demands for other ports, when public traffic is off.
    #[serde(rename = "trafficAccessToken", default)]
    pub traffic_access_token: Option<String>,
    /// The sandbox's domain, when it differs from the client's.
    #[serde(default)]
    pub domain: Option<String>,
}

/// What `GET /sandboxes/{id}` answers (the part we read).
#[derive(Debug, Deserialize)]
pub(super) struct SandboxDetail {
    /// `running` or `paused`.
    pub state: String,
}

/// `GET /sandboxes/{id}`: `None` when E2B does not know it.
pub(super) async fn get(
    api: &ControlPlane,
    id: &str,
) -> Result<Option<SandboxDetail>, ProviderError> {
    match api
        .call(
            Method::GET,
            &format!("/sandboxes/{id}"),
            None,
            "a sandbox lookup",
        )
        .await
    {
        Ok(answer) => Ok(Some(answer.json("a sandbox lookup")?)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `POST /v2/sandboxes`, made idempotent by `key` so a retried create makes one sandbox.
pub(super) async fn create(
    api: &ControlPlane,
    body: &NewSandbox<'_>,
    key: &str,
) -> Result<Sandbox, ProviderError> {
    let body = serde_json::to_value(body).map_err(anyhow::Error::new)?;
    let headers = [("idempotency-key", key.to_string())];
    match api
        .call_with(
            Method::POST,
            "/v2/sandboxes",
            Some(&body),
            &headers,
            "create",
        )
        .await
    {
        Ok(answer) => answer.json("create"),
        // E2B's own refusals of the request (unknown template, a timeout above the plan's
        // limit) are the caller's to fix.
        Err(
            e @ CallError::Status {
                status: 400 | 404 | 422,
                ..
            },
        ) => Err(ProviderError::InvalidSpec(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// `POST /v2/sandboxes/{id}/connect`: resumes a paused sandbox and makes its timeout at least
/// `timeout` seconds from now. `None` when E2B does not know it.
pub(super) async fn connect(
    api: &ControlPlane,
    id: &str,
    timeout: u64,
) -> Result<Option<Sandbox>, ProviderError> {
    let body = serde_json::json!({ "timeout": timeout });
    let path = format!("/v2/sandboxes/{id}/connect");
    match api.call(Method::POST, &path, Some(&body), "connect").await {
        Ok(answer) => Ok(Some(answer.json("connect")?)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `POST /sandboxes/{id}/timeout`: E2B kills the sandbox `timeout` seconds from now.
/// `false` when E2B does not know it.
pub(super) async fn set_timeout(
    api: &ControlPlane,
    id: &str,
    timeout: u64,
) -> Result<bool, ProviderError> {
    let body = serde_json::json!({ "timeout": timeout });
    let path = format!("/sandboxes/{id}/timeout");
    match api
        .call(Method::POST, &path, Some(&body), "a timeout change")
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `DELETE /sandboxes/{id}`; a sandbox E2B does not know is already deleted.
pub(super) async fn kill(api: &ControlPlane, id: &str) -> Result<(), ProviderError> {
    match api
        .call(Method::DELETE, &format!("/sandboxes/{id}"), None, "kill")
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

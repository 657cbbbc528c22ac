//! E2B's control plane (`https://api.{domain}`, key in `X-API-Key`): the request and answer
//! bodies we use, with E2B's exact field names, and one function per call.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::cloud::http::{CallError, ControlPlane};
use tether_relay_core::provider::ProviderError;

/// Sandboxes asked for per list page: E2B's largest `limit`.
const LIST_PAGE: usize = 100;
/// The most list pages read for one listing.
const MAX_LIST_PAGES: usize = 1000;

/// `POST /v2/sandboxes` (always secured: envd demands its access token), or v1
/// `POST /sandboxes` with `"secure": true` added, where a deployment has no v2.
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
    /// When E2B kills it (RFC 3339).
    #[serde(rename = "endAt", default)]
    pub end_at: Option<String>,
}

impl SandboxDetail {
    /// How long until E2B kills it, when `endAt` is readable.
    pub(super) fn ends_in(&self) -> Option<std::time::Duration> {
        let at = humantime::parse_rfc3339_weak(self.end_at.as_deref()?).ok()?;
        Some(
            at.duration_since(std::time::SystemTime::now())
                .unwrap_or_default(),
        )
    }
}

/// One sandbox of a list (the part we read).
#[derive(Debug, Deserialize)]
pub(super) struct Listed {
    /// E2B's id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Its metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// Every running or paused sandbox of the team: `GET /v2/sandboxes` a page at a time (at most
/// [`LIST_PAGE`] each, the next asked for with the `x-next-token` the last one answered, as
/// the SDK's paginator does), or v1 `GET /sandboxes` (running ones, in one answer) where a
/// deployment has no v2. At most [`MAX_LIST_PAGES`] pages; a token that repeats is an error
/// rather than a loop.
pub(super) async fn list(api: &ControlPlane) -> Result<Vec<Listed>, ProviderError> {
    let mut all = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_LIST_PAGES {
        let mut query = vec![
            ("state", "running,paused".to_string()),
            ("limit", LIST_PAGE.to_string()),
        ];
        if let Some(token) = &token {
            query.push(("nextToken", token.clone()));
        }
        let query = serde_urlencoded::to_string(&query).map_err(anyhow::Error::new)?;
        let answer = match api
            .call(
                Method::GET,
                &format!("/v2/sandboxes?{query}"),
                None,
                "a sandbox list",
            )
            .await
        {
            Err(e) if e.status() == Some(404) && token.is_none() => {
                let v1 = api
                    .call(Method::GET, "/sandboxes", None, "a sandbox list")
                    .await?;
                return v1.json("a sandbox list");
            }
            other => other?,
        };
        let page: Vec<Listed> = answer.json("a sandbox list")?;
        all.extend(page);
        let next = answer
            .headers
            .get("x-next-token")
            .and_then(|t| t.to_str().ok())
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        match next {
            None => return Ok(all),
            Some(next) if Some(&next) == token.as_ref() => {
                return Err(ProviderError::Other(anyhow::anyhow!(
                    "E2B answered the same next-page token twice while listing sandboxes"
                )))
            }
            Some(next) => token = Some(next),
        }
    }
    Err(ProviderError::Other(anyhow::anyhow!(
        "E2B's sandbox list went on past {MAX_LIST_PAGES} pages of {LIST_PAGE}; not all \
         sandboxes were read"
    )))
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
/// A deployment without v2 (E2B's public infra, self-hosted, answers 404 as it does for an
/// unknown template) gets v1 `POST /sandboxes` with `"secure": true`, as the SDKs sent
/// before v2; a 404 there too is the caller's template.
pub(super) async fn create(
    api: &ControlPlane,
    body: &NewSandbox<'_>,
    key: &str,
) -> Result<Sandbox, ProviderError> {
    let json = serde_json::to_value(body).map_err(anyhow::Error::new)?;
    let headers = [("idempotency-key", key.to_string())];
    let v2 = api
        .call_with(
            Method::POST,
            "/v2/sandboxes",
            Some(&json),
            &headers,
            "create",
        )
        .await;
    let answer = match v2 {
        Err(e) if e.status() == Some(404) => {
            tracing::debug!("E2B has no v2 create here ({e}); trying v1 with secure envd");
            let mut json = json;
            json["secure"] = serde_json::Value::Bool(true);
            api.call_with(Method::POST, "/sandboxes", Some(&json), &headers, "create")
                .await
        }
        other => other,
    };
    match answer {
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
/// `timeout` seconds from now. `false` only when a read of the sandbox confirms E2B does not
/// know it: a deployment without `connect` (E2B's public infra) answers 404 too, and then
/// gets the older calls, `resume` when paused, else a timeout of at least `timeout`.
pub(super) async fn connect(
    api: &ControlPlane,
    id: &str,
    timeout: u64,
) -> Result<bool, ProviderError> {
    let body = serde_json::json!({ "timeout": timeout });
    let path = format!("/v2/sandboxes/{id}/connect");
    match api.call(Method::POST, &path, Some(&body), "connect").await {
        Ok(_) => return Ok(true),
        Err(e) if e.status() == Some(404) => {
            tracing::debug!("E2B answered 404 to connect ({e}); reading sandbox {id}");
        }
        Err(e) => return Err(e.into()),
    }
    let Some(detail) = get(api, id).await? else {
        return Ok(false);
    };
    if detail.state == "paused" {
        let path = format!("/sandboxes/{id}/resume");
        match api.call(Method::POST, &path, Some(&body), "resume").await {
            Ok(_) => return Ok(true),
            // Resumed meanwhile by someone else: extend it below.
            Err(e) if e.status() == Some(409) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if detail
        .ends_in()
        .is_some_and(|left| left.as_secs() >= timeout)
    {
        return Ok(true);
    }
    set_timeout(api, id, timeout).await
}

/// `POST /sandboxes/{id}/timeout`: E2B kills the sandbox `timeout` seconds from now.
/// `false` when a read of the sandbox confirms E2B does not know it (a 404 from the route
/// alone proves nothing).
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
        Err(e) if e.status() == Some(404) => match get(api, id).await? {
            None => Ok(false),
            Some(_) => Err(ProviderError::Other(anyhow::anyhow!(
                "E2B answered 404 to a timeout change of sandbox {id}, which it still lists: {e}"
            ))),
        },
        Err(e) => Err(e.into()),
    }
}

/// `DELETE /sandboxes/{id}`; a sandbox E2B does not know is already deleted (which a read
/// confirms before the relay forgets it).
pub(super) async fn kill(api: &ControlPlane, id: &str) -> Result<(), ProviderError> {
    match api
        .call(Method::DELETE, &format!("/sandboxes/{id}"), None, "kill")
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.status() == Some(404) => match get(api, id).await? {
            None => Ok(()),
            Some(_) => Err(ProviderError::Other(anyhow::anyhow!(
                "E2B answered 404 to killing sandbox {id}, which it still lists: {e}"
            ))),
        },
        Err(e) => Err(e.into()),
    }
}

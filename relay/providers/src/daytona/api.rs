//! Daytona's REST API (`{DAYTONA_API_URL}/sandbox...`, `Authorization: Bearer <key>`): the
//! bodies we use, with Daytona's field names, and one function per call.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::cloud::http::{CallError, ControlPlane};
use tether_relay_core::provider::ProviderError;

/// Sandboxes asked for per list page (Daytona takes up to 200).
const LIST_PAGE: usize = 100;
/// The most list pages read for one listing.
const MAX_LIST_PAGES: usize = 1000;

/// `POST /sandbox`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CreateSandbox<'a> {
    /// Unique per organization: the relay's id, so a retried create finds its sandbox.
    pub name: &'a str,
    /// The snapshot (the `--image`).
    pub snapshot: &'a str,
    /// The container's environment, which the entrypoint (our agent) sees.
    pub env: &'a BTreeMap<String, String>,
    /// Our labels, plus the relay's id.
    pub labels: &'a BTreeMap<String, String>,
    /// Previews need the token.
    pub public: bool,
    /// No outbound network.
    pub network_block_all: bool,
    /// IPv4 CIDRs allowed out, comma-separated (excludes `domainAllowList`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_allow_list: Option<String>,
    /// Host names allowed out, comma-separated (excludes `networkAllowList`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_allow_list: Option<String>,
    /// Minutes without activity before Daytona stops it (0: never).
    pub auto_stop_interval: u64,
    /// Minutes after a stop before Daytona deletes it (0: at once; -1: never).
    pub auto_delete_interval: i64,
    /// Minutes of wall-clock life before Daytona destroys it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_minutes: Option<u64>,
}

/// A `Sandbox` answer (the part we read).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Sandbox {
    /// Daytona's id (a UUID).
    pub id: String,
    /// `started`, `stopped`, `error`, ...
    #[serde(default)]
    pub state: String,
    /// Why it is in `error` or `build_failed`.
    #[serde(default)]
    pub error_reason: Option<String>,
    /// Whether an `error` can be undone with `recover` (the sandbox and its files are there).
    #[serde(default)]
    pub recoverable: bool,
}

/// `GET /sandbox/{id}/ports/{port}/preview-url`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Preview {
    /// Where the port is served (always use it: domains vary by region).
    pub url: String,
    /// `X-Daytona-Preview-Token`; a new one after every start.
    pub token: String,
}

/// `POST /sandbox`. A name that exists (a retry whose first try got through) answers 409:
/// the sandbox by that name is ours.
pub(super) async fn create(
    api: &ControlPlane,
    body: &CreateSandbox<'_>,
) -> Result<Sandbox, ProviderError> {
    let json = serde_json::to_value(body).map_err(anyhow::Error::new)?;
    match api
        .call(Method::POST, "/sandbox", Some(&json), "create")
        .await
    {
        Ok(answer) => answer.json("create"),
        Err(e) if e.status() == Some(409) => match get(api, body.name).await? {
            Some(sandbox) => Ok(sandbox),
            None => Err(e.into()),
        },
        // Unknown or inactive snapshot, resources with a snapshot, a failed start.
        Err(
            e @ CallError::Status {
                status: 400 | 404 | 422,
                ..
            },
        ) => Err(ProviderError::InvalidSpec(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// One sandbox of a list (the part we read).
#[derive(Debug, Deserialize)]
pub(super) struct Listed {
    /// Daytona's id.
    pub id: String,
    /// Its labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its state.
    #[serde(default)]
    pub state: String,
}

/// Every sandbox (`GET /sandbox`): Daytona's `labels` filter matches whole key-value pairs,
/// so sandboxes with a label of any value are picked out by the caller. The answer is a page
/// `{items, nextCursor}` (the next one asked for with `cursor`, as the SDK pages), or a bare
/// array from older servers, which answer everything at once. At most [`MAX_LIST_PAGES`]
/// pages of [`LIST_PAGE`]; a cursor that repeats is an error rather than a loop.
pub(super) async fn list(api: &ControlPlane) -> Result<Vec<Listed>, ProviderError> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Page {
        Bare(Vec<Listed>),
        Paged {
            items: Vec<Listed>,
            #[serde(rename = "nextCursor", default)]
            next_cursor: Option<String>,
        },
    }
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_LIST_PAGES {
        let mut query = vec![("limit", LIST_PAGE.to_string())];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.clone()));
        }
        let query = serde_urlencoded::to_string(&query).map_err(anyhow::Error::new)?;
        let page: Page = api
            .call(
                Method::GET,
                &format!("/sandbox?{query}"),
                None,
                "a sandbox list",
            )
            .await?
            .json("a sandbox list")?;
        let next = match page {
            Page::Bare(items) => {
                all.extend(items);
                return Ok(all);
            }
            Page::Paged { items, next_cursor } => {
                all.extend(items);
                next_cursor.filter(|c| !c.is_empty())
            }
        };
        match next {
            None => return Ok(all),
            Some(next) if Some(&next) == cursor.as_ref() => {
                return Err(ProviderError::Other(anyhow::anyhow!(
                    "Daytona answered the same cursor twice while listing sandboxes"
                )))
            }
            Some(next) => cursor = Some(next),
        }
    }
    Err(ProviderError::Other(anyhow::anyhow!(
        "Daytona's sandbox list went on past {MAX_LIST_PAGES} pages of {LIST_PAGE}; not all \
         sandboxes were read"
    )))
}

/// `GET /sandbox/{idOrName}`: `None` when Daytona does not know it.
pub(super) async fn get(api: &ControlPlane, id: &str) -> Result<Option<Sandbox>, ProviderError> {
    match api
        .call(
            Method::GET,
            &format!("/sandbox/{id}"),
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

/// `DELETE /sandbox/{id}`; a sandbox Daytona does not know is already deleted, which a read
/// of it confirms before the relay forgets it.
pub(super) async fn delete(api: &ControlPlane, id: &str) -> Result<(), ProviderError> {
    match api
        .call(Method::DELETE, &format!("/sandbox/{id}"), None, "delete")
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.status() == Some(404) => match get(api, id).await? {
            None => Ok(()),
            Some(_) => Err(ProviderError::Other(anyhow::anyhow!(
                "Daytona answered 404 to deleting sandbox {id}, which it still has: {e}"
            ))),
        },
        Err(e) => Err(e.into()),
    }
}

/// `POST /sandbox/{id}/recover`: out of a recoverable `error`, booting again.
pub(super) async fn recover(api: &ControlPlane, id: &str) -> Result<Sandbox, ProviderError> {
    let answer = api
        .call(
            Method::POST,
            &format!("/sandbox/{id}/recover"),
            None,
            "recover",
        )
        .await?;
    answer.json("recover")
}

/// `POST /sandbox/{id}/start`.
pub(super) async fn start(api: &ControlPlane, id: &str) -> Result<Sandbox, ProviderError> {
    let answer = api
        .call(Method::POST, &format!("/sandbox/{id}/start"), None, "start")
        .await?;
    answer.json("start")
}

/// `POST /sandbox/{id}/ttl/{minutes}`: re-anchored from now. `false` when a read of the
/// sandbox confirms Daytona does not know it; a Daytona without the route (its last public
/// server, self-hosted) is told apart by that read, and refused clearly: the sandbox stays.
pub(super) async fn set_ttl(
    api: &ControlPlane,
    id: &str,
    minutes: u64,
) -> Result<bool, ProviderError> {
    match api
        .call(
            Method::POST,
            &format!("/sandbox/{id}/ttl/{minutes}"),
            None,
            "a TTL change",
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.status() == Some(404) => match get(api, id).await? {
            None => Ok(false),
            Some(_) => Err(ProviderError::InvalidSpec(format!(
                "this Daytona cannot change a sandbox's TTL (it has no TTL route: a self-hosted \
                 Daytona before TTLs, which answered {e}); sandbox {id} is kept as it is, with \
                 the lifetime it was created with"
            ))),
        },
        Err(e) => Err(e.into()),
    }
}

/// `GET /sandbox/{id}/ports/{port}/preview-url`.
pub(super) async fn preview(
    api: &ControlPlane,
    id: &str,
    port: u16,
) -> Result<Preview, ProviderError> {
    let path = format!("/sandbox/{id}/ports/{port}/preview-url");
    api.call(Method::GET, &path, None, "a preview URL")
        .await?
        .json("a preview URL")
}

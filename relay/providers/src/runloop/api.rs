//! Runloop's REST API (`{RUNLOOP_BASE_URL}/v1/...`, `Authorization: Bearer <key>`): the bodies
//! the provider sends and reads, with Runloop's field names (its official SDK's
//! `DevboxCreateParams`, `DevboxView`, `TunnelView`, `NetworkPolicyCreateParams`), and one
//! function per call. Every id and tunnel key Runloop answers is checked before it is put in
//! a path or a host name: an answer is data, not a route.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::anyhow;
use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::egress::NewPolicy;
use super::size::Size;
use crate::cloud::http::{CallError, ControlPlane};
use tether_relay_core::provider::ProviderError;

/// Longest id or tunnel key taken from an answer.
const MAX_ID: usize = 128;
/// The most pages of a devbox list read (5000 devboxes a page, Runloop's maximum).
const MAX_PAGES: usize = 100;
/// Devboxes asked for per page.
const PAGE_LIMIT: u32 = 5000;
/// How long Runloop holds a `wait_for_status` call (its server caps it at 30 s).
const WAIT_HOLD: Duration = Duration::from_secs(25);

/// `POST /v1/devboxes`.
#[derive(Debug, Serialize)]
pub(super) struct CreateDevbox<'a> {
    /// The relay's id (Runloop's names are labels, not unique).
    pub name: &'a str,
    /// A blueprint by id (`bpt_...`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blueprint_id: Option<&'a str>,
    /// A blueprint by name: its latest successful build.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blueprint_name: Option<&'a str>,
    /// The devbox's main program, run through its shell: the agent.
    pub entrypoint: &'a str,
    /// The devbox's environment (the agent's token among it).
    pub environment_variables: &'a BTreeMap<String, String>,
    /// Our labels, plus the relay's id.
    pub metadata: &'a BTreeMap<String, String>,
    /// Size, lifetime and network policy.
    pub launch_parameters: LaunchParameters,
    /// The V2 tunnel the agent is reached through.
    pub tunnel: TunnelConfig,
}

/// `launch_parameters`, the part we set.
#[derive(Debug, Default, Serialize)]
pub(super) struct LaunchParameters {
    /// `resource_size_request` and the custom size.
    #[serde(flatten)]
    pub size: Size,
    /// Seconds until Runloop shuts the devbox down, reset by `keep_alive`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_alive_time_seconds: Option<u64>,
    /// The idle policy (`after_idle`), when the sandbox has an idle timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    /// The egress policy; none is Runloop's open default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_policy_id: Option<String>,
}

/// `launch_parameters.lifecycle`.
#[derive(Debug, Serialize)]
pub(super) struct Lifecycle {
    /// What Runloop does after a while without activity.
    pub after_idle: AfterIdle,
}

/// `after_idle`.
#[derive(Debug, Serialize)]
pub(super) struct AfterIdle {
    /// Seconds without activity.
    pub idle_time_seconds: u64,
    /// `shutdown`: an idle sandbox is deleted, as the relay's idle timeout does.
    pub on_idle: &'static str,
}

/// `tunnel` of a create.
#[derive(Debug, Serialize)]
pub(super) struct TunnelConfig {
    /// `authenticated`: only holders of the tunnel's token reach the agent's port.
    pub auth_mode: &'static str,
    /// Tunnel traffic counts as activity for the idle policy.
    pub http_keep_alive: bool,
}

/// A `DevboxView` (the part we read).
#[derive(Debug, Deserialize)]
pub(super) struct Devbox {
    /// `dbx_...`.
    pub id: String,
    /// `provisioning`, `running`, `suspended`, `failure`, `shutdown`, ...
    pub status: String,
    /// Why it failed.
    #[serde(default)]
    pub failure_reason: Option<String>,
    /// Why it shut down.
    #[serde(default)]
    pub shutdown_reason: Option<String>,
    /// Its metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Its V2 tunnel.
    #[serde(default)]
    pub tunnel: Option<Tunnel>,
    /// What it was created with.
    #[serde(default)]
    pub launch_parameters: Option<LaunchRead>,
}

/// `launch_parameters` as read back (the part we read).
#[derive(Debug, Default, Deserialize)]
pub(super) struct LaunchRead {
    /// The egress policy.
    #[serde(default)]
    pub network_policy_id: Option<String>,
}

/// A `TunnelView` (the part we read).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub(super) struct Tunnel {
    /// Names the tunnel: `https://{port}-{tunnel_key}.tunnel.{domain}`.
    pub tunnel_key: String,
    /// `X-Runloop-Tunnel-Authorization: Bearer {auth_token}` (authenticated tunnels).
    #[serde(default)]
    pub auth_token: Option<String>,
}

impl Devbox {
    /// A status after which nothing runs in it again.
    pub(super) fn ended(&self) -> bool {
        matches!(self.status.as_str(), "shutdown" | "failure")
    }

    /// Why it ended, in Runloop's words.
    pub(super) fn reason(&self) -> String {
        match (&self.failure_reason, &self.shutdown_reason) {
            (Some(f), _) => f.clone(),
            (None, Some(s)) => s.clone(),
            (None, None) => "no reason given".into(),
        }
    }
}

/// Refuses an id or tunnel key that is not plain letters, digits, `_` and `-`: it goes into
/// URL paths and host names.
pub(super) fn check_id(what: &str, id: &str) -> Result<(), ProviderError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        return Ok(());
    }
    Err(ProviderError::Other(anyhow!(
        "Runloop answered a {what} that is not an id ({:?}): refusing to use it",
        id.chars().take(MAX_ID).collect::<String>()
    )))
}

fn checked(devbox: Devbox) -> Result<Devbox, ProviderError> {
    check_id("devbox id", &devbox.id)?;
    Ok(devbox)
}

impl Devbox {
    /// Its tunnel, once its key is checked: the key goes into a host name.
    pub(super) fn checked_tunnel(&self) -> Result<Option<Tunnel>, ProviderError> {
        match &self.tunnel {
            Some(tunnel) => {
                check_id("tunnel key", &tunnel.tunnel_key)?;
                Ok(Some(tunnel.clone()))
            }
            None => Ok(None),
        }
    }
}

/// `POST /v1/devboxes`. Runloop's API takes no idempotency key (its SDK sends none): a
/// create retried after a lost answer may leave a second devbox, which carries the relay's
/// label and is found by `tether ls --orphans`.
pub(super) async fn create(
    api: &ControlPlane,
    body: &CreateDevbox<'_>,
) -> Result<Devbox, ProviderError> {
    let json = serde_json::to_value(body).map_err(anyhow::Error::new)?;
    match api
        .call(Method::POST, "/v1/devboxes", Some(&json), "a devbox create")
        .await
    {
        Ok(answer) => checked(answer.json("a devbox create")?),
        // An unknown blueprint, a size or policy Runloop refuses.
        Err(
            e @ CallError::Status {
                status: 400 | 404 | 422,
                ..
            },
        ) => Err(ProviderError::InvalidSpec(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// `GET /v1/devboxes/{id}`: `None` when Runloop's API says it has no such devbox.
pub(super) async fn get(api: &ControlPlane, id: &str) -> Result<Option<Devbox>, ProviderError> {
    check_id("devbox id", id)?;
    match api
        .call(
            Method::GET,
            &format!("/v1/devboxes/{id}"),
            None,
            "a devbox lookup",
        )
        .await
    {
        Ok(answer) => Ok(Some(checked(answer.json("a devbox lookup")?)?)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `POST /v1/devboxes/{id}/wait_for_status`: the devbox once its status is one of
/// `statuses`, or as it is when Runloop's hold ends (its 408).
pub(super) async fn wait_for_status(
    api: &ControlPlane,
    id: &str,
    statuses: &[&str],
) -> Result<Option<Devbox>, ProviderError> {
    check_id("devbox id", id)?;
    let body = serde_json::json!({
        "statuses": statuses,
        "timeout_seconds": WAIT_HOLD.as_secs(),
    });
    match api
        .call(
            Method::POST,
            &format!("/v1/devboxes/{id}/wait_for_status"),
            Some(&body),
            "a wait for the devbox's status",
        )
        .await
    {
        Ok(answer) => Ok(Some(checked(answer.json("a status wait")?)?)),
        Err(e) if e.status() == Some(408) => get(api, id).await,
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Every devbox of the account, page by page (`GET /v1/devboxes?starting_after=`).
pub(super) async fn list(api: &ControlPlane) -> Result<Vec<Devbox>, ProviderError> {
    #[derive(Deserialize)]
    struct Page {
        devboxes: Vec<Devbox>,
        #[serde(default)]
        has_more: Option<bool>,
    }
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut path = format!("/v1/devboxes?limit={PAGE_LIMIT}&include_total_count=false");
        if let Some(after) = &after {
            path.push_str(&format!("&starting_after={after}"));
        }
        let page: Page = api
            .call(Method::GET, &path, None, "a devbox list")
            .await?
            .json("a devbox list")?;
        let more = page.has_more.unwrap_or(false) && !page.devboxes.is_empty();
        for devbox in page.devboxes {
            // A devbox whose id is not one is skipped, not trusted.
            if check_id("devbox id", &devbox.id).is_ok() {
                after = Some(devbox.id.clone());
                all.push(devbox);
            }
        }
        if !more {
            return Ok(all);
        }
    }
    Err(ProviderError::Other(anyhow!(
        "Runloop's devbox list has more than {MAX_PAGES} pages; stopped reading"
    )))
}

/// A lifecycle call (`shutdown`, `suspend`, `resume`) on devbox `id`; the devbox after it.
/// `None` when a read confirms Runloop does not have it.
pub(super) async fn lifecycle(
    api: &ControlPlane,
    id: &str,
    call: &str,
) -> Result<Option<Devbox>, ProviderError> {
    check_id("devbox id", id)?;
    let what = format!("a devbox {call}");
    match api
        .call(
            Method::POST,
            &format!("/v1/devboxes/{id}/{call}"),
            None,
            &what,
        )
        .await
    {
        Ok(answer) => Ok(Some(checked(answer.json(&what)?)?)),
        // A route-level 404 proves nothing: only a read of the devbox says it is gone.
        Err(e) if e.status() == Some(404) => match get(api, id).await? {
            None => Ok(None),
            Some(_) => Err(ProviderError::Other(anyhow!(
                "Runloop answered 404 to the {call} of devbox {id}, which it still has: {e}"
            ))),
        },
        Err(e) => Err(e.into()),
    }
}

/// `POST /v1/devboxes/{id}/shutdown`: `true` once it is shut down (or Runloop does not
/// have it any more, which a read confirms); a devbox that had ended already is fine.
pub(super) async fn shutdown(
    api: &ControlPlane,
    id: &str,
) -> Result<Option<Devbox>, ProviderError> {
    match lifecycle(api, id, "shutdown").await {
        Ok(devbox) => Ok(devbox),
        Err(e) => match get(api, id).await? {
            None => Ok(None),
            Some(devbox) if devbox.ended() => Ok(Some(devbox)),
            Some(_) => Err(e),
        },
    }
}

/// `POST /v1/devboxes/{id}/enable_tunnel`: an authenticated V2 tunnel, for a devbox created
/// without one.
pub(super) async fn enable_tunnel(api: &ControlPlane, id: &str) -> Result<Tunnel, ProviderError> {
    check_id("devbox id", id)?;
    let body = serde_json::json!({ "auth_mode": "authenticated", "http_keep_alive": true });
    let tunnel: Tunnel = api
        .call(
            Method::POST,
            &format!("/v1/devboxes/{id}/enable_tunnel"),
            Some(&body),
            "a tunnel",
        )
        .await?
        .json("a tunnel")?;
    check_id("tunnel key", &tunnel.tunnel_key)?;
    Ok(tunnel)
}

/// `POST /v1/devboxes/{id}/keep_alive`: resets its keep-alive and idle timers. `false` when
/// a read confirms Runloop does not have it.
pub(super) async fn keep_alive(api: &ControlPlane, id: &str) -> Result<bool, ProviderError> {
    check_id("devbox id", id)?;
    match api
        .call(
            Method::POST,
            &format!("/v1/devboxes/{id}/keep_alive"),
            None,
            "a keep-alive",
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.status() == Some(404) => Ok(get(api, id).await?.is_some()),
        Err(e) => Err(e.into()),
    }
}

/// `POST /v1/devboxes/{id}/execute_async`: starts `command` in a fresh login shell of the
/// devbox, with its environment.
pub(super) async fn execute_async(
    api: &ControlPlane,
    id: &str,
    command: &str,
) -> Result<(), ProviderError> {
    check_id("devbox id", id)?;
    let body = serde_json::json!({ "command": command });
    api.call(
        Method::POST,
        &format!("/v1/devboxes/{id}/execute_async"),
        Some(&body),
        "starting the agent",
    )
    .await?;
    Ok(())
}

/// A `NetworkPolicyView` (the part we read).
#[derive(Debug, Deserialize)]
pub(super) struct Policy {
    /// `npol_...`.
    pub id: String,
    /// Its name.
    pub name: String,
}

/// `POST /v1/network-policies`.
pub(super) async fn create_policy(
    api: &ControlPlane,
    body: &NewPolicy,
) -> Result<Policy, ProviderError> {
    let json = serde_json::to_value(body).map_err(anyhow::Error::new)?;
    let policy: Policy = match api
        .call(
            Method::POST,
            "/v1/network-policies",
            Some(&json),
            "a network policy create",
        )
        .await
    {
        Ok(answer) => answer.json("a network policy create")?,
        Err(
            e @ CallError::Status {
                status: 400 | 422, ..
            },
        ) => {
            return Err(ProviderError::InvalidSpec(format!(
                "Runloop refused the sandbox's network policy: {e}"
            )))
        }
        Err(e) => return Err(e.into()),
    };
    check_id("network policy id", &policy.id)?;
    Ok(policy)
}

/// `GET /v1/network-policies/{id}`: `None` when Runloop does not have it.
pub(super) async fn get_policy(
    api: &ControlPlane,
    id: &str,
) -> Result<Option<Policy>, ProviderError> {
    check_id("network policy id", id)?;
    match api
        .call(
            Method::GET,
            &format!("/v1/network-policies/{id}"),
            None,
            "a network policy lookup",
        )
        .await
    {
        Ok(answer) => Ok(Some(answer.json("a network policy lookup")?)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `POST /v1/network-policies/{id}/delete`; one Runloop does not have is deleted already.
pub(super) async fn delete_policy(api: &ControlPlane, id: &str) -> Result<(), ProviderError> {
    check_id("network policy id", id)?;
    match api
        .call(
            Method::POST,
            &format!("/v1/network-policies/{id}/delete"),
            None,
            "a network policy delete",
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.status() == Some(404) => match get_policy(api, id).await? {
            None => Ok(()),
            Some(_) => Err(ProviderError::Other(anyhow!(
                "Runloop answered 404 to deleting network policy {id}, which it still has: {e}"
            ))),
        },
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_could_steer_a_request_are_refused() {
        for good in ["dbx_2xMDUOsKMiZBYKsvSRtMA", "npol-1", "abc123"] {
            assert!(check_id("devbox id", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "../v1/objects",
            "dbx_1/shutdown",
            "a.b",
            "x?y",
            "dbx 1",
            &"a".repeat(200),
        ] {
            let err = check_id("devbox id", bad).unwrap_err().to_string();
            assert!(err.contains("not an id"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_create_request_carries_runloop_field_names() {
        let env = BTreeMap::from([("A".to_string(), "1".to_string())]);
        let metadata = BTreeMap::from([("tether.sandbox".to_string(), "sb-1".to_string())]);
        let body = CreateDevbox {
            name: "sb-1",
            blueprint_id: None,
            blueprint_name: Some("tether"),
            entrypoint: "tether-agent serve --listen 0.0.0.0:7421",
            environment_variables: &env,
            metadata: &metadata,
            launch_parameters: LaunchParameters {
                keep_alive_time_seconds: Some(3600),
                lifecycle: Some(Lifecycle {
                    after_idle: AfterIdle {
                        idle_time_seconds: 600,
                        on_idle: "shutdown",
                    },
                }),
                network_policy_id: Some("npol_1".into()),
                ..LaunchParameters::default()
            },
            tunnel: TunnelConfig {
                auth_mode: "authenticated",
                http_keep_alive: true,
            },
        };
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["blueprint_name"], "tether");
        assert!(json.get("blueprint_id").is_none(), "{json}");
        assert_eq!(json["environment_variables"]["A"], "1");
        assert_eq!(json["launch_parameters"]["keep_alive_time_seconds"], 3600);
        assert_eq!(
            json["launch_parameters"]["lifecycle"]["after_idle"]["on_idle"],
            "shutdown"
        );
        assert_eq!(json["launch_parameters"]["network_policy_id"], "npol_1");
        assert!(json["launch_parameters"]
            .get("resource_size_request")
            .is_none());
        assert_eq!(json["tunnel"]["auth_mode"], "authenticated");
    }
}

//! The `e2b` provider: sandboxes are E2B Firecracker microVMs made from a template (the
//! `--image`), reached through E2B's edge at `{port}-{sandboxID}.{domain}`.
//!
//! - Create: `POST /v2/sandboxes` (idempotent by the relay's id, labels as metadata, the TTL
//!   as E2B's timeout), then start the agent through envd with its token ([`envd`]), since a
//!   template's start command cannot see per-sandbox values, and with the variables the
//!   template was built with (`tether image build --env`), which E2B keeps for build steps
//!   only.
//! - Connect: a WebSocket to the agent's port through the edge, with the traffic access token
//!   when the sandbox has one. A paused sandbox is resumed (`/connect`), and an agent that is
//!   not listening (after a reboot) is started again. A sandbox without a TTL has its timeout
//!   pushed ahead at every connect and, every half timeout, while a session stays open.
//! - Pause and resume: E2B's pause (memory and processes kept, the agent with them) and its
//!   connect, which resumes ([`pause`]); E2B's `paused` is [`SandboxState::Paused`]. While
//!   paused, E2B's edge answers nothing inside the sandbox.
//! - Network: `--network` and allowlists as E2B's `allow_internet_access`, `allowOut` and
//!   `denyOut` ([`egress`]); what E2B cannot express is refused.
//! - Settings: `E2B_API_KEY`; `E2B_TIMEOUT` (seconds, E2B's timeout of a sandbox without a
//!   TTL, default 3600); `E2B_DOMAIN` (default `e2b.app`); `E2B_API_URL` (default
//!   `https://api.{domain}`); `E2B_SANDBOX_URL` sends all sandbox traffic to one URL with
//!   `E2b-Sandbox-Id`/`-Port` routing headers, as E2B's SDKs do (a local edge or proxy).

mod api;
mod egress;
mod envd;
mod pause;
pub(crate) mod template;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::anyhow;
use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};

use super::cloud::constants::AGENT_PORT;
use super::cloud::http::{self, ControlPlane};
use super::cloud::settings::Settings;
use super::cloud::websocket::{self, EdgeError};
use tether_relay_core::provider::{
    AgentSocket, Capabilities, Created, Labelled, NetworkInfo, Provider, ProviderError,
    SandboxHandle, SandboxSpec, SandboxState,
};

/// E2B's default domain.
const DEFAULT_DOMAIN: &str = "e2b.app";
/// envd's port inside every sandbox.
const ENVD_PORT: u16 = 49983;
/// E2B's lifetime for a sandbox created without a TTL, extended on every connect: the
/// longest a Hobby plan allows. The relay's own TTL and idle timeout still apply.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
/// The metadata key holding the relay's sandbox id.
const ID_METADATA: &str = "tether.sandbox";

/// How the provider reaches E2B.
#[derive(Clone, Debug)]
struct Endpoints {
    api: ControlPlane,
    domain: String,
    /// One URL for all sandbox traffic, routed by headers (`E2B_SANDBOX_URL`).
    sandbox_url: Option<String>,
    /// E2B's timeout of a sandbox without a TTL (`E2B_TIMEOUT`, else [`DEFAULT_TIMEOUT`]).
    default_timeout: Duration,
}

/// Runs sandboxes on E2B.
#[derive(Clone, Debug)]
pub struct E2bProvider {
    /// `Err` when no key is configured: every call reports it.
    endpoints: Result<Endpoints, String>,
}

/// What the registry keeps for an E2B sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Meta {
    /// The sandbox's domain.
    domain: String,
    /// envd's access token.
    envd_access_token: Option<String>,
    /// The edge's token for ports other than envd's.
    traffic_access_token: Option<String>,
    /// E2B's timeout in seconds, as created (the relay's TTL, or [`DEFAULT_TIMEOUT`]).
    timeout_secs: u64,
    /// No TTL was asked for: extend E2B's timeout on every connect.
    keep_alive: bool,
    /// The names of the sandbox's own env (its envVars): they win over the template's image
    /// env when the agent is started again.
    #[serde(default)]
    env_keys: BTreeSet<String>,
}

impl E2bProvider {
    /// A provider configured from `settings`; without `E2B_API_KEY` it exists but every call
    /// fails with an error naming the variable.
    pub fn new(settings: &Settings) -> E2bProvider {
        let endpoints = Self::endpoints(settings).map_err(|e| e.to_string());
        E2bProvider { endpoints }
    }

    fn endpoints(settings: &Settings) -> Result<Endpoints, ProviderError> {
        let key = settings.require("e2b", "E2B_API_KEY")?;
        let domain = settings
            .get("E2B_DOMAIN")
            .unwrap_or_else(|| DEFAULT_DOMAIN.to_string());
        let base = settings
            .get("E2B_API_URL")
            .unwrap_or_else(|| format!("https://api.{domain}"));
        let api = ControlPlane::new(
            http::client()?,
            "E2B",
            &base,
            ("x-api-key", &key),
            "E2B_API_KEY",
        )?;
        let sandbox_url = settings
            .get("E2B_SANDBOX_URL")
            .map(|u| u.trim_end_matches('/').to_string());
        let default_timeout = match settings.get("E2B_TIMEOUT") {
            None => DEFAULT_TIMEOUT,
            Some(secs) => match secs.trim().parse::<u64>() {
                Ok(secs) if secs > 0 => Duration::from_secs(secs),
                _ => {
                    return Err(ProviderError::Unavailable(format!(
                        "E2B_TIMEOUT is {secs:?}: set it to a number of seconds, at most what \
                         your E2B plan allows (Hobby: 3600, Pro: 86400)"
                    )))
                }
            },
        };
        Ok(Endpoints {
            api,
            domain,
            sandbox_url,
            default_timeout,
        })
    }

    fn ready(&self) -> Result<&Endpoints, ProviderError> {
        self.endpoints
            .as_ref()
            .map_err(|e| ProviderError::Auth(e.clone()))
    }
}

/// E2B's control plane as `settings` configure it (the same key and URL as the provider's),
/// for `tether image build --target e2b`.
pub(crate) fn control_plane(settings: &Settings) -> Result<ControlPlane, ProviderError> {
    E2bProvider::endpoints(settings).map(|e| e.api)
}

impl Endpoints {
    /// The URL and routing headers of `port` in sandbox `id`.
    fn route(&self, id: &str, domain: &str, port: u16) -> (String, HeaderMap) {
        let mut headers = HeaderMap::new();
        match &self.sandbox_url {
            Some(url) => {
                headers.insert("e2b-sandbox-id", header(id));
                headers.insert("e2b-sandbox-port", header(&port.to_string()));
                (url.clone(), headers)
            }
            None => (format!("https://{port}-{id}.{domain}"), headers),
        }
    }

    fn envd(&self, id: &str, meta: &Meta) -> envd::Envd {
        let (url, mut headers) = self.route(id, &meta.domain, ENVD_PORT);
        if let Some(token) = &meta.envd_access_token {
            headers.insert("x-access-token", header(token));
        }
        envd::Envd { url, headers }
    }

    /// Starts the agent in sandbox `id` with its token and the template's image env (less
    /// the sandbox's own variables, which envd gives every process already).
    async fn start_agent(
        &self,
        id: &str,
        meta: &Meta,
        agent_token: &str,
    ) -> Result<(), ProviderError> {
        let envd = self.envd(id, meta);
        let env = envd::image_env(self.api.http(), &envd, &meta.env_keys).await?;
        envd::start_agent(self.api.http(), &envd, agent_token, &env).await
    }

    async fn open_agent(
        &self,
        id: &str,
        meta: &Meta,
        agent_token: &str,
    ) -> Result<AgentSocket, EdgeError> {
        let (url, mut headers) = self.route(id, &meta.domain, AGENT_PORT);
        if let Some(token) = &meta.traffic_access_token {
            headers.insert("e2b-traffic-access-token", header(token));
        }
        websocket::open(self.api.http(), &url, headers, agent_token).await
    }
}

fn header(value: &str) -> HeaderValue {
    // Ids and tokens from E2B are plain ASCII; anything else would be refused by E2B anyway.
    HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

fn load_meta(sandbox: &SandboxHandle) -> Result<Meta, ProviderError> {
    serde_json::from_value(sandbox.meta.clone()).map_err(|e| {
        ProviderError::Other(anyhow!(
            "the relay's record of E2B sandbox {} is unreadable ({e}); delete it with `tether rm {}`",
            sandbox.provider_ref,
            sandbox.id
        ))
    })
}

/// Refuses what a template fixes at build time.
fn check_spec(spec: &SandboxSpec) -> Result<&str, ProviderError> {
    let Some(template) = spec.image.as_deref() else {
        return Err(ProviderError::InvalidSpec(
            "the e2b provider needs a template: pass --image with the name or id of an E2B \
             template that has tether-agent on its PATH (see docs/providers.md)"
                .into(),
        ));
    };
    if spec.cpus.is_some() || spec.memory_bytes.is_some() || spec.pids.is_some() {
        return Err(ProviderError::InvalidSpec(
            "E2B sets CPU and memory when a template is built (`--cpu-count`, `--memory-mb`) and \
             has no process limit; drop --cpus, --memory and --pids, or build a template with \
             the size you need"
                .into(),
        ));
    }
    Ok(template)
}

#[async_trait]
impl Provider for E2bProvider {
    fn name(&self) -> &'static str {
        "e2b"
    }

    async fn create(
        &self,
        id: &str,
        agent_token: &str,
        spec: &SandboxSpec,
    ) -> Result<Created, ProviderError> {
        let template = check_spec(spec)?;
        let outbound = egress::outbound(spec)?;
        let e2b = self.ready()?;
        let timeout = spec.ttl.unwrap_or(e2b.default_timeout).as_secs().max(1);
        let mut metadata: BTreeMap<String, String> = spec.labels.clone();
        metadata.insert(ID_METADATA.into(), id.into());
        let body = api::NewSandbox {
            template_id: template,
            timeout,
            metadata: &metadata,
            env_vars: &spec.env,
            allow_internet_access: outbound.allow_internet_access,
            network: api::Network {
                // The agent checks its own token too; this keeps strangers off its port at all.
                allow_public_traffic: false,
                allow_out: outbound.allow_out,
                deny_out: outbound.deny_out,
            },
        };
        // E2B's idempotency keys are `[a-z0-9-]`; relay ids are too, once lower-cased.
        let created = api::create(&e2b.api, &body, &id.to_ascii_lowercase()).await?;
        let meta = Meta {
            domain: created.domain.clone().unwrap_or_else(|| e2b.domain.clone()),
            envd_access_token: created.envd_access_token,
            traffic_access_token: created.traffic_access_token,
            timeout_secs: timeout,
            keep_alive: spec.ttl.is_none(),
            env_keys: spec.env.keys().cloned().collect(),
        };
        let sandbox_id = created.sandbox_id;
        if let Err(e) = e2b.start_agent(&sandbox_id, &meta, agent_token).await {
            // Nobody can reach a sandbox without its agent: do not leave it running.
            if let Err(kill) = api::kill(&e2b.api, &sandbox_id).await {
                tracing::warn!(
                    "cannot kill E2B sandbox {sandbox_id} after its agent failed: {kill}"
                );
            }
            return Err(e);
        }
        let meta = serde_json::to_value(&meta).map_err(anyhow::Error::new)?;
        Ok(Created {
            provider_ref: sandbox_id,
            meta,
        })
    }

    async fn state(&self, sandbox: &SandboxHandle) -> Result<SandboxState, ProviderError> {
        let e2b = self.ready()?;
        Ok(match api::get(&e2b.api, &sandbox.provider_ref).await? {
            None => SandboxState::Gone,
            Some(detail) if detail.state == "paused" => SandboxState::Paused,
            Some(_) => SandboxState::Running,
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pause: true,
            ..Capabilities::default()
        }
    }

    async fn pause(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        self.pause_sandbox(sandbox).await
    }

    async fn resume(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        self.resume_sandbox(sandbox).await
    }

    async fn delete(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        api::kill(&self.ready()?.api, &sandbox.provider_ref).await
    }

    async fn renew(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), ProviderError> {
        let e2b = self.ready()?;
        match api::set_timeout(&e2b.api, &sandbox.provider_ref, ttl.as_secs().max(1)).await? {
            true => Ok(()),
            false => Err(ProviderError::Gone(sandbox.id.clone())),
        }
    }

    async fn connect(&self, sandbox: &SandboxHandle) -> Result<AgentSocket, ProviderError> {
        let e2b = self.ready()?;
        let meta = load_meta(sandbox)?;
        let id = &sandbox.provider_ref;
        if meta.keep_alive && !api::connect(&e2b.api, id, meta.timeout_secs).await? {
            return Err(ProviderError::Gone(sandbox.id.clone()));
        }
        let first = match e2b.open_agent(id, &meta, &sandbox.agent_token).await {
            Ok(socket) => return Ok(socket),
            Err(e) => e,
        };
        tracing::debug!("E2B sandbox {id}: agent unreachable ({first}); resuming and retrying");
        // Paused (resume it), or rebooted without our agent (start it again).
        if !api::connect(&e2b.api, id, meta.timeout_secs).await? {
            return Err(ProviderError::Gone(sandbox.id.clone()));
        }
        match e2b.open_agent(id, &meta, &sandbox.agent_token).await {
            Ok(socket) => return Ok(socket),
            Err(EdgeError::Refused { status: 502, .. }) => {}
            Err(e) => return Err(edge_failure(id, e)),
        }
        e2b.start_agent(id, &meta, &sandbox.agent_token).await?;
        e2b.open_agent(id, &meta, &sandbox.agent_token)
            .await
            .map_err(|e| edge_failure(id, e))
    }

    fn network_info(&self, spec: &SandboxSpec) -> NetworkInfo {
        egress::info(spec)
    }

    fn relay_egress_entry(
        &self,
        _spec: &SandboxSpec,
        url: &tether_relay_core::egress::route::EgressUrl,
    ) -> Result<tether_relay_core::egress::route::RelayEntry, ProviderError> {
        egress::relay_entry(url)
    }

    fn keep_alive_every(&self, sandbox: &SandboxHandle) -> Option<Duration> {
        let meta = load_meta(sandbox).ok()?;
        // Half the timeout: a session outlives any number of them.
        meta.keep_alive
            .then_some(Duration::from_secs(meta.timeout_secs.max(2) / 2))
    }

    async fn keep_alive(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        let e2b = self.ready()?;
        let meta = load_meta(sandbox)?;
        // A connect would resume a sandbox paused under an open session; paused, E2B's
        // timeout does not run, so there is nothing to extend.
        match api::get(&e2b.api, &sandbox.provider_ref).await? {
            None => return Err(ProviderError::Gone(sandbox.id.clone())),
            Some(detail) if detail.state == "paused" => return Ok(()),
            Some(_) => {}
        }
        match api::connect(&e2b.api, &sandbox.provider_ref, meta.timeout_secs).await? {
            true => Ok(()),
            false => Err(ProviderError::Gone(sandbox.id.clone())),
        }
    }

    async fn labelled(&self) -> Result<Option<Vec<Labelled>>, ProviderError> {
        let listed = api::list(&self.ready()?.api).await?;
        Ok(Some(
            listed
                .into_iter()
                .filter_map(|s| {
                    Some(Labelled {
                        id: s.metadata.get(ID_METADATA)?.clone(),
                        provider_ref: s.sandbox_id,
                    })
                })
                .collect(),
        ))
    }
}

fn edge_failure(id: &str, e: EdgeError) -> ProviderError {
    let hint = match e.status() {
        Some(401) => "; the agent refused its token",
        Some(403) => "; E2B's edge refused the traffic access token",
        _ => "",
    };
    ProviderError::Other(anyhow!(
        "cannot open the agent's WebSocket in E2B sandbox {id}: {e}{hint}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_key_names_the_variable() {
        let provider = E2bProvider::new(&Settings::from_pairs([]));
        let err = provider.ready().unwrap_err();
        assert!(matches!(err, ProviderError::Auth(_)));
        assert!(err.to_string().contains("E2B_API_KEY"), "{err}");
    }

    #[test]
    fn the_edge_routes_by_host_or_by_headers() {
        let plain = E2bProvider::new(&Settings::from_pairs([("E2B_API_KEY", "k")]));
        let (url, headers) = plain.ready().unwrap().route("abc", "e2b.app", 7421);
        assert_eq!(url, "https://7421-abc.e2b.app");
        assert!(headers.is_empty());

        let routed = E2bProvider::new(&Settings::from_pairs([
            ("E2B_API_KEY", "k"),
            ("E2B_SANDBOX_URL", "http://127.0.0.1:9/"),
        ]));
        let (url, headers) = routed.ready().unwrap().route("abc", "e2b.app", 49983);
        assert_eq!(url, "http://127.0.0.1:9");
        assert_eq!(headers["e2b-sandbox-id"], "abc");
        assert_eq!(headers["e2b-sandbox-port"], "49983");
    }

    #[test]
    fn templates_fix_resources() {
        assert!(check_spec(&SandboxSpec::default()).is_err());
        let spec = SandboxSpec {
            image: Some("tether".into()),
            cpus: Some(2.0),
            ..Default::default()
        };
        assert!(check_spec(&spec)
            .unwrap_err()
            .to_string()
            .contains("--cpu-count"));
        let spec = SandboxSpec {
            image: Some("tether".into()),
            ..Default::default()
        };
        assert_eq!(check_spec(&spec).unwrap(), "tether");
    }
}

//! The `runloop` provider: sandboxes are Runloop devboxes made from a blueprint (the
//! `--image`), reached through the devbox's authenticated V2 tunnel at
//! `https://{port}-{tunnel_key}.tunnel.{domain}`.
//!
//! - Create: a network policy of the sandbox's egress first ([`egress`]), then `POST
//!   /v1/devboxes` with the blueprint, the agent as the devbox's `entrypoint`, the agent's
//!   token and `--env` in `environment_variables`, labels as `metadata`, the size
//!   ([`size`]), lifetimes and policy in `launch_parameters`, and an authenticated tunnel.
//!   Then wait until it is `running` and its agent answers through the tunnel; a devbox that
//!   fails either is shut down and its policy deleted.
//! - Connect: a WebSocket through the tunnel with `X-Runloop-Tunnel-Authorization: Bearer
//!   <tunnel token>`, the agent token in `X-Tether-Agent-Token`. A suspended devbox is
//!   resumed; Runloop does not restart processes at a resume, so the agent is started again
//!   with `execute_async` (the command carries no token: the devbox's environment does).
//! - Lifetimes: Runloop shuts a devbox down when its keep-alive timer runs out
//!   (`keep_alive_time_seconds`) or after `after_idle`. A TTL becomes the keep-alive time;
//!   without one it is an hour (`RUNLOOP_KEEP_ALIVE`), pushed ahead at every connect and while
//!   a session stays open; an idle timeout becomes `after_idle` (shutdown), whose timer the
//!   same keep-alives reset.
//! - Gone only when a read of the devbox says so (404 from the API, `shutdown`); a devbox in
//!   `failure` is dead (nothing runs in it again), not silently forgotten.
//! - Settings: `RUNLOOP_API_KEY`; `RUNLOOP_BASE_URL` (default `https://api.runloop.ai`, as
//!   Runloop's SDK); `RUNLOOP_TUNNEL_URL` sends all tunnel traffic to one URL with the
//!   tunnel's host name in `Host` (a local edge, or the fake); `RUNLOOP_KEEP_ALIVE`.

mod api;
pub(crate) mod blueprint;
mod egress;
mod size;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue, HOST};
use serde::{Deserialize, Serialize};

use super::cloud::constants::{
    AGENT_ARGS, AGENT_PORT, AGENT_PROGRAM, AGENT_TOKEN_ENV, POLL_INTERVAL,
};
use super::cloud::http::{self, ControlPlane};
use super::cloud::settings::Settings;
use super::cloud::websocket::{self, EdgeError, TokenIn};
use tether_relay_core::provider::{
    AgentSocket, Created, Labelled, NetworkInfo, Provider, ProviderError, SandboxHandle,
    SandboxSpec, SandboxState,
};

/// Runloop's API when `RUNLOOP_BASE_URL` is not set.
const DEFAULT_BASE_URL: &str = "https://api.runloop.ai";
/// The variable holding the API key.
pub(crate) const KEY_VAR: &str = "RUNLOOP_API_KEY";
/// The metadata key holding the relay's sandbox id.
const ID_METADATA: &str = "tether.sandbox";
/// Runloop's keep-alive time of a sandbox without a TTL: Runloop's own default, pushed ahead
/// while the sandbox is used.
const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(3600);
/// The longest keep-alive time Runloop takes.
const MAX_KEEP_ALIVE: Duration = Duration::from_secs(48 * 3600);
/// How long a devbox may take to be `running` (a large blueprint boots slowly).
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// The header of an authenticated tunnel's token.
const TUNNEL_AUTH: &str = "x-runloop-tunnel-authorization";
/// Blueprint ids; any other `--image` is a blueprint name.
const BLUEPRINT_ID_PREFIX: &str = "bpt_";

/// How the provider reaches Runloop.
#[derive(Clone, Debug)]
struct Endpoints {
    api: ControlPlane,
    /// `runloop.ai` for `api.runloop.ai`: tunnels are `{port}-{key}.tunnel.{domain}`.
    domain: String,
    /// One URL for all tunnel traffic, routed by `Host` (`RUNLOOP_TUNNEL_URL`).
    tunnel_url: Option<String>,
    /// The keep-alive time of sandboxes without a TTL.
    keep_alive: Duration,
}

/// Runs sandboxes on Runloop.
#[derive(Clone, Debug)]
pub struct RunloopProvider {
    /// `Err` when no key is configured: every call reports it.
    endpoints: Result<Endpoints, String>,
}

/// Which of Runloop's timers ends the devbox, as created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Timer {
    /// The keep-alive time is the sandbox's TTL: nothing pushes it ahead.
    Ttl,
    /// The keep-alive time of a sandbox without a TTL: sessions push it ahead.
    KeepAlive,
    /// `after_idle`: sessions push it ahead.
    Idle,
}

/// What the registry keeps for a Runloop devbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Meta {
    /// The devbox's tunnel.
    tunnel: api::Tunnel,
    /// The timer that ends it.
    timer: Timer,
    /// That timer's length, in seconds.
    timer_secs: u64,
    /// The network policy made for it, deleted with it.
    policy_id: Option<String>,
}

impl RunloopProvider {
    /// A provider configured from `settings`; without `RUNLOOP_API_KEY` it exists but every
    /// call fails with an error naming the variable.
    pub fn new(settings: &Settings) -> RunloopProvider {
        let endpoints = Self::endpoints(settings).map_err(|e| e.to_string());
        RunloopProvider { endpoints }
    }

    fn endpoints(settings: &Settings) -> Result<Endpoints, ProviderError> {
        let api = control_plane(settings)?;
        let base = base_url(settings);
        let host = reqwest::Url::parse(&base)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .ok_or_else(|| {
                ProviderError::Unavailable(format!(
                    "RUNLOOP_BASE_URL is {base:?}: set it to Runloop's API URL, such as \
                     {DEFAULT_BASE_URL}"
                ))
            })?;
        // As Runloop's SDK derives it: the API's host without its `api.`.
        let domain = host.strip_prefix("api.").unwrap_or(&host).to_string();
        let keep_alive = match settings.get("RUNLOOP_KEEP_ALIVE") {
            None => DEFAULT_KEEP_ALIVE,
            Some(secs) => match secs.trim().parse::<u64>() {
                Ok(secs) if secs > 0 && secs <= MAX_KEEP_ALIVE.as_secs() => {
                    Duration::from_secs(secs)
                }
                _ => {
                    return Err(ProviderError::Unavailable(format!(
                        "RUNLOOP_KEEP_ALIVE is {secs:?}: set it to a number of seconds from 1 \
                         to {} (Runloop's longest keep-alive time)",
                        MAX_KEEP_ALIVE.as_secs()
                    )))
                }
            },
        };
        Ok(Endpoints {
            api,
            domain,
            tunnel_url: settings
                .get("RUNLOOP_TUNNEL_URL")
                .map(|u| u.trim_end_matches('/').to_string()),
            keep_alive,
        })
    }

    fn ready(&self) -> Result<&Endpoints, ProviderError> {
        self.endpoints
            .as_ref()
            .map_err(|e| ProviderError::Auth(e.clone()))
    }
}

fn base_url(settings: &Settings) -> String {
    settings
        .get("RUNLOOP_BASE_URL")
        .unwrap_or_else(|| DEFAULT_BASE_URL.to_string())
}

/// Runloop's API as `settings` configure it (`RUNLOOP_API_KEY`, `RUNLOOP_BASE_URL`): for this
/// provider and for `tether image build --target runloop`, so both reach the same Runloop.
pub(crate) fn control_plane(settings: &Settings) -> Result<ControlPlane, ProviderError> {
    let key = settings.require("runloop", KEY_VAR)?;
    ControlPlane::new(
        http::client()?,
        "Runloop",
        &base_url(settings),
        ("authorization", &format!("Bearer {key}")),
        KEY_VAR,
    )
}

impl Endpoints {
    /// Opens the agent's WebSocket through the devbox's tunnel.
    async fn open_agent(
        &self,
        tunnel: &api::Tunnel,
        agent_token: &str,
    ) -> Result<AgentSocket, EdgeError> {
        let host = format!("{AGENT_PORT}-{}.tunnel.{}", tunnel.tunnel_key, self.domain);
        let mut headers = HeaderMap::new();
        let url = match &self.tunnel_url {
            Some(url) => {
                headers.insert(HOST, header(&host)?);
                url.clone()
            }
            None => format!("https://{host}"),
        };
        if let Some(token) = &tunnel.auth_token {
            headers.insert(TUNNEL_AUTH, header(&format!("Bearer {token}"))?);
        }
        // Runloop's tunnel takes its own header for its token; the agent's goes in ours, so
        // nothing in the way mistakes one for the other.
        websocket::open_with(
            self.api.http(),
            &url,
            headers,
            agent_token,
            TokenIn::TetherHeader,
        )
        .await
    }

    /// Opens the agent's WebSocket, waiting while the agent is still starting (the tunnel
    /// answers 502 until something listens on the port).
    async fn open_when_ready(
        &self,
        id: &str,
        tunnel: &api::Tunnel,
        agent_token: &str,
    ) -> Result<AgentSocket, EdgeError> {
        websocket::open_when_ready(&format!("Runloop devbox {id}"), || {
            self.open_agent(tunnel, agent_token)
        })
        .await
    }
}

fn header(value: &str) -> Result<HeaderValue, EdgeError> {
    HeaderValue::from_str(value)
        .map_err(|_| EdgeError::Network(format!("{value:?} is not a valid header value")))
}

fn load_meta(sandbox: &SandboxHandle) -> Result<Meta, ProviderError> {
    serde_json::from_value(sandbox.meta.clone()).map_err(|e| {
        ProviderError::Other(anyhow!(
            "the relay's record of Runloop devbox {} is unreadable ({e}); delete it with `tether rm {}`",
            sandbox.provider_ref,
            sandbox.id
        ))
    })
}

/// The blueprint `spec` names, refusing what a devbox cannot carry.
fn blueprint(spec: &SandboxSpec) -> Result<(Option<&str>, Option<&str>), ProviderError> {
    let Some(image) = spec.image.as_deref().filter(|i| !i.is_empty()) else {
        return Err(ProviderError::InvalidSpec(
            "the runloop provider needs a blueprint: pass --image with the name or id of a \
             Runloop blueprint that has tether-agent on its PATH (`tether image build --target \
             runloop` makes one; see docs/providers.md)"
                .into(),
        ));
    };
    if spec.env.contains_key(AGENT_TOKEN_ENV) {
        return Err(ProviderError::InvalidSpec(format!(
            "{AGENT_TOKEN_ENV} is reserved for the relay"
        )));
    }
    Ok(if image.starts_with(BLUEPRINT_ID_PREFIX) {
        (Some(image), None)
    } else {
        (None, Some(image))
    })
}

/// The timer that ends a devbox created from `spec`, and its length.
fn timer(spec: &SandboxSpec, default: Duration) -> Result<(Timer, Duration), ProviderError> {
    if let Some(idle) = spec.idle_timeout {
        return Ok((Timer::Idle, idle.max(Duration::from_secs(1))));
    }
    match spec.ttl {
        Some(ttl) if ttl > MAX_KEEP_ALIVE => Err(ProviderError::InvalidSpec(format!(
            "Runloop shuts a devbox down after at most {} hours without a keep-alive, so a \
             --ttl above that cannot be held there: leave --ttl out (the relay then keeps the \
             devbox alive while it is used) or ask for at most 48h",
            MAX_KEEP_ALIVE.as_secs() / 3600
        ))),
        Some(ttl) => Ok((Timer::Ttl, ttl.max(Duration::from_secs(1)))),
        None => Ok((Timer::KeepAlive, default)),
    }
}

/// The agent's command line, as the devbox's shell runs it.
fn agent_command() -> String {
    std::iter::once(AGENT_PROGRAM)
        .chain(AGENT_ARGS)
        .collect::<Vec<_>>()
        .join(" ")
}

fn edge_failure(id: &str, e: EdgeError) -> ProviderError {
    let hint = match e.status() {
        Some(401) if e.to_string().contains("agent token") => "; the agent refused its token",
        Some(401 | 403) => "; Runloop's tunnel refused the tunnel token",
        Some(502..=504) => {
            "; nothing answers on the agent's port: the blueprint must have tether-agent on its \
             PATH (see docs/providers.md)"
        }
        _ => "",
    };
    ProviderError::Other(anyhow!(
        "cannot open the agent's WebSocket in Runloop devbox {id}: {e}{hint}"
    ))
}

impl RunloopProvider {
    /// Waits until devbox `id` is `running`; fails on `failure` or `shutdown` with Runloop's
    /// reason.
    async fn wait_running(
        &self,
        api: &ControlPlane,
        id: &str,
    ) -> Result<api::Devbox, ProviderError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let devbox = api::wait_for_status(api, id, &["running", "failure", "shutdown"])
                .await?
                .ok_or_else(|| ProviderError::Gone(id.to_string()))?;
            match devbox.status.as_str() {
                "running" => return Ok(devbox),
                "failure" | "shutdown" => {
                    return Err(ProviderError::Other(anyhow!(
                        "Runloop devbox {id} did not start ({}): {}",
                        devbox.status,
                        devbox.reason()
                    )))
                }
                status if Instant::now() > deadline => {
                    return Err(ProviderError::Other(anyhow!(
                        "Runloop devbox {id} is still `{status}` after {START_TIMEOUT:?}"
                    )))
                }
                _ => tokio::time::sleep(POLL_INTERVAL).await,
            }
        }
    }

    /// Shuts down what a failed create made; failures are logged (the create's own error is
    /// what the user needs).
    async fn undo(&self, api: &ControlPlane, devbox: Option<&str>, policy: Option<&str>) {
        if let Some(id) = devbox {
            if let Err(e) = api::shutdown(api, id).await {
                tracing::warn!("cannot shut down Runloop devbox {id} after a failed create: {e}");
            }
        }
        if let Some(policy) = policy {
            if let Err(e) = api::delete_policy(api, policy).await {
                tracing::warn!("cannot delete Runloop network policy {policy}: {e}");
            }
        }
    }

    /// Brings devbox `id` back to `running` with its agent listening: resumes it if it is
    /// suspended and starts the agent again (Runloop restarts no process at a resume).
    async fn revive(
        &self,
        e: &Endpoints,
        sandbox: &SandboxHandle,
        tunnel: &api::Tunnel,
    ) -> Result<AgentSocket, ProviderError> {
        let id = &sandbox.provider_ref;
        let found = api::get(&e.api, id)
            .await?
            .ok_or_else(|| ProviderError::Gone(sandbox.id.clone()))?;
        let devbox = match found.status.as_str() {
            "shutdown" => return Err(ProviderError::Gone(sandbox.id.clone())),
            "failure" => {
                return Err(ProviderError::Other(anyhow!(
                    "Runloop devbox {id} has failed ({}); nothing can run in it again: remove it \
                     with `tether rm {}`",
                    found.reason(),
                    sandbox.id
                )))
            }
            "suspending" | "suspended" => {
                if found.status == "suspending" {
                    api::wait_for_status(&e.api, id, &["suspended", "failure", "shutdown"]).await?;
                }
                tracing::info!("Runloop devbox {id} is suspended; resuming it");
                api::lifecycle(&e.api, id, "resume")
                    .await?
                    .ok_or_else(|| ProviderError::Gone(sandbox.id.clone()))?;
                self.wait_running(&e.api, id).await?
            }
            "running" => found,
            _ => self.wait_running(&e.api, id).await?,
        };
        // The tunnel survives a resume; a fresh read of it wins over the record.
        let tunnel = devbox.checked_tunnel()?.unwrap_or_else(|| tunnel.clone());
        match e.open_agent(&tunnel, &sandbox.agent_token).await {
            Ok(socket) => return Ok(socket),
            Err(EdgeError::Refused {
                status: 502..=504, ..
            }) => {}
            Err(err) => return Err(edge_failure(id, err)),
        }
        // The agent is not listening (a resume, or a restart inside): start it again. Its
        // token comes from the devbox's environment, never from this command line; a second
        // agent racing a first loses the port and exits.
        api::execute_async(&e.api, id, &agent_command()).await?;
        e.open_when_ready(id, &tunnel, &sandbox.agent_token)
            .await
            .map_err(|err| edge_failure(id, err))
    }
}

#[async_trait]
impl Provider for RunloopProvider {
    fn name(&self) -> &'static str {
        "runloop"
    }

    async fn create(
        &self,
        id: &str,
        agent_token: &str,
        spec: &SandboxSpec,
    ) -> Result<Created, ProviderError> {
        let (blueprint_id, blueprint_name) = blueprint(spec)?;
        let size = size::size(spec)?;
        let policy = egress::policy(id, spec)?;
        let e = self.ready()?;
        let (timer, length) = timer(spec, e.keep_alive)?;
        let policy_id = match &policy {
            Some(policy) => Some(api::create_policy(&e.api, policy).await?.id),
            None => None,
        };
        let mut metadata: BTreeMap<String, String> = spec.labels.clone();
        metadata.insert(ID_METADATA.into(), id.into());
        let mut env = spec.env.clone();
        env.insert(AGENT_TOKEN_ENV.into(), agent_token.into());
        let secs = length.as_secs().max(1);
        let body = api::CreateDevbox {
            name: id,
            blueprint_id,
            blueprint_name,
            entrypoint: &agent_command(),
            environment_variables: &env,
            metadata: &metadata,
            launch_parameters: api::LaunchParameters {
                size,
                keep_alive_time_seconds: (timer != Timer::Idle).then_some(secs),
                lifecycle: (timer == Timer::Idle).then_some(api::Lifecycle {
                    after_idle: api::AfterIdle {
                        idle_time_seconds: secs,
                        on_idle: "shutdown",
                    },
                }),
                network_policy_id: policy_id.clone(),
            },
            tunnel: api::TunnelConfig {
                auth_mode: "authenticated",
                http_keep_alive: true,
            },
        };
        let created = match api::create(&e.api, &body).await {
            Ok(created) => created,
            Err(err) => {
                self.undo(&e.api, None, policy_id.as_deref()).await;
                return Err(err);
            }
        };
        let devbox_id = created.id.clone();
        let ready = async {
            let running = self.wait_running(&e.api, &devbox_id).await?;
            let tunnel = match running.checked_tunnel()? {
                Some(tunnel) => tunnel,
                None => match created.checked_tunnel()? {
                    Some(tunnel) => tunnel,
                    None => api::enable_tunnel(&e.api, &devbox_id).await?,
                },
            };
            // Proves the blueprint has our agent, started with our token, before anyone
            // relies on it.
            drop(
                e.open_when_ready(&devbox_id, &tunnel, agent_token)
                    .await
                    .map_err(|err| edge_failure(&devbox_id, err))?,
            );
            Ok::<_, ProviderError>(tunnel)
        };
        let tunnel = match ready.await {
            Ok(tunnel) => tunnel,
            Err(err) => {
                self.undo(&e.api, Some(&devbox_id), policy_id.as_deref())
                    .await;
                return Err(err);
            }
        };
        let meta = Meta {
            tunnel,
            timer,
            timer_secs: secs,
            policy_id,
        };
        Ok(Created {
            provider_ref: devbox_id,
            meta: serde_json::to_value(&meta).map_err(anyhow::Error::new)?,
        })
    }

    async fn state(&self, sandbox: &SandboxHandle) -> Result<SandboxState, ProviderError> {
        let e = self.ready()?;
        let Some(devbox) = api::get(&e.api, &sandbox.provider_ref).await? else {
            return Ok(SandboxState::Gone);
        };
        Ok(match devbox.status.as_str() {
            "shutdown" => SandboxState::Gone,
            "failure" => {
                tracing::warn!(
                    "Runloop reports devbox {} of sandbox {} as failed: {}",
                    devbox.id,
                    sandbox.id,
                    devbox.reason()
                );
                SandboxState::Dead
            }
            "suspending" | "suspended" => SandboxState::Stopped,
            _ => SandboxState::Running,
        })
    }

    async fn delete(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        let e = self.ready()?;
        let devbox = api::shutdown(&e.api, &sandbox.provider_ref).await?;
        // The policy made for this sandbox: from the record, else (an orphan, whose record is
        // lost) from the devbox, and only if it is ours by name.
        let recorded = load_meta(sandbox).ok().and_then(|m| m.policy_id);
        let policy = recorded.or_else(|| {
            devbox
                .and_then(|d| d.launch_parameters)
                .and_then(|l| l.network_policy_id)
        });
        if let Some(policy) = policy {
            let ours = format!("{}{}", egress::POLICY_PREFIX, sandbox.id);
            match api::get_policy(&e.api, &policy).await? {
                Some(found) if found.name == ours => api::delete_policy(&e.api, &policy).await?,
                Some(found) => tracing::info!(
                    "keeping Runloop network policy {policy} ({}): not made for sandbox {}",
                    found.name,
                    sandbox.id
                ),
                None => {}
            }
        }
        Ok(())
    }

    async fn renew(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), ProviderError> {
        let e = self.ready()?;
        let meta = load_meta(sandbox)?;
        if meta.timer == Timer::Idle {
            // Runloop's timer is the idle one; the TTL is the relay's.
            return Ok(());
        }
        if meta.timer == Timer::Ttl && ttl.as_secs() > meta.timer_secs {
            return Err(ProviderError::InvalidSpec(format!(
                "Runloop devbox {}'s keep-alive time is fixed at create ({} s), and a keep-alive \
                 can only restart it: a TTL beyond that needs a new sandbox",
                sandbox.provider_ref, meta.timer_secs
            )));
        }
        match api::keep_alive(&e.api, &sandbox.provider_ref).await? {
            true => Ok(()),
            false => Err(ProviderError::Gone(sandbox.id.clone())),
        }
    }

    async fn connect(&self, sandbox: &SandboxHandle) -> Result<AgentSocket, ProviderError> {
        let e = self.ready()?;
        let meta = load_meta(sandbox)?;
        let id = &sandbox.provider_ref;
        if meta.timer != Timer::Ttl {
            match api::keep_alive(&e.api, id).await {
                Ok(true) => {}
                Ok(false) => return Err(ProviderError::Gone(sandbox.id.clone())),
                // Runloop keeps only a running devbox alive: a suspended one is revived below.
                Err(err) => tracing::debug!("Runloop devbox {id}: no keep-alive ({err})"),
            }
        }
        match e.open_agent(&meta.tunnel, &sandbox.agent_token).await {
            Ok(socket) => Ok(socket),
            Err(first) => {
                tracing::debug!("Runloop devbox {id}: agent unreachable ({first}); checking it");
                self.revive(e, sandbox, &meta.tunnel).await
            }
        }
    }

    fn network_info(&self, spec: &SandboxSpec) -> NetworkInfo {
        egress::info(spec)
    }

    fn keep_alive_every(&self, sandbox: &SandboxHandle) -> Option<Duration> {
        let meta = load_meta(sandbox).ok()?;
        // Half the timer: a session outlives any number of them.
        (meta.timer != Timer::Ttl).then_some(Duration::from_secs(meta.timer_secs.max(2) / 2))
    }

    async fn keep_alive(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        match api::keep_alive(&self.ready()?.api, &sandbox.provider_ref).await? {
            true => Ok(()),
            false => Err(ProviderError::Gone(sandbox.id.clone())),
        }
    }

    async fn labelled(&self) -> Result<Option<Vec<Labelled>>, ProviderError> {
        let listed = api::list(&self.ready()?.api).await?;
        Ok(Some(
            listed
                .into_iter()
                .filter(|d| d.status != "shutdown")
                .filter_map(|d| {
                    Some(Labelled {
                        id: d.metadata.get(ID_METADATA)?.clone(),
                        provider_ref: d.id,
                    })
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_key_names_the_variable() {
        let provider = RunloopProvider::new(&Settings::from_pairs([]));
        let err = provider.ready().unwrap_err();
        assert!(matches!(err, ProviderError::Auth(_)));
        assert!(err.to_string().contains("RUNLOOP_API_KEY"), "{err}");
    }

    #[test]
    fn tunnels_are_named_after_the_api_domain() {
        let provider = RunloopProvider::new(&Settings::from_pairs([("RUNLOOP_API_KEY", "k")]));
        assert_eq!(provider.ready().unwrap().domain, "runloop.ai");
        let custom = RunloopProvider::new(&Settings::from_pairs([
            ("RUNLOOP_API_KEY", "k"),
            ("RUNLOOP_BASE_URL", "http://127.0.0.1:9"),
        ]));
        assert_eq!(custom.ready().unwrap().domain, "127.0.0.1");
        let bad = RunloopProvider::new(&Settings::from_pairs([
            ("RUNLOOP_API_KEY", "k"),
            ("RUNLOOP_KEEP_ALIVE", "forever"),
        ]));
        assert!(bad
            .ready()
            .unwrap_err()
            .to_string()
            .contains("RUNLOOP_KEEP_ALIVE"));
    }

    #[test]
    fn images_name_blueprints_by_id_or_name() {
        assert!(blueprint(&SandboxSpec::default()).is_err());
        let by_id = SandboxSpec {
            image: Some("bpt_123".into()),
            ..Default::default()
        };
        assert_eq!(blueprint(&by_id).unwrap(), (Some("bpt_123"), None));
        let by_name = SandboxSpec {
            image: Some("tether".into()),
            ..Default::default()
        };
        assert_eq!(blueprint(&by_name).unwrap(), (None, Some("tether")));
        let reserved = SandboxSpec {
            image: Some("tether".into()),
            env: BTreeMap::from([(AGENT_TOKEN_ENV.to_string(), "x".to_string())]),
            ..Default::default()
        };
        assert!(blueprint(&reserved).is_err());
    }

    #[test]
    fn lifetimes_pick_runloop_timers() {
        let default = Duration::from_secs(3600);
        let none = SandboxSpec::default();
        assert_eq!(timer(&none, default).unwrap(), (Timer::KeepAlive, default));
        let ttl = SandboxSpec {
            ttl: Some(Duration::from_secs(600)),
            ..Default::default()
        };
        assert_eq!(
            timer(&ttl, default).unwrap(),
            (Timer::Ttl, Duration::from_secs(600))
        );
        let idle = SandboxSpec {
            ttl: Some(Duration::from_secs(600)),
            idle_timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        assert_eq!(timer(&idle, default).unwrap().0, Timer::Idle);
        let long = SandboxSpec {
            ttl: Some(Duration::from_secs(49 * 3600)),
            ..Default::default()
        };
        assert!(timer(&long, default)
            .unwrap_err()
            .to_string()
            .contains("48"));
        assert_eq!(agent_command(), "tether-agent serve --listen 0.0.0.0:7421");
    }
}

//! The `daytona` provider: sandboxes are Daytona containers made from a snapshot (the
//! `--image`), reached through Daytona's preview proxy with `X-Daytona-Preview-Token`.
//!
//! - Create: `POST /sandbox` named by the relay's id (a retried create finds its sandbox),
//!   labels as labels, the agent token in the container's environment (Daytona runs the
//!   snapshot's exec-form ENTRYPOINT, which starts the agent), the idle timeout as
//!   `autoStopInterval` and the TTL as `ttlMinutes`. Then wait for `started` (failing on
//!   `error`/`build_failed`) and for the agent to answer on its preview URL.
//! - Connect: the preview URL with its token, the agent token in `X-Tether-Agent-Token`:
//!   never as `Authorization: Bearer`, which Daytona's proxy tries first as a Daytona
//!   credential, counting each refusal in the failed-auth limiter that then answers 429 to
//!   every call from the relay's IP. A refused preview token (401, or 307 from older Daytona;
//!   it changes at every start): fetch a fresh one. A stopped sandbox is started again first.
//! - Gone only when a read of the sandbox says so (404, `destroyed`): a 404 from a route a
//!   self-hosted Daytona lacks proves nothing, so without the TTL route renew is refused and
//!   the sandbox kept; `error` is broken, not gone, and a recoverable one is recovered.
//! - Network: `--network` and allowlists as Daytona's `networkBlockAll`, `networkAllowList`
//!   and `domainAllowList` ([`egress`]); what Daytona cannot express is refused.
//! - Settings: `DAYTONA_API_KEY`; `DAYTONA_API_URL` (default `https://app.daytona.io/api`).

mod api;
mod egress;
pub(crate) mod snapshot;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};

use super::cloud::constants::{AGENT_PORT, AGENT_TOKEN_ENV, POLL_INTERVAL};
use super::cloud::http::{self, ControlPlane};
use super::cloud::settings::Settings;
use super::cloud::websocket::{self, EdgeError, TokenIn};
use tether_relay_core::provider::{
    AgentSocket, Created, Labelled, NetworkInfo, Provider, ProviderError, SandboxHandle,
    SandboxSpec, SandboxState,
};

/// Daytona's API when `DAYTONA_API_URL` is not set.
const DEFAULT_API_URL: &str = "https://app.daytona.io/api";
/// How long a sandbox may take to reach `started` (pulling a large snapshot is slow).
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// The label holding the relay's sandbox id.
const ID_LABEL: &str = "tether.sandbox";
/// The variable holding the API key.
pub(crate) const KEY_VAR: &str = "DAYTONA_API_KEY";
/// The preview proxy's token header.
const PREVIEW_TOKEN: &str = "x-daytona-preview-token";

/// Runs sandboxes on Daytona.
#[derive(Debug)]
pub struct DaytonaProvider {
    /// `Err` when no key is configured: every call reports it.
    api: Result<ControlPlane, String>,
    /// The freshest preview URL and token per Daytona sandbox (tokens change at each start).
    previews: Mutex<HashMap<String, api::Preview>>,
}

/// What the registry keeps for a Daytona sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Meta {
    /// The agent's preview URL and token at create.
    preview: api::Preview,
}

impl DaytonaProvider {
    /// A provider configured from `settings`; without `DAYTONA_API_KEY` every call fails
    /// with an error naming it.
    pub fn new(settings: &Settings) -> DaytonaProvider {
        let api = control_plane(settings).map_err(|e| e.to_string());
        DaytonaProvider {
            api,
            previews: Mutex::new(HashMap::new()),
        }
    }

    fn api(&self) -> Result<&ControlPlane, ProviderError> {
        self.api
            .as_ref()
            .map_err(|e| ProviderError::Auth(e.clone()))
    }

    fn remember(&self, id: &str, preview: &api::Preview) {
        self.previews
            .lock()
            .expect("preview cache")
            .insert(id.to_string(), preview.clone());
    }

    /// Waits until sandbox `id` is `started`.
    async fn wait_started(
        &self,
        api: &ControlPlane,
        id: &str,
        mut sandbox: api::Sandbox,
    ) -> Result<(), ProviderError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match sandbox.state.as_str() {
                "started" => return Ok(()),
                "error" | "build_failed" | "destroyed" | "destroying" => {
                    return Err(ProviderError::Other(anyhow!(
                        "Daytona sandbox {id} failed to start ({}): {}",
                        sandbox.state,
                        sandbox.error_reason.as_deref().unwrap_or("no reason given")
                    )))
                }
                _ if Instant::now() > deadline => {
                    return Err(ProviderError::Other(anyhow!(
                        "Daytona sandbox {id} is still `{}` after {START_TIMEOUT:?}",
                        sandbox.state
                    )))
                }
                _ => {}
            }
            tokio::time::sleep(POLL_INTERVAL).await;
            sandbox = api::get(api, id)
                .await?
                .ok_or_else(|| ProviderError::Gone(id.to_string()))?;
        }
    }

    /// Opens the agent's WebSocket, waiting while the agent is still starting (the proxy
    /// answers 502 until something listens on the port).
    async fn open_when_ready(
        &self,
        id: &str,
        preview: &api::Preview,
        agent_token: &str,
    ) -> Result<AgentSocket, EdgeError> {
        let api = self.api().map_err(|e| EdgeError::Network(e.to_string()))?;
        let token = HeaderValue::from_str(&preview.token).map_err(|_| {
            EdgeError::Network("the preview token is not a valid header value".into())
        })?;
        websocket::open_when_ready(&format!("Daytona sandbox {id}"), || {
            let mut headers = HeaderMap::new();
            headers.insert(PREVIEW_TOKEN, token.clone());
            websocket::open_with(
                api.http(),
                &preview.url,
                headers,
                agent_token,
                TokenIn::TetherHeader,
            )
        })
        .await
    }
}

/// Daytona's API as `settings` configure it (`DAYTONA_API_KEY`, `DAYTONA_API_URL`): for this
/// provider, and for `tether image build --target daytona`, so both reach the same Daytona.
pub(crate) fn control_plane(settings: &Settings) -> Result<ControlPlane, ProviderError> {
    let key = settings.require("daytona", KEY_VAR)?;
    let base = settings
        .get("DAYTONA_API_URL")
        .unwrap_or_else(|| DEFAULT_API_URL.to_string());
    ControlPlane::new(
        http::client()?,
        "Daytona",
        &base,
        ("authorization", &format!("Bearer {key}")),
        KEY_VAR,
    )
}

/// Refuses what a snapshot fixes.
fn check_spec(spec: &SandboxSpec) -> Result<&str, ProviderError> {
    let Some(snapshot) = spec.image.as_deref() else {
        return Err(ProviderError::InvalidSpec(
            "the daytona provider needs a snapshot: pass --image with the name of a Daytona \
             snapshot whose exec-form ENTRYPOINT starts tether-agent (see docs/providers.md)"
                .into(),
        ));
    };
    if spec.cpus.is_some() || spec.memory_bytes.is_some() || spec.pids.is_some() {
        return Err(ProviderError::InvalidSpec(
            "Daytona takes CPU, memory and disk from the snapshot; drop --cpus, --memory and \
             --pids, or create a snapshot with the resources you need"
                .into(),
        ));
    }
    if spec.env.contains_key(AGENT_TOKEN_ENV) {
        return Err(ProviderError::InvalidSpec(format!(
            "{AGENT_TOKEN_ENV} is reserved for the relay"
        )));
    }
    Ok(snapshot)
}

fn minutes(d: Duration) -> u64 {
    d.as_secs().div_ceil(60).max(1)
}

fn edge_failure(id: &str, e: EdgeError) -> ProviderError {
    let hint = match e.status() {
        Some(307) => "; Daytona's preview proxy refused the preview token",
        Some(401) if e.to_string().contains("sandbox token") => "; the agent refused its token",
        Some(401) => "; Daytona's preview proxy refused the preview token",
        Some(429) => {
            "; Daytona is rate limiting this relay (its failed-auth limiter blocks an IP for a \
             while after repeated refused credentials: check DAYTONA_API_KEY, then retry later)"
        }
        Some(502..=504) => {
            "; nothing answers on the agent's port: the snapshot's exec-form ENTRYPOINT must \
             start `tether-agent serve --listen 0.0.0.0:7421` (see docs/providers.md)"
        }
        _ => "",
    };
    ProviderError::Other(anyhow!(
        "cannot open the agent's WebSocket in Daytona sandbox {id}: {e}{hint}"
    ))
}

#[async_trait]
impl Provider for DaytonaProvider {
    fn name(&self) -> &'static str {
        "daytona"
    }

    async fn create(
        &self,
        id: &str,
        agent_token: &str,
        spec: &SandboxSpec,
    ) -> Result<Created, ProviderError> {
        let snapshot = check_spec(spec)?;
        let outbound = egress::outbound(spec)?;
        let api = self.api()?;
        let mut labels: BTreeMap<String, String> = spec.labels.clone();
        labels.insert(ID_LABEL.into(), id.into());
        let mut env = spec.env.clone();
        env.insert(AGENT_TOKEN_ENV.into(), agent_token.into());
        let body = api::CreateSandbox {
            name: id,
            snapshot,
            env: &env,
            labels: &labels,
            public: false,
            network_block_all: outbound.block_all,
            network_allow_list: outbound.network_allow_list,
            domain_allow_list: outbound.domain_allow_list,
            // The relay deletes idle sandboxes itself; Daytona's stop is the backstop, and a
            // stopped sandbox of ours is deleted, not kept.
            auto_stop_interval: spec.idle_timeout.map_or(0, minutes),
            auto_delete_interval: if spec.idle_timeout.is_some() { 0 } else { -1 },
            ttl_minutes: spec.ttl.map(minutes),
        };
        let sandbox = api::create(api, &body).await?;
        let daytona_id = sandbox.id.clone();
        let ready = async {
            self.wait_started(api, &daytona_id, sandbox).await?;
            let preview = api::preview(api, &daytona_id, AGENT_PORT).await?;
            // Proves the ENTRYPOINT started our agent, with our token, before anyone relies on it.
            drop(
                self.open_when_ready(&daytona_id, &preview, agent_token)
                    .await
                    .map_err(|e| edge_failure(&daytona_id, e))?,
            );
            Ok::<_, ProviderError>(preview)
        };
        let preview = match ready.await {
            Ok(preview) => preview,
            Err(e) => {
                if let Err(del) = api::delete(api, &daytona_id).await {
                    tracing::warn!(
                        "cannot delete Daytona sandbox {daytona_id} after a failed create: {del}"
                    );
                }
                return Err(e);
            }
        };
        self.remember(&daytona_id, &preview);
        let meta = serde_json::to_value(Meta { preview }).map_err(anyhow::Error::new)?;
        Ok(Created {
            provider_ref: daytona_id,
            meta,
        })
    }

    async fn state(&self, sandbox: &SandboxHandle) -> Result<SandboxState, ProviderError> {
        let Some(found) = api::get(self.api()?, &sandbox.provider_ref).await? else {
            return Ok(SandboxState::Gone);
        };
        Ok(match found.state.as_str() {
            "destroyed" | "destroying" => SandboxState::Gone,
            // It still exists, files and all: broken, not gone. A recoverable error is
            // recovered at the next connect.
            "error" | "build_failed" => {
                tracing::warn!(
                    "Daytona reports sandbox {} as `{}`: {}",
                    sandbox.id,
                    found.state,
                    found.error_reason.as_deref().unwrap_or("no reason given")
                );
                SandboxState::Unknown
            }
            "stopped" | "stopping" | "archived" | "archiving" | "paused" | "pausing" => {
                SandboxState::Stopped
            }
            _ => SandboxState::Running,
        })
    }

    async fn delete(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        self.previews
            .lock()
            .expect("preview cache")
            .remove(&sandbox.provider_ref);
        api::delete(self.api()?, &sandbox.provider_ref).await
    }

    async fn renew(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), ProviderError> {
        match api::set_ttl(self.api()?, &sandbox.provider_ref, minutes(ttl)).await? {
            true => Ok(()),
            false => Err(ProviderError::Gone(sandbox.id.clone())),
        }
    }

    async fn connect(&self, sandbox: &SandboxHandle) -> Result<AgentSocket, ProviderError> {
        let api = self.api()?;
        let id = &sandbox.provider_ref;
        let cached = self
            .previews
            .lock()
            .expect("preview cache")
            .get(id)
            .cloned();
        let preview = match cached {
            Some(preview) => preview,
            None => {
                let meta: Meta = serde_json::from_value(sandbox.meta.clone()).map_err(|e| {
                    anyhow!("the relay's record of Daytona sandbox {id} is unreadable: {e}")
                })?;
                meta.preview
            }
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            PREVIEW_TOKEN,
            HeaderValue::from_str(&preview.token).map_err(|_| anyhow!("bad preview token"))?,
        );
        let first = match websocket::open_with(
            api.http(),
            &preview.url,
            headers,
            &sandbox.agent_token,
            TokenIn::TetherHeader,
        )
        .await
        {
            Ok(socket) => return Ok(socket),
            Err(e) => e,
        };
        tracing::debug!("Daytona sandbox {id}: {first}; checking its state");
        // Stopped (start it: that issues a new token), or restarted (fetch the new token).
        let found = api::get(api, id)
            .await?
            .ok_or_else(|| ProviderError::Gone(sandbox.id.clone()))?;
        match found.state.as_str() {
            "destroyed" | "destroying" => return Err(ProviderError::Gone(sandbox.id.clone())),
            "stopped" | "archived" | "paused" => {
                let started = api::start(api, id).await?;
                self.wait_started(api, id, started).await?;
            }
            // Broken but there, files and all: recover it as the SDK's `recover` does.
            "error" if found.recoverable => {
                tracing::info!(
                    "Daytona sandbox {id} is in a recoverable error ({}); recovering it",
                    found.error_reason.as_deref().unwrap_or("no reason given")
                );
                let recovered = api::recover(api, id).await?;
                self.wait_started(api, id, recovered).await?;
            }
            _ => self.wait_started(api, id, found).await?,
        }
        let preview = api::preview(api, id, AGENT_PORT).await?;
        self.remember(id, &preview);
        self.open_when_ready(id, &preview, &sandbox.agent_token)
            .await
            .map_err(|e| edge_failure(id, e))
    }

    fn network_info(&self, spec: &SandboxSpec) -> NetworkInfo {
        egress::info(spec)
    }

    fn relay_egress_entry(
        &self,
        spec: &SandboxSpec,
        url: &tether_relay_core::egress::route::EgressUrl,
    ) -> Result<tether_relay_core::egress::route::RelayEntry, ProviderError> {
        egress::relay_entry(spec, url)
    }

    async fn labelled(&self) -> Result<Option<Vec<Labelled>>, ProviderError> {
        let listed = api::list(self.api()?).await?;
        Ok(Some(
            listed
                .into_iter()
                .filter(|s| !matches!(s.state.as_str(), "destroyed" | "destroying"))
                .filter_map(|s| {
                    Some(Labelled {
                        id: s.labels.get(ID_LABEL)?.clone(),
                        provider_ref: s.id,
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
        let provider = DaytonaProvider::new(&Settings::from_pairs([]));
        let err = provider.api().unwrap_err();
        assert!(err.to_string().contains("DAYTONA_API_KEY"), "{err}");
    }

    #[test]
    fn snapshots_fix_resources_and_durations_round_up_to_minutes() {
        assert!(check_spec(&SandboxSpec::default()).is_err());
        let spec = SandboxSpec {
            image: Some("tether".into()),
            memory_bytes: Some(1 << 30),
            ..Default::default()
        };
        assert!(check_spec(&spec).is_err());
        assert_eq!(minutes(Duration::from_secs(61)), 2);
        assert_eq!(minutes(Duration::from_secs(1)), 1);
    }
}

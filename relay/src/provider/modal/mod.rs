//! The `modal` provider: sandboxes are Modal Sandboxes made from a Modal image (the `--image`:
//! a name published on Modal, or a registry tag such as `ghcr.io/me/tether-agent:1`), whose
//! entrypoint runs the agent on an encrypted port that Modal exposes through a TLS tunnel.
//!
//! - Create: `EnvironmentGetOrCreate` (for its image builder version), `AppGetOrCreate` (app
//!   `tether`, or `MODAL_APP`), the image (`ImageGetByTag` for a published name, else
//!   `ImageGetOrCreate` with `FROM <image>`, waiting on `ImageJoinStreaming` while it
//!   builds), then `SandboxCreate` named by
//!   the relay's id, with `tether-agent serve --listen 0.0.0.0:7421` as its entrypoint
//!   arguments, the token in its environment, port 7421 open, labels as tags, the TTL as its
//!   timeout and the idle timeout as Modal's. Then `SandboxGetTunnels` for the port's tunnel,
//!   and wait for the agent to answer through it.
//! - Connect: a WebSocket to the tunnel (`wss://host:port`), bearer agent token.
//! - Files: [`client`] (the gRPC session, auth and retries), [`image`] (building, publishing
//!   and resolving images), [`names`] (Modal's image names), [`tunnel`] (finding and opening
//!   the agent's tunnel), `modal.proto` and `messages.proto` (the part of Modal's API we use,
//!   compiled by `build.rs`).
//! - `--image` is an image published on Modal under that name (`tether image build --target
//!   modal` makes one; looked up with `ImageGetByTag`), else a registry tag.
//! - Image builds (for `tether image build --target modal`): [`ModalProvider::build_image`]
//!   and [`ModalProvider::publish_image`].
//! - Settings: `MODAL_TOKEN_ID`, `MODAL_TOKEN_SECRET`; `MODAL_SERVER_URL` (default
//!   `https://api.modal.com`; a plain `http://` server, such as the fake, also means plain
//!   tunnels); `MODAL_ENVIRONMENT`; `MODAL_APP`.

pub(crate) mod build;
mod client;
mod image;
mod names;
mod tunnel;

pub(crate) use self::image::{BuildError, Definition};
pub(crate) use self::names::ImageName;

/// The messages and client generated from `modal.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod pb {
    tonic::include_proto!("modal.client");
}

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use async_trait::async_trait;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;
use tonic::Code;

use self::client::Modal;
use self::pb::network_access::NetworkAccessType;
use super::cloud::constants::{AGENT_ARGS, AGENT_PORT, AGENT_PROGRAM, AGENT_TOKEN_ENV};
use super::cloud::http;
use super::cloud::settings::Settings;
use super::cloud::websocket::{self, EdgeError};
use super::{
    AgentSocket, Created, NetworkPolicy, Provider, ProviderError, SandboxHandle, SandboxSpec,
    SandboxState,
};

/// Modal's API when `MODAL_SERVER_URL` is not set.
const DEFAULT_SERVER_URL: &str = "https://api.modal.com";
/// The Modal app our sandboxes belong to, unless `MODAL_APP` says.
const DEFAULT_APP: &str = "tether";
/// Modal's longest sandbox lifetime, used when no TTL is asked for (Modal's own default is 5
/// minutes, far shorter than what a relay sandbox is expected to live).
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The tag holding the relay's sandbox id.
const ID_TAG: &str = "tether.sandbox";

/// Runs sandboxes on Modal.
pub struct ModalProvider {
    /// `Err` when no token is configured: every call reports it.
    modal: Result<Modal, String>,
    /// Whether tunnels are TLS (`wss://`): yes, unless the server itself is plain HTTP.
    tls_tunnels: bool,
    environment: String,
    app_name: String,
    app: OnceCell<App>,
    http: Option<reqwest::Client>,
}

impl std::fmt::Debug for ModalProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModalProvider")
            .field("app", &self.app_name)
            .finish_non_exhaustive()
    }
}

/// Our Modal app, and how its environment builds images.
#[derive(Debug)]
struct App {
    id: String,
    /// `image_builder_version` of the environment, passed with every image.
    builder_version: String,
}

/// What the registry keeps for a Modal sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Meta {
    /// The agent's tunnel, `wss://host:port`.
    url: String,
    /// When Modal's timeout ends it, milliseconds since the Unix epoch.
    ends_ms: u64,
}

impl ModalProvider {
    /// A provider configured from `settings`; without a token every call fails with an error
    /// naming the variables.
    pub(crate) fn new(settings: &Settings) -> ModalProvider {
        let url = settings
            .get("MODAL_SERVER_URL")
            .unwrap_or_else(|| DEFAULT_SERVER_URL.to_string());
        let modal = (|| {
            let id = settings.require("modal", "MODAL_TOKEN_ID")?;
            let secret = settings.require("modal", "MODAL_TOKEN_SECRET")?;
            Modal::new(&url, &id, &secret)
        })()
        .map_err(|e| e.to_string());
        ModalProvider {
            modal,
            tls_tunnels: !url.starts_with("http://"),
            environment: settings.get("MODAL_ENVIRONMENT").unwrap_or_default(),
            app_name: settings
                .get("MODAL_APP")
                .unwrap_or_else(|| DEFAULT_APP.to_string()),
            app: OnceCell::new(),
            http: http::client().ok(),
        }
    }

    fn modal(&self) -> Result<&Modal, ProviderError> {
        self.modal
            .as_ref()
            .map_err(|e| ProviderError::Auth(e.clone()))
    }

    fn http(&self) -> Result<&reqwest::Client, ProviderError> {
        self.http
            .as_ref()
            .ok_or_else(|| ProviderError::Unavailable("cannot set up an HTTP client".into()))
    }

    /// Our app's id and the environment's image builder version, asked once.
    async fn app(&self, modal: &Modal) -> Result<&App, ProviderError> {
        self.app
            .get_or_try_init(|| async {
                let req = pb::EnvironmentGetOrCreateRequest {
                    deployment_name: self.environment.clone(),
                    object_creation_type: pb::ObjectCreationType::Unspecified as i32,
                };
                let environment = modal
                    .call("EnvironmentGetOrCreate", req, |mut c, r| async move {
                        c.environment_get_or_create(r).await
                    })
                    .await?;
                let builder_version = environment
                    .metadata
                    .and_then(|m| m.settings)
                    .map(|s| s.image_builder_version)
                    .unwrap_or_default();
                let req = pb::AppGetOrCreateRequest {
                    app_name: self.app_name.clone(),
                    environment_name: self.environment.clone(),
                    object_creation_type: pb::ObjectCreationType::CreateIfMissing as i32,
                };
                let answer = modal
                    .call("AppGetOrCreate", req, |mut c, r| async move {
                        c.app_get_or_create(r).await
                    })
                    .await?;
                Ok(App {
                    id: answer.app_id,
                    builder_version,
                })
            })
            .await
    }

    /// Fails when no Modal token is configured, with the variables to set.
    pub(crate) fn check_credentials(&self) -> Result<(), ProviderError> {
        self.modal().map(|_| ())
    }

    /// Builds `definition` in our app, passing each line of Modal's build log to `on_log`;
    /// returns the image id.
    pub(crate) async fn build_image(
        &self,
        definition: Definition,
        on_log: &(dyn Fn(String) + Send + Sync),
    ) -> Result<String, BuildError> {
        let modal = self.modal()?;
        let app = self.app(modal).await?;
        image::build(modal, &app.id, &app.builder_version, definition, on_log).await
    }

    /// Publishes image `image_id` as `name`, in `MODAL_ENVIRONMENT` unless the name says;
    /// returns the tag Modal resolves (`[environment/]name:tag`).
    pub(crate) async fn publish_image(
        &self,
        image_id: &str,
        name: &ImageName,
    ) -> Result<String, ProviderError> {
        image::publish(self.modal()?, &self.environment, image_id, name).await
    }

    async fn terminate(&self, modal: &Modal, sandbox_id: &str) -> Result<(), ProviderError> {
        let req = pb::SandboxTerminateRequest {
            sandbox_id: sandbox_id.to_string(),
        };
        match modal
            .call("SandboxTerminate", req, |mut c, r| async move {
                c.sandbox_terminate(r).await
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(Code::NotFound) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Refuses what a Modal sandbox cannot do.
fn check_spec(spec: &SandboxSpec) -> Result<(&str, Duration), ProviderError> {
    let Some(image) = spec.image.as_deref() else {
        return Err(ProviderError::InvalidSpec(
            "the modal provider needs an image: pass --image with the name of an image built \
             by `tether image build --target modal`, or a registry tag of a linux/amd64 image \
             that has tether-agent on its PATH and no ENTRYPOINT (see docs/providers.md)"
                .into(),
        ));
    };
    if spec.cpus.is_some() || spec.memory_bytes.is_some() || spec.pids.is_some() {
        return Err(ProviderError::InvalidSpec(
            "the modal provider does not set resources yet; drop --cpus, --memory and --pids"
                .into(),
        ));
    }
    if spec.env.contains_key(AGENT_TOKEN_ENV) {
        return Err(ProviderError::InvalidSpec(format!(
            "{AGENT_TOKEN_ENV} is reserved for the relay"
        )));
    }
    let timeout = spec.ttl.unwrap_or(MAX_TIMEOUT);
    if timeout > MAX_TIMEOUT {
        return Err(ProviderError::InvalidSpec(format!(
            "Modal sandboxes live at most {} hours; ask for a shorter --ttl",
            MAX_TIMEOUT.as_secs() / 3600
        )));
    }
    Ok((image, timeout))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn edge_failure(id: &str, e: EdgeError) -> ProviderError {
    let hint = match e.status() {
        Some(401) => "; the agent refused its token",
        _ => "; the image must have tether-agent on its PATH and no ENTRYPOINT of its own",
    };
    ProviderError::Other(anyhow!(
        "cannot open the agent's WebSocket in Modal sandbox {id}: {e}{hint}"
    ))
}

#[async_trait]
impl Provider for ModalProvider {
    fn name(&self) -> &'static str {
        "modal"
    }

    async fn create(
        &self,
        id: &str,
        agent_token: &str,
        spec: &SandboxSpec,
    ) -> Result<Created, ProviderError> {
        let (image, timeout) = check_spec(spec)?;
        let modal = self.modal()?;
        let app = self.app(modal).await?;
        let app_id = app.id.clone();
        let image_id = image::resolve(
            modal,
            &app_id,
            &app.builder_version,
            &self.environment,
            image,
        )
        .await?;
        let mut env = spec.env.clone();
        env.insert(AGENT_TOKEN_ENV.into(), agent_token.into());
        let mut tags: BTreeMap<String, String> = spec.labels.clone();
        tags.insert(ID_TAG.into(), id.into());
        let network = match spec.network {
            // BLOCKED would forbid open ports; an empty allowlist blocks all outbound traffic.
            NetworkPolicy::None => NetworkAccessType::Allowlist,
            NetworkPolicy::Host => NetworkAccessType::Open,
        };
        let definition = pb::Sandbox {
            entrypoint_args: std::iter::once(AGENT_PROGRAM)
                .chain(AGENT_ARGS)
                .map(str::to_string)
                .collect(),
            image_id,
            timeout_secs: timeout.as_secs().max(1) as u32,
            open_ports: Some(pb::PortSpecs {
                ports: vec![pb::PortSpec {
                    port: u32::from(AGENT_PORT),
                    unencrypted: false,
                }],
            }),
            network_access: Some(pb::NetworkAccess {
                network_access_type: network as i32,
            }),
            name: Some(id.to_string()),
            idle_timeout_secs: spec.idle_timeout.map(|d| d.as_secs().max(1) as u32),
            environment_variables: Some(pb::StringMap {
                contents: env.into_iter().collect(),
            }),
        };
        let req = pb::SandboxCreateRequest {
            app_id: app_id.clone(),
            definition: Some(definition),
            environment_name: self.environment.clone(),
            tags: tags
                .into_iter()
                .map(|(tag_name, tag_value)| pb::SandboxTag {
                    tag_name,
                    tag_value,
                })
                .collect(),
        };
        let ends_ms = now_ms() + timeout.as_millis() as u64;
        let sandbox_id = match modal
            .call("SandboxCreate", req, |mut c, r| async move {
                c.sandbox_create(r).await
            })
            .await
        {
            Ok(answer) => answer.sandbox_id,
            // A retried create whose first try got through: the sandbox by that name is ours.
            Err(e) if e.code() == Some(Code::AlreadyExists) => {
                let req = pb::SandboxGetFromNameRequest {
                    sandbox_name: id.to_string(),
                    environment_name: self.environment.clone(),
                    app_name: self.app_name.clone(),
                };
                modal
                    .call("SandboxGetFromName", req, |mut c, r| async move {
                        c.sandbox_get_from_name(r).await
                    })
                    .await?
                    .sandbox_id
            }
            Err(e) => return Err(e.into()),
        };
        let ready = async {
            let url = tunnel::find(modal, &sandbox_id, self.tls_tunnels).await?;
            drop(
                tunnel::open_when_ready(self.http()?, &url, agent_token)
                    .await
                    .map_err(|e| edge_failure(&sandbox_id, e))?,
            );
            Ok::<_, ProviderError>(url)
        };
        let url = match ready.await {
            Ok(url) => url,
            Err(e) => {
                if let Err(t) = self.terminate(modal, &sandbox_id).await {
                    tracing::warn!(
                        "cannot terminate Modal sandbox {sandbox_id} after a failed create: {t}"
                    );
                }
                return Err(e);
            }
        };
        let meta = serde_json::to_value(Meta { url, ends_ms }).map_err(anyhow::Error::new)?;
        Ok(Created {
            provider_ref: sandbox_id,
            meta,
        })
    }

    async fn state(&self, sandbox: &SandboxHandle) -> Result<SandboxState, ProviderError> {
        let modal = self.modal()?;
        let req = pb::SandboxWaitRequest {
            sandbox_id: sandbox.provider_ref.clone(),
            timeout: 0.0,
        };
        match modal
            .call("SandboxWait", req, |mut c, r| async move {
                c.sandbox_wait(r).await
            })
            .await
        {
            Ok(answer) if answer.result.is_some() => Ok(SandboxState::Gone),
            Ok(_) => Ok(SandboxState::Running),
            Err(e) if e.code() == Some(Code::NotFound) => Ok(SandboxState::Gone),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        self.terminate(self.modal()?, &sandbox.provider_ref).await
    }

    async fn renew(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), ProviderError> {
        let meta: Meta = serde_json::from_value(sandbox.meta.clone())
            .map_err(|e| anyhow!("unreadable record: {e}"))?;
        if now_ms() + ttl.as_millis() as u64 <= meta.ends_ms {
            return Ok(());
        }
        Err(ProviderError::InvalidSpec(format!(
            "Modal fixes a sandbox's lifetime when it is created, and sandbox {} ends sooner than \
             that; create a new sandbox with a longer --ttl",
            sandbox.id
        )))
    }

    async fn connect(&self, sandbox: &SandboxHandle) -> Result<AgentSocket, ProviderError> {
        let meta: Meta = serde_json::from_value(sandbox.meta.clone()).map_err(|e| {
            anyhow!(
                "the relay's record of Modal sandbox {} is unreadable: {e}",
                sandbox.provider_ref
            )
        })?;
        match websocket::open(
            self.http()?,
            &meta.url,
            HeaderMap::new(),
            &sandbox.agent_token,
        )
        .await
        {
            Ok(socket) => Ok(socket),
            Err(e) => match self.state(sandbox).await? {
                SandboxState::Gone => Err(ProviderError::Gone(sandbox.id.clone())),
                _ => Err(edge_failure(&sandbox.provider_ref, e)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_token_names_the_variables() {
        let provider = ModalProvider::new(&Settings::from_pairs([("MODAL_TOKEN_ID", "ak-1")]));
        let err = provider.modal().unwrap_err();
        assert!(err.to_string().contains("MODAL_TOKEN_SECRET"), "{err}");
    }

    #[test]
    fn lifetimes_are_bounded_by_modal() {
        let spec = SandboxSpec {
            image: Some("alpine".into()),
            ..Default::default()
        };
        assert_eq!(check_spec(&spec).unwrap().1, MAX_TIMEOUT);
        let long = SandboxSpec {
            ttl: Some(MAX_TIMEOUT * 2),
            ..spec
        };
        assert!(check_spec(&long).is_err());
    }
}

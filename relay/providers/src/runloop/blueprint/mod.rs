//! `tether image build --target runloop`: a Runloop blueprint built by Runloop's builder
//! from a Dockerfile, with the static agent at [`AGENT_PATH`], on the `PATH` where the
//! relay's `runloop` provider expects it (it passes the agent as the devbox's entrypoint, so
//! the image needs no ENTRYPOINT of its own).
//!
//! The flow is the SDK's: the agent packed as a build context ([`context`]) and uploaded as an
//! Object (`POST /v1/objects`, `PUT` to its upload URL, `POST .../complete`), then `POST
//! /v1/blueprints` with a Dockerfile `FROM --from`, `COPY`ing the agent and applying
//! `--env`, `--workdir` and `--user`, and the object as its `build_context`; then its status is
//! polled until `build_complete` or `failed`, each new line of its build log streamed. The
//! object is deleted once the build has ended (it also expires by itself after a day).
//! Everything that can be checked here (the name, the agent, the key, the base's existence) is
//! checked before anything is uploaded.
//!
//! `--base`, `--push` and `--start` do not apply: Runloop pulls the base itself, and the
//! provider starts the agent as the devbox's entrypoint.

mod api;
mod context;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::cloud::http::ControlPlane;
use crate::cloud::settings::{Settings, CONFIG_FILE};
use crate::image::{Event, RemoteBuild, RemoteBuilt, TargetError};
use crate::runloop::{control_plane, KEY_VAR};
use tether_oci::constants::AGENT_PATH;
use tether_oci::reference::Reference;

/// The provider's name, as `tether create --provider` takes it.
const PROVIDER: &str = "runloop";
/// The pause between two status polls (Runloop's SDK polls a build every second).
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long a build may take before we stop waiting (it goes on at Runloop).
const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long Runloop keeps the build context's object if we cannot delete it: a day, in ms.
const CONTEXT_TTL_MS: u64 = 24 * 3600 * 1000;
/// The most of a blueprint name.
const MAX_NAME: usize = 128;
/// The longest build log line echoed.
const MAX_LOG_LINE: usize = 4096;

/// Builds `req` as a Runloop blueprint, reporting progress to `events`.
pub(crate) async fn build(
    req: &RemoteBuild,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<RemoteBuilt, TargetError> {
    check_name(&req.name)?;
    if req.base.is_some() || req.push.is_some() {
        return Err(TargetError::Usage(
            "--target runloop builds from a registry image that Runloop pulls: push your base \
             with `tether image push` and pass it as --from REF (--base and --push are not used)"
                .into(),
        ));
    }
    let Some(from) = req.from.as_deref().map(str::trim) else {
        return Err(TargetError::Usage(
            "--target runloop needs a base: --from REF, a registry image Runloop can pull \
             (e.g. ubuntu:24.04); the agent is added on top of it"
                .into(),
        ));
    };
    Reference::parse(from)?;
    let dockerfile = dockerfile(from, req)?;
    tether_oci::agent::check_static(&req.agent)?;
    let api = connect()?;
    events(Event::Step(format!("checking the base {from}")));
    crate::image::check_base("Runloop", from, req.insecure, events).await?;

    events(Event::Step("packing the agent".into()));
    let (agent, epoch) = (req.agent.clone(), req.epoch);
    let packed = tokio::task::spawn_blocking(move || context::pack(&agent, epoch))
        .await
        .map_err(|e| TargetError::Usage(format!("packing the agent failed: {e}")))??;

    events(Event::Step("uploading the agent".into()));
    let object = api::create_object(
        &api,
        &api::NewObject {
            name: "tether-agent-context.tar.gz",
            content_type: "tgz",
            ttl_ms: CONTEXT_TTL_MS,
        },
    )
    .await?;
    let built = async {
        api::upload(api.http(), &object, packed).await?;
        api::complete_object(&api, &object.id).await?;
        events(Event::Step(format!(
            "building blueprint {} from {from}",
            req.name
        )));
        let version = env!("CARGO_PKG_VERSION");
        let blueprint = api::create(
            &api,
            &api::NewBlueprint {
                name: &req.name,
                dockerfile: &dockerfile,
                build_context: api::BuildContext {
                    kind: "object",
                    object_id: &object.id,
                },
                metadata: BTreeMap::from([("tether.agent", version)]),
            },
        )
        .await?;
        wait(&api, &req.name, &blueprint.id, events).await?;
        Ok::<_, TargetError>(blueprint.id)
    }
    .await;
    if let Err(e) = api::delete_object(&api, &object.id).await {
        tracing::warn!(
            "cannot delete the build context's object {}: {e}",
            object.id
        );
    }
    Ok(RemoteBuilt {
        provider: PROVIDER,
        name: req.name.clone(),
        id: built?,
        build_id: None,
    })
}

/// The blueprint's Dockerfile: the base, the agent, the overrides.
fn dockerfile(from: &str, req: &RemoteBuild) -> Result<String, TargetError> {
    let line_safe = |what: &str, value: &str| {
        if value.contains(['\n', '\r']) {
            Err(TargetError::Usage(format!(
                "{what} holds a line break, which a Dockerfile cannot carry: {value:?}"
            )))
        } else {
            Ok(())
        }
    };
    line_safe("--from", from)?;
    let mut file = format!("FROM {from}\nCOPY {} {AGENT_PATH}\n", context::AGENT_SOURCE);
    let o = &req.overrides;
    for (key, value) in &o.env {
        line_safe("--env", value)?;
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(TargetError::Usage(format!(
                "--env {key}: a variable's name is letters, digits and `_`"
            )));
        }
        // A JSON string is a double-quoted Dockerfile value: `"` and `\` escaped.
        let quoted = serde_json::to_string(value).map_err(|e| TargetError::Usage(e.to_string()))?;
        file.push_str(&format!("ENV {key}={quoted}\n"));
    }
    if let Some(dir) = &o.workdir {
        line_safe("--workdir", dir)?;
        file.push_str(&format!("WORKDIR {dir}\n"));
    }
    if let Some(user) = &o.user {
        line_safe("--user", user)?;
        file.push_str(&format!("USER {user}\n"));
    }
    Ok(file)
}

/// Blueprint names: what `--image` takes back, so nothing a shell or URL would mangle.
fn check_name(name: &str) -> Result<(), TargetError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with("bpt_")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-:/".contains(c));
    if ok {
        return Ok(());
    }
    Err(TargetError::Usage(format!(
        "{name:?} is not a usable blueprint name: use up to {MAX_NAME} letters, digits, dots, \
         dashes, underscores, colons and slashes, not starting with `bpt_` (Runloop's ids)"
    )))
}

/// Runloop's API, configured as the relay's Runloop provider is.
fn connect() -> Result<ControlPlane, TargetError> {
    let data_dir = tether_client::local::data_dir();
    let settings = Settings::load(&data_dir);
    if settings.get(KEY_VAR).is_none() {
        return Err(TargetError::Settings(format!(
            "--target runloop needs a Runloop API key: set {KEY_VAR} (or `api_key` under \
             [runloop] in {}); RUNLOOP_BASE_URL picks another Runloop",
            data_dir.join(CONFIG_FILE).display()
        )));
    }
    control_plane(&settings).map_err(|e| TargetError::Settings(e.to_string()))
}

/// Polls the blueprint until its build ends, streaming each new log line.
async fn wait(
    api: &ControlPlane,
    name: &str,
    id: &str,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<(), TargetError> {
    let deadline = Instant::now() + BUILD_TIMEOUT;
    let mut shown = 0;
    loop {
        let blueprint = api::get(api, id).await?;
        let logs = api::logs(api, id).await?;
        for line in logs.iter().skip(shown) {
            let message: String = line.message.chars().take(MAX_LOG_LINE).collect();
            let level = if line.level.is_empty() {
                "info"
            } else {
                &line.level
            };
            events(Event::Log(format!("[{level}] {}", message.trim_end())));
        }
        shown = shown.max(logs.len());
        match blueprint.status.as_str() {
            "build_complete" => return Ok(()),
            "failed" => {
                return Err(TargetError::BuildFailed {
                    provider: PROVIDER,
                    name: name.to_string(),
                    reason: blueprint
                        .failure_reason
                        .unwrap_or_else(|| "Runloop gave no reason".into()),
                })
            }
            _ if Instant::now() > deadline => {
                return Err(TargetError::Timeout {
                    provider: PROVIDER,
                    name: name.to_string(),
                    waited: BUILD_TIMEOUT,
                })
            }
            _ => tokio::time::sleep(POLL_INTERVAL).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_oci::config::Overrides;

    fn request(from: Option<&str>) -> RemoteBuild {
        RemoteBuild {
            name: "tether-sandbox".into(),
            from: from.map(str::to_string),
            base: None,
            push: None,
            insecure: false,
            agent: "tether-agent".into(),
            overrides: Overrides::default(),
            epoch: 0,
        }
    }

    #[test]
    fn the_dockerfile_adds_the_agent_and_the_overrides() {
        let mut req = request(Some("ubuntu:24.04"));
        req.overrides
            .env
            .push(("GREETING".into(), "say \"hi\"".into()));
        req.overrides.workdir = Some("/work".into());
        req.overrides.user = Some("1000".into());
        let file = dockerfile("ubuntu:24.04", &req).unwrap();
        assert_eq!(
            file,
            "FROM ubuntu:24.04\nCOPY tether-agent /usr/local/bin/tether-agent\n\
             ENV GREETING=\"say \\\"hi\\\"\"\nWORKDIR /work\nUSER 1000\n"
        );
        req.overrides.env.push(("BAD".into(), "two\nlines".into()));
        assert!(dockerfile("ubuntu:24.04", &req).is_err());
    }

    #[test]
    fn names_and_flags_are_checked_before_anything_is_sent() {
        assert!(check_name("tether-sandbox-1").is_ok());
        assert!(check_name("team/sandbox:1.2").is_ok());
        for bad in ["", "has space", "bpt_123", "a\"b"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}

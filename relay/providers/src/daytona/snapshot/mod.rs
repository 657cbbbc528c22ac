//! `tether image build --target daytona`: a Daytona snapshot (`POST /snapshots`) of a
//! registry image that has the agent, polled until `active`.
//!
//! - The image: `--from REF`, one that already has the agent (built by `tether image build`
//!   and pushed by `tether image push`; its config is checked for the agent's label,
//!   [`check`]), or one built here and pushed first ([`local`]): `--base PATH --push
//!   REGISTRY/NAME:TAG`, or `--from REF --push REGISTRY/NAME:TAG` (REF pulled as the base).
//!   Daytona refuses images tagged `latest` (and an untagged reference means `latest`): that
//!   is checked here, before anything is built or sent.
//! - The snapshot's `entrypoint` is the agent with every argument, as the relay's Daytona
//!   provider expects: Daytona replaces the image's ENTRYPOINT with its daemon, which starts
//!   the snapshot's entrypoint and drops the image's CMD, so the snapshot names it explicitly.
//! - Progress: Daytona keeps build logs only for snapshots it builds from a Dockerfile; a
//!   pulled snapshot's progress is its state (`pending`, `pulling`, `active`), reported as log
//!   lines as Daytona's SDK reports them. A snapshot that ends in `error` or `build_failed`
//!   fails the build with Daytona's `errorReason`, and is deleted so the name can be reused.
//! - Credentials: `DAYTONA_API_KEY` and `DAYTONA_API_URL`, read as the relay's provider reads
//!   them (environment, else the relay's `config.toml`).

mod api;
mod check;
mod local;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::cloud::http::ControlPlane;
use crate::cloud::settings::Settings;
use crate::daytona::{control_plane, KEY_VAR};
use crate::image::{Event, RemoteBuild, RemoteBuilt, TargetError};
use tether_oci::config::StartMode;
use tether_oci::constants::{AGENT_LABEL, ENTRYPOINT};
use tether_oci::reference::{Reference, Target};

const PROVIDER: &str = "daytona";
/// How often the snapshot's state is read (Daytona's SDK reads it every second).
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long a snapshot may take to become `active` (Daytona gives a pull 15 minutes).
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// The tag Daytona refuses: it moves, and a snapshot must pin its image.
const REFUSED_TAG: &str = "latest";

/// Where the snapshot's image comes from.
enum Source<'a> {
    /// A registry image that already has the agent, as given and parsed.
    Registry(&'a str, Reference),
    /// A base on disk, built here and pushed to the reference.
    Local { base: &'a Path, push: &'a Reference },
    /// A registry image without the agent: pulled here as the base, built, and pushed.
    Base {
        from: Reference,
        push: &'a Reference,
    },
}

/// Builds `req` as a Daytona snapshot.
pub(crate) async fn build(
    req: &RemoteBuild,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<RemoteBuilt, TargetError> {
    check_name(&req.name)?;
    let source = source(req)?;
    let api = connect()?;
    let image_name = match source {
        Source::Registry(from, parsed) => {
            check_agent(from, &parsed, req.insecure, events).await?;
            from.to_string()
        }
        Source::Local { base, push } => local::build_and_push(req, base, push, events).await?,
        Source::Base { from, push } => local::pull_build_and_push(req, &from, push, events).await?,
    };
    events(Event::Step(format!(
        "creating the Daytona snapshot {} from {image_name}",
        req.name
    )));
    let body = api::CreateSnapshot {
        name: &req.name,
        image_name: &image_name,
        entrypoint: &ENTRYPOINT,
    };
    let created = api::create(&api, &body).await?;
    let id = created.id.clone();
    wait_active(&api, &req.name, created, events).await?;
    Ok(RemoteBuilt {
        provider: PROVIDER,
        name: req.name.clone(),
        id,
        build_id: None,
    })
}

/// Refuses a `--from` image that its registry shows to lack the agent; an image that cannot
/// be read here is let through (Daytona may have credentials this machine lacks).
async fn check_agent(
    from: &str,
    parsed: &Reference,
    insecure: bool,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<(), TargetError> {
    events(Event::Step(format!("checking that {from} has the agent")));
    match check::agent(parsed, insecure).await {
        check::Agent::Present => Ok(()),
        check::Agent::Missing => Err(TargetError::Usage(format!(
            "{from} has no tether-agent (its config lacks the `{AGENT_LABEL}` label that \
             `tether image build` sets): add --push REGISTRY/NAME:TAG to build an image with \
             the agent on top of it here and push it there"
        ))),
        check::Agent::Unknown(why) => {
            tracing::warn!(
                "cannot check that {from} has the agent ({why}); Daytona will pull it with \
                 its own credentials"
            );
            Ok(())
        }
    }
}

/// Daytona's rule for snapshot names: `/`-separated parts of letters, digits, `_ . - :`.
fn check_name(name: &str) -> Result<(), TargetError> {
    let ok = !name.is_empty()
        && name.split('/').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-:".contains(c))
        });
    if ok {
        return Ok(());
    }
    Err(TargetError::Usage(format!(
        "{name:?} is not a valid Daytona snapshot name: use letters, digits, dots, dashes, \
         underscores and colons (e.g. tether-sandbox-1)"
    )))
}

/// The image source the flags describe, checked.
fn source(req: &RemoteBuild) -> Result<Source<'_>, TargetError> {
    let usage = |m: &str| Err(TargetError::Usage(m.to_string()));
    match (&req.from, &req.base, &req.push) {
        (Some(_), Some(_), _) => usage(
            "--from and --base are exclusive: --from names a registry image that already has \
             the agent; --base (with --push) builds one here",
        ),
        (Some(from), None, Some(push)) => {
            check_pinned(push, &push.to_string(), "--push")?;
            Ok(Source::Base {
                from: Reference::parse(from.trim())?,
                push,
            })
        }
        (Some(from), None, None) => {
            let o = &req.overrides;
            if !o.env.is_empty()
                || o.workdir.is_some()
                || o.user.is_some()
                || o.start != StartMode::Entrypoint
            {
                return usage(
                    "--env, --workdir, --user and --start change an image built here, and \
                     Daytona snapshots have no such settings: build with --base PATH --push \
                     REGISTRY/NAME:TAG instead of --from, or bake them into the --from image",
                );
            }
            let from = from.trim();
            let parsed = Reference::parse(from)?;
            check_pinned(&parsed, from, "--from")?;
            Ok(Source::Registry(from, parsed))
        }
        (None, Some(base), Some(push)) => {
            check_pinned(push, &push.to_string(), "--push")?;
            Ok(Source::Local { base, push })
        }
        (None, Some(_), None) => usage(
            "--target daytona needs the image in a registry Daytona can pull from: add --push \
             REGISTRY/NAME:TAG (e.g. ghcr.io/you/tether-sandbox:1) to build here and push there",
        ),
        (None, None, _) => usage(
            "--target daytona needs an image: --from REF (a registry image that has the agent, \
             e.g. built by `tether image build` and pushed by `tether image push`), or --base \
             PATH --push REGISTRY/NAME:TAG to build one here and push it",
        ),
    }
}

/// Refuses a reference Daytona would refuse: unparsable, or tagged (or defaulting to) `latest`.
fn check_pinned(parsed: &Reference, reference: &str, flag: &str) -> Result<(), TargetError> {
    match &parsed.target {
        Target::Tag(tag) if tag == REFUSED_TAG => Err(TargetError::Usage(format!(
            "{flag} {reference}: Daytona refuses images tagged `{REFUSED_TAG}` (a reference \
             without a tag means `{REFUSED_TAG}`): use a fixed tag such as \
             {}/{}:v1, or a digest (@sha256:...)",
            parsed.registry, parsed.repository
        ))),
        _ => Ok(()),
    }
}

/// Daytona's API, configured as the relay's Daytona provider is.
fn connect() -> Result<ControlPlane, TargetError> {
    let settings = Settings::load(&tether_client::local::data_dir());
    if settings.get(KEY_VAR).is_none() {
        return Err(TargetError::Settings(format!(
            "--target daytona needs a Daytona API key: set {KEY_VAR} (in the environment, or \
             `api_key` under [daytona] in {}/config.toml); DAYTONA_API_URL picks another \
             Daytona",
            tether_client::local::data_dir().display()
        )));
    }
    control_plane(&settings).map_err(|e| TargetError::Settings(e.to_string()))
}

/// Polls the snapshot until `active`, reporting each new state as a log line.
async fn wait_active(
    api: &ControlPlane,
    name: &str,
    mut snapshot: api::Snapshot,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<(), TargetError> {
    let deadline = Instant::now() + ACTIVE_TIMEOUT;
    let mut reported = String::new();
    loop {
        let state = snapshot.state.as_str();
        let terminal = matches!(state, "active" | "error" | "build_failed");
        if state != reported && !terminal {
            events(Event::Log(format!("Creating snapshot {name} ({state})")));
            reported = state.to_string();
        }
        match state {
            "active" => {
                events(Event::Log(format!("Created snapshot {name} (active)")));
                return Ok(());
            }
            "error" | "build_failed" | "removing" | "inactive" => {
                let reason = snapshot
                    .error_reason
                    .clone()
                    .unwrap_or_else(|| format!("the snapshot is {state}"));
                let cleanup = match api::delete(api, &snapshot.id).await {
                    Ok(()) => "; the failed snapshot was deleted, so the name is free again",
                    Err(e) => {
                        tracing::warn!("cannot delete the failed snapshot {name}: {e}");
                        ""
                    }
                };
                return Err(TargetError::BuildFailed {
                    provider: PROVIDER,
                    name: name.to_string(),
                    reason: format!("{reason}{cleanup}"),
                });
            }
            _ if Instant::now() > deadline => {
                return Err(TargetError::Timeout {
                    provider: PROVIDER,
                    name: name.to_string(),
                    waited: ACTIVE_TIMEOUT,
                })
            }
            _ => {}
        }
        tokio::time::sleep(POLL_INTERVAL).await;
        snapshot = api::get(api, &snapshot.id).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_oci::config::Overrides;

    fn request(from: Option<&str>, base: Option<&str>, push: Option<&str>) -> RemoteBuild {
        RemoteBuild {
            name: "tether-sandbox-1".into(),
            from: from.map(str::to_string),
            base: base.map(Into::into),
            push: push.map(|p| Reference::parse(p).unwrap()),
            insecure: false,
            agent: "tether-agent".into(),
            overrides: Overrides::default(),
            epoch: 0,
        }
    }

    fn usage_of(req: &RemoteBuild) -> String {
        match source(req) {
            Err(TargetError::Usage(m)) => m,
            Err(e) => panic!("not a usage error: {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn latest_and_untagged_images_are_refused_before_anything_runs() {
        let m = usage_of(&request(Some("ghcr.io/acme/sandbox:latest"), None, None));
        assert!(
            m.contains("latest") && m.contains("ghcr.io/acme/sandbox:v1"),
            "{m}"
        );
        let m = usage_of(&request(Some("ghcr.io/acme/sandbox"), None, None));
        assert!(m.contains("without a tag"), "{m}");
        let m = usage_of(&request(
            None,
            Some("rootfs"),
            Some("127.0.0.1:5000/s:latest"),
        ));
        assert!(m.contains("--push"), "{m}");
        assert!(source(&request(Some("ghcr.io/acme/sandbox:1"), None, None)).is_ok());
        let digest = format!("ghcr.io/acme/sandbox@sha256:{}", "a".repeat(64));
        assert!(source(&request(Some(&digest), None, None)).is_ok());
    }

    #[test]
    fn the_flags_must_name_exactly_one_image() {
        assert!(usage_of(&request(None, None, None)).contains("--from REF"));
        assert!(usage_of(&request(None, Some("rootfs"), None)).contains("--push"));
        assert!(usage_of(&request(Some("a/b:1"), Some("rootfs"), None)).contains("exclusive"));
        let mut req = request(Some("a/b:1"), None, None);
        req.overrides.env.push(("A".into(), "1".into()));
        assert!(usage_of(&req).contains("--env"));
        assert!(source(&request(None, Some("rootfs"), Some("127.0.0.1:5000/s:v1"))).is_ok());
        // A registry image as the base: pulled, built on, pushed.
        assert!(source(&request(
            Some("python:3.12"),
            None,
            Some("127.0.0.1:5000/s:v1")
        ))
        .is_ok());
    }

    #[test]
    fn snapshot_names_follow_daytona() {
        assert!(check_name("tether-sandbox-1").is_ok());
        assert!(check_name("team/sandbox:1.2").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("has space").is_err());
        assert!(check_name("a//b").is_err());
    }
}

//! `tether image build --target e2b`: an E2B template built by E2B's own builder (the v2
//! template system), with the static agent baked at [`AGENT_PATH`], where the relay's `e2b`
//! provider expects it: after each create the provider starts `tether-agent serve` through
//! envd, so the template needs the agent on its `PATH` and no start command.
//!
//! The flow is the SDK's `Template.build`: request a build (`POST /v3/templates`), upload the
//! agent as a COPY step's files unless E2B already has them ([`files`]), start the build from
//! `--from` with the COPY, ENV, WORKDIR and USER steps, then poll its status, streaming each
//! new log entry, until it is ready or failed. Everything that can be checked here (the name,
//! the agent, the key, the base's existence) is checked before anything is uploaded.
//!
//! `--env` is an ENV step (the build and its ready command see it), and, since E2B keeps a
//! template's ENV for its build only, also a file COPY'd to the provider's image env file,
//! which the relay reads when it starts the agent in a sandbox of the template: the variables
//! then reach every process there, as an image's ENV does on the other providers.
//!
//! `--start` and `--insecure` do not apply: E2B ignores an image's ENTRYPOINT and CMD, and
//! pulls the base itself.

mod api;
mod files;

use std::time::{Duration, Instant};

use crate::cloud::constants::AGENT_TOKEN_ENV;
use crate::cloud::settings::{Settings, CONFIG_FILE};
use crate::e2b::envd::IMAGE_ENV_FILE;
use crate::image::{Event, RemoteBuild, RemoteBuilt, TargetError};
use tether_oci::constants::AGENT_PATH;
use tether_oci::reference::Reference;

/// The provider's name, as `tether create --provider` takes it.
const PROVIDER: &str = "e2b";
/// The setting that holds the API key (as the relay's `e2b` provider reads it).
const KEY_VAR: &str = "E2B_API_KEY";
/// The base without `--from`: E2B's own, what the SDK's `Template()` starts from.
const DEFAULT_BASE: &str = "e2bdev/base";
/// CPU cores and memory of the template's sandboxes: the defaults of `e2b template create`.
const CPU_COUNT: u32 = 2;
const MEMORY_MB: u32 = 1024;
/// Checked at the end of the build: the agent runs in the template (as images/e2b does).
const READY_CMD: &str = "/usr/local/bin/tether-agent version";
/// The pause between two status polls (the SDK's `logs_refresh_frequency`).
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How long a build may take before we stop waiting (it goes on at E2B).
const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Builds `req` as an E2B template, reporting progress to `events`.
pub(crate) async fn build(
    req: &RemoteBuild,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<RemoteBuilt, TargetError> {
    check_name(&req.name)?;
    if req.base.is_some() || req.push.is_some() {
        return Err(TargetError::Usage(
            "--target e2b builds from a registry image that E2B pulls: push your base with \
             `tether image push` and pass it as --from REF (--base and --push are not used)"
                .into(),
        ));
    }
    let from = match &req.from {
        Some(from) => {
            Reference::parse(from)?;
            from.clone()
        }
        None => DEFAULT_BASE.to_string(),
    };
    tether_oci::agent::check_static(&req.agent)?;
    let data_dir = tether_client::local::data_dir();
    let settings = Settings::load(&data_dir);
    if settings.get(KEY_VAR).is_none() {
        return Err(TargetError::Settings(format!(
            "--target e2b needs an E2B API key: set {KEY_VAR} (or `api_key` under [e2b] in {})",
            data_dir.join(CONFIG_FILE).display()
        )));
    }
    let api =
        crate::e2b::control_plane(&settings).map_err(|e| TargetError::Settings(e.to_string()))?;
    if req.from.is_some() {
        events(Event::Step(format!("checking the base {from}")));
        crate::image::check_base("E2B", &from, false, events).await?;
    }

    events(Event::Step("packing the agent".into()));
    let (agent, epoch) = (req.agent.clone(), req.epoch);
    let packed = tokio::task::spawn_blocking(move || files::pack(&agent, AGENT_PATH, epoch))
        .await
        .map_err(|e| TargetError::Usage(format!("packing the agent failed: {e}")))??;
    let env_file = image_env(&req.overrides.env, epoch)?;

    events(Event::Step(format!("requesting template {}", req.name)));
    let requested = api::request_build(
        &api,
        &api::NewTemplate {
            name: &req.name,
            cpu_count: CPU_COUNT,
            memory_mb: MEMORY_MB,
        },
    )
    .await?;
    let template = &requested.template_id;
    upload(&api, template, &packed, "the agent", events).await?;
    if let Some(env_file) = &env_file {
        upload(&api, template, env_file, "the image env", events).await?;
    }

    events(Event::Step(format!("starting the build from {from}")));
    let start = api::BuildStart {
        from_image: Some(from),
        force: false,
        steps: steps(
            req,
            &packed.hash,
            env_file.as_ref().map(|f| f.hash.as_str()),
        ),
        ready_cmd: Some(READY_CMD.into()),
    };
    api::start_build(&api, template, &requested.build_id, &start).await?;
    wait(&api, req, &requested, events).await?;
    Ok(RemoteBuilt {
        provider: PROVIDER,
        name: req.name.clone(),
        id: requested.template_id,
        build_id: Some(requested.build_id),
    })
}

/// Uploads `packed` (`what`, in messages) for a COPY step unless E2B has it already.
async fn upload(
    api: &crate::cloud::http::ControlPlane,
    template: &str,
    packed: &files::Packed,
    what: &str,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<(), TargetError> {
    let link = api::file_upload_link(api, template, &packed.hash).await?;
    if link.present {
        return Ok(());
    }
    let Some(url) = link.url else {
        return Err(TargetError::Api {
            provider: PROVIDER,
            message: format!("E2B gave no upload link for {what}'s files"),
        });
    };
    events(Event::Step(format!("uploading {what}")));
    api::upload(api.http(), &url, &link.headers, packed.tar_gz.clone()).await
}

/// `--env` as the image env file (a JSON object), packed for its COPY step; `None` without
/// `--env`.
fn image_env(env: &[(String, String)], epoch: u64) -> Result<Option<files::Packed>, TargetError> {
    if env.is_empty() {
        return Ok(None);
    }
    if let Some((key, _)) = env
        .iter()
        .find(|(k, _)| k.is_empty() || k.contains(['=', '\0']) || k == AGENT_TOKEN_ENV)
    {
        return Err(TargetError::Usage(format!(
            "--env {key:?}: a variable name cannot be empty, hold '=' or NUL, or be \
             {AGENT_TOKEN_ENV}"
        )));
    }
    let map: std::collections::BTreeMap<&str, &str> =
        env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let json = serde_json::to_vec(&map).expect("strings serialize");
    files::pack_bytes(
        files::ENV_SOURCE,
        files::ENV_MODE,
        &json,
        IMAGE_ENV_FILE,
        epoch,
    )
    .map(Some)
}

/// The steps on top of the base: the agent, then the environment (an ENV step, and the image
/// env file when `env_hash` says it was uploaded), working directory and user, the last of
/// which become the sandboxes' defaults.
fn steps(req: &RemoteBuild, files_hash: &str, env_hash: Option<&str>) -> Vec<api::Step> {
    let step = |kind: &'static str, args: Vec<String>| api::Step {
        kind,
        args,
        files_hash: None,
        force: false,
    };
    let mut steps = vec![api::Step {
        files_hash: Some(files_hash.to_string()),
        ..step(
            "COPY",
            vec![
                files::AGENT_SOURCE.into(),
                AGENT_PATH.into(),
                "root".into(),
                format!("{:04o}", files::AGENT_MODE),
            ],
        )
    }];
    let overrides = &req.overrides;
    if !overrides.env.is_empty() {
        let args = overrides
            .env
            .iter()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .collect();
        steps.push(step("ENV", args));
    }
    if let Some(hash) = env_hash {
        steps.push(api::Step {
            files_hash: Some(hash.to_string()),
            ..step(
                "COPY",
                vec![
                    files::ENV_SOURCE.into(),
                    IMAGE_ENV_FILE.into(),
                    "root".into(),
                    format!("{:04o}", files::ENV_MODE),
                ],
            )
        });
    }
    if let Some(dir) = &overrides.workdir {
        steps.push(step("WORKDIR", vec![dir.clone()]));
    }
    if let Some(user) = &overrides.user {
        steps.push(step("USER", vec![user.clone()]));
    }
    steps
}

/// Polls the build until it is ready, streaming its log; fails with E2B's reason.
async fn wait(
    api: &crate::cloud::http::ControlPlane,
    req: &RemoteBuild,
    requested: &api::Requested,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<(), TargetError> {
    events(Event::Step(format!("building {}", req.name)));
    let started = Instant::now();
    let mut offset = 0;
    loop {
        let info =
            api::build_status(api, &requested.template_id, &requested.build_id, offset).await?;
        let page_full = info.log_entries.len() >= api::LOGS_LIMIT;
        offset += info.log_entries.len();
        for entry in info.log_entries {
            events(Event::Log(match entry.level.as_str() {
                "warn" | "error" => format!("{}: {}", entry.level, entry.message),
                _ => entry.message,
            }));
        }
        // A full page may not be the end of the log: read on before reporting the outcome.
        if page_full {
            continue;
        }
        match info.status {
            api::BuildStatus::Ready => return Ok(()),
            api::BuildStatus::Error => {
                let reason = match info.reason {
                    Some(api::Reason {
                        message,
                        step: Some(step),
                    }) => format!("{message} (step {step})"),
                    Some(reason) => reason.message,
                    None => "E2B gave no reason".into(),
                };
                return Err(TargetError::BuildFailed {
                    provider: PROVIDER,
                    name: req.name.clone(),
                    reason,
                });
            }
            api::BuildStatus::Building | api::BuildStatus::Waiting => {}
        }
        if started.elapsed() >= BUILD_TIMEOUT {
            return Err(TargetError::Timeout {
                provider: PROVIDER,
                name: req.name.clone(),
                waited: BUILD_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Refuses names E2B would refuse: `[namespace/]alias[:tag]`, the alias (and namespace)
/// `[a-z0-9-_]+` and the tag `[a-z0-9-_.]+` (E2B's `id.ParseName`). E2B lower-cases names; we
/// refuse capitals instead, so the name printed is the name `tether create` finds.
fn check_name(name: &str) -> Result<(), TargetError> {
    let word = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && s.bytes().all(|b| {
                b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b"-_".contains(&b)
                    || extra.contains(&b)
            })
    };
    let (identifier, tag) = match name.split_once(':') {
        Some((id, tag)) => (id, Some(tag)),
        None => (name, None),
    };
    let (namespace, alias) = match identifier.split_once('/') {
        Some((ns, alias)) => (Some(ns), alias),
        None => (None, identifier),
    };
    let valid = word(alias, b"")
        && namespace.is_none_or(|ns| word(ns, b""))
        && tag.is_none_or(|t| word(t, b"."));
    if valid {
        return Ok(());
    }
    Err(TargetError::Usage(format!(
        "{name:?} is not a valid E2B template name: write NAME or NAME:TAG, NAME of lowercase \
         letters, digits, '-' and '_' (and TAG also '.'), e.g. tether-sandbox:v1"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_oci::config::Overrides;

    #[test]
    fn names_follow_e2bs_rules() {
        for good in ["tether", "tether-sandbox:v1.2", "team_1/my-template:latest"] {
            check_name(good).unwrap();
        }
        for bad in ["", "Tether", "a b", "x:", "/x", "x:v/1", "tmpl!"] {
            let err = check_name(bad).unwrap_err().to_string();
            assert!(
                err.contains("not a valid E2B template name"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn steps_are_encoded_as_the_sdk_does() {
        let req = RemoteBuild {
            name: "t".into(),
            from: None,
            base: None,
            push: None,
            insecure: false,
            agent: "agent".into(),
            overrides: Overrides {
                env: vec![("A".into(), "1".into()), ("B".into(), "2".into())],
                workdir: Some("/work".into()),
                user: Some("user".into()),
                ..Default::default()
            },
            epoch: 0,
        };
        let steps = serde_json::to_value(steps(&req, "abc", Some("def"))).unwrap();
        assert_eq!(
            steps,
            serde_json::json!([
                {"type": "COPY", "args": ["tether-agent", AGENT_PATH, "root", "0755"],
                 "filesHash": "abc", "force": false},
                {"type": "ENV", "args": ["A", "1", "B", "2"], "force": false},
                {"type": "COPY",
                 "args": ["tether-image-env.json", "/etc/tether/image-env.json", "root", "0644"],
                 "filesHash": "def", "force": false},
                {"type": "WORKDIR", "args": ["/work"], "force": false},
                {"type": "USER", "args": ["user"], "force": false},
            ])
        );
    }

    #[test]
    fn the_image_env_file_is_json_and_refuses_what_env_cannot_hold() {
        assert!(image_env(&[], 0).unwrap().is_none());
        let env = vec![("A".to_string(), "x y \"z\"".to_string())];
        let packed = image_env(&env, 0).unwrap().unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&packed.tar_gz[..]));
        let mut entry = archive.entries().unwrap().next().unwrap().unwrap();
        let mut body = String::new();
        std::io::Read::read_to_string(&mut entry, &mut body).unwrap();
        assert_eq!(body, r#"{"A":"x y \"z\""}"#);
        for bad in ["", "A=B", "TETHER_AGENT_TOKEN"] {
            assert!(
                image_env(&[(bad.to_string(), "v".to_string())], 0).is_err(),
                "{bad}"
            );
        }
    }
}

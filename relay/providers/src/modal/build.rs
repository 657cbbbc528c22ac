//! `tether image build --target modal`: a Modal image built by Modal's own builder, then
//! published under `--name` so that `tether create --provider modal --image NAME` finds it.
//!
//! The definition is what the SDK sends for `Image.from_registry(FROM)` with
//! `dockerfile_commands(...)` whose `COPY` takes a file of its context: `FROM <--from>`, the
//! agent uploaded as the build's context mount (through Modal's blob storage: at 4.7 MiB it
//! is over what the SDK ever sends inline) and copied to [`AGENT_PATH`], the `--env`, `--workdir` and `--user` settings, then
//! `ENTRYPOINT []` and the agent's command line as `CMD`. No `RUN` step: the whole build is
//! declarative, so it needs nothing from the base but a file system.
//!
//! Modal appends a sandbox's arguments to the image's ENTRYPOINT, and the relay passes the
//! agent's command line as those arguments, so a Modal image has no ENTRYPOINT whatever
//! `--start` says (see `images/modal/README.md`); the `CMD` serves SDK users who pass none.
//!
//! Before anything is sent, the agent is checked (static x86_64) and so is `--from`: its
//! manifest is fetched from its registry, and a registry that says it has no such image fails
//! the build here. A registry this machine cannot reach or is refused by is left for Modal to
//! judge (it may have credentials or a network that we do not).
//!
//! Then `ImagePublish` names the image `[environment/]NAME[:TAG]` (`:latest` by default) in
//! `MODAL_ENVIRONMENT`. Modal deduplicates definitions, so building the same thing again
//! finds the image already built and only publishes it again.

use crate::cloud::settings::Settings;
use crate::modal::{BuildError, ContextFile, Definition, ImageName, ModalProvider};
use tether_client::local::data_dir as default_data_dir;
use tether_oci::agent;
use tether_oci::config::Overrides;
use tether_oci::constants::{AGENT_PATH, ENTRYPOINT};
use tether_relay_core::provider::ProviderError;

use crate::image::{Event, RemoteBuild, RemoteBuilt, TargetError};

/// The provider's name in messages.
const PROVIDER: &str = "modal";
/// The agent's name among the build's context files (what the `COPY` names).
const AGENT_CONTEXT_FILE: &str = "/tether-agent";
/// The agent's permissions in the image: executable by every user.
const AGENT_MODE: u32 = 0o755;

/// Builds `req` on Modal and publishes it under `req.name`.
pub(crate) async fn build(
    req: &RemoteBuild,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<RemoteBuilt, TargetError> {
    let name =
        ImageName::parse(&req.name).map_err(|e| TargetError::Usage(format!("--name: {e}")))?;
    let Some(from) = req.from.as_deref() else {
        return Err(TargetError::Usage(
            "--target modal needs --from REGISTRY/IMAGE:TAG: the linux/amd64 registry image \
             Modal pulls and builds on (for example --from debian:bookworm-slim)"
                .into(),
        ));
    };
    if req.base.is_some() || req.push.is_some() {
        return Err(TargetError::Usage(
            "--base and --push are not for --target modal: Modal pulls the --from image itself"
                .into(),
        ));
    }
    // Everything wrong here is said before anything is sent to Modal.
    let provider = ModalProvider::new(&Settings::load(&default_data_dir()));
    provider.check_credentials().map_err(api_error)?;
    agent::check_static(&req.agent)?;
    let commands = dockerfile_commands(from, &req.overrides)?;
    events(Event::Step(format!("checking {from}")));
    crate::image::check_base("Modal", from, req.insecure, events).await?;
    let bytes = tokio::fs::read(&req.agent).await.map_err(|e| {
        TargetError::Usage(format!(
            "cannot read the agent {}: {e}",
            req.agent.display()
        ))
    })?;
    let definition = Definition {
        commands,
        files: vec![ContextFile {
            path: AGENT_CONTEXT_FILE.to_string(),
            data: bytes.into(),
            mode: AGENT_MODE,
        }],
    };

    events(Event::Step(format!(
        "building {name} on Modal from {from} (the agent goes up as the build's context)"
    )));
    let log = |line: String| events(Event::Log(line));
    let image_id = provider
        .build_image(definition, &log)
        .await
        .map_err(|e| match e {
            BuildError::Failed {
                image_id,
                status,
                exception,
            } => TargetError::BuildFailed {
                provider: PROVIDER,
                name: req.name.clone(),
                reason: match exception.trim() {
                    "" => format!("Modal gave no reason (image {image_id}, {status})"),
                    why => format!("{why} (Modal image {image_id}, {status})"),
                },
            },
            BuildError::TimedOut { waited, .. } => TargetError::Timeout {
                provider: PROVIDER,
                name: req.name.clone(),
                waited,
            },
            BuildError::Call(e) => api_error(e),
        })?;
    events(Event::Step(format!("publishing {image_id} as {name}")));
    provider
        .publish_image(&image_id, &name)
        .await
        .map_err(api_error)?;
    Ok(RemoteBuilt {
        provider: PROVIDER,
        name: req.name.clone(),
        id: image_id,
        build_id: None,
    })
}

fn api_error(e: ProviderError) -> TargetError {
    match e {
        ProviderError::Auth(message) => TargetError::Settings(message),
        e => TargetError::Api {
            provider: PROVIDER,
            message: e.to_string(),
        },
    }
}

/// The image's Dockerfile commands: on `from`, the agent and the run settings.
fn dockerfile_commands(from: &str, overrides: &Overrides) -> Result<Vec<String>, TargetError> {
    let from = from.trim();
    if from.is_empty() || from.contains(char::is_whitespace) {
        return Err(TargetError::Usage(format!(
            "--from {from:?} is not an image reference; give REGISTRY/IMAGE:TAG"
        )));
    }
    let mut commands = vec![
        format!("FROM {from}"),
        format!("COPY --chmod={AGENT_MODE:o} {AGENT_CONTEXT_FILE} {AGENT_PATH}"),
    ];
    for (key, value) in &overrides.env {
        let bad_key = key.is_empty()
            || key
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '=' | '"' | '\\' | '$'));
        if bad_key {
            return Err(TargetError::Usage(format!(
                "--env {key:?}: a variable name cannot be empty or hold spaces, '=', quotes, \
                 '\\' or '$'"
            )));
        }
        single_line("--env", value)?;
        commands.push(format!("ENV {key}=\"{}\"", escape(value)));
    }
    if let Some(workdir) = &overrides.workdir {
        single_line("--workdir", workdir)?;
        if !workdir.starts_with('/') {
            return Err(TargetError::Usage(format!(
                "--workdir {workdir:?} must be an absolute path"
            )));
        }
        commands.push(format!("WORKDIR {}", escape(workdir)));
    }
    if let Some(user) = &overrides.user {
        if user.is_empty() || user.contains(|c: char| c.is_whitespace() || c == '$') {
            return Err(TargetError::Usage(format!(
                "--user {user:?} must be a user name or id (USER[:GROUP]), without spaces or '$'"
            )));
        }
        commands.push(format!("USER {user}"));
    }
    let cmd = serde_json::to_string(&ENTRYPOINT).expect("strings serialize");
    commands.push("ENTRYPOINT []".into());
    commands.push(format!("CMD {cmd}"));
    Ok(commands)
}

/// Refuses values that would end the Dockerfile instruction early.
fn single_line(flag: &str, value: &str) -> Result<(), TargetError> {
    if value.contains(['\n', '\r']) {
        return Err(TargetError::Usage(format!(
            "{flag} {value:?} holds a line break, which a Dockerfile instruction cannot"
        )));
    }
    Ok(())
}

/// Escapes what a Dockerfile would interpret in a value: quotes, backslashes and `$`
/// (variable substitution), each with a backslash.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '"' | '\\' | '$') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_oci::config::StartMode;

    #[test]
    fn the_definition_copies_the_agent_and_clears_the_entrypoint() {
        let overrides = Overrides {
            start: StartMode::Entrypoint,
            env: vec![("GREETING".into(), "hi \"you\" $HOME".into())],
            workdir: Some("/work dir".into()),
            user: Some("1000:1000".into()),
        };
        let commands = dockerfile_commands("127.0.0.1:5000/base:v1", &overrides).unwrap();
        assert_eq!(
            commands,
            [
                "FROM 127.0.0.1:5000/base:v1",
                "COPY --chmod=755 /tether-agent /usr/local/bin/tether-agent",
                r#"ENV GREETING="hi \"you\" \$HOME""#,
                "WORKDIR /work dir",
                "USER 1000:1000",
                "ENTRYPOINT []",
                r#"CMD ["/usr/local/bin/tether-agent","serve","--listen","0.0.0.0:7421"]"#,
            ]
        );
    }

    #[test]
    fn values_that_would_break_an_instruction_are_refused() {
        let mut overrides = Overrides::default();
        assert!(dockerfile_commands("base with space", &overrides).is_err());
        overrides.env = vec![("A".into(), "two\nlines".into())];
        assert!(dockerfile_commands("alpine", &overrides).is_err());
        overrides.env = vec![("A B".into(), "x".into())];
        assert!(dockerfile_commands("alpine", &overrides).is_err());
        overrides.env.clear();
        overrides.workdir = Some("relative".into());
        assert!(dockerfile_commands("alpine", &overrides).is_err());
    }
}

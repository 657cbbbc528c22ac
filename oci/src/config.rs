//! The OCI image documents we read and write, as serde structs: the index, the manifest, the
//! image config with its run settings, and the descriptors that link them by digest
//! (<https://github.com/opencontainers/image-spec>). Fields we do not use are kept in
//! `extra` maps, so a base's config survives a rebuild intact. Also: deriving a Tether image's
//! config from its base's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::constants::{
    AGENT_LABEL, AGENT_PATH, AGENT_PORT, ARCHITECTURE, DEFAULT_PATH, ENTRYPOINT, OS,
};
use super::digest::Digest;

/// An image index (a layout's `index.json`, or a multi-platform list).
pub(crate) const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// An image manifest.
pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// An image config.
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// A gzip-compressed layer, the only kind we write.
pub(crate) const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// An uncompressed layer (what `docker save` holds).
pub(crate) const MEDIA_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// Docker's equivalents, which OCI layouts and registries also hold.
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// See [`DOCKER_MANIFEST`].
pub(crate) const DOCKER_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
/// The annotation naming a manifest in a layout's index (its tag).
pub(crate) const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A link to a blob: its type, digest and size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// What the blob is.
    pub media_type: String,
    /// Its content address.
    pub digest: Digest,
    /// Its length in bytes.
    pub size: u64,
    /// For entries of an index: the platform the manifest is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// Free-form metadata, such as the tag of a manifest in a layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// An operating system and CPU architecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Platform {
    /// `amd64`, `arm64`, ...
    pub architecture: String,
    /// `linux`, ...
    pub os: String,
    /// `v8` for arm64, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// A list of manifests (a layout's `index.json`, or a multi-platform image).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Index {
    /// Always 2.
    pub schema_version: u32,
    /// [`MEDIA_INDEX`] (optional in old documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The manifests (or nested indexes).
    pub manifests: Vec<Descriptor>,
    /// Free-form metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// One image: its config and its layers, bottom first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`MEDIA_MANIFEST`] or `DOCKER_MANIFEST`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The image config.
    pub config: Descriptor,
    /// The layers, bottom first.
    pub layers: Vec<Descriptor>,
    /// Free-form metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// An image config: platform, how to run it, and the uncompressed digests of its layers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// When the image was made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// The CPU architecture, e.g. `amd64`.
    #[serde(default)]
    pub architecture: String,
    /// The operating system, e.g. `linux`.
    #[serde(default)]
    pub os: String,
    /// How a container of the image runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<RunConfig>,
    /// The layers' uncompressed digests.
    #[serde(default)]
    pub rootfs: RootFs,
    /// How each layer was made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<History>,
    /// Everything else (`author`, `variant`, ...), kept as it was.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// How a container of the image runs (the config's `config` object).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    /// `user`, `uid`, `user:group` or `uid:gid`; root when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// `port/proto` keys, empty-object values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_ports: Option<BTreeMap<String, Value>>,
    /// `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    /// The program and its first arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// Arguments appended to the entrypoint (or the program, without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    /// The working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Free-form metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Everything else (`StopSignal`, `Volumes`, `Healthcheck`, ...), kept as it was.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The config's `rootfs` object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RootFs {
    /// Always `layers`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The uncompressed digest of each layer, bottom first.
    pub diff_ids: Vec<Digest>,
}

impl Default for RootFs {
    fn default() -> Self {
        RootFs {
            kind: "layers".into(),
            diff_ids: Vec::new(),
        }
    }
}

/// One step of how the image was made.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// When (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// The command or tool that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// A note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// The step changed the config only and added no layer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub empty_layer: bool,
}

impl ImageConfig {
    /// `os/architecture[/variant]`, for messages.
    pub(crate) fn platform(&self) -> String {
        let mut p = format!("{}/{}", self.os, self.architecture);
        if let Some(Value::String(v)) = self.extra.get("variant") {
            p.push('/');
            p.push_str(v);
        }
        p
    }

    /// Whether sandboxes can run it.
    pub(crate) fn is_linux_amd64(&self) -> bool {
        self.os == OS && self.architecture == ARCHITECTURE
    }
}

/// How an image starts its agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartMode {
    /// The ENTRYPOINT is the agent with every argument, and there is no CMD: what Docker,
    /// podman and Daytona (which keeps only the ENTRYPOINT) need.
    #[default]
    Entrypoint,
    /// The CMD is the agent with every argument, and there is no ENTRYPOINT: what Modal
    /// needs, which appends its own arguments (the agent command) to any ENTRYPOINT.
    Cmd,
}

/// What a build sets on top of the base's run settings.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// Where the agent command goes.
    pub start: StartMode,
    /// Variables added to (or replacing those of) the base's environment.
    pub env: Vec<(String, String)>,
    /// The working directory, instead of the base's.
    pub workdir: Option<String>,
    /// The user, instead of the base's.
    pub user: Option<String>,
}

/// The config of a Tether image: the base's, with the agent as entrypoint and the added
/// layers recorded. `created` is the build's fixed timestamp (RFC 3339).
pub(crate) fn agent_config(
    base: &ImageConfig,
    overrides: &Overrides,
    added: &[(Digest, &str)],
    created: &str,
) -> ImageConfig {
    let mut config = base.clone();
    config.created = Some(created.to_string());
    config.os = OS.into();
    config.architecture = ARCHITECTURE.into();
    let mut run = config.config.take().unwrap_or_default();

    let agent: Vec<String> = ENTRYPOINT.iter().map(|s| s.to_string()).collect();
    // A base's CMD would be appended to the agent's arguments and make it refuse to start;
    // a base's ENTRYPOINT would run instead of the agent.
    (run.entrypoint, run.cmd) = match overrides.start {
        StartMode::Entrypoint => (Some(agent), None),
        StartMode::Cmd => (None, Some(agent)),
    };
    let mut env = run.env.take().unwrap_or_default();
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.insert(0, DEFAULT_PATH.to_string());
    }
    for (key, value) in &overrides.env {
        env.retain(|e| e.split_once('=').map(|(k, _)| k) != Some(key.as_str()));
        env.push(format!("{key}={value}"));
    }
    run.env = Some(env);
    if let Some(dir) = &overrides.workdir {
        run.working_dir = Some(dir.clone());
    }
    if let Some(user) = &overrides.user {
        run.user = Some(user.clone());
    }
    run.exposed_ports
        .get_or_insert_with(BTreeMap::new)
        .insert(format!("{AGENT_PORT}/tcp"), Value::Object(Map::new()));
    run.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(AGENT_LABEL.into(), AGENT_PATH.into());
    config.config = Some(run);

    for (diff_id, created_by) in added {
        config.rootfs.diff_ids.push(diff_id.clone());
        config.history.push(History {
            created: Some(created.to_string()),
            created_by: Some(created_by.to_string()),
            comment: Some("tether image build".into()),
            empty_layer: false,
        });
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let text = r#"{"architecture":"amd64","os":"linux","author":"me",
            "config":{"Cmd":["/bin/sh"],"StopSignal":"SIGTERM"},
            "rootfs":{"type":"layers","diff_ids":[]}}"#;
        let config: ImageConfig = serde_json::from_str(text).unwrap();
        let back = serde_json::to_value(&config).unwrap();
        assert_eq!(back["author"], "me");
        assert_eq!(back["config"]["StopSignal"], "SIGTERM");
        assert_eq!(back["config"]["Cmd"][0], "/bin/sh");
    }

    #[test]
    fn the_agent_replaces_the_command_and_keeps_the_environment() {
        let base = ImageConfig {
            architecture: "amd64".into(),
            os: "linux".into(),
            config: Some(RunConfig {
                cmd: Some(vec!["/bin/bash".into()]),
                env: Some(vec!["PATH=/opt/bin".into(), "LANG=C".into()]),
                working_dir: Some("/src".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let overrides = Overrides {
            env: vec![("LANG".into(), "C.UTF-8".into())],
            user: Some("1000".into()),
            ..Default::default()
        };
        let layer = Digest::of(b"layer");
        let config = agent_config(
            &base,
            &overrides,
            &[(layer.clone(), "agent")],
            "1970-01-01T00:00:00Z",
        );
        let run = config.config.as_ref().unwrap();
        assert_eq!(run.entrypoint.as_deref().unwrap()[0], AGENT_PATH);
        assert_eq!(run.cmd, None);
        assert_eq!(
            run.env.as_deref().unwrap(),
            ["PATH=/opt/bin", "LANG=C.UTF-8"]
        );
        assert_eq!(run.working_dir.as_deref(), Some("/src"));
        assert_eq!(run.user.as_deref(), Some("1000"));
        assert!(run.exposed_ports.as_ref().unwrap().contains_key("7421/tcp"));
        assert_eq!(config.rootfs.diff_ids, [layer]);
        assert_eq!(config.history.len(), 1);

        let modal = Overrides {
            start: StartMode::Cmd,
            ..Default::default()
        };
        let run = agent_config(&base, &modal, &[], "x").config.unwrap();
        assert_eq!(
            (run.entrypoint, run.cmd.unwrap()[0].as_str()),
            (None, AGENT_PATH)
        );

        let scratch = agent_config(&ImageConfig::default(), &Overrides::default(), &[], "x");
        assert_eq!(scratch.config.unwrap().env.unwrap(), [DEFAULT_PATH]);
        assert!(scratch.os == "linux" && scratch.architecture == "amd64");
    }
}

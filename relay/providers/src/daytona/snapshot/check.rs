//! Whether a registry image has the agent, read from its config (the label `tether image
//! build` sets) without pulling its layers: a `--from` image without it would make a
//! snapshot whose every sandbox fails to start, so it is refused before Daytona is asked.

use tether_oci::config::ImageConfig;
use tether_oci::constants::{AGENT_LABEL, MAX_JSON_BYTES};
use tether_oci::pull::fetch_manifest;
use tether_oci::reference::Reference;
use tether_oci::{ImageError, PullOptions};

/// What the registry says about the agent.
pub(super) enum Agent {
    /// The image carries the agent label.
    Present,
    /// The image was read and has no agent label.
    Missing,
    /// The image could not be read here (Daytona may still reach it with its own
    /// credentials); why.
    Unknown(String),
}

/// Reads `reference`'s config from its registry and looks for the agent label.
pub(super) async fn agent(reference: &Reference, insecure: bool) -> Agent {
    match label(reference, insecure).await {
        Ok(true) => Agent::Present,
        Ok(false) => Agent::Missing,
        Err(e) => Agent::Unknown(e.to_string()),
    }
}

async fn label(reference: &Reference, insecure: bool) -> Result<bool, ImageError> {
    let name = reference.to_string();
    let remote = fetch_manifest(reference, &PullOptions { insecure }).await?;
    let config = &remote.manifest.config;
    if config.size > MAX_JSON_BYTES {
        return Err(ImageError::BadImage {
            path: name.into(),
            reason: format!("its config is {} bytes", config.size),
        });
    }
    let registry = &remote.registry;
    let config = registry
        .get_blob(&config.digest)
        .await?
        .bytes()
        .await
        .map_err(|e| registry.read_failed(e))?;
    let config: ImageConfig =
        serde_json::from_slice(&config).map_err(|e| ImageError::BadImage {
            path: name.into(),
            reason: format!("its config is not valid JSON: {e}"),
        })?;
    Ok(config
        .config
        .and_then(|run| run.labels)
        .is_some_and(|labels| labels.contains_key(AGENT_LABEL)))
}

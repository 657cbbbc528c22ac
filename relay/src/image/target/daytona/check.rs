//! Whether a registry image has the agent, read from its config (the label `tether image
//! build` sets) without pulling its layers: a `--from` image without it would make a
//! snapshot whose every sandbox fails to start, so it is refused before Daytona is asked.

use serde::Deserialize;

use crate::image::config::{Descriptor, ImageConfig, Manifest};
use crate::image::constants::{AGENT_LABEL, ARCHITECTURE, MAX_JSON_BYTES, OS};
use crate::image::reference::Reference;
use crate::image::registry::Registry;
use crate::image::ImageError;

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

/// An index's entries, enough to choose the linux/amd64 manifest.
#[derive(Deserialize)]
struct Entries {
    #[serde(default)]
    manifests: Vec<Descriptor>,
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
    let registry = Registry::new(reference, insecure || reference.is_loopback())?;
    let name = reference.to_string();
    let (mut bytes, _) = registry.get_manifest(reference.target_str()).await?;
    let entries: Entries = serde_json::from_slice(&bytes).map_err(|e| bad(&name, e))?;
    if !entries.manifests.is_empty() {
        let Some(chosen) = entries.manifests.iter().find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == OS && p.architecture == ARCHITECTURE)
        }) else {
            // Not about the agent: Daytona refuses it with its own reason.
            return Err(ImageError::BadImage {
                path: name.into(),
                reason: format!("it has no {OS}/{ARCHITECTURE} image"),
            });
        };
        (bytes, _) = registry.get_manifest(chosen.digest.as_str()).await?;
    }
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(&name, e))?;
    if manifest.config.size > MAX_JSON_BYTES {
        return Err(ImageError::BadImage {
            path: name.into(),
            reason: format!("its config is {} bytes", manifest.config.size),
        });
    }
    let config = registry
        .get_blob(&manifest.config.digest)
        .await?
        .bytes()
        .await
        .map_err(|e| registry.read_failed(e))?;
    let config: ImageConfig = serde_json::from_slice(&config).map_err(|e| bad(&name, e))?;
    Ok(config
        .config
        .and_then(|run| run.labels)
        .is_some_and(|labels| labels.contains_key(AGENT_LABEL)))
}

fn bad(name: &str, e: serde_json::Error) -> ImageError {
    ImageError::BadImage {
        path: name.into(),
        reason: format!("its manifest or config is not valid JSON: {e}"),
    }
}

//! Pulling an image from a registry into an OCI image layout on disk: the manifest (the
//! linux/amd64 one, when the reference names a multi-platform index), its config and its
//! layers, each checked against its digest and size as it streams in ([`fetch_manifest`]
//! alone reads an image's manifest without its layers). The manifest is kept
//! byte for byte, so the layout's digest is the registry's. Used by the provider fakes'
//! builders, and by anything that needs a registry image as a local base.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::Deserialize;

use super::build::parent_dir;
use super::config::{Descriptor, Manifest};
use super::constants::{ARCHITECTURE, OS};
use super::digest::Digest;
use super::error::{ImageError, IoContext};
use super::layout::Layout;
use super::reference::{Reference, Target};
use super::registry::Registry;

/// How to pull.
#[derive(Clone, Debug, Default)]
pub struct PullOptions {
    /// Speak plain HTTP (always so for loopback registries).
    pub insecure: bool,
}

/// What a pull wrote.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// The digest of the image's manifest (the platform manifest, not an index).
    pub manifest: Digest,
    /// The layout directory.
    pub layout: PathBuf,
}

/// An index's entries, enough to choose a platform.
#[derive(Deserialize)]
struct Entries {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

/// A registry image's linux/amd64 manifest, exactly as the registry stores it.
pub struct RemoteManifest {
    /// The repository it came from, for fetching its blobs.
    pub registry: Registry,
    /// The manifest's bytes.
    pub bytes: Bytes,
    /// Its media type.
    pub media_type: String,
    /// The manifest, parsed.
    pub manifest: Manifest,
}

/// Fetches `reference`'s manifest, choosing the linux/amd64 one when the reference names a
/// multi-platform index, and checking digests wherever one is known.
pub async fn fetch_manifest(
    reference: &Reference,
    opts: &PullOptions,
) -> Result<RemoteManifest, ImageError> {
    let registry = Registry::new(reference, opts.insecure || reference.is_loopback())?;
    let name = reference.to_string();
    let (mut bytes, mut media_type) = registry.get_manifest(reference.target_str()).await?;
    if let Target::Digest(want) = &reference.target {
        check_digest(&name, want, &Digest::of(&bytes))?;
    }
    let entries: Entries = serde_json::from_slice(&bytes).map_err(|e| bad(&name, e))?;
    if !entries.manifests.is_empty() {
        let found: Vec<String> = entries
            .manifests
            .iter()
            .filter_map(|m| m.platform.as_ref())
            .map(|p| format!("{}/{}", p.os, p.architecture))
            .collect();
        let chosen = entries
            .manifests
            .iter()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.os == OS && p.architecture == ARCHITECTURE)
            })
            .ok_or_else(|| ImageError::WrongPlatform {
                path: PathBuf::from(&name),
                found: found.join(", "),
            })?;
        let digest = chosen.digest.clone();
        (bytes, media_type) = registry.get_manifest(digest.as_str()).await?;
        check_digest(&name, &digest, &Digest::of(&bytes))?;
    }
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| bad(&name, e))?;
    if media_type.is_empty() {
        media_type = manifest.media_type.clone().unwrap_or_default();
    }
    Ok(RemoteManifest {
        registry,
        bytes,
        media_type,
        manifest,
    })
}

/// Pulls `reference`'s linux/amd64 image into a new OCI image layout directory `dir` (which
/// must not exist, or be empty), tagged with the reference's tag.
pub async fn pull(
    reference: &Reference,
    dir: &Path,
    opts: &PullOptions,
) -> Result<Pulled, ImageError> {
    let RemoteManifest {
        registry,
        bytes,
        media_type,
        manifest,
    } = fetch_manifest(reference, opts).await?;

    // Staged beside `dir` and renamed into place, so a failed pull leaves nothing behind.
    let parent = parent_dir(dir);
    let staging = tempfile::Builder::new()
        .prefix(".tether-pull-")
        .tempdir_in(&parent)
        .io(|| format!("creating a staging directory in {}", parent.display()))?;
    let layout = Layout::create(&staging.path().join("layout"))?;
    for blob in std::iter::once(&manifest.config).chain(&manifest.layers) {
        fetch_blob(&registry, &layout, blob).await?;
    }
    let desc = layout.write_blob(&media_type, &bytes)?;
    let tag = match &reference.target {
        Target::Tag(tag) => Some(tag.as_str()),
        Target::Digest(_) => None,
    };
    let digest = layout.write_image_index(desc, tag)?;
    // An empty directory may stand where the layout goes; anything else is refused.
    let _ = std::fs::remove_dir(dir);
    std::fs::rename(layout.root(), dir)
        .io(|| format!("moving the pulled image to {}", dir.display()))?;
    Ok(Pulled {
        manifest: digest,
        layout: dir.to_path_buf(),
    })
}

/// Streams the blob `desc` into `layout`, checking its digest and size.
async fn fetch_blob(
    registry: &Registry,
    layout: &Layout,
    desc: &Descriptor,
) -> Result<(), ImageError> {
    if layout.blob_path(&desc.digest).exists() {
        return Ok(());
    }
    let mut response = registry.get_blob(&desc.digest).await?;
    let mut writer = layout.blob_writer()?;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| registry.read_failed(e))?
    {
        writer.write_all(&chunk).io(|| {
            format!(
                "writing blob {} in {}",
                desc.digest,
                layout.root().display()
            )
        })?;
    }
    let (digest, size) = writer.finish()?;
    if digest != desc.digest || size != desc.size {
        let _ = std::fs::remove_file(layout.blob_path(&digest));
        return Err(layout.bad(format!(
            "the registry sent {size} bytes with digest {digest} for blob {} ({} bytes)",
            desc.digest, desc.size
        )));
    }
    Ok(())
}

fn check_digest(name: &str, want: &Digest, got: &Digest) -> Result<(), ImageError> {
    if want == got {
        return Ok(());
    }
    Err(ImageError::BadImage {
        path: PathBuf::from(name),
        reason: format!("the registry's manifest has digest {got}, not {want}"),
    })
}

fn bad(name: &str, e: serde_json::Error) -> ImageError {
    ImageError::BadImage {
        path: PathBuf::from(name),
        reason: format!("its manifest is not valid JSON: {e}"),
    }
}

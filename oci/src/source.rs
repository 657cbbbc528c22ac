//! An image on disk, opened for reading: an OCI layout directory, an OCI layout tarball, or
//! a `docker save` tarball (converted to a layout). Opening picks the linux/amd64 manifest
//! (by tag when asked), reads its config, and can verify every blob before anything is built
//! or uploaded from it.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use tempfile::TempDir;

use super::config::{
    Descriptor, ImageConfig, Index, Manifest, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, MEDIA_CONFIG,
    MEDIA_INDEX, MEDIA_LAYER_GZIP, MEDIA_LAYER_TAR, MEDIA_MANIFEST, REF_NAME,
};
use super::constants::{ARCHITECTURE, OS};
use super::digest::digest_reader;
use super::error::{ImageError, IoContext};
use super::layout::{self, descriptor, Layout};

/// `manifest.json` of a `docker save` tarball.
const DOCKER_SAVE_MANIFEST: &str = "manifest.json";

/// An opened image: its layout, the chosen manifest and its config.
#[derive(Debug)]
pub struct ImageSource {
    /// What the user named (directory or tarball).
    pub path: PathBuf,
    /// Where its blobs are.
    pub layout: Layout,
    /// The manifest's descriptor (its digest is the image's digest).
    pub manifest_desc: Descriptor,
    /// The manifest.
    pub manifest: Manifest,
    /// The config.
    pub config: ImageConfig,
    /// Where a tarball was unpacked; removed on drop.
    _scratch: Option<TempDir>,
}

impl ImageSource {
    /// Opens the image at `path` (a layout directory or tarball). A tarball is unpacked into
    /// a temporary directory under `scratch`. `tag` picks a manifest by its
    /// `org.opencontainers.image.ref.name`; without it the layout must hold one image.
    pub fn open(path: &Path, tag: Option<&str>, scratch: &Path) -> Result<ImageSource, ImageError> {
        let meta = fs::metadata(path).map_err(|e| ImageError::BadImage {
            path: path.to_path_buf(),
            reason: format!("it cannot be read: {e}"),
        })?;
        let (layout, dir) = if meta.is_dir() {
            (Layout::open(path)?, None)
        } else {
            fs::create_dir_all(scratch).io(|| format!("creating {}", scratch.display()))?;
            let dir = tempfile::Builder::new()
                .prefix(".unpacking-")
                .tempdir_in(scratch)
                .io(|| format!("creating a directory in {}", scratch.display()))?;
            (open_tarball(path, dir.path())?, Some(dir))
        };
        let manifest_desc = choose(&layout, &layout.index()?, tag)?;
        let manifest: Manifest = layout.read_json(&manifest_desc)?;
        if manifest.config.media_type != MEDIA_CONFIG
            && manifest.config.media_type != "application/vnd.docker.container.image.v1+json"
        {
            return Err(layout.bad(format!(
                "its config has type {}, which is not an image config (an artifact?)",
                manifest.config.media_type
            )));
        }
        let config: ImageConfig = layout.read_json(&manifest.config)?;
        if config.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(layout.bad(format!(
                "its config lists {} layers but its manifest {}",
                config.rootfs.diff_ids.len(),
                manifest.layers.len()
            )));
        }
        Ok(ImageSource {
            path: path.to_path_buf(),
            layout,
            manifest_desc,
            manifest,
            config,
            _scratch: dir,
        })
    }

    /// Fails unless the config says linux/amd64.
    pub fn check_platform(&self) -> Result<(), ImageError> {
        if self.config.is_linux_amd64() {
            Ok(())
        } else {
            Err(ImageError::WrongPlatform {
                path: self.path.clone(),
                found: self.config.platform(),
            })
        }
    }

    /// Checks every layer blob's presence, size and digest (config and manifest were checked
    /// when read).
    pub(crate) fn verify_blobs(&self) -> Result<(), ImageError> {
        for layer in &self.manifest.layers {
            self.layout.verify_blob(layer)?;
        }
        Ok(())
    }
}

/// The manifest of `index` to use: by tag, the only one, or the one for linux/amd64; nested
/// indexes (multi-platform images) are followed.
fn choose(layout: &Layout, index: &Index, tag: Option<&str>) -> Result<Descriptor, ImageError> {
    let tag_of = |d: &Descriptor| {
        d.annotations
            .as_ref()
            .and_then(|a| a.get(REF_NAME))
            .cloned()
    };
    let tags: Vec<String> = index.manifests.iter().filter_map(tag_of).collect();
    let chosen = match tag {
        Some(tag) => index
            .manifests
            .iter()
            .find(|d| tag_of(d).as_deref() == Some(tag))
            .ok_or_else(|| {
                layout.bad(format!(
                    "it has no image tagged {tag:?} (its tags: {})",
                    list(&tags)
                ))
            })?,
        None => match index.manifests.as_slice() {
            [] => return Err(layout.bad("its index lists no image".into())),
            [only] => only,
            many => many.iter().find(|d| is_ours(d)).ok_or_else(|| {
                layout.bad(format!(
                    "it holds {} images; name one by tag (its tags: {})",
                    many.len(),
                    list(&tags)
                ))
            })?,
        },
    };
    match chosen.media_type.as_str() {
        MEDIA_MANIFEST | DOCKER_MANIFEST => Ok(chosen.clone()),
        MEDIA_INDEX | DOCKER_MANIFEST_LIST => {
            let nested: Index = layout.read_json(chosen)?;
            if let Some(d) = nested.manifests.iter().find(|d| is_ours(d)) {
                return Ok(d.clone());
            }
            let offered: Vec<String> = nested
                .manifests
                .iter()
                .filter_map(|d| {
                    d.platform
                        .as_ref()
                        .map(|p| format!("{}/{}", p.os, p.architecture))
                })
                .collect();
            Err(ImageError::WrongPlatform {
                path: layout.root().to_path_buf(),
                found: format!("multi-platform ({}) without linux/amd64", list(&offered)),
            })
        }
        other => Err(layout.bad(format!(
            "its index points at a {other}, not an image manifest"
        ))),
    }
}

/// Whether an index entry is for linux/amd64.
fn is_ours(d: &Descriptor) -> bool {
    d.platform
        .as_ref()
        .is_some_and(|p| p.os == OS && p.architecture == ARCHITECTURE)
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// Unpacks an OCI layout tarball, or converts a `docker save` tarball, into `dir`.
fn open_tarball(tarball: &Path, dir: &Path) -> Result<Layout, ImageError> {
    let bad = |reason: String| ImageError::BadImage {
        path: tarball.to_path_buf(),
        reason,
    };
    let names =
        tar_names(tarball).map_err(|e| bad(format!("it is not a readable tar archive ({e})")))?;
    if names.iter().any(|n| n == "oci-layout") {
        return Layout::extract_tarball(tarball, dir);
    }
    if names.iter().any(|n| n == DOCKER_SAVE_MANIFEST) {
        return convert_docker_save(tarball, dir);
    }
    Err(bad(
        "it holds neither an OCI layout (`oci-layout`, `index.json`) nor a `docker save` \
         image (`manifest.json`)"
            .into(),
    ))
}

/// The names of a tarball's entries, without a leading `./`.
fn tar_names(tarball: &Path) -> io::Result<Vec<String>> {
    let mut archive = tar::Archive::new(BufReader::new(File::open(tarball)?));
    let mut names = Vec::new();
    for entry in archive.entries()? {
        let entry = entry?;
        names.push(
            entry
                .path()?
                .to_string_lossy()
                .trim_start_matches("./")
                .to_string(),
        );
    }
    Ok(names)
}

/// One image of a `docker save` tarball's `manifest.json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SavedImage {
    config: String,
    layers: Vec<String>,
}

/// Turns a `docker save` tarball into an OCI layout in `dir`: its config and layer files
/// become blobs, and a manifest is written for them.
fn convert_docker_save(tarball: &Path, dir: &Path) -> Result<Layout, ImageError> {
    let bad = |reason: String| ImageError::BadImage {
        path: tarball.to_path_buf(),
        reason,
    };
    let raw = dir.join("saved");
    let mut archive = tar::Archive::new(BufReader::new(
        File::open(tarball).io(|| format!("opening {}", tarball.display()))?,
    ));
    for entry in archive.entries().map_err(|e| bad(e.to_string()))? {
        let mut entry = entry.map_err(|e| bad(format!("it is not a valid tar archive: {e}")))?;
        if !matches!(
            entry.header().entry_type(),
            tar::EntryType::Regular | tar::EntryType::Continuous
        ) {
            continue;
        }
        let name = entry.path().map_err(|e| bad(e.to_string()))?.into_owned();
        if name
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(bad(format!("entry {} leaves the archive", name.display())));
        }
        let dst = raw.join(&name);
        fs::create_dir_all(dst.parent().unwrap_or(&raw))
            .io(|| format!("creating {}", raw.display()))?;
        let mut out = File::create(&dst).io(|| format!("creating {}", dst.display()))?;
        io::copy(&mut entry, &mut out)
            .map_err(|e| bad(format!("{} cannot be read: {e}", name.display())))?;
    }
    let saved: Vec<SavedImage> =
        layout::read_json_file(&raw.join(DOCKER_SAVE_MANIFEST)).map_err(bad)?;
    let [image] = saved.as_slice() else {
        return Err(bad(format!(
            "it holds {} images; save one image per tarball",
            saved.len()
        )));
    };
    let layout = Layout::create(&dir.join("layout"))?;
    let adopt = |name: &str, media_type: Option<&str>| -> Result<Descriptor, ImageError> {
        let path = raw.join(name);
        if Path::new(name)
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::RootDir))
        {
            return Err(bad(format!(
                "its manifest names {name}, outside the archive"
            )));
        }
        let (digest, size) = File::open(&path)
            .and_then(|f| digest_reader(BufReader::new(f)))
            .map_err(|e| {
                bad(format!(
                    "{name}, named by its manifest, cannot be read: {e}"
                ))
            })?;
        let media_type = match media_type {
            Some(t) => t,
            None if is_gzip(&path) => MEDIA_LAYER_GZIP,
            None => MEDIA_LAYER_TAR,
        };
        let dst = layout.blob_path(&digest);
        fs::rename(&path, &dst)
            .or_else(|_| fs::copy(&path, &dst).map(drop))
            .io(|| format!("moving {}", path.display()))?;
        Ok(descriptor(media_type, digest, size))
    };
    let config = adopt(&image.config, Some(MEDIA_CONFIG))?;
    let layers = image
        .layers
        .iter()
        .map(|l| adopt(l, None))
        .collect::<Result<Vec<_>, _>>()?;
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(MEDIA_MANIFEST.into()),
        config,
        layers,
        annotations: None,
    };
    let manifest = layout.write_json(MEDIA_MANIFEST, &manifest)?;
    layout.write_index(vec![manifest])?;
    let _ = fs::remove_dir_all(&raw);
    Ok(layout)
}

/// Whether the file starts with the gzip magic number.
fn is_gzip(path: &Path) -> bool {
    let mut magic = [0u8; 2];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == [0x1f, 0x8b]
}

//! A fake's image store, the builder behind every fake's template, snapshot and image builds:
//! registry images pulled into OCI layouts (the fakes have no internet, so references name a
//! registry the test started), and new images derived from them by adding one layer of files
//! and editing the config, as a Dockerfile's COPY, ENV, WORKDIR, USER, ENTRYPOINT and CMD do.
//!
//! Every image lives under `<data_dir>/images/<manifest digest>`, so the same content is
//! stored once and a sandbox made from it is unpacked once (the local provider caches by
//! digest too).

use std::path::{Path, PathBuf};

use anyhow::Context;
use tether_oci::config::{Descriptor, History, Manifest, MEDIA_CONFIG, MEDIA_MANIFEST};
use tether_oci::layout::Layout;
use tether_oci::reference::Reference;
use tether_oci::source::ImageSource;
use tether_oci::{layer, pull, PullOptions};

/// The store's folder under a fake's data directory.
const STORE_DIR: &str = "images";
/// The timestamp of derived layers and history: fixed, so equal inputs give equal digests.
const EPOCH: u64 = 0;
/// The tag recorded in derived images' layouts.
const TAG: &str = "latest";

/// The images of one fake.
#[derive(Clone, Debug)]
pub(crate) struct Images {
    root: PathBuf,
}

/// A file to add to an image.
#[derive(Clone, Debug)]
pub(crate) struct AddFile {
    /// Where it goes in the image (absolute).
    pub path: String,
    /// Its content: a file on this machine.
    pub source: PathBuf,
    /// Its permission bits.
    pub mode: u32,
}

/// Changes to an image's run settings; `None` and empty leave the base's.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConfigEdit {
    /// The new ENTRYPOINT (`Some(vec![])` clears it).
    pub entrypoint: Option<Vec<String>>,
    /// The new CMD (`Some(vec![])` clears it).
    pub cmd: Option<Vec<String>>,
    /// Drop every variable of the base before setting `env` (E2B, whose images carry none
    /// into a sandbox's processes).
    pub clear_env: bool,
    /// Variables to set (replacing the base's value of the same name).
    pub env: Vec<(String, String)>,
    /// The new working directory.
    pub workdir: Option<String>,
    /// The new user.
    pub user: Option<String>,
}

impl Images {
    /// The store under `data_dir`.
    pub(crate) fn new(data_dir: &Path) -> Images {
        Images {
            root: data_dir.join(STORE_DIR),
        }
    }

    /// Pulls `reference` (plain HTTP for loopback registries) into the store; returns the
    /// image's layout directory.
    pub(crate) async fn pull(&self, reference: &str) -> anyhow::Result<PathBuf> {
        let parsed = Reference::parse(reference)?;
        let staging = self.staging()?;
        let dir = staging.path().join("image");
        let pulled = pull(&parsed, &dir, &PullOptions::default())
            .await
            .with_context(|| format!("pulling {reference}"))?;
        self.keep(&dir, pulled.manifest.hex())
    }

    /// A new image: `base` (a layout directory) plus one layer holding `files`, with `edit`
    /// applied to its config; returns its layout directory. Blocking.
    pub(crate) fn derive(
        &self,
        base: &Path,
        files: &[AddFile],
        edit: &ConfigEdit,
    ) -> anyhow::Result<PathBuf> {
        let staging = self.staging()?;
        let source = ImageSource::open(base, None, staging.path())?;
        source.check_platform()?;
        let dir = staging.path().join("image");
        let layout = Layout::create(&dir)?;
        for blob in &source.manifest.layers {
            layout.import_blob(&source.layout, blob)?;
        }
        let mut layers: Vec<Descriptor> = source.manifest.layers.clone();
        let mut config = source.config.clone();
        if !files.is_empty() {
            let entries = files
                .iter()
                .flat_map(|f| layer::file_with_parents(&f.path, &f.source, f.mode))
                .collect();
            let written = layer::write(&layout, entries, EPOCH)?;
            layers.push(written.desc);
            config.rootfs.diff_ids.push(written.diff_id);
            let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
            config.history.push(History {
                created_by: Some(format!("COPY {}", paths.join(" "))),
                ..History::default()
            });
        }
        apply(edit, config.config.get_or_insert_with(Default::default));
        let config_desc = layout.write_json(MEDIA_CONFIG, &config)?;
        let manifest = Manifest {
            schema_version: 2,
            media_type: Some(MEDIA_MANIFEST.into()),
            config: config_desc,
            layers,
            annotations: None,
        };
        let desc = layout.write_json(MEDIA_MANIFEST, &manifest)?;
        let digest = layout.write_image_index(desc, Some(TAG))?;
        drop(source);
        self.keep(&dir, digest.hex())
    }

    /// A scratch directory inside the store (same file system, so images move by rename).
    fn staging(&self) -> anyhow::Result<tempfile::TempDir> {
        std::fs::create_dir_all(&self.root)
            .with_context(|| format!("creating {}", self.root.display()))?;
        tempfile::Builder::new()
            .prefix(".staging-")
            .tempdir_in(&self.root)
            .with_context(|| format!("creating a directory in {}", self.root.display()))
    }

    /// The variables of the image at `layout` (its config's `Env`), in order. Blocking.
    pub(crate) fn env_of(layout: &Path) -> anyhow::Result<Vec<(String, String)>> {
        let scratch = layout.parent().unwrap_or(layout);
        let source = ImageSource::open(layout, None, scratch)?;
        Ok(source
            .config
            .config
            .and_then(|run| run.env)
            .unwrap_or_default()
            .iter()
            .filter_map(|e| e.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// Moves the finished layout `dir` to its place by digest (keeping an existing copy).
    fn keep(&self, dir: &Path, digest_hex: &str) -> anyhow::Result<PathBuf> {
        let place = self.root.join(digest_hex);
        if !place.exists() {
            std::fs::rename(dir, &place)
                .with_context(|| format!("storing the image at {}", place.display()))?;
        }
        Ok(place)
    }
}

/// Applies `edit` to a config's run settings.
fn apply(edit: &ConfigEdit, run: &mut tether_oci::config::RunConfig) {
    if let Some(entrypoint) = &edit.entrypoint {
        run.entrypoint = (!entrypoint.is_empty()).then(|| entrypoint.clone());
    }
    if let Some(cmd) = &edit.cmd {
        run.cmd = (!cmd.is_empty()).then(|| cmd.clone());
    }
    if edit.clear_env {
        run.env = None;
    }
    if !edit.env.is_empty() {
        let env = run.env.get_or_insert_with(Vec::new);
        for (key, value) in &edit.env {
            let prefix = format!("{key}=");
            env.retain(|e| !e.starts_with(&prefix));
            env.push(format!("{key}={value}"));
        }
    }
    if let Some(workdir) = &edit.workdir {
        run.working_dir = Some(workdir.clone());
    }
    if let Some(user) = &edit.user {
        run.user = Some(user.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_replace_what_they_name_and_keep_the_rest() {
        let mut run = tether_oci::config::RunConfig {
            env: Some(vec!["PATH=/bin".into(), "A=1".into()]),
            entrypoint: Some(vec!["/bin/sh".into()]),
            cmd: Some(vec!["-c".into(), "true".into()]),
            working_dir: Some("/".into()),
            ..Default::default()
        };
        let edit = ConfigEdit {
            entrypoint: Some(vec![]),
            env: vec![("A".into(), "2".into()), ("B".into(), "3".into())],
            workdir: Some("/work".into()),
            ..ConfigEdit::default()
        };
        apply(&edit, &mut run);
        assert_eq!(run.entrypoint, None);
        assert_eq!(run.cmd, Some(vec!["-c".to_string(), "true".to_string()]));
        assert_eq!(
            run.env,
            Some(vec!["PATH=/bin".into(), "A=2".into(), "B=3".into()])
        );
        assert_eq!(run.working_dir.as_deref(), Some("/work"));
        assert_eq!(run.user, None);
    }
}

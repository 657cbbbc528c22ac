//! `tether image build --target oci`: a base plus a layer holding the static agent, with the
//! agent as entrypoint, written as an OCI layout directory or tarball. Everything is checked
//! before anything is written, the image is assembled in a staging directory beside the
//! output and moved into place at the end, and the result is reproducible: the same base,
//! agent, settings and `SOURCE_DATE_EPOCH` give the same manifest digest.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;

use super::agent;
use super::base::Base;
use super::config::{self, Descriptor, Manifest, Overrides, MEDIA_CONFIG, MEDIA_MANIFEST};
use super::constants::{AGENT_PATH, SOURCE_DATE_EPOCH};
use super::digest::Digest;
use super::error::{ImageError, IoContext};
use super::layer;
use super::layout::Layout;

/// What to build.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// The base (see `Base::open`), or none.
    pub base: Option<PathBuf>,
    /// The static agent binary.
    pub agent: PathBuf,
    /// A layout directory, or a tarball when it ends in `.tar`.
    pub output: PathBuf,
    /// The tag recorded in the layout's index.
    pub tag: String,
    /// Settings on top of the base's.
    pub overrides: Overrides,
    /// Every timestamp in the image, in seconds since the epoch.
    pub epoch: u64,
}

/// What a build wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Built {
    /// Where.
    pub output: PathBuf,
    /// Whether it is a tarball (else a layout directory).
    pub tarball: bool,
    /// The manifest's digest: the image's identity in registries and caches.
    pub digest: Digest,
    /// The config's digest.
    pub config: Digest,
    /// The layers, bottom first.
    pub layers: Vec<Descriptor>,
    /// The tag in the layout's index.
    pub tag: String,
}

/// The build time: `SOURCE_DATE_EPOCH` when set, else 0 (the epoch), never the clock.
pub fn source_date_epoch() -> Result<u64, ImageError> {
    match std::env::var(SOURCE_DATE_EPOCH) {
        Err(_) => Ok(0),
        Ok(v) => v.trim().parse().map_err(|_| ImageError::Output {
            path: PathBuf::from(SOURCE_DATE_EPOCH),
            reason: format!("{SOURCE_DATE_EPOCH}={v:?} is not a number of seconds since 1970"),
        }),
    }
}

/// Whether `output` names a tarball.
pub(crate) fn is_tarball(output: &Path) -> bool {
    output.extension().is_some_and(|e| e == "tar")
}

/// Builds the image `opts` describes. `step` is told what is happening, for progress.
pub fn build(opts: &BuildOptions, step: &dyn Fn(&str)) -> Result<Built, ImageError> {
    agent::check_static(&opts.agent)?;
    let tarball = is_tarball(&opts.output);
    check_output(&opts.output, tarball)?;
    let parent = parent_dir(&opts.output);
    let staging = tempfile::Builder::new()
        .prefix(".tether-build-")
        .tempdir_in(&parent)
        .io(|| format!("creating a staging directory in {}", parent.display()))?;

    step("checking the base");
    let base = Base::open(opts.base.as_deref(), staging.path())?;
    let layout = Layout::create(&staging.path().join("layout"))?;

    step(&format!("adding {}", base.describe()));
    let base_layers = base.write_layers(&layout, opts.epoch)?;
    step("adding the agent");
    let agent_layer = layer::write(
        &layout,
        layer::file_with_parents(AGENT_PATH, &opts.agent, 0o755),
        opts.epoch,
    )?;

    let created = rfc3339(opts.epoch);
    let mut added: Vec<(Digest, &str)> = base_layers
        .iter()
        .filter_map(|l| l.created_by.map(|by| (l.diff_id.clone(), by)))
        .collect();
    added.push((
        agent_layer.diff_id.clone(),
        "tether image build: the static tether-agent",
    ));
    let image_config = config::agent_config(&base.config(), &opts.overrides, &added, &created);
    let config_desc = layout.write_json(MEDIA_CONFIG, &image_config)?;

    let mut layers: Vec<Descriptor> = base_layers.into_iter().map(|l| l.desc).collect();
    layers.push(agent_layer.desc);
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(MEDIA_MANIFEST.into()),
        config: config_desc.clone(),
        layers: layers.clone(),
        annotations: None,
    };
    let manifest_desc = layout.write_json(MEDIA_MANIFEST, &manifest)?;
    let digest = layout.write_image_index(manifest_desc, Some(&opts.tag))?;

    step("writing the image");
    drop(base);
    finish(&layout, &opts.output, tarball, staging.path())?;
    Ok(Built {
        output: opts.output.clone(),
        tarball,
        digest,
        config: config_desc.digest,
        layers,
        tag: opts.tag.clone(),
    })
}

/// `1970-01-01T00:00:00Z` for `epoch` seconds.
fn rfc3339(epoch: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(epoch)).to_string()
}

/// The directory an output goes in (`.` for a bare file name).
pub(crate) fn parent_dir(output: &Path) -> PathBuf {
    match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Refuses outputs a build would clobber: an existing file that is not a tarball, or a
/// directory that is neither empty nor an image layout.
fn check_output(output: &Path, tarball: bool) -> Result<(), ImageError> {
    let bad = |reason: &str| ImageError::Output {
        path: output.to_path_buf(),
        reason: reason.into(),
    };
    if !parent_dir(output).is_dir() {
        return Err(bad("its parent directory does not exist"));
    }
    let Ok(meta) = fs::symlink_metadata(output) else {
        return Ok(());
    };
    match (tarball, meta.is_dir()) {
        (true, true) => Err(bad(
            "it is a directory, but a name ending in .tar asks for a tarball",
        )),
        (true, false) => Ok(()),
        (false, true) if Layout::is_layout(output) || is_empty_dir(output) => Ok(()),
        (false, true) => Err(bad(
            "it is a directory that holds other files; name a new directory, an empty one, an \
             existing image layout to replace, or a .tar file",
        )),
        (false, false) => Err(bad(
            "it is an existing file; name a directory for an image layout, or end the name in .tar",
        )),
    }
}

fn is_empty_dir(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}

/// Moves the staged layout to `output`, as a directory or packed into a tarball.
fn finish(layout: &Layout, output: &Path, tarball: bool, staging: &Path) -> Result<(), ImageError> {
    if tarball {
        let tmp = staging.join("image.tar");
        let file = fs::File::create(&tmp).io(|| format!("creating {}", tmp.display()))?;
        let mut out = std::io::BufWriter::new(file);
        layout.write_tarball(&mut out)?;
        drop(out);
        return fs::rename(&tmp, output).io(|| format!("moving the image to {}", output.display()));
    }
    if output.exists() {
        fs::remove_dir_all(output).io(|| format!("replacing {}", output.display()))?;
    }
    fs::rename(layout.root(), output).io(|| format!("moving the image to {}", output.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn outputs_that_hold_other_things_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(check_output(&d.join("new"), false).is_ok());
        assert!(check_output(&d.join("new.tar"), true).is_ok());
        assert!(check_output(&d.join("missing/new"), false).is_err());
        fs::write(d.join("file"), b"x").unwrap();
        assert!(check_output(&d.join("file"), false)
            .unwrap_err()
            .to_string()
            .contains(".tar"));
        fs::create_dir(d.join("full")).unwrap();
        fs::write(d.join("full/x"), b"x").unwrap();
        assert!(check_output(&d.join("full"), false).is_err());
        fs::create_dir(d.join("empty")).unwrap();
        assert!(check_output(&d.join("empty"), false).is_ok());
    }
}

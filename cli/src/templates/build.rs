//! A template built into an OCI image on this machine: its root filesystem ([`super::rootfs`])
//! plus the static agent, through the same reproducible build as `tether image build --base`.
//! Kept in `DATA/templates/NAME` (through [`super::Staging`], so a failed build leaves nothing
//! behind), or written where `--output` says. Progress goes to a callback; the CLI draws it.

use std::path::PathBuf;
use std::time::Instant;

use tether_oci::config::Overrides;
use tether_oci::digest::Digest;

use super::{rootfs, spec, Record, Spec, Staging};

/// What to build.
pub(crate) struct LocalBuild {
    /// The template.
    pub spec: Spec,
    /// The Debian archive (`--mirror`).
    pub mirror: String,
    /// The static agent.
    pub agent: PathBuf,
    /// The tag in the layout.
    pub tag: String,
    /// The image's settings: the spec's, then the command line's.
    pub overrides: Overrides,
    /// Every timestamp, seconds since 1970.
    pub epoch: u64,
    /// Where to write the layout instead of `DATA/templates/NAME`.
    pub output: Option<PathBuf>,
}

/// What a local build wrote.
#[derive(Debug, serde::Serialize)]
pub(crate) struct LocalBuilt {
    /// The template.
    pub template: String,
    /// The OCI layout.
    pub layout: PathBuf,
    /// Its manifest digest.
    pub digest: Digest,
    /// The spec's digest.
    pub spec: String,
    /// Whether it is kept for `tether create --template` (no `--output`).
    pub registered: bool,
    /// How long the root filesystem took, seconds.
    pub rootfs_seconds: f64,
    /// How long the image took, seconds.
    pub image_seconds: f64,
}

/// The build time: `SOURCE_DATE_EPOCH` when set, else the templates' fixed date.
pub(crate) fn epoch() -> anyhow::Result<u64> {
    if std::env::var_os(tether_oci::constants::SOURCE_DATE_EPOCH).is_some() {
        return Ok(tether_oci::build::source_date_epoch()?);
    }
    Ok(spec::DEFAULT_EPOCH)
}

/// The spec's settings, then `extra`'s (`--env` added, `--workdir` and `--user` replacing).
pub(crate) fn overrides(spec: &Spec, extra: &Overrides) -> Overrides {
    let mut out = spec.overrides();
    out.start = extra.start;
    out.env.extend(extra.env.iter().cloned());
    if extra.workdir.is_some() {
        out.workdir.clone_from(&extra.workdir);
    }
    if extra.user.is_some() {
        out.user.clone_from(&extra.user);
    }
    out
}

/// The layout of the template `spec` built here from this very spec, if there is one.
pub(crate) fn reusable(spec: &Spec) -> Option<(PathBuf, Record)> {
    let record = super::built(spec.name)?;
    (record.spec == spec.digest()).then(|| (super::image_path(spec.name), record))
}

/// Builds `req`, telling `progress` each step and line of output.
pub(crate) fn local(req: LocalBuild, progress: &dyn Fn(&str)) -> anyhow::Result<LocalBuilt> {
    tether_oci::agent::check_static(&req.agent)?;
    let name = req.spec.name;
    let staging = Staging::new(name)?;
    let started = Instant::now();
    progress(&format!("building the root file system of {name}"));
    rootfs::build(
        &req.spec,
        &req.mirror,
        req.epoch,
        &staging.rootfs(),
        staging.path(),
        progress,
    )?;
    let rootfs_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let output = req.output.clone().unwrap_or_else(|| staging.image());
    let opts = tether_oci::BuildOptions {
        base: Some(staging.rootfs()),
        agent: req.agent.clone(),
        output,
        tag: req.tag.clone(),
        overrides: req.overrides.clone(),
        epoch: req.epoch,
    };
    let built = tether_oci::build(&opts, progress)?;
    let image_seconds = started.elapsed().as_secs_f64();
    let spec_digest = req.spec.digest();
    let (layout, registered) = match req.output {
        // The staging folder (and the root filesystem in it) goes when dropped.
        Some(output) => (output, false),
        None => {
            let record = Record {
                name: name.to_string(),
                spec: spec_digest.clone(),
                digest: built.digest.to_string(),
            };
            staging.commit(&record)?;
            (super::image_path(name), true)
        }
    };
    Ok(LocalBuilt {
        template: name.to_string(),
        layout,
        digest: built.digest,
        spec: spec_digest,
        registered,
        rootfs_seconds,
        image_seconds,
    })
}

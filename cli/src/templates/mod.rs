//! Templates: ready-made sandbox images named as E2B's pages name them (`base`,
//! `data-science`), so code written for E2B finds what it expects (`python`, `pip`, `node`,
//! `git`, the user `user` in `/home/user`).
//!
//! # Layout
//! - [`spec`]: each template as data (Debian packages, pinned wheels, user, working
//!   directory, environment) and its digest;
//! - `rootfs`: building a spec's root filesystem from the Debian archive and PyPI;
//! - `build`: that root filesystem and the agent as an OCI image, kept here;
//! - here: where built templates are kept on this machine, building one there atomically, and
//!   what `tether create --template NAME` asks for.
//!
//! A template built for local sandboxes is kept in `DATA/templates/NAME/` (`DATA` is the
//! relay's data directory on this machine, see [`tether_client::local::data_dir`]): `image/`,
//! the OCI layout `--image oci:PATH` runs, and [`RECORD_FILE`], what it was built from. On a
//! cloud provider a template is built under [`provider_name`].

pub(crate) mod build;
pub(crate) mod rootfs;
pub(crate) mod spec;

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub(crate) use spec::Spec;

/// The folder of `DATA` that holds built templates.
const TEMPLATES_DIR: &str = "templates";
/// A built template's OCI layout, in its folder.
const IMAGE_DIR: &str = "image";
/// A built template's record, in its folder.
pub(crate) const RECORD_FILE: &str = "template.json";
/// The prefix of a template's name on a cloud provider.
const PROVIDER_PREFIX: &str = "tether-";

/// What `DATA/templates/NAME/template.json` says.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    /// The template.
    pub name: String,
    /// The digest of the spec it was built from ([`Spec::digest`]).
    pub spec: String,
    /// The image's manifest digest.
    pub digest: String,
}

/// The template called `name`, or an error that lists the known ones (a clap value parser).
pub(crate) fn lookup(name: &str) -> Result<Spec, String> {
    spec::find(name).ok_or_else(|| {
        format!(
            "there is no template {name:?}; the templates are {} (`tether image templates` \
             lists them)",
            spec::names()
        )
    })
}

/// `DATA/templates`.
pub(crate) fn dir() -> PathBuf {
    tether_client::local::data_dir().join(TEMPLATES_DIR)
}

/// Where the template `name` is kept once built: `DATA/templates/NAME`.
pub(crate) fn folder(name: &str) -> PathBuf {
    dir().join(name)
}

/// The built template `name`'s OCI layout.
pub(crate) fn image_path(name: &str) -> PathBuf {
    folder(name).join(IMAGE_DIR)
}

/// The record of the built template `name`, if it is built.
pub(crate) fn built(name: &str) -> Option<Record> {
    let text = fs::read(folder(name).join(RECORD_FILE)).ok()?;
    let record: Record = serde_json::from_slice(&text).ok()?;
    image_path(name)
        .join("index.json")
        .is_file()
        .then_some(record)
}

/// The name a template is built under on a cloud provider: `tether-NAME` (not `NAME`, which
/// on E2B is E2B's own template, without the agent).
pub(crate) fn provider_name(name: &str) -> String {
    format!("{PROVIDER_PREFIX}{name}")
}

/// The command that builds `name` for local sandboxes, for messages.
pub(crate) fn build_command(name: &str) -> String {
    format!("tether image build --template {name}")
}

/// What `tether create --template NAME [--provider P]` sends as its image: the built
/// template's layout for the local provider, [`provider_name`] for any other.
pub(crate) fn image_for(name: &str, provider: Option<&str>) -> anyhow::Result<String> {
    lookup(name).map_err(anyhow::Error::msg)?;
    match provider {
        None | Some("local") => {
            if built(name).is_none() {
                anyhow::bail!(
                    "the template {name} is not built on this machine (no {}): build it with \
                     `{}` (as root; a few minutes, from the Debian archive and PyPI)",
                    image_path(name).display(),
                    build_command(name)
                );
            }
            Ok(format!("oci:{}", image_path(name).display()))
        }
        Some(_) => Ok(provider_name(name)),
    }
}

/// A template build in progress: a folder beside the built templates, removed unless
/// [`Staging::commit`] moves it into place, so a failed build leaves nothing behind and
/// the template built before it untouched.
pub(crate) struct Staging {
    dir: tempfile::TempDir,
    name: String,
}

impl Staging {
    /// A new staging folder for `name` in `DATA/templates`.
    pub(crate) fn new(name: &str) -> anyhow::Result<Staging> {
        let parent = dir();
        fs::create_dir_all(&parent)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", parent.display()))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!(".build-{name}-"))
            .tempdir_in(&parent)
            .map_err(|e| {
                anyhow::anyhow!("cannot create a build folder in {}: {e}", parent.display())
            })?;
        // mkdtemp's 0700 would keep an unprivileged relay and its sandboxes out of the image.
        fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        Ok(Staging {
            dir,
            name: name.to_string(),
        })
    }

    /// The staging folder.
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where the root filesystem is built.
    pub(crate) fn rootfs(&self) -> PathBuf {
        self.path().join("rootfs")
    }

    /// Where the OCI layout is written.
    pub(crate) fn image(&self) -> PathBuf {
        self.path().join(IMAGE_DIR)
    }

    /// Drops the root filesystem, records `record`, and moves the folder to
    /// `DATA/templates/NAME`, replacing the template built before (moved aside first, so the
    /// name never points at a partial image).
    pub(crate) fn commit(self, record: &Record) -> anyhow::Result<PathBuf> {
        let rootfs = self.rootfs();
        if rootfs.exists() {
            fs::remove_dir_all(&rootfs)
                .map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", rootfs.display()))?;
        }
        let json = serde_json::to_vec_pretty(record)?;
        fs::write(self.path().join(RECORD_FILE), json)?;
        let target = folder(&self.name);
        let old = dir().join(format!(".old-{}-{}", self.name, std::process::id()));
        let had_old = target.exists();
        if had_old {
            fs::rename(&target, &old)
                .map_err(|e| anyhow::anyhow!("cannot move {} aside: {e}", target.display()))?;
        }
        let staged = self.dir.keep();
        fs::rename(&staged, &target).map_err(|e| {
            anyhow::anyhow!("cannot move the template to {}: {e}", target.display())
        })?;
        if had_old {
            let _ = fs::remove_dir_all(&old);
        }
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = lookup("bse").unwrap_err();
        assert!(
            err.contains("\"bse\"") && err.contains("base, data-science"),
            "{err}"
        );
        assert_eq!(lookup("base").unwrap().name, "base");
    }

    #[test]
    fn cloud_providers_take_the_prefixed_name() {
        assert_eq!(image_for("base", Some("e2b")).unwrap(), "tether-base");
        assert!(image_for("nope", Some("e2b")).is_err());
    }
}

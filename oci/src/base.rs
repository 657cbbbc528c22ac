//! What an image is built on (`--base`): nothing (the agent alone), an image on disk (an
//! OCI layout directory or tarball, or a `docker save` tarball), or a root filesystem
//! directory that becomes one layer. Opening a base checks everything a build will need
//! (platform, every blob's digest, every file readable), so a broken base fails before any
//! output is written or any upload starts.

use std::fs;
use std::path::{Path, PathBuf};

use super::config::{Descriptor, ImageConfig};
use super::digest::Digest;
use super::error::ImageError;
use super::layer::{self, Entry};
use super::layout::Layout;
use super::source::ImageSource;

/// An opened, checked base.
#[derive(Debug)]
pub(crate) enum Base {
    /// No base.
    Scratch,
    /// An image; its layers are copied as they are.
    Image(Box<ImageSource>),
    /// A root filesystem directory, listed.
    Rootfs {
        /// The directory.
        dir: PathBuf,
        /// What its layer will hold.
        entries: Vec<Entry>,
    },
}

/// A layer a base puts into the new image.
#[derive(Clone, Debug)]
pub(crate) struct BaseLayer {
    /// The blob.
    pub desc: Descriptor,
    /// The uncompressed digest.
    pub diff_id: Digest,
    /// How the layer was made, when the base's config does not record it already.
    pub created_by: Option<&'static str>,
}

impl Base {
    /// Opens `path`, or no base. A tarball is unpacked under `scratch`.
    pub(crate) fn open(path: Option<&Path>, scratch: &Path) -> Result<Base, ImageError> {
        let Some(path) = path else {
            return Ok(Base::Scratch);
        };
        let meta = match fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::BaseMissing(path.to_path_buf()))
            }
            Err(e) => {
                return Err(ImageError::BadBase {
                    path: path.to_path_buf(),
                    reason: format!("it cannot be read ({e})"),
                })
            }
        };
        if meta.is_dir() && !Layout::is_layout(path) {
            let uid = nix::unistd::geteuid().as_raw();
            let gid = nix::unistd::getegid().as_raw();
            let entries =
                layer::entries_of_dir(path, uid, gid).map_err(|e| ImageError::BadBase {
                    path: path.to_path_buf(),
                    reason: format!("it is read as a root filesystem directory, and {e}"),
                })?;
            return Ok(Base::Rootfs {
                dir: path.to_path_buf(),
                entries,
            });
        }
        let source = ImageSource::open(path, None, scratch).map_err(|e| as_base_error(path, e))?;
        source.check_platform()?;
        source.verify_blobs().map_err(|e| as_base_error(path, e))?;
        Ok(Base::Image(Box::new(source)))
    }

    /// The config the new image starts from.
    pub(crate) fn config(&self) -> ImageConfig {
        match self {
            Base::Image(source) => source.config.clone(),
            Base::Scratch | Base::Rootfs { .. } => ImageConfig::default(),
        }
    }

    /// Puts the base's layers into `out` (copied, or written from the directory with every
    /// time `mtime`), bottom first.
    pub(crate) fn write_layers(
        &self,
        out: &Layout,
        mtime: u64,
    ) -> Result<Vec<BaseLayer>, ImageError> {
        match self {
            Base::Scratch => Ok(Vec::new()),
            Base::Image(source) => {
                let pairs = source
                    .manifest
                    .layers
                    .iter()
                    .zip(&source.config.rootfs.diff_ids);
                pairs
                    .map(|(desc, diff_id)| {
                        out.import_blob(&source.layout, desc)?;
                        Ok(BaseLayer {
                            desc: desc.clone(),
                            diff_id: diff_id.clone(),
                            created_by: None,
                        })
                    })
                    .collect()
            }
            Base::Rootfs { entries, .. } => {
                let written = layer::write(out, entries.clone(), mtime)?;
                Ok(vec![BaseLayer {
                    desc: written.desc,
                    diff_id: written.diff_id,
                    created_by: Some("tether image build: the base root filesystem directory"),
                }])
            }
        }
    }

    /// A short description, for progress and summaries.
    pub(crate) fn describe(&self) -> String {
        match self {
            Base::Scratch => "no base".into(),
            Base::Image(source) => format!(
                "the image {} ({} layers)",
                source.path.display(),
                source.manifest.layers.len()
            ),
            Base::Rootfs { dir, entries } => {
                format!(
                    "the directory {} ({} entries)",
                    dir.display(),
                    entries.len()
                )
            }
        }
    }
}

/// A failure reading an image base, phrased as a base error.
fn as_base_error(path: &Path, e: ImageError) -> ImageError {
    match e {
        ImageError::BadImage { reason, .. } => ImageError::BadBase {
            path: path.to_path_buf(),
            reason,
        },
        other => other,
    }
}

//! `tether image push`: an image on disk (layout directory or tarball) to a registry. The
//! image is opened and every blob verified first, then the registry is checked (reachable,
//! credentials accepted), then blobs the repository lacks are uploaded a few at a time with
//! a progress event each ([`PushProgress`]), and finally the manifest is put under the tag, byte for byte, so the
//! registry's digest is the image's.

use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use serde::Serialize;
use tokio::io::AsyncReadExt;

use super::config::Descriptor;
use super::constants::{DEFAULT_CHUNK_BYTES, PARALLEL_UPLOADS};
use super::digest::Digest;
use super::error::{ImageError, IoContext};
use super::reference::Reference;
use super::registry::Registry;
use super::source::ImageSource;

/// How to push.
#[derive(Clone, Debug)]
pub struct PushOptions {
    /// Speak plain HTTP (always so for loopback registries).
    pub insecure: bool,
    /// Blobs up to this size go in one request; larger ones in chunks of it.
    pub chunk_bytes: usize,
    /// Where to unpack a tarball while pushing it.
    pub scratch: PathBuf,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            insecure: false,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            scratch: std::env::temp_dir(),
        }
    }
}

/// What a push did.
#[derive(Clone, Debug, Serialize)]
pub struct Pushed {
    /// Where it went.
    pub reference: String,
    /// The manifest's digest (pull by `REGISTRY/NAME@DIGEST`).
    pub digest: Digest,
    /// Every blob, layers first, then the config.
    pub blobs: Vec<PushedBlob>,
}

/// One blob of a push.
#[derive(Clone, Debug, Serialize)]
pub struct PushedBlob {
    /// Its digest.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
    /// Whether the registry had it already (nothing was sent).
    pub existed: bool,
}

/// How a push is going, blob by blob, for a caller to show (the CLI draws a bar per blob).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushProgress {
    /// A blob's upload starts (or it is checked for).
    Started {
        /// Its digest.
        digest: Digest,
        /// Its size in bytes.
        size: u64,
    },
    /// `bytes` more of the blob were sent.
    Sent {
        /// The blob.
        digest: Digest,
        /// Bytes sent since the last event.
        bytes: u64,
    },
    /// The blob is in the repository: `existed` when it was there already.
    Finished {
        /// The blob.
        digest: Digest,
        /// Whether nothing had to be sent.
        existed: bool,
    },
}

/// Pushes the image at `image` to `target`, telling `progress` how each blob goes.
pub async fn push(
    image: &Path,
    target: &Reference,
    opts: &PushOptions,
    progress: &(dyn Fn(PushProgress) + Sync),
) -> Result<Pushed, ImageError> {
    let (path, scratch) = (image.to_path_buf(), opts.scratch.clone());
    let source = tokio::task::spawn_blocking(move || {
        let source = ImageSource::open(&path, None, &scratch)?;
        source.verify_blobs()?;
        Ok::<_, ImageError>(source)
    })
    .await
    .expect("opening the image does not panic")?;

    let registry = Registry::new(target, opts.insecure || target.is_loopback())?;
    registry.ping().await?;

    let mut blobs: Vec<Descriptor> = source.manifest.layers.clone();
    blobs.push(source.manifest.config.clone());
    let source = &source;
    let registry = &registry;
    let pushed: Vec<PushedBlob> = stream::iter(blobs)
        .map(|desc| async move {
            let path = source.layout.blob_path(&desc.digest);
            push_blob(registry, &desc, &path, opts.chunk_bytes.max(1), progress).await
        })
        .buffered(PARALLEL_UPLOADS)
        .try_collect()
        .await?;

    let media_type = source.manifest_desc.media_type.clone();
    let body = Bytes::from(source.layout.read_blob(&source.manifest_desc)?);
    let reported = registry
        .put_manifest(target.target_str(), &media_type, body)
        .await?;
    let digest = source.manifest_desc.digest.clone();
    if let Some(reported) = reported.filter(|r| r != digest.as_str()) {
        return Err(ImageError::Registry {
            registry: target.registry.clone(),
            what: format!("the manifest for {}", target.target_str()),
            status: 201,
            message: format!(
                ": it stored it as {reported}, not {digest} (the registry rewrote it)"
            ),
        });
    }
    Ok(Pushed {
        reference: target.to_string(),
        digest,
        blobs: pushed,
    })
}

/// Uploads one blob unless the repository has it.
async fn push_blob(
    registry: &Registry,
    desc: &Descriptor,
    path: &Path,
    chunk_bytes: usize,
    progress: &(dyn Fn(PushProgress) + Sync),
) -> Result<PushedBlob, ImageError> {
    let digest = &desc.digest;
    progress(PushProgress::Started {
        digest: digest.clone(),
        size: desc.size,
    });
    let sent = |bytes| {
        progress(PushProgress::Sent {
            digest: digest.clone(),
            bytes,
        })
    };
    let blob = PushedBlob {
        digest: desc.digest.clone(),
        size: desc.size,
        existed: registry.has_blob(&desc.digest).await?,
    };
    if blob.existed {
        progress(PushProgress::Finished {
            digest: digest.clone(),
            existed: true,
        });
        return Ok(blob);
    }
    let what = || format!("reading {}", path.display());
    let mut file = tokio::fs::File::open(path).await.io(what)?;
    let mut at = registry.start_upload(&desc.digest).await?;
    let mut offset = 0u64;
    loop {
        let left = desc.size.saturating_sub(offset);
        let chunk = read_chunk(&mut file, left.min(chunk_bytes as u64))
            .await
            .io(what)?;
        let last = offset + chunk.len() as u64 >= desc.size;
        if last {
            // The whole blob when it fits in a chunk (a monolithic upload), else its tail.
            let len = chunk.len() as u64;
            registry.finish_upload(&at, &desc.digest, chunk).await?;
            sent(len);
            break;
        }
        if chunk.is_empty() {
            return Err(ImageError::Io {
                what: what(),
                error: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the blob shrank while it was uploaded",
                ),
            });
        }
        let len = chunk.len() as u64;
        at = registry
            .upload_chunk(&at, offset, chunk, &desc.digest)
            .await?;
        offset += len;
        sent(len);
    }
    progress(PushProgress::Finished {
        digest: digest.clone(),
        existed: false,
    });
    Ok(blob)
}

/// The next `len` bytes of `file` (fewer at its end).
async fn read_chunk(file: &mut tokio::fs::File, len: u64) -> std::io::Result<Bytes> {
    let mut chunk = BytesMut::with_capacity(len as usize);
    let mut limited = file.take(len);
    while limited.read_buf(&mut chunk).await? > 0 {}
    Ok(chunk.freeze())
}

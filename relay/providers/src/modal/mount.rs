//! An image build's context as a Modal Mount, the way the SDK sends the files that a
//! Dockerfile's `COPY` names (`Image.dockerfile_commands(..., context_dir=...)`,
//! `add_local_file(..., copy=True)`; `modal/mount.py`): each file by its SHA-256 (asking
//! first which Modal already has, `MountBatchedCheckExistence`), the missing ones uploaded
//! with `MountPutFile` (inline when small, else by a blob id from [`super::blob`]), then the
//! set named with `MountGetOrCreate`, owned by the app. The image definition carries the
//! mount's id (`context_mount_id`) instead of the bytes, so no gRPC message nears the 4 MiB
//! that gRPC servers accept by default.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use super::client::Modal;
use super::pb;
use tether_relay_core::provider::ProviderError;

/// The SDK's `LARGE_FILE_LIMIT`: a file this large or larger never goes inline over gRPC.
const LARGE_FILE_LIMIT: usize = 4 << 20; // 4 MiB
/// Room for the rest of a `MountPutFile` message (hash, framing) under gRPC's 4 MiB: files
/// this close to [`LARGE_FILE_LIMIT`] go to blob storage too, where the SDK would send a
/// message just over the limit.
const MESSAGE_ROOM: usize = 64 << 10; // 64 KiB
/// Hashes asked about in one `MountBatchedCheckExistence` (the SDK's batch size).
const EXISTENCE_BATCH: usize = 64;
/// How long Modal may take to say it has a file put (the SDK's
/// `MOUNT_PUT_FILE_CLIENT_TIMEOUT`).
const PUT_FILE_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// The pause between two `MountPutFile` calls for a file Modal does not have yet.
const PUT_FILE_PAUSE: Duration = Duration::from_secs(1);

/// One file of a build context.
#[derive(Clone, Debug)]
pub(crate) struct ContextFile {
    /// Its path in the context, absolute (`/tether-agent`): what a `COPY` names.
    pub(crate) path: String,
    /// Its bytes.
    pub(crate) data: Bytes,
    /// Its permission bits.
    pub(crate) mode: u32,
}

/// Whether `len` bytes go to blob storage rather than inline.
fn by_blob(len: usize) -> bool {
    len >= LARGE_FILE_LIMIT - MESSAGE_ROOM
}

/// Uploads what Modal lacks of `files` and makes a mount of them owned by app `app_id`;
/// returns the mount's id.
pub(super) async fn create(
    modal: &Modal,
    http: &reqwest::Client,
    app_id: &str,
    files: &[ContextFile],
) -> Result<String, ProviderError> {
    let hashes: Vec<String> = files
        .iter()
        .map(|f| hex::encode(Sha256::digest(&f.data)))
        .collect();
    let mut missing = BTreeSet::new();
    let unique: BTreeSet<&String> = hashes.iter().collect();
    let unique: Vec<&String> = unique.into_iter().collect();
    for batch in unique.chunks(EXISTENCE_BATCH) {
        let req = pb::MountBatchedCheckExistenceRequest {
            sha256_hex_hashes: batch.iter().map(|h| (*h).clone()).collect(),
        };
        let answer = modal
            .call("MountBatchedCheckExistence", req, |mut c, r| async move {
                c.mount_batched_check_existence(r).await
            })
            .await?;
        missing.extend(answer.missing_sha256_hex_hashes);
    }
    for (file, hash) in files.iter().zip(&hashes) {
        // Each missing content once, whatever number of paths hold it.
        if missing.remove(hash) {
            put_file(modal, http, file, hash).await?;
        }
    }
    let req = pb::MountGetOrCreateRequest {
        object_creation_type: pb::ObjectCreationType::AnonymousOwnedByApp as i32,
        files: files
            .iter()
            .zip(&hashes)
            .map(|(f, hash)| pb::MountFile {
                filename: f.path.clone(),
                sha256_hex: hash.clone(),
                size: Some(f.data.len() as u64),
                mode: Some(f.mode),
            })
            .collect(),
        app_id: app_id.to_string(),
        ..Default::default()
    };
    let answer = modal
        .call("MountGetOrCreate", req, |mut c, r| async move {
            c.mount_get_or_create(r).await
        })
        .await?;
    Ok(answer.mount_id)
}

/// `MountPutFile` for `file` (inline, or by a blob id after uploading it), asked again until
/// Modal says it has the content.
async fn put_file(
    modal: &Modal,
    http: &reqwest::Client,
    file: &ContextFile,
    hash: &str,
) -> Result<(), ProviderError> {
    use pb::mount_put_file_request::DataOneof;
    let data = if by_blob(file.data.len()) {
        let blob_id = super::blob::upload(modal, http, file.data.clone())
            .await
            .map_err(|e| match e {
                ProviderError::Other(e) => ProviderError::Other(e.context(format!(
                    "cannot upload {} ({} bytes) for Modal's image build",
                    file.path,
                    file.data.len()
                ))),
                e => e,
            })?;
        DataOneof::DataBlobId(blob_id)
    } else {
        DataOneof::Data(file.data.to_vec())
    };
    let req = pb::MountPutFileRequest {
        sha256_hex: hash.to_string(),
        data_oneof: Some(data),
    };
    let started = Instant::now();
    loop {
        let answer = modal
            .call("MountPutFile", req.clone(), |mut c, r| async move {
                c.mount_put_file(r).await
            })
            .await?;
        if answer.exists {
            return Ok(());
        }
        if started.elapsed() >= PUT_FILE_TIMEOUT {
            return Err(ProviderError::Other(anyhow!(
                "Modal did not take {} within {PUT_FILE_TIMEOUT:?}",
                file.path
            )));
        }
        tokio::time::sleep(PUT_FILE_PAUSE).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_files_never_go_inline() {
        assert!(!by_blob(1 << 20));
        assert!(by_blob(LARGE_FILE_LIMIT));
        // Just under the SDK's limit, the message around the file would not fit in 4 MiB.
        assert!(by_blob(LARGE_FILE_LIMIT - 100));
        assert!(by_blob(5 << 20));
    }
}

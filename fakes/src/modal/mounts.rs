//! The fake's Mounts, as the SDK builds an image's context (`modal/mount.py`): files are
//! kept by SHA-256 (`MountBatchedCheckExistence` says which are missing; `MountPutFile`
//! stores one, inline or from a blob, after checking its SHA-256), and a mount names a set of
//! them with paths and modes (`MountGetOrCreate`, anonymous and owned by an app, or
//! ephemeral). The same files in the same app make the same mount, so an image definition
//! that names it is the same definition again. An image's `context_mount_id` is the build
//! context its `COPY` commands take files from.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use tonic::Status;

use super::pb::mount_put_file_request::DataOneof;
use super::pb::*;
use super::service::{Service, BASE62};
use crate::dockerfile::ContextEntry;
use crate::sandboxes::random_id;

/// A file's mode when the mount gives none.
const DEFAULT_MODE: u32 = 0o644;
/// Bytes kept in all files together.
const MAX_STORED_BYTES: usize = 2 << 30; // 2 GiB

/// Files by content, and mounts.
#[derive(Default)]
pub(super) struct MountTable {
    /// SHA-256 (hex) → content.
    files: HashMap<String, Bytes>,
    stored: usize,
    /// Mount id → path → (SHA-256, mode).
    mounts: HashMap<String, BTreeMap<String, (String, u32)>>,
    /// `app/digest of the files` → mount id.
    by_content: HashMap<String, String>,
}

impl MountTable {
    /// The files of mount `id`, as a build context.
    pub(super) fn context(&self, id: &str) -> Option<HashMap<String, ContextEntry>> {
        let mount = self.mounts.get(id)?;
        Some(
            mount
                .iter()
                .map(|(path, (hash, mode))| {
                    let entry = ContextEntry {
                        data: self.files.get(hash).cloned().unwrap_or_default(),
                        mode: Some(*mode),
                    };
                    (path.clone(), entry)
                })
                .collect(),
        )
    }
}

fn check_hash(hash: &str) -> Result<(), Status> {
    if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "{hash:?} is not a SHA-256 in hex"
        )))
    }
}

impl Service {
    /// `MountBatchedCheckExistence`: which of the hashes the fake has no file for.
    pub(super) fn mount_check_in(
        &self,
        req: MountBatchedCheckExistenceRequest,
    ) -> Result<MountBatchedCheckExistenceResponse, Status> {
        for hash in &req.sha256_hex_hashes {
            check_hash(hash)?;
        }
        let table = self.0.mounts.lock().expect("mount table");
        Ok(MountBatchedCheckExistenceResponse {
            missing_sha256_hex_hashes: req
                .sha256_hex_hashes
                .into_iter()
                .filter(|h| !table.files.contains_key(&h.to_ascii_lowercase()))
                .collect(),
        })
    }

    /// `MountPutFile`: stores the content (inline, or a stored blob's) under its SHA-256,
    /// which it must have. Without content, says whether the fake has it.
    pub(super) fn mount_put_file_in(
        &self,
        req: MountPutFileRequest,
    ) -> Result<MountPutFileResponse, Status> {
        check_hash(&req.sha256_hex)?;
        let hash = req.sha256_hex.to_ascii_lowercase();
        let data = match req.data_oneof {
            Some(DataOneof::Data(data)) => Bytes::from(data),
            Some(DataOneof::DataBlobId(id)) => self
                .0
                .blobs
                .lock()
                .expect("blob table")
                .data(&id)
                .ok_or_else(|| {
                Status::not_found(format!("Blob {id} not found, or not uploaded whole"))
            })?,
            None => {
                let exists = self
                    .0
                    .mounts
                    .lock()
                    .expect("mount table")
                    .files
                    .contains_key(&hash);
                return Ok(MountPutFileResponse { exists });
            }
        };
        let actual = hex::encode(Sha256::digest(&data));
        if actual != hash {
            return Err(Status::invalid_argument(format!(
                "the file's SHA-256 is {actual}, not {hash}"
            )));
        }
        let mut table = self.0.mounts.lock().expect("mount table");
        if !table.files.contains_key(&hash) {
            if table.stored + data.len() > MAX_STORED_BYTES {
                return Err(Status::resource_exhausted("the fake's file store is full"));
            }
            table.stored += data.len();
            table.files.insert(hash, data);
        }
        Ok(MountPutFileResponse { exists: true })
    }

    /// `MountGetOrCreate` of an anonymous mount (owned by an app, or ephemeral): every file
    /// must have been put, every path be absolute.
    pub(super) fn mount_get_or_create_in(
        &self,
        req: MountGetOrCreateRequest,
    ) -> Result<MountGetOrCreateResponse, Status> {
        let kind = ObjectCreationType::try_from(req.object_creation_type)
            .map_err(|_| Status::invalid_argument("unknown object creation type"))?;
        let owner = match kind {
            ObjectCreationType::AnonymousOwnedByApp => {
                let known = self
                    .0
                    .apps
                    .lock()
                    .expect("apps")
                    .values()
                    .any(|id| *id == req.app_id);
                if !known {
                    return Err(Status::not_found(format!("App {} not found", req.app_id)));
                }
                req.app_id.clone()
            }
            ObjectCreationType::Ephemeral => String::new(),
            _ => {
                return Err(Status::unimplemented(
                    "the fake makes anonymous mounts only (owned by an app, or ephemeral)",
                ))
            }
        };
        let mut table = self.0.mounts.lock().expect("mount table");
        let mut files = BTreeMap::new();
        for file in req.files {
            check_hash(&file.sha256_hex)?;
            let hash = file.sha256_hex.to_ascii_lowercase();
            if !file.filename.starts_with('/') {
                return Err(Status::invalid_argument(format!(
                    "mount path {:?} is not absolute",
                    file.filename
                )));
            }
            if !table.files.contains_key(&hash) {
                return Err(Status::failed_precondition(format!(
                    "file {} ({hash}) was never put (MountPutFile)",
                    file.filename
                )));
            }
            files.insert(file.filename, (hash, file.mode.unwrap_or(DEFAULT_MODE)));
        }
        let mut digest = Sha256::new();
        for (path, (hash, mode)) in &files {
            digest.update(format!("{path}\0{hash}\0{mode:o}\n"));
        }
        let checksum = hex::encode(digest.finalize());
        let key = format!("{owner}/{checksum}");
        let mount_id = match table.by_content.get(&key) {
            Some(id) => id.clone(),
            None => {
                let id = format!("mo-{}", random_id(22, BASE62));
                table.mounts.insert(id.clone(), files);
                table.by_content.insert(key, id.clone());
                id
            }
        };
        Ok(MountGetOrCreateResponse {
            mount_id,
            handle_metadata: Some(MountHandleMetadata {
                content_checksum_sha256_hex: checksum,
            }),
        })
    }
}

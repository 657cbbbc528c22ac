//! A COPY step's files (the agent, the image env file): the gzipped tar E2B's builder
//! unpacks, and the files hash it is stored under, computed as E2B's SDK computes it
//! (`calculate_files_hash` in `e2b/template/utils.py`): SHA-256 over `COPY {src} {dest}`, then
//! for each file its path relative to the context, its `st_mode` and size in decimal, and its
//! bytes.
//!
//! Our "context" is the tar itself: one regular file (the agent: [`AGENT_SOURCE`], mode
//! 0755), so the hash depends on the file's bytes and destination only, not on where the
//! binary happens to sit or its mode on this disk. The same agent is then uploaded once per
//! template, as E2B intends.

use std::path::Path;

use sha2::{Digest as _, Sha256};

use crate::cloud::context::one_file_tar_gz;
use crate::image::TargetError;

/// The agent's name in the tar, i.e. the COPY step's source.
pub(super) const AGENT_SOURCE: &str = "tether-agent";
/// The agent's permissions in the tar and in the template.
pub(super) const AGENT_MODE: u32 = 0o755;
/// `S_IFREG`: the file-type bits of a regular file in `st_mode`.
const S_IFREG: u32 = 0o100000;

/// The name of the image env file in its tar, i.e. its COPY step's source.
pub(super) const ENV_SOURCE: &str = "tether-image-env.json";
/// The image env file's permissions: readable by all (it holds what `--env` gave the image,
/// as an image's ENV does).
pub(super) const ENV_MODE: u32 = 0o644;

/// One file, ready to upload for a COPY step.
pub(super) struct Packed {
    /// The COPY step's `filesHash` (lowercase hex SHA-256).
    pub hash: String,
    /// The gzipped tar holding the file.
    pub tar_gz: Vec<u8>,
}

/// Reads the agent at `agent` and packs it as [`AGENT_SOURCE`] for a COPY to `dest`; `mtime`
/// is the tar entry's timestamp (the build's SOURCE_DATE_EPOCH), seconds.
pub(super) fn pack(agent: &Path, dest: &str, mtime: u64) -> Result<Packed, TargetError> {
    let bytes = std::fs::read(agent).map_err(|error| tether_oci::ImageError::Io {
        what: format!("cannot read the agent {}", agent.display()),
        error,
    })?;
    pack_bytes(AGENT_SOURCE, AGENT_MODE, &bytes, dest, mtime)
}

/// Packs `content` as `source` with `mode` for a COPY to `dest`.
pub(super) fn pack_bytes(
    source: &str,
    mode: u32,
    content: &[u8],
    dest: &str,
    mtime: u64,
) -> Result<Packed, TargetError> {
    Ok(Packed {
        hash: files_hash(source, mode, dest, content),
        tar_gz: one_file_tar_gz(source, mode, content, mtime).map_err(|error| {
            tether_oci::ImageError::Io {
                what: format!("cannot pack {source}"),
                error,
            }
        })?,
    })
}

/// The SDK's hash of a COPY of one file named `source` (with `mode`) holding `content` to
/// `dest`.
fn files_hash(source: &str, mode: u32, dest: &str, content: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(format!("COPY {source} {dest}").as_bytes());
    hash.update(source.as_bytes());
    hash.update((S_IFREG | mode).to_string().as_bytes());
    hash.update(content.len().to_string().as_bytes());
    hash.update(content);
    hex::encode(hash.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_the_sdks() {
        // E2B's Python SDK (2.x) on a context holding `tether-agent` = "hi", mode 0755:
        // `calculate_files_hash("tether-agent", "/usr/local/bin/tether-agent", ctx, [], False, None)`.
        let sdk = "b69ddc959a34274e8b25a065c9865feb87d8a0217aa8b26aa80c4cf69ce7e1bd";
        let hash = |dest| files_hash(AGENT_SOURCE, AGENT_MODE, dest, b"hi");
        assert_eq!(hash("/usr/local/bin/tether-agent"), sdk);
        assert_ne!(hash("/bin/tether-agent"), sdk);
    }

    #[test]
    fn the_tar_holds_the_agent_executable() {
        let packed = one_file_tar_gz(AGENT_SOURCE, AGENT_MODE, b"#!agent", 7).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&packed[..]));
        let mut entries = archive.entries().unwrap();
        let mut entry = entries.next().unwrap().unwrap();
        assert_eq!(entry.path().unwrap().to_str(), Some(AGENT_SOURCE));
        assert_eq!(entry.header().mode().unwrap(), 0o755);
        assert_eq!(entry.header().mtime().unwrap(), 7);
        let mut body = String::new();
        std::io::Read::read_to_string(&mut entry, &mut body).unwrap();
        assert_eq!(body, "#!agent");
        assert!(entries.next().is_none());
    }
}

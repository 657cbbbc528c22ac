//! The blueprint's build context: a gzipped tar holding only the static agent, as
//! [`AGENT_SOURCE`] with mode 0755, which the Dockerfile's COPY puts on the image's `PATH`.
//! Runloop takes a build context as an Object of content type `tgz`.

use std::io::Write;
use std::path::Path;

use flate2::write::GzEncoder;

use crate::provider::image::TargetError;
use tether_oci::constants::GZIP_LEVEL;

/// The agent's name in the context, i.e. the COPY's source.
pub(super) const AGENT_SOURCE: &str = "tether-agent";
/// The agent's permissions in the context (COPY keeps them).
const AGENT_MODE: u32 = 0o755;

/// Reads the agent at `agent` and packs it; `mtime` is the tar entry's timestamp (the build's
/// SOURCE_DATE_EPOCH), seconds.
pub(super) fn pack(agent: &Path, mtime: u64) -> Result<Vec<u8>, TargetError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |error| tether_oci::ImageError::Io { what, error }
    };
    let bytes =
        std::fs::read(agent).map_err(io(&format!("cannot read the agent {}", agent.display())))?;
    Ok(tar_gz(&bytes, mtime).map_err(io("cannot pack the agent"))?)
}

fn tar_gz(content: &[u8], mtime: u64) -> std::io::Result<Vec<u8>> {
    let gz = GzEncoder::new(Vec::new(), flate2::Compression::new(GZIP_LEVEL));
    let mut tar = tar::Builder::new(gz);
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(AGENT_MODE);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(mtime);
    header.set_size(content.len() as u64);
    header.set_cksum();
    tar.append_data(&mut header, AGENT_SOURCE, content)?;
    let mut gz = tar.into_inner()?;
    gz.flush()?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_holds_the_agent_executable_only() {
        let packed = tar_gz(b"#!agent", 7).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&packed[..]));
        let mut entries = archive.entries().unwrap();
        let mut entry = entries.next().unwrap().unwrap();
        assert_eq!(entry.path().unwrap().to_str(), Some(AGENT_SOURCE));
        assert_eq!(entry.header().mode().unwrap(), 0o755);
        let mut body = String::new();
        std::io::Read::read_to_string(&mut entry, &mut body).unwrap();
        assert_eq!(body, "#!agent");
        assert!(entries.next().is_none());
    }
}

//! The blueprint's build context: a gzipped tar holding only the static agent, as
//! [`AGENT_SOURCE`] with mode 0755, which the Dockerfile's COPY puts on the image's `PATH`.
//! Runloop takes a build context as an Object of content type `tgz`.

use std::path::Path;

use crate::cloud::context::one_file_tar_gz;
use crate::image::TargetError;

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
    Ok(one_file_tar_gz(AGENT_SOURCE, AGENT_MODE, &bytes, mtime)
        .map_err(io("cannot pack the agent"))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_holds_the_agent_executable_only() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("some-agent-build");
        std::fs::write(&agent, b"#!agent").unwrap();
        let packed = pack(&agent, 7).unwrap();
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

    #[test]
    fn a_missing_agent_is_named() {
        let err = pack(Path::new("/nonexistent/tether-agent"), 7).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/tether-agent"),
            "{err}"
        );
    }
}

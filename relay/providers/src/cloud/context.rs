//! A build context of one file, as the E2B template builder and Runloop's blueprint builder
//! both take it: a gzipped tar holding one regular file owned by root, with the mode and
//! timestamp the caller gives (the build's SOURCE_DATE_EPOCH, so the same agent packs to the
//! same bytes).

use std::io::Write;

use flate2::write::GzEncoder;
use tether_oci::constants::GZIP_LEVEL;

/// A gzipped tar of `content` as `name` with `mode` and `mtime` (seconds), owned by root.
pub(crate) fn one_file_tar_gz(
    name: &str,
    mode: u32,
    content: &[u8],
    mtime: u64,
) -> std::io::Result<Vec<u8>> {
    let gz = GzEncoder::new(Vec::new(), flate2::Compression::new(GZIP_LEVEL));
    let mut tar = tar::Builder::new(gz);
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(mtime);
    header.set_size(content.len() as u64);
    header.set_cksum();
    tar.append_data(&mut header, name, content)?;
    let mut gz = tar.into_inner()?;
    gz.flush()?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tar_holds_the_one_file_as_given() {
        let packed = one_file_tar_gz("tether-agent", 0o755, b"#!agent", 7).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&packed[..]));
        let mut entries = archive.entries().unwrap();
        let mut entry = entries.next().unwrap().unwrap();
        assert_eq!(entry.path().unwrap().to_str(), Some("tether-agent"));
        let header = entry.header();
        assert_eq!(header.mode().unwrap(), 0o755);
        assert_eq!(header.mtime().unwrap(), 7);
        assert_eq!((header.uid().unwrap(), header.gid().unwrap()), (0, 0));
        let mut body = String::new();
        std::io::Read::read_to_string(&mut entry, &mut body).unwrap();
        assert_eq!(body, "#!agent");
        assert!(entries.next().is_none());
        // The same input packs to the same bytes.
        assert_eq!(
            packed,
            one_file_tar_gz("tether-agent", 0o755, b"#!agent", 7).unwrap()
        );
    }
}

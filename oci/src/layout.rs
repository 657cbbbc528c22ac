//! An OCI image layout on disk (<https://github.com/opencontainers/image-spec/blob/main/image-layout.md>):
//! the `oci-layout` marker, `index.json`, and content-addressed `blobs/sha256/<hex>`. Writing
//! blobs (each checked against its digest, put in place by rename), reading them back with
//! their size and digest verified, and packing a layout into a reproducible tarball.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::config::{Descriptor, Index, Platform, MEDIA_INDEX, REF_NAME};
use super::constants::{ARCHITECTURE, MAX_JSON_BYTES, OS};
use super::digest::{digest_reader, Digest, HashingWriter};
use super::error::{ImageError, IoContext};

/// The marker file's name and content.
const MARKER: &str = "oci-layout";
const MARKER_CONTENT: &str = r#"{"imageLayoutVersion":"1.0.0"}"#;
/// The index's file name.
const INDEX: &str = "index.json";
/// Where blobs live, under the layout.
const BLOBS: &str = "blobs/sha256";
/// Blobs' permissions: readable by all, like every other file of a layout.
const BLOB_MODE: u32 = 0o644;

/// An image layout directory.
#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// Makes `dir` (which must not hold a layout yet) a new, empty layout.
    pub fn create(dir: &Path) -> Result<Layout, ImageError> {
        fs::create_dir_all(dir.join(BLOBS)).io(|| format!("creating {}", dir.display()))?;
        fs::write(dir.join(MARKER), MARKER_CONTENT).io(|| format!("writing {}", dir.display()))?;
        Ok(Layout {
            root: dir.to_path_buf(),
        })
    }

    /// Opens the layout at `dir`, checking its marker.
    pub(crate) fn open(dir: &Path) -> Result<Layout, ImageError> {
        let bad = |reason: String| ImageError::BadImage {
            path: dir.to_path_buf(),
            reason,
        };
        let marker = fs::read_to_string(dir.join(MARKER)).map_err(|e| {
            bad(format!(
                "it has no readable `{MARKER}` file ({e}), so it is not an OCI image layout"
            ))
        })?;
        let version: serde_json::Value = serde_json::from_str(&marker)
            .map_err(|e| bad(format!("its `{MARKER}` file is not JSON: {e}")))?;
        match version["imageLayoutVersion"].as_str() {
            Some(v) if v.starts_with("1.") => Ok(Layout {
                root: dir.to_path_buf(),
            }),
            other => Err(bad(format!("unsupported image layout version {other:?}"))),
        }
    }

    /// Whether `dir` looks like a layout (has the marker file).
    pub(crate) fn is_layout(dir: &Path) -> bool {
        dir.join(MARKER).is_file()
    }

    /// The layout's directory.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The file of the blob `digest` (which may not exist).
    pub(crate) fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join(BLOBS).join(digest.hex())
    }

    /// A writer for a new blob; [`BlobWriter::finish`] names it by its digest.
    pub(crate) fn blob_writer(&self) -> Result<BlobWriter, ImageError> {
        let dir = self.root.join(BLOBS);
        let file = tempfile::Builder::new()
            .prefix(".incoming-")
            .tempfile_in(&dir)
            .io(|| format!("creating a blob in {}", dir.display()))?;
        Ok(BlobWriter {
            inner: HashingWriter::new(BufWriter::new(file)),
            layout: self.clone(),
        })
    }

    /// Stores `bytes` as a blob of type `media_type`.
    pub(crate) fn write_blob(
        &self,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<Descriptor, ImageError> {
        let mut writer = self.blob_writer()?;
        writer
            .write_all(bytes)
            .io(|| format!("writing a blob in {}", self.root.display()))?;
        let (digest, size) = writer.finish()?;
        Ok(descriptor(media_type, digest, size))
    }

    /// Stores `value` as a JSON blob (compact, keys in declaration order: reproducible).
    pub fn write_json<T: Serialize>(
        &self,
        media_type: &str,
        value: &T,
    ) -> Result<Descriptor, ImageError> {
        let bytes = serde_json::to_vec(value).expect("image documents serialize");
        self.write_blob(media_type, &bytes)
    }

    /// Copies the blob `desc` of `other` into this layout (a hard link when they share a
    /// file system), checking its size and digest.
    pub fn import_blob(&self, other: &Layout, desc: &Descriptor) -> Result<(), ImageError> {
        other.open_blob(desc)?;
        let src = other.blob_path(&desc.digest);
        let dst = self.blob_path(&desc.digest);
        if dst.exists() {
            return Ok(());
        }
        if fs::hard_link(&src, &dst).is_ok() {
            return Ok(());
        }
        let mut writer = self.blob_writer()?;
        let mut file = File::open(&src).io(|| format!("opening {}", src.display()))?;
        io::copy(&mut file, &mut writer).io(|| format!("copying {}", src.display()))?;
        let (digest, size) = writer.finish()?;
        if digest != desc.digest || size != desc.size {
            return Err(other.bad(format!("blob {} changed while it was copied", desc.digest)));
        }
        Ok(())
    }

    /// Opens the blob `desc`, checking that it exists with the size the descriptor says.
    pub(crate) fn open_blob(&self, desc: &Descriptor) -> Result<File, ImageError> {
        let path = self.blob_path(&desc.digest);
        let file = File::open(&path).map_err(|e| {
            self.bad(format!(
                "its blob {} ({}) cannot be opened: {e}",
                desc.digest, desc.media_type
            ))
        })?;
        let len = file
            .metadata()
            .io(|| format!("reading {}", path.display()))?
            .len();
        if len != desc.size {
            return Err(self.bad(format!(
                "its blob {} is {len} bytes but the image says {} (a truncated copy?)",
                desc.digest, desc.size
            )));
        }
        Ok(file)
    }

    /// Hashes the blob `desc` and fails unless it matches its digest.
    pub(crate) fn verify_blob(&self, desc: &Descriptor) -> Result<(), ImageError> {
        let file = self.open_blob(desc)?;
        let (digest, _) = digest_reader(io::BufReader::new(file))
            .io(|| format!("reading {}", self.blob_path(&desc.digest).display()))?;
        if digest != desc.digest {
            return Err(self.bad(format!(
                "its blob {} is corrupt: its content hashes to {digest}",
                desc.digest
            )));
        }
        Ok(())
    }

    /// Reads the blob `desc` whole, verified: for JSON documents and other small blobs.
    pub(crate) fn read_blob(&self, desc: &Descriptor) -> Result<Vec<u8>, ImageError> {
        if desc.size > MAX_JSON_BYTES {
            return Err(self.bad(format!(
                "its document {} is {} bytes, too large to be one",
                desc.digest, desc.size
            )));
        }
        let mut bytes = Vec::with_capacity(desc.size as usize);
        self.open_blob(desc)?
            .read_to_end(&mut bytes)
            .io(|| format!("reading {}", self.blob_path(&desc.digest).display()))?;
        if Digest::of(&bytes) != desc.digest {
            return Err(self.bad(format!(
                "its blob {} is corrupt: its content does not match its digest",
                desc.digest
            )));
        }
        Ok(bytes)
    }

    /// Reads and parses the JSON blob `desc`.
    pub(crate) fn read_json<T: DeserializeOwned>(
        &self,
        desc: &Descriptor,
    ) -> Result<T, ImageError> {
        let bytes = self.read_blob(desc)?;
        serde_json::from_slice(&bytes).map_err(|e| {
            self.bad(format!(
                "its {} {} is not valid: {e}",
                desc.media_type, desc.digest
            ))
        })
    }

    /// The layout's `index.json`.
    pub(crate) fn index(&self) -> Result<Index, ImageError> {
        let path = self.root.join(INDEX);
        let bytes =
            fs::read(&path).map_err(|e| self.bad(format!("its {INDEX} cannot be read: {e}")))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| self.bad(format!("its {INDEX} is not a valid image index: {e}")))
    }

    /// Writes `index.json` listing `manifests`.
    pub(crate) fn write_index(&self, manifests: Vec<Descriptor>) -> Result<(), ImageError> {
        let index = Index {
            schema_version: 2,
            media_type: Some(MEDIA_INDEX.into()),
            manifests,
            annotations: None,
        };
        let bytes = serde_json::to_vec(&index).expect("the index serializes");
        let path = self.root.join(INDEX);
        fs::write(&path, bytes).io(|| format!("writing {}", path.display()))
    }

    /// Writes `index.json` listing the one linux/amd64 image whose manifest is `manifest`,
    /// under `tag` when given; returns the manifest's digest.
    pub fn write_image_index(
        &self,
        mut manifest: Descriptor,
        tag: Option<&str>,
    ) -> Result<Digest, ImageError> {
        manifest.platform = Some(Platform {
            architecture: ARCHITECTURE.into(),
            os: OS.into(),
            variant: None,
        });
        manifest.annotations = tag.map(|t| [(REF_NAME.to_string(), t.to_string())].into());
        let digest = manifest.digest.clone();
        self.write_index(vec![manifest])?;
        Ok(digest)
    }

    /// An [`ImageError::BadImage`] about this layout.
    pub(crate) fn bad(&self, reason: String) -> ImageError {
        ImageError::BadImage {
            path: self.root.clone(),
            reason,
        }
    }

    /// Writes the layout as a tarball to `out`: entries sorted, owned by root, all times
    /// zero, so the same layout always gives the same bytes.
    pub(crate) fn write_tarball(&self, out: impl Write) -> Result<(), ImageError> {
        let mut tar = tar::Builder::new(out);
        let mut names = vec![MARKER.to_string(), INDEX.to_string()];
        let blobs = self.root.join(BLOBS);
        let mut digests: Vec<String> = fs::read_dir(&blobs)
            .io(|| format!("listing {}", blobs.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| !name.starts_with('.'))
            .collect();
        digests.sort();
        for dir in ["blobs/", "blobs/sha256/"] {
            let mut header = tar_header(tar::EntryType::Directory, 0o755, 0);
            tar.append_data(&mut header, dir, io::empty())
                .io(|| "writing the image tarball".into())?;
        }
        names.extend(digests.into_iter().map(|d| format!("{BLOBS}/{d}")));
        for name in names {
            let path = self.root.join(&name);
            let file = File::open(&path).io(|| format!("opening {}", path.display()))?;
            let len = file
                .metadata()
                .io(|| format!("reading {}", path.display()))?
                .len();
            let mut header = tar_header(tar::EntryType::Regular, 0o644, len);
            tar.append_data(&mut header, &name, file)
                .io(|| format!("adding {} to the image tarball", path.display()))?;
        }
        tar.into_inner()
            .and_then(|mut w| w.flush())
            .io(|| "finishing the image tarball".into())
    }

    /// Unpacks the layout tarball `tarball` into the empty directory `dir`. Only the layout's
    /// own files are taken; links and paths outside it are refused.
    pub(crate) fn extract_tarball(tarball: &Path, dir: &Path) -> Result<Layout, ImageError> {
        let bad = |reason: String| ImageError::BadImage {
            path: tarball.to_path_buf(),
            reason,
        };
        let file = File::open(tarball).io(|| format!("opening {}", tarball.display()))?;
        let mut archive = tar::Archive::new(io::BufReader::new(file));
        let entries = archive
            .entries()
            .map_err(|e| bad(format!("it is not a tar archive: {e}")))?;
        for entry in entries {
            let mut entry =
                entry.map_err(|e| bad(format!("it is not a valid tar archive: {e}")))?;
            let path = entry
                .path()
                .map_err(|e| bad(format!("an entry has an unreadable name: {e}")))?
                .into_owned();
            let name = path.to_string_lossy().trim_start_matches("./").to_string();
            match entry.header().entry_type() {
                tar::EntryType::Directory => continue,
                tar::EntryType::Regular | tar::EntryType::Continuous => {}
                other => {
                    return Err(bad(format!(
                        "{name} is a {other:?}, but an image tarball holds plain files"
                    )))
                }
            }
            let wanted = name == MARKER
                || name == INDEX
                || name
                    .strip_prefix("blobs/sha256/")
                    .is_some_and(|h| Digest::parse(&format!("sha256:{h}")).is_ok());
            if !wanted {
                continue;
            }
            let dst = dir.join(&name);
            if let Some(parent) = dst.parent() {
                fs::create_dir_all(parent).io(|| format!("creating {}", parent.display()))?;
            }
            let mut out = File::create(&dst).io(|| format!("creating {}", dst.display()))?;
            io::copy(&mut entry, &mut out)
                .map_err(|e| bad(format!("{name} cannot be read: {e}")))?;
        }
        Layout::open(dir).map_err(|_| {
            bad(format!(
                "it holds no `{MARKER}` file, so it is not an OCI image tarball"
            ))
        })
    }
}

/// A blob being written; hashed as it goes.
pub(crate) struct BlobWriter {
    inner: HashingWriter<BufWriter<tempfile::NamedTempFile>>,
    layout: Layout,
}

impl BlobWriter {
    /// Puts the blob in place under its digest; returns the digest and size.
    pub(crate) fn finish(self) -> Result<(Digest, u64), ImageError> {
        let (buffered, digest, size) = self.inner.finish();
        let what = || format!("writing a blob in {}", self.layout.root.display());
        let file = buffered.into_inner().map_err(|e| e.into_error()).io(what)?;
        // Blobs are shared read-only content (tempfile creates files 0600).
        fs::set_permissions(file.path(), fs::Permissions::from_mode(BLOB_MODE)).io(what)?;
        let dst = self.layout.blob_path(&digest);
        file.persist(&dst).map_err(|e| e.error).io(what)?;
        Ok((digest, size))
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A descriptor without platform or annotations.
pub(crate) fn descriptor(media_type: &str, digest: Digest, size: u64) -> Descriptor {
    Descriptor {
        media_type: media_type.into(),
        digest,
        size,
        platform: None,
        annotations: None,
    }
}

/// A tar header with every field that could vary between builds fixed.
pub(crate) fn tar_header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// Reads JSON from a file of at most [`MAX_JSON_BYTES`].
pub(crate) fn read_json_file<T: DeserializeOwned>(path: &Path) -> Result<T, String> {
    let file = File::open(path).map_err(|e| format!("{} cannot be read: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_JSON_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{} cannot be read: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{} is not valid: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MEDIA_CONFIG;

    #[test]
    fn blobs_are_content_addressed_and_verified() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(dir.path()).unwrap();
        let desc = layout.write_blob(MEDIA_CONFIG, b"{}").unwrap();
        assert_eq!(desc.digest, Digest::of(b"{}"));
        assert_eq!(layout.read_blob(&desc).unwrap(), b"{}");
        layout.verify_blob(&desc).unwrap();

        fs::write(layout.blob_path(&desc.digest), b"[]").unwrap();
        let err = layout.read_blob(&desc).unwrap_err().to_string();
        assert!(err.contains("corrupt"), "{err}");
        fs::write(layout.blob_path(&desc.digest), b"{}\n").unwrap();
        let err = layout.read_blob(&desc).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
    }

    #[test]
    fn tarballs_are_reproducible_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::create(&dir.path().join("a")).unwrap();
        let desc = layout.write_blob(MEDIA_CONFIG, b"{}").unwrap();
        layout.write_index(vec![desc.clone()]).unwrap();
        let mut first = Vec::new();
        layout.write_tarball(&mut first).unwrap();
        let mut second = Vec::new();
        layout.write_tarball(&mut second).unwrap();
        assert_eq!(first, second);

        let tarball = dir.path().join("a.tar");
        fs::write(&tarball, &first).unwrap();
        let out = dir.path().join("b");
        let back = Layout::extract_tarball(&tarball, &out).unwrap();
        assert_eq!(back.index().unwrap().manifests, std::slice::from_ref(&desc));
        assert_eq!(back.read_blob(&desc).unwrap(), b"{}");

        fs::write(&tarball, b"not a tarball at all").unwrap();
        assert!(Layout::extract_tarball(&tarball, &dir.path().join("c")).is_err());
    }
}

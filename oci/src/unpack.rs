//! Turning an OCI image on disk (`oci:PATH` or `oci:PATH:TAG`, a layout directory or
//! tarball) into a root filesystem directory and the settings to run it with, for the local
//! provider. Root filesystems are cached under their manifest digest: the first create
//! unpacks (in a staging directory, moved into place when complete, so a crash or a
//! concurrent create never leaves half an image in the cache), later ones only read the
//! image's index, manifest and config.

use std::fs::{self, File};
use std::path::{Component, Path, PathBuf};

use super::agent;
use super::apply::{layer_reader, Applier};
use super::config::{ImageConfig, RunConfig};
use super::constants::AGENT_LABEL;
use super::digest::Digest;
use super::error::{ImageError, IoContext};
use super::layout::read_json_file;
use super::source::ImageSource;

/// The transport prefix of an image reference on disk.
pub(crate) const OCI_PREFIX: &str = "oci:";
/// In a cache entry: the root filesystem, and the image config.
const ROOTFS: &str = "rootfs";
const CONFIG: &str = "config.json";

/// An image unpacked into a root filesystem.
#[derive(Clone, Debug)]
pub struct PreparedImage {
    /// The image's manifest digest.
    pub digest: Digest,
    /// The root filesystem directory (shared by every sandbox of the image: mount it
    /// read-only, e.g. as an overlay's lower layer).
    pub rootfs: PathBuf,
    /// How the image says to run it: entrypoint, command, environment, working directory,
    /// user.
    pub config: RunConfig,
    /// Whether this call unpacked it (false: it came from the cache).
    pub unpacked: bool,
}

impl PreparedImage {
    /// The image's environment (`KEY=VALUE`).
    pub fn env(&self) -> &[String] {
        self.config.env.as_deref().unwrap_or_default()
    }

    /// The host path of the static agent baked into the image, if it has one: the file its
    /// `dev.tether.agent` label names, else its entrypoint when that is a `tether-agent`.
    pub fn agent(&self) -> Option<PathBuf> {
        let labelled = self
            .config
            .labels
            .as_ref()
            .and_then(|l| l.get(AGENT_LABEL))
            .cloned();
        let entrypoint = self
            .config
            .entrypoint
            .as_ref()
            .and_then(|e| e.first())
            .cloned();
        let path = labelled.or(entrypoint.filter(|p| p.ends_with("/tether-agent")))?;
        let rel = Path::new(path.strip_prefix('/')?);
        // The image names the path: `..` or a link on the way could lead anywhere on the
        // host. Only a plain file reached through plain directories inside the root counts.
        let mut host = self.rootfs.clone();
        for part in rel.components() {
            let Component::Normal(part) = part else {
                return None;
            };
            host.push(part);
            if fs::symlink_metadata(&host).ok()?.file_type().is_symlink() {
                return None;
            }
        }
        (host.is_file() && agent::check_static(&host).is_ok()).then_some(host)
    }
}

/// Whether a `--image` value names an OCI image on disk.
pub fn is_oci_ref(image: &str) -> bool {
    image.starts_with(OCI_PREFIX)
}

/// Unpacks the image `image_ref` (`oci:PATH` or `oci:PATH:TAG`) into `cache_dir`, or finds
/// it there, checking that it is a linux/amd64 image with intact blobs.
pub fn prepare_rootfs(image_ref: &str, cache_dir: &Path) -> Result<PreparedImage, ImageError> {
    let (path, tag) = parse_ref(image_ref);
    fs::create_dir_all(cache_dir)
        .io(|| format!("creating the image cache {}", cache_dir.display()))?;
    let source = ImageSource::open(&path, tag.as_deref(), cache_dir)?;
    source.check_platform()?;
    let digest = source.manifest_desc.digest.clone();
    let entry = cache_dir.join(digest.hex());
    if entry.join(CONFIG).is_file() {
        touch(&entry);
        return cached(&entry, digest, &path);
    }

    source.verify_blobs()?;
    let staging = tempfile::Builder::new()
        .prefix(".unpacking-")
        .tempdir_in(cache_dir)
        .io(|| format!("creating a directory in {}", cache_dir.display()))?;
    let image_dir = staging.path().join("image");
    let rootfs = image_dir.join(ROOTFS);
    fs::create_dir_all(&rootfs).io(|| format!("creating {}", rootfs.display()))?;
    let mut applier = Applier::new(&rootfs, &path);
    for layer in &source.manifest.layers {
        let file: File = source.layout.open_blob(layer)?;
        let reader =
            layer_reader(file, &layer.media_type).map_err(|reason| source.layout.bad(reason))?;
        applier.apply(reader, layer.digest.short())?;
    }
    if applier.skipped_devices > 0 {
        tracing::debug!(
            "left out {} device nodes of {} (creating them needs root)",
            applier.skipped_devices,
            path.display()
        );
    }
    applier.finish()?;
    let config_path = image_dir.join(CONFIG);
    fs::write(
        &config_path,
        serde_json::to_vec(&source.config).expect("the config serializes"),
    )
    .io(|| format!("writing {}", config_path.display()))?;
    match fs::rename(&image_dir, &entry) {
        Ok(()) => {}
        // Another create unpacked the same image first; theirs is as good as ours.
        Err(_) if entry.join(CONFIG).is_file() => return cached(&entry, digest, &path),
        Err(e) => return Err(e).io(|| format!("moving the unpacked image to {}", entry.display())),
    }
    Ok(PreparedImage {
        digest,
        rootfs: entry.join(ROOTFS),
        config: source.config.config.clone().unwrap_or_default(),
        unpacked: true,
    })
}

/// Marks a cache entry as just used (its directory's mtime orders [`prune_cache`]).
fn touch(entry: &Path) {
    if let Ok(dir) = File::open(entry) {
        let _ = dir.set_modified(std::time::SystemTime::now());
    }
}

/// Removes unpacked images from `cache_dir` that no sandbox uses (`in_use`: digests in hex),
/// keeping the `keep_unused` most recently used of them for quick re-creates. Each goes by a
/// rename out of the cache first, so a concurrent create never finds half an entry. Returns
/// how many were removed.
pub fn prune_cache(
    cache_dir: &Path,
    in_use: &std::collections::HashSet<String>,
    keep_unused: usize,
) -> usize {
    let Ok(entries) = fs::read_dir(cache_dir) else {
        return 0;
    };
    let mut unused: Vec<(std::time::SystemTime, String)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let used = e.metadata().ok()?.modified().ok()?;
            (!name.starts_with('.') && !in_use.contains(&name)).then_some((used, name))
        })
        .collect();
    unused.sort_by_key(|u| std::cmp::Reverse(u.0));
    let mut removed = 0;
    for (_, name) in unused.into_iter().skip(keep_unused) {
        let doomed = cache_dir.join(format!(".removing-{name}"));
        if fs::rename(cache_dir.join(&name), &doomed).is_ok() {
            match fs::remove_dir_all(&doomed) {
                Ok(()) => removed += 1,
                Err(e) => tracing::warn!("cannot remove {}: {e}", doomed.display()),
            }
        }
    }
    removed
}

/// A cache entry that is already complete.
fn cached(entry: &Path, digest: Digest, image: &Path) -> Result<PreparedImage, ImageError> {
    let config: ImageConfig =
        read_json_file(&entry.join(CONFIG)).map_err(|reason| ImageError::BadImage {
            path: image.to_path_buf(),
            reason: format!(
                "its cached copy is damaged ({reason}); delete {} to unpack it again",
                entry.display()
            ),
        })?;
    Ok(PreparedImage {
        digest,
        rootfs: entry.join(ROOTFS),
        config: config.config.unwrap_or_default(),
        unpacked: false,
    })
}

/// `oci:PATH[:TAG]` → (PATH, TAG). A colon is part of the path when the whole path exists.
fn parse_ref(image_ref: &str) -> (PathBuf, Option<String>) {
    let rest = image_ref.strip_prefix(OCI_PREFIX).unwrap_or(image_ref);
    if Path::new(rest).exists() {
        return (PathBuf::from(rest), None);
    }
    match rest.rsplit_once(':') {
        Some((path, tag)) if !tag.contains('/') && Path::new(path).exists() => {
            (PathBuf::from(path), Some(tag.to_string()))
        }
        _ => (PathBuf::from(rest), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baked_agent_is_only_found_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        fs::create_dir_all(rootfs.join("usr")).unwrap();
        std::os::unix::fs::symlink("/usr", rootfs.join("host")).unwrap();
        let image = |path: &str| PreparedImage {
            digest: Digest::of(b""),
            rootfs: rootfs.clone(),
            config: RunConfig {
                labels: Some([(AGENT_LABEL.to_string(), path.to_string())].into()),
                ..Default::default()
            },
            unpacked: false,
        };
        // Debian's static busybox stands in for a static agent, where installed.
        if agent::check_static(Path::new("/bin/busybox")).is_ok() {
            fs::copy("/bin/busybox", rootfs.join("usr/agent")).unwrap();
            assert_eq!(image("/usr/agent").agent(), Some(rootfs.join("usr/agent")));
        }
        assert_eq!(image("/../../bin/busybox").agent(), None);
        assert_eq!(image("/host/bin/busybox").agent(), None);
        assert_eq!(image("relative").agent(), None);
    }

    #[test]
    fn pruning_keeps_images_in_use_and_the_most_recent_unused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path();
        let base = std::time::SystemTime::now() - std::time::Duration::from_secs(100);
        for (i, name) in ["aa", "bb", "cc", "dd"].iter().enumerate() {
            let entry = cache.join(name);
            fs::create_dir_all(entry.join(ROOTFS)).unwrap();
            File::open(&entry)
                .unwrap()
                .set_modified(base + std::time::Duration::from_secs(i as u64))
                .unwrap();
        }
        fs::create_dir(cache.join(".unpacking-x")).unwrap();
        let in_use = ["aa".to_string()].into();
        // Unused: bb (oldest), cc, dd (newest); keep one.
        assert_eq!(prune_cache(cache, &in_use, 1), 2);
        let mut left: Vec<String> = fs::read_dir(cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [".unpacking-x", "aa", "dd"]);
    }

    #[test]
    fn references_split_a_tag_only_off_an_existing_path() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        assert_eq!(
            parse_ref(&format!("oci:{d}")),
            (dir.path().to_path_buf(), None)
        );
        assert_eq!(
            parse_ref(&format!("oci:{d}:v1")),
            (dir.path().to_path_buf(), Some("v1".into()))
        );
        assert_eq!(
            parse_ref("oci:/nonexistent:v1"),
            (PathBuf::from("/nonexistent:v1"), None)
        );
        assert!(is_oci_ref("oci:/x") && !is_oci_ref("/x"));
    }
}

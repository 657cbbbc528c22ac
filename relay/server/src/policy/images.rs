//! Which host directories may be a local sandbox's image: only under the roots the operator
//! configured (`tether serve --image-root DIR`), never the relay's data directory, anything
//! inside it or anything containing it, and only for admin tokens (the policy's caller checks
//! that). `oci:` images are unpacked into the relay's own cache and open to everyone.
//!
//! A path is resolved once, symlinks and all, and the check is made on the result, which is
//! what the provider gets: a symlink planted after the check cannot redirect it, since the
//! provider refuses a path that no longer resolves to itself.

use std::path::{Path, PathBuf};

/// The configured roots and the data directory, all canonical.
#[derive(Clone, Debug)]
pub(super) struct ImageRoots {
    roots: Vec<PathBuf>,
    data_dir: PathBuf,
}

/// Why a directory was refused, and whether it was the caller's mistake (400) or not allowed
/// (403).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The path is not an absolute path to a directory that exists.
    Invalid(String),
    /// The path is outside what this relay allows.
    Forbidden(String),
}

impl ImageRoots {
    /// Canonicalises `roots` and `data_dir` (which must exist); refuses a root inside the data
    /// directory, where sandboxes' own files live.
    pub(super) fn new(roots: &[PathBuf], data_dir: &Path) -> anyhow::Result<ImageRoots> {
        use anyhow::Context;
        let data_dir = std::fs::canonicalize(data_dir)
            .with_context(|| format!("cannot resolve the data directory {}", data_dir.display()))?;
        let mut canonical = Vec::new();
        for root in roots {
            let resolved = std::fs::canonicalize(root).with_context(|| {
                format!(
                    "--image-root {} cannot be used; give an existing directory",
                    root.display()
                )
            })?;
            anyhow::ensure!(
                resolved.is_dir(),
                "--image-root {} is not a directory",
                root.display()
            );
            anyhow::ensure!(
                !resolved.starts_with(&data_dir),
                "--image-root {} is inside the relay's data directory {}, which holds every \
                 sandbox's files and the relay's secrets; choose a directory outside it",
                root.display(),
                data_dir.display()
            );
            canonical.push(resolved);
        }
        Ok(ImageRoots {
            roots: canonical,
            data_dir,
        })
    }

    /// The canonical directory `image` names, if this relay lets images come from there.
    pub(super) fn resolve(&self, image: &str) -> Result<PathBuf, Refusal> {
        if !image.starts_with('/') {
            return Err(Refusal::Invalid(format!(
                "image {image:?} must be an absolute path to a root file system directory, or \
                 oci:PATH"
            )));
        }
        if self.roots.is_empty() {
            return Err(Refusal::Forbidden(format!(
                "image {image:?} is a host directory, and this relay allows none: its operator \
                 can allow some with `tether serve --image-root DIR`; or use an oci: image \
                 (`tether image build`)"
            )));
        }
        let dir = std::fs::canonicalize(image).map_err(|e| {
            Refusal::Invalid(format!(
                "image {image:?} cannot be used as a root file system: {e}"
            ))
        })?;
        if !dir.is_dir() {
            return Err(Refusal::Invalid(format!(
                "image {image:?} is not a directory; pass a root file system directory"
            )));
        }
        if dir.starts_with(&self.data_dir) || self.data_dir.starts_with(&dir) {
            return Err(Refusal::Forbidden(format!(
                "image {image:?} is, contains or is inside the relay's data directory, which \
                 holds other sandboxes' files and the relay's secrets; use a directory under {}",
                self.roots_list()
            )));
        }
        if !self.roots.iter().any(|root| dir.starts_with(root)) {
            return Err(Refusal::Forbidden(format!(
                "image {image:?} (resolved: {}) is not under an image root of this relay; use \
                 a directory under {}",
                dir.display(),
                self.roots_list()
            )));
        }
        Ok(dir)
    }

    /// Refuses an `oci:PATH[:TAG]` image whose layout lies in the data directory: nothing
    /// there is an image, and sandboxes' workspaces are, so a layout there is a tenant's
    /// planted file (symlinked blobs, a FIFO) or another tenant's files.
    pub(super) fn check_oci(&self, image: &str) -> Result<(), Refusal> {
        let Some(rest) = image.strip_prefix("oci:") else {
            return Ok(());
        };
        let untagged = rest.rsplit_once(':').map(|(path, _)| path);
        let inside = [Some(rest), untagged]
            .into_iter()
            .flatten()
            .filter_map(|path| std::fs::canonicalize(path).ok())
            .any(|path| path.starts_with(&self.data_dir));
        if inside {
            return Err(Refusal::Forbidden(format!(
                "image {image:?} is inside the relay's data directory, which holds sandboxes' \
                 files, not images; build or pull the image elsewhere (`tether image build`)"
            )));
        }
        Ok(())
    }

    fn roots_list(&self) -> String {
        let all: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        all.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(got: Result<PathBuf, Refusal>) -> String {
        match got {
            Err(Refusal::Forbidden(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn only_directories_under_a_root_and_away_from_the_data_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("images");
        let data = tmp.path().join("data");
        for dir in [root.join("alpine/etc"), data.join("local/sb-1/workspace")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let none = ImageRoots::new(&[], &data).unwrap();
        assert!(forbidden(none.resolve("/etc")).contains("--image-root"));

        let roots = ImageRoots::new(std::slice::from_ref(&root), &data).unwrap();
        let alpine = std::fs::canonicalize(root.join("alpine")).unwrap();
        assert_eq!(roots.resolve(alpine.to_str().unwrap()), Ok(alpine.clone()));
        assert!(forbidden(roots.resolve("/etc")).contains("not under an image root"));

        // A symlink under the root that leads out of it is judged by where it leads.
        let link = root.join("escape");
        std::os::unix::fs::symlink("/etc", &link).unwrap();
        assert!(forbidden(roots.resolve(link.to_str().unwrap())).contains("resolved: /etc"));

        let up = format!("{}/alpine/../../data", root.display());
        assert!(forbidden(roots.resolve(&up)).contains("data directory"));

        // A root that contains the data directory still never reaches into it, nor above it.
        let wide = ImageRoots::new(&[PathBuf::from("/")], &data).unwrap();
        let workspace = data.join("local/sb-1/workspace");
        assert!(forbidden(wide.resolve(workspace.to_str().unwrap())).contains("data directory"));
        assert!(forbidden(wide.resolve(tmp.path().to_str().unwrap())).contains("data directory"));
        assert!(forbidden(wide.resolve("/")).contains("data directory"));

        let planted = format!("oci:{}", workspace.display());
        assert!(matches!(
            wide.check_oci(&planted),
            Err(Refusal::Forbidden(_))
        ));
        let tagged = format!("{planted}:latest");
        assert!(matches!(
            wide.check_oci(&tagged),
            Err(Refusal::Forbidden(_))
        ));
        assert_eq!(
            wide.check_oci(&format!("oci:{}:v1", root.display())),
            Ok(())
        );
        assert_eq!(wide.check_oci("oci:/nonexistent/layout"), Ok(()));

        assert!(matches!(
            roots.resolve("relative"),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(
            roots.resolve(&format!("{}/missing", root.display())),
            Err(Refusal::Invalid(_))
        ));
        assert!(ImageRoots::new(&[data.join("local")], &data).is_err());
        assert!(ImageRoots::new(&[tmp.path().join("missing")], &data).is_err());
    }
}

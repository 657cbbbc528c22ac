//! Where a sandbox's files live on the host: `<data_dir>/local/<id>/` with its agent socket and
//! log, the mount point of its root, and its disk (an image file, and the mount point where
//! its workspace, `/tmp` and the overlay's upper and work layers are directories). The
//! agent's own files stay off the disk, so a full disk never stops the agent.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::constants::{IMAGE_MARKER, MAX_SOCKET_PATH_LEN, PROVIDER_DIR};
use super::error::{IoContext, LocalError};

/// The host paths of one sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(super) struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// The layout of sandbox `id` under the relay's data directory.
    pub(super) fn new(data_dir: &Path, id: &str) -> Self {
        Layout {
            dir: provider_dir(data_dir).join(id),
        }
    }

    /// The layout as seen from inside the sandbox's directory (the working directory), for
    /// a process that may not traverse the directories above it.
    pub(super) fn here() -> Self {
        Layout {
            dir: PathBuf::from("."),
        }
    }

    /// A layout from a directory stored in metadata, if it is where `new` would put it:
    /// a delete must never remove a directory outside the provider's own.
    pub(super) fn from_stored(data_dir: &Path, id: &str, dir: &Path) -> Option<Self> {
        let expected = Self::new(data_dir, id);
        (expected.dir == dir).then_some(expected)
    }

    /// `<data_dir>/local/<id>`, private to the relay's user.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }
    /// Where the sandbox's disk is mounted (see `disk`); everything the sandbox can write
    /// lives under it.
    pub(super) fn disk(&self) -> PathBuf {
        self.dir.join("disk")
    }
    /// The disk's image file (sparse), behind a loop device.
    pub(super) fn disk_image(&self) -> PathBuf {
        self.dir.join("disk.img")
    }
    /// Bound at `/workspace`; lives as long as the sandbox.
    pub(super) fn workspace(&self) -> PathBuf {
        self.disk().join("workspace")
    }
    /// Bound at `/tmp` (which holds HOME in a sandbox without an image).
    pub(super) fn tmp(&self) -> PathBuf {
        self.disk().join("tmp")
    }
    /// The agent's listening socket.
    pub(super) fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }
    /// The agent's (and the sandbox init's) stdout and stderr.
    pub(super) fn log(&self) -> PathBuf {
        self.dir.join("agent.log")
    }
    /// Where the sandbox init assembles the root before pivoting into it; on the host it stays
    /// an empty directory, since every mount on it lives in the sandbox's mount namespace.
    pub(super) fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    /// The overlay's writable layer, for sandboxes with an image.
    pub(super) fn upper(&self) -> PathBuf {
        self.disk().join("upper")
    }
    /// The overlay's scratch directory, for sandboxes with an image (on the same file system
    /// as the upper layer, as overlayfs requires).
    pub(super) fn work(&self) -> PathBuf {
        self.disk().join("work")
    }
    /// The file naming the cached image (its digest in hex) this sandbox runs, if any.
    pub(super) fn image_marker(&self) -> PathBuf {
        self.dir.join(IMAGE_MARKER)
    }
    /// The sandbox's egress CA certificate, bound at `/etc/tether/egress-ca.pem` (see `trust`).
    pub(super) fn egress_ca(&self) -> PathBuf {
        self.dir.join("egress-ca.pem")
    }
    /// The root's CA bundle with the egress CA added, bound over the system bundles.
    pub(super) fn ca_bundle(&self) -> PathBuf {
        self.dir.join("ca-bundle.pem")
    }

    /// Creates the sandbox's directory with the mount points of its root and its disk (the
    /// disk's own directories are made by `disk::create`). Fails if the sandbox directory
    /// already exists, so a create never adopts another sandbox's files.
    pub(super) fn create(&self) -> Result<(), LocalError> {
        if self.socket().as_os_str().len() > MAX_SOCKET_PATH_LEN {
            return Err(LocalError::Unavailable(format!(
                "the agent socket path {} is longer than the {MAX_SOCKET_PATH_LEN} bytes a Unix \
                 socket allows; use a shorter relay data directory",
                self.socket().display()
            )));
        }
        let parent = self.dir.parent().unwrap_or(&self.dir);
        fs::create_dir_all(parent).context(|| format!("create {}", parent.display()))?;
        // Sockets, logs and workspaces of every sandbox are under here: relay's user only.
        fs::set_permissions(parent, fs::Permissions::from_mode(0o700))
            .context(|| format!("restrict {}", parent.display()))?;
        match DirBuilder::new().mode(0o700).create(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(LocalError::Exists(self.dir.clone()))
            }
            other => other.context(|| format!("create {}", self.dir.display()))?,
        }
        for (d, mode) in [(self.root(), 0o755), (self.disk(), 0o700)] {
            if let Err(e) = DirBuilder::new().mode(mode).create(&d) {
                // The directory is ours (we just made it): leave nothing half-built.
                let _ = fs::remove_dir_all(&self.dir);
                return Err(LocalError::io(format!("create {}", d.display()), e));
            }
        }
        Ok(())
    }
}

/// The digests (hex) of the cached images that existing sandboxes run.
pub(super) fn images_in_use(data_dir: &Path) -> std::collections::HashSet<String> {
    let Ok(entries) = std::fs::read_dir(provider_dir(data_dir)) else {
        return Default::default();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join(IMAGE_MARKER)).ok())
        .map(|digest| digest.trim().to_string())
        .collect()
}

/// `<data_dir>/local`.
pub(super) fn provider_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(PROVIDER_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_under_the_sandbox_dir() {
        let l = Layout::new(Path::new("/var/lib/tether"), "sb-1");
        assert_eq!(l.dir(), Path::new("/var/lib/tether/local/sb-1"));
        assert_eq!(
            l.socket(),
            Path::new("/var/lib/tether/local/sb-1/agent.sock")
        );
        assert_eq!(
            l.workspace(),
            Path::new("/var/lib/tether/local/sb-1/disk/workspace")
        );
        assert!(l.tmp().starts_with(l.disk()) && l.upper().starts_with(l.disk()));
        assert!(!l.socket().starts_with(l.disk()) && !l.log().starts_with(l.disk()));
    }

    #[test]
    fn stored_dirs_outside_the_provider_are_refused() {
        let data = Path::new("/var/lib/tether");
        assert!(
            Layout::from_stored(data, "sb-1", Path::new("/var/lib/tether/local/sb-1")).is_some()
        );
        assert!(Layout::from_stored(data, "sb-1", Path::new("/home")).is_none());
        assert!(
            Layout::from_stored(data, "sb-1", Path::new("/var/lib/tether/local/sb-2")).is_none()
        );
    }

    #[test]
    fn create_refuses_an_existing_sandbox_and_long_socket_paths() {
        let data = std::env::temp_dir().join(format!("tether-layout-{}", std::process::id()));
        let l = Layout::new(&data, "sb-1");
        l.create().unwrap();
        assert!(l.root().is_dir() && l.disk().is_dir());
        assert!(matches!(l.create(), Err(LocalError::Exists(_))));
        let long = Layout::new(&data.join("x".repeat(100)), "sb-1");
        assert!(matches!(long.create(), Err(LocalError::Unavailable(_))));
        fs::remove_dir_all(&data).unwrap();
    }
}

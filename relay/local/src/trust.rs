//! Installing a sandbox's egress CA (sandboxes with secrets, whose HTTPS to the secrets' hosts
//! the relay intercepts): the relay writes the CA and a bundle (the root's own system bundle
//! plus the CA) into the sandbox's directory; the init binds them read-only over the system
//! bundle paths that exist and at `BUNDLE_PATH` and `CA_PATH`; the environment points
//! OpenSSL, Python's requests, curl and Node at them. The CA's key is never written here.

use std::fs;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use super::error::{InitError, LocalError};
use super::layout::Layout;
use super::mounts;
use super::plan::Rootfs;

pub(super) use tether_relay_core::egress::ca::environment;
use tether_relay_core::egress::ca::{
    bundle, certificate_blocks, BUNDLE_PATH, CA_PATH, SYSTEM_BUNDLES,
};

/// Largest system bundle read: 16 MiB.
const MAX_BUNDLE_BYTES: u64 = 16 << 20;

const READ_ONLY: MsFlags = MsFlags::MS_RDONLY
    .union(MsFlags::MS_NOSUID)
    .union(MsFlags::MS_NODEV);

/// Relay side: writes the CA and the bundle for a sandbox whose root is `rootfs`.
pub(super) fn write(layout: &Layout, rootfs: &Rootfs, ca_pem: &str) -> Result<(), LocalError> {
    let lower = match rootfs {
        Rootfs::Host => PathBuf::from("/"),
        Rootfs::Image(lower) => lower.clone(),
    };
    let bundle = bundle(&system_bundle(&lower), ca_pem);
    for (path, text) in [(layout.egress_ca(), ca_pem), (layout.ca_bundle(), &bundle)] {
        fs::write(&path, text)
            .map_err(|e| LocalError::io(format!("write {}", path.display()), e))?;
    }
    Ok(())
}

/// The certificates of the first system bundle of the root at `lower`: only PEM certificate
/// blocks, and only from a file that resolves inside that root (an image's symlink must not
/// pull a host file into the sandbox).
fn system_bundle(lower: &Path) -> String {
    let Ok(root) = fs::canonicalize(lower) else {
        return String::new();
    };
    for rel in SYSTEM_BUNDLES {
        let Ok(path) = fs::canonicalize(root.join(rel)) else {
            continue;
        };
        if !path.starts_with(&root) {
            continue;
        }
        let mut text = String::new();
        let read = fs::File::open(&path).and_then(|f| {
            use std::io::Read;
            f.take(MAX_BUNDLE_BYTES).read_to_string(&mut text)
        });
        if read.is_ok() {
            return certificate_blocks(&text);
        }
    }
    String::new()
}

/// Sandbox side (PID 1, before the root is read-only): binds the files into `root`.
pub(super) fn install(root: &Path, layout: &Layout) -> Result<(), InitError> {
    for rel in SYSTEM_BUNDLES {
        let target = root.join(rel);
        // A symlink would be followed outside the root being built: only regular files.
        if fs::symlink_metadata(&target).is_ok_and(|m| m.is_file()) {
            mounts::bind(&layout.ca_bundle(), &target, READ_ONLY)?;
        }
    }
    for (src, dst) in [
        (layout.ca_bundle(), BUNDLE_PATH),
        (layout.egress_ca(), CA_PATH),
    ] {
        let target = root.join(dst.trim_start_matches('/'));
        mounts::mount_point_file(&target)?;
        mounts::bind(&src, &target, READ_ONLY)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_symlink_out_of_its_root_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("etc/ssl/certs");
        fs::create_dir_all(&certs).unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        fs::write(
            outside.path(),
            "-----BEGIN CERTIFICATE-----\nHOST\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path(), certs.join("ca-certificates.crt")).unwrap();
        assert_eq!(system_bundle(dir.path()), "");
        fs::remove_file(certs.join("ca-certificates.crt")).unwrap();
        fs::write(
            certs.join("ca-certificates.crt"),
            "-----BEGIN CERTIFICATE-----\nIMG\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(system_bundle(dir.path()).contains("IMG"));
    }
}

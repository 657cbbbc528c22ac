//! The sandbox's `/etc`: for a root built from the host, only the entries programs need to
//! run (users, name resolution, the dynamic linker, certificates, time zone, terminfo), each
//! bound read-only by itself so secrets such as `shadow` or `ssh/` never appear; for any root,
//! the generated identity files `hostname` and `hosts`.

use std::fs;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use super::error::InitError;
use super::mounts;

/// Host `/etc` entries a sandbox built from the host sees, read-only, when they exist.
const SHARED: [&str; 31] = [
    "passwd",
    "group",
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/ca-trust",
    "crypto-policies",
    "localtime",
    "timezone",
    "os-release",
    "lsb-release",
    "debian_version",
    "terminfo",
    "protocols",
    "services",
    "networks",
    "mime.types",
    "shells",
    "profile",
    "bash.bashrc",
    "inputrc",
];

/// Flags of every bind from the host's `/etc`.
const READ_ONLY: MsFlags = MsFlags::MS_RDONLY
    .union(MsFlags::MS_NOSUID)
    .union(MsFlags::MS_NODEV);

/// Fills `<root>/etc` with the shared host entries and the sandbox's identity. `visible` are
/// the host directories the sandbox sees at the same path: a host symlink into them (such as
/// `localtime`) is recreated as a symlink, any other is bound as the file it points to.
pub(super) fn populate_from_host(
    root: &Path,
    id: &str,
    visible: &[PathBuf],
) -> Result<(), InitError> {
    let etc = root.join("etc");
    mounts::mount_point_dir(&etc)?;
    for name in SHARED {
        let host = Path::new("/etc").join(name);
        let Ok(meta) = fs::symlink_metadata(&host) else {
            continue;
        };
        let dst = etc.join(name);
        if meta.is_symlink() {
            // A dangling link (e.g. to a resolver that is not running) is left out.
            let Ok(resolved) = fs::canonicalize(&host) else {
                continue;
            };
            if visible.iter().any(|v| resolved.starts_with(v)) {
                let target = fs::read_link(&host).unwrap_or(resolved);
                if let Some(parent) = dst.parent() {
                    mounts::mount_point_dir(parent)?;
                }
                mounts::symlink(&target, &dst)?;
                continue;
            }
            bind_entry(&resolved, &dst, resolved.is_dir())?;
        } else {
            bind_entry(&host, &dst, meta.is_dir())?;
        }
    }
    mounts::symlink(Path::new("/proc/self/mounts"), &etc.join("mtab"))?;
    write_identity(root, id)
}

fn bind_entry(src: &Path, dst: &Path, is_dir: bool) -> Result<(), InitError> {
    if is_dir {
        mounts::mount_point_dir(dst)?;
    } else {
        mounts::mount_point_file(dst)?;
    }
    mounts::bind(src, dst, READ_ONLY)
}

/// Writes `<root>/etc/hostname` and `<root>/etc/hosts` naming the sandbox.
pub(super) fn write_identity(root: &Path, id: &str) -> Result<(), InitError> {
    let etc = root.join("etc");
    mounts::mount_point_dir(&etc)?;
    mounts::write_file(&etc.join("hostname"), &format!("{id}\n"))?;
    mounts::write_file(&etc.join("hosts"), &hosts(id))
}

/// Copies the host's `resolv.conf` into an image's `/etc`, for sandboxes on the host network.
pub(super) fn copy_resolver(root: &Path) -> Result<(), InitError> {
    match fs::read_to_string("/etc/resolv.conf") {
        Ok(text) => mounts::write_file(&root.join("etc/resolv.conf"), &text),
        Err(_) => Ok(()),
    }
}

fn hosts(id: &str) -> String {
    format!("127.0.0.1\tlocalhost\n127.0.1.1\t{id}\n::1\tlocalhost ip6-localhost ip6-loopback\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_never_shared() {
        for secret in [
            "shadow",
            "gshadow",
            "ssh",
            "ssl",
            "ssl/private",
            "sudoers",
            "machine-id",
        ] {
            assert!(!SHARED.contains(&secret), "{secret} must not be shared");
        }
    }

    #[test]
    fn hosts_names_the_sandbox() {
        let h = hosts("sb-1");
        assert!(h.contains("127.0.0.1\tlocalhost\n"));
        assert!(h.contains("127.0.1.1\tsb-1\n"));
    }
}

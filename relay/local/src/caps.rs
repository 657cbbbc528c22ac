//! The privileges left to a sandbox's root (which is root only in its user namespace): the
//! capability bounding set is cut to what ordinary work needs (Docker's default set, minus
//! `MKNOD`, `SETFCAP` and `NET_RAW`: no raw sockets, so no sniffing or forged packets, and
//! no `SYS_RESOURCE`, so no process may exceed its limits). Without `SYS_PTRACE` no sandbox
//! process can trace or read the agent, which is not dumpable. Without `SYS_ADMIN`
//! nothing inside can remount the read-only binds, undo `/proc`'s masks or mount anything; without
//! `DAC_READ_SEARCH` it cannot open host files by handle; without `NET_ADMIN` it cannot touch
//! the host's network when it shares it.

use super::error::{InitError, Step};
use super::sys;

/// Capabilities a sandbox keeps, by number (see capabilities(7)).
const KEPT: [(u32, &str); 11] = [
    (0, "CHOWN"),
    (1, "DAC_OVERRIDE"),
    (3, "FOWNER"),
    (4, "FSETID"),
    (5, "KILL"),
    (6, "SETGID"),
    (7, "SETUID"),
    (8, "SETPCAP"),
    (10, "NET_BIND_SERVICE"),
    (18, "SYS_CHROOT"),
    (29, "AUDIT_WRITE"),
];

/// Cuts the bounding set to [`KEPT`] and empties the inherited sets. Must run after every
/// mount is in place (they need `SYS_ADMIN`) and before exec.
pub(super) fn restrict() -> Result<(), InitError> {
    for cap in 0..=sys::last_capability() {
        if !KEPT.iter().any(|(kept, _)| *kept == cap) {
            sys::drop_bounding_capability(cap)
                .step(|| format!("dropping capability {cap} from the bounding set"))?;
        }
    }
    sys::clear_inherited_capabilities().step(|| "clearing inheritable capabilities".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangerous_capabilities_are_not_kept() {
        // SYS_ADMIN, SYS_MODULE, SYS_PTRACE, NET_ADMIN, DAC_READ_SEARCH, MKNOD, SYS_RAWIO,
        // NET_RAW, SYS_RESOURCE.
        for cap in [21, 16, 19, 12, 2, 27, 17, 13, 24] {
            assert!(
                !KEPT.iter().any(|(k, _)| *k == cap),
                "capability {cap} must be dropped"
            );
        }
    }
}

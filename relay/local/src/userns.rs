//! The sandbox's user namespace. Root inside a sandbox is never root on the host:
//!
//! - Relay side: [`mapping_for`] picks the ids. A root relay maps the sandbox's ids `0..65536`
//!   to the unprivileged host range at [`SANDBOX_ID_BASE`] and gives each sandbox a namespace
//!   owner of its own (the kernel counts per-user limits such as inotify instances against the
//!   owner, so one sandbox cannot use up another's, or host root's). [`open_sandbox_dir`] lets
//!   the sandbox's root through the sandbox's directory to its disk, which it owns.
//! - Sandbox side, root relays only: the init forks a child that drops to the owner uid and
//!   unshares its user namespace ([`become_owner_and_unshare`]); the init, still root on the
//!   host, writes the child's id maps ([`write_maps`]), which a process cannot do for itself
//!   with a range it does not own.

use std::os::unix::fs::PermissionsExt;

use nix::unistd::{getegid, geteuid, setgroups, setresgid, setresuid, Gid, Pid, Uid};

use super::config::IdMapping;
use super::constants::{
    SANDBOX_ID_BASE, SANDBOX_ID_COUNT, SANDBOX_OWNER_BASE, SANDBOX_OWNER_SLOTS,
};
use super::error::{InitError, IoContext, LocalError, Step};
use super::layout::Layout;
use super::{namespaces, sys};

/// The user namespace mapping of sandbox `id` for a relay running as this process's user.
pub(super) fn mapping_for(id: &str) -> IdMapping {
    let euid = geteuid();
    if !euid.is_root() {
        return IdMapping::Own {
            uid: euid.as_raw(),
            gid: getegid().as_raw(),
        };
    }
    IdMapping::Range {
        base: SANDBOX_ID_BASE,
        count: SANDBOX_ID_COUNT,
        owner: SANDBOX_OWNER_BASE + owner_slot(id),
    }
}

/// A slot in the owner range from the sandbox id (FNV-1a): distinct for distinct sandboxes
/// but for rare collisions, whose only effect is two sandboxes sharing per-user limits.
fn owner_slot(id: &str) -> u32 {
    let hash = id.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    hash % SANDBOX_OWNER_SLOTS
}

/// Lets the sandbox's root reach its own directories (its disk, mounted inside) through the
/// sandbox's directory, which stays the relay's: it also holds the agent's socket and log.
/// What the sandbox writes belongs to its root already (see `disk`).
pub(super) fn open_sandbox_dir(layout: &Layout, mapping: IdMapping) -> Result<(), LocalError> {
    if matches!(mapping, IdMapping::Own { .. }) {
        return Ok(()); // The directory is the relay's own, which is root inside.
    }
    std::fs::set_permissions(layout.dir(), std::fs::Permissions::from_mode(0o711))
        .context(|| format!("open {} to the sandbox's root", layout.dir().display()))
}

/// In the init's child: drops every host privilege, becoming the namespace's owner, and
/// unshares a user namespace in which it holds every capability. Its ids map to nothing until
/// the init writes the maps.
pub(super) fn become_owner_and_unshare(base: u32, owner: u32) -> Result<(), InitError> {
    setgroups(&[]).step(|| "dropping the host's supplementary groups".into())?;
    let gid = Gid::from_raw(base);
    setresgid(gid, gid, gid).step(|| format!("switching to host gid {base}"))?;
    let uid = Uid::from_raw(owner);
    setresuid(uid, uid, uid).step(|| format!("switching to host uid {owner}"))?;
    namespaces::unshare_user_namespace()
}

/// In the child, once mapped: takes uid and gid 0 of its namespace (host `base`).
pub(super) fn become_root_inside() -> Result<(), InitError> {
    let root = Uid::from_raw(0);
    let group = Gid::from_raw(0);
    setresgid(group, group, group).step(|| "switching to gid 0 in the sandbox".into())?;
    setresuid(root, root, root).step(|| "switching to uid 0 in the sandbox".into())?;
    // Changing uids made this process undumpable, which gives its /proc files to host root,
    // out of its own reach (it writes /proc/self/oom_score_adj, for one). Nothing can reach
    // it meanwhile: it is alone in a namespace nobody else has entered; the agent, once
    // exec'd, makes itself undumpable again.
    sys::set_dumpable().step(|| "making the sandbox's first process dumpable".into())
}

/// In the init (root on the host): maps ids `0..count` of `child`'s user namespace to host ids
/// `base..base + count`.
pub(super) fn write_maps(child: Pid, base: u32, count: u32) -> Result<(), InitError> {
    let line = format!("0 {base} {count}");
    for map in ["uid_map", "gid_map"] {
        let file = format!("/proc/{child}/{map}");
        std::fs::write(&file, line.as_bytes()).step(|| format!("writing {line:?} to {file}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_stay_in_their_range_and_differ() {
        let a = owner_slot("sb-1");
        let b = owner_slot("sb-2");
        assert_ne!(a, b);
        assert!(a < SANDBOX_OWNER_SLOTS && b < SANDBOX_OWNER_SLOTS);
    }
}

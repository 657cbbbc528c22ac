//! Writing on this machine what a sandbox sends (`tether cp` down, `tether sync` pulls),
//! treating every byte of it as hostile: whatever the agent claims, nothing is written
//! outside the destination directory.
//!
//! # Layout
//! - [`path`]: [`SandboxPath`], a relative path from the sandbox checked component by
//!   component (no `..`, no absolute path, no empty or `.` component, no NUL, bounded length);
//! - [`dir`]: [`Dest`], the destination opened once as a directory fd and walked from there
//!   component by component with `O_NOFOLLOW | O_DIRECTORY` (`openat` family), never through
//!   a path string joined from sandbox data; a symlink on the way is refused, not followed;
//! - [`landing`]: [`Landing`], a file written under a short random name (`O_EXCL |
//!   O_NOFOLLOW`) and renamed into place with `renameat`, removed if it never lands; [`Links`],
//!   the symlinks, created only once every file has landed;
//! - [`unpack`]: a tar stream from the sandbox unpacked through all of the above;
//! - [`pack`]: the other way, a host tree into a tar stream exactly (holes, hard links;
//!   FIFOs and devices named, not sent);
//! - [`download`]: `tether cp ID:/path LOCAL`;
//! - [`error`]: why it failed, [`HostFsError`].
//!
//! Modes: setuid, setgid and sticky bits from the sandbox are dropped unless the user asks
//! to keep them ([`ModePolicy::Preserve`], `--preserve-mode`). Sizes the sandbox announces
//! are never used to allocate: bytes are copied through fixed buffers as they arrive.

pub mod dir;
pub mod download;
pub mod error;
pub mod landing;
pub mod pack;
pub mod path;
pub mod unpack;

pub use dir::Dest;
pub use download::download;
pub use error::HostFsError;
pub use landing::{Landing, Links};
pub use path::SandboxPath;
pub use unpack::unpack;

/// What happens to the setuid, setgid and sticky bits of what a sandbox sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModePolicy {
    /// Dropped: a file from a sandbox never becomes setuid on this machine by accident.
    #[default]
    DropSpecial,
    /// Kept as the sandbox has them (`--preserve-mode`).
    Preserve,
}

impl ModePolicy {
    /// From the `--preserve-mode` flag.
    pub fn from_flag(preserve: bool) -> ModePolicy {
        match preserve {
            true => ModePolicy::Preserve,
            false => ModePolicy::DropSpecial,
        }
    }

    /// The permission bits to give a file or directory the sandbox says has `mode`.
    pub fn apply(self, mode: u32) -> u32 {
        match self {
            ModePolicy::DropSpecial => mode & 0o777,
            ModePolicy::Preserve => mode & 0o7777,
        }
    }
}

/// Permission bits as rustix takes them. `mode_t` is 32 bits on Linux and 16 on macOS; only
/// the permission and setuid/setgid/sticky bits (`0o7777`) are ever passed, so nothing is lost.
#[allow(
    clippy::unnecessary_cast,
    reason = "a no-op on Linux, a narrowing on macOS"
)]
fn permissions(bits: u32) -> rustix::fs::Mode {
    rustix::fs::Mode::from_bits_truncate((bits & 0o7777) as rustix::fs::RawMode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_bits_go_unless_kept() {
        assert_eq!(ModePolicy::DropSpecial.apply(0o104755), 0o755);
        assert_eq!(ModePolicy::DropSpecial.apply(0o3777), 0o777);
        assert_eq!(ModePolicy::Preserve.apply(0o104755), 0o4755);
        assert_eq!(ModePolicy::from_flag(false), ModePolicy::DropSpecial);
    }
}

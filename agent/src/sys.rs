//! The agent's only unsafe code: adopting inherited file descriptors.
#![allow(unsafe_code)]

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Takes ownership of inherited descriptor `fd`, checking first that it is open.
pub fn adopt_fd(fd: RawFd) -> anyhow::Result<OwnedFd> {
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).map_err(|e| {
        anyhow::anyhow!("file descriptor {fd} is not open ({e}); was it passed to the agent?")
    })?;
    // SAFETY: the descriptor was inherited from our parent for this purpose, is open (checked
    // above), and nothing else in this process owns it: main() adopts each flag's fd once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

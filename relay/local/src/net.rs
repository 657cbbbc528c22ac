//! The sandbox's network: a new network namespace starts with `lo` down, so the init brings
//! it up, letting processes inside listen on and connect to 127.0.0.1 and ::1 while nothing
//! outside is reachable.

use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use super::error::{InitError, Step};
use super::sys;

/// Brings the loopback interface of the current network namespace up.
pub(super) fn bring_up_loopback() -> Result<(), InitError> {
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .step(|| "opening a socket to configure the loopback interface".into())?;
    sys::set_interface_up(std::os::fd::AsFd::as_fd(&sock), "lo")
        .step(|| "bringing the loopback interface up".into())
}

//! The egress types every part of the relay shares: what a sandbox may reach and its bound
//! secrets ([`policy`]), the named sets of hosts an allowlist may name ([`preset`]), where
//! sandboxes elsewhere reach the relay's egress ([`route`]), each sandbox's CA and where
//! sandboxes keep it ([`ca`]), the explicit proxy inside a local sandbox and the environment
//! that points at it ([`explicit_proxy`]), and the [`TrustShelf`] that hands a new local
//! sandbox its CA. The egress service itself is `tether-egress`.

pub mod ca;
pub mod explicit_proxy;
pub mod policy;
pub mod preset;
pub mod route;
mod shelf;

pub use shelf::TrustShelf;

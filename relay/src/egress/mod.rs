//! Egress control for sandboxes with `"network": "allowlist"`: which host names and networks
//! a sandbox may reach ([`policy`]), and the secrets bound to it by placeholder ([`secrets`]).
pub mod policy;
pub mod secrets;

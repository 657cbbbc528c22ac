//! Egress control for sandboxes with `"network": "allowlist"`: which host names and networks
//! a sandbox may reach ([`policy`]).
pub mod policy;

//! Egress control for sandboxes with `"network": "allowlist"`: which host names and networks
//! a sandbox may reach ([`policy`]), the secrets bound to it by placeholder ([`secrets`]), and
//! secrets put into its requests on the way out ([`inject`]).
pub mod inject;
pub mod policy;
pub mod secrets;

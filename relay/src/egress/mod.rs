//! Egress control for sandboxes with `"network": "allowlist"`.
//!
//! # Layout
//! - [`policy`]: what a sandbox may reach (host patterns, networks) and its bound secrets;
//!   [`secrets`]: binding secrets to a sandbox by placeholder at create.
//! - [`service`]: the relay-wide [`Egress`] that attaches to and detaches from sandboxes.
//! - Local sandboxes: [`netns`] enters a sandbox's network namespace to set its route and
//!   `rules` (nftables) and open the relay's sockets there; `dns` answers lookups with fake
//!   addresses from the sandbox's `pool`; `proxy` serves the redirected and explicit
//!   connections, reading first bytes with `sniff` and resolving names with `resolve`.
//! - [`ca`]: the per-sandbox CA of sandboxes with secrets; [`inject`] intercepts TLS to the
//!   hosts their secrets are bound to and swaps placeholders for values.
//! - `constants`: every tunable.
pub mod ca;
mod constants;
mod dns;
pub mod inject;
pub mod netns;
pub mod policy;
mod pool;
mod proxy;
mod resolve;
mod rules;
pub mod secrets;
pub mod service;
mod sniff;

pub use service::{Egress, EgressConfig, EgressError, TrustShelf};

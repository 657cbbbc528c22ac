//! Egress control for sandboxes with `"network": "allowlist"`.
//!
//! # Layout
//! - `policy` (in `tether-relay-core`): what a sandbox may reach (host patterns, networks)
//!   and its bound secrets.
//! - [`service`]: the relay-wide [`Egress`] that attaches to and detaches from sandboxes.
//! - Local sandboxes: [`netns`] enters a sandbox's network namespace to set its route and
//!   `rules` (nftables) and open the relay's sockets there; `dns` answers lookups with fake
//!   addresses from the sandbox's `pool`; `udp` relays datagrams to allowed networks.
//! - Sandboxes elsewhere (cloud sandboxes with secrets): `route` (core) is where they reach the
//!   relay (`--egress-url`), their credential and environment; `listener` is the egress
//!   listener, which authenticates each request before handing it to the sandbox's proxy;
//!   [`trust`] installs their CA through their agent.
//! - Every sandbox: `proxy` serves its connections, reading first bytes ahead with `stream`
//!   and `sniff`, resolving names with `resolve`, and moving bytes with `tunnel`; [`reach`]
//!   is the one address filter every destination passes (and the create check's bound).
//! - `ca` (core): the per-sandbox CA of sandboxes with secrets and where sandboxes keep it;
//!   [`inject`] intercepts TLS to the hosts their secrets are bound to and swaps placeholders
//!   for values.
//! - `constants`: every tunable.
#![warn(missing_docs)]

mod constants;
mod dns;
pub mod inject;
mod listener;
pub mod netns;
mod pool;
mod proxy;
pub mod reach;
mod resolve;
mod rules;
pub mod service;
mod sniff;
mod stream;
pub mod trust;
mod tunnel;
mod udp;

pub use service::{Egress, EgressConfig, EgressError};

// The shared egress types, by the short names the modules here use.
use tether_relay_core::egress::{ca, policy, preset, route};

//! The relay of Tether (`tether serve`): it provisions sandboxes through its providers, keeps
//! track of them and their tokens, and tunnels client sessions to each sandbox's agent.
//!
//! # Layout
//! - [`provider`]: the provider trait and one module per provider: `local` (Linux
//!   namespaces), and behind Cargo features (all on by default) `e2b`, `daytona` and `modal`,
//!   each with its image build ([`provider::image`]: `tether image build --target`).
//! - [`store`]: sandboxes and tokens in SQLite.
//! - [`server`]: the relay itself: REST API, tunnels, previews, policy.
//! - [`egress`]: what sandboxes with an allowlist may reach.
//!
//! The REST contract it serves is [`tether_client::api`]; images come from [`tether_oci`].
#![warn(missing_docs)]

pub mod egress;
pub mod provider;
pub mod server;
pub mod store;

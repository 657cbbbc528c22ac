//! What every part of Tether's relay shares, and nothing else: the [`provider`] trait with
//! sandbox specs, handles and states, and the agent socket ([`provider::upgrade`]); the
//! store's [`record`]s (sandbox ids, tenants, roles, tokens); and the [`egress`] policy
//! types. The store, egress, the local runtime, the other providers and the server each build
//! on it, and on nothing of each other's but what their arrows allow (docs/architecture.md).
#![warn(missing_docs)]

pub mod egress;
pub mod provider;
pub mod record;

//! Relays as replicas of one another over a shared database.
//!
//! # Layout
//! - `node`: this relay's node id (`<data_dir>/node.id`).

pub(super) mod node;

//! The host side of Tether: providers that run sandboxes, the relay that tunnels clients to
//! each sandbox's agent, the Rust client library, and the `tether` command line.
//!
//! # Layout
//! - [`client`]: the client library: [`client::Session`] speaks the protocol to an agent
//!   (directly or through a relay), [`client::RelayClient`] manages sandboxes over REST.
//! - [`api`]: the relay's REST contract, shared by server and client.
//! - [`provider`]: the provider trait and one module per provider (`local`: namespaces).
//! - [`registry`]: sandboxes and tokens in SQLite. [`server`]: the relay itself.
//! - [`cli`]: the `tether` commands.
//! - [`sync`]: the engine of `tether sync` and `tether dev`: local trees mirrored into sandboxes.
//! - [`hostfs`]: writing here what a sandbox sends (`cp` down, `sync` pulls), nothing outside
//!   the destination whatever it sends; [`escape`]: printing text a sandbox chose.
//! - [`mcp`]: `tether mcp`, an MCP server exposing sandboxes as tools (stdio or HTTP).
//! - [`bench`]: `tether bench`: latency and throughput against a sandbox, next to this
//!   machine's floors.
#![warn(missing_docs)]

pub mod api;
pub mod bench;
pub mod cli;
pub mod client;
pub mod escape;
pub mod hostfs;
pub mod image;
pub mod mcp;
pub mod provider;
pub mod registry;
pub mod server;
pub mod size;
pub mod sync;

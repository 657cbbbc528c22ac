//! What the cloud providers (`e2b`, `daytona`, `modal`) share, so each of them is only the
//! facts of its own API:
//!
//! - [`settings`]: credentials and endpoints, from environment variables or the relay's
//!   `config.toml`, and the error that names the variable to set;
//! - [`retry`]: which failures are passing and how long to wait before the next try;
//! - [`http`]: the JSON-over-HTTPS client with those retries and errors;
//! - [`websocket`]: opening the agent's WebSocket through a provider's edge;
//! - [`context`]: the one-file build context (a tar.gz) that E2B's and Runloop's builders take;
//! - [`egress`]: what the providers' allowlist mappings share (refusing secrets);
//! - [`constants`]: the agent's port and every shared tunable.
//!
//! Credentials stay on the relay: they authenticate the relay to the provider's control plane
//! and are never put in a sandbox's environment, files or command line.
#![cfg_attr(
    not(all(feature = "e2b", feature = "daytona", feature = "modal")),
    allow(
        dead_code,
        reason = "each provider uses its part; with one of them built out, some goes unused"
    )
)]

pub(crate) mod constants;
#[cfg(any(feature = "e2b", feature = "runloop"))]
pub(crate) mod context;
pub(crate) mod egress;
pub(crate) mod http;
pub(crate) mod retry;
pub(crate) mod settings;
pub(crate) mod websocket;

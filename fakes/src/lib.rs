//! Local stand-ins for the cloud providers Tether supports, so their provider code can be run
//! and tested without an account: each fake serves its provider's real paths, field names (or
//! protobuf messages), status codes, error bodies and states, and runs every sandbox it is
//! asked for as a real local sandbox with the real `tether-agent` inside.
//!
//! # Layout
//! - [`sandboxes`]: the local sandboxes behind every fake (the relay's `local` provider, with
//!   networking cut off), and starting processes and dialling ports inside them.
//! - `edge`: proxying an HTTP request or WebSocket upgrade to a port inside a sandbox.
//! - `images`: each fake's image store: registry images pulled, and images derived from
//!   them with added files and config edits (what the fakes' template, snapshot and image
//!   builds produce).
//! - `dockerfile`: Dockerfile commands (COPY, ENV, WORKDIR, USER, ENTRYPOINT, CMD) built into
//!   a new image of a fake's store: Modal's image definitions, Daytona's `buildInfo`.
//! - `faults`: failures injected on demand (`POST /__fake/faults`): 429 with `Retry-After`,
//!   503, or any status, for the next N requests.
//! - [`e2b`]: E2B's control plane, template builds, envd's process API and its
//!   `{port}-{id}.{domain}` edge.
//! - [`daytona`]: Daytona's REST API (sandboxes and snapshots) and its token-checking preview
//!   proxy.
//! - [`modal`]: Modal's gRPC API (sandboxes, image builds and names) and its tunnels.
//! - [`runloop`]: Runloop's REST API (devboxes, network policies, objects, blueprints) and its
//!   V2 tunnels.
//! - [`serve`]: the listener every fake runs on, and its readiness line.
//!
//! The `tether-fake` binary runs one of them: `tether-fake e2b --listen 127.0.0.1:0
//! --data-dir DIR` prints `listening http://ADDR` once it serves.
#![forbid(unsafe_code)]

pub mod daytona;
mod dockerfile;
pub mod e2b;
mod edge;
mod faults;
mod images;
pub mod modal;
pub mod runloop;
pub mod sandboxes;
pub mod serve;

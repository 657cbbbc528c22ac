//! The end-to-end suite as one test binary: each module was once a binary of its own, and each
//! linked the whole host side, so a change to the relay re-linked it nineteen times. A module
//! per area; run one with `cargo test -p tether-e2e --test e2e cli::` (module path as filter).
//!
//! Tests here share one process, so none may change process-wide state that another could
//! see (environment variables, the working directory, signal dispositions, rlimits): a test
//! that must do so lives in a binary of its own beside this one (`tests/tests/hostile.rs`).
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

mod agent_exec;
mod agent_files;
mod agent_protocol;
mod bench;
mod bounds;
mod chaos;
mod cli;
mod contention;
mod data_dir;
mod dev;
mod docs;
mod egress;
mod egress_cloud;
mod escape;
mod exact;
mod faults;
mod forward;
mod image;
mod image_daytona;
mod image_e2b;
mod image_modal;
mod image_runloop;
mod isolation;
mod power;
mod preview;
mod providers_daytona;
mod providers_docker;
mod providers_e2b;
mod providers_fidelity;
mod providers_modal;
mod providers_orphans;
mod providers_runloop;
mod replicas;
mod secrets;
mod splice;
mod sync;
mod templates;
mod tls;

/// Servers the forward and preview tests run inside sandboxes.
#[path = "support/servers.rs"]
mod servers;

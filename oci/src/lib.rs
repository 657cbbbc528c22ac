//! Tether's sandbox images: building an OCI image with the static agent baked in (no Docker needed),
//! pushing it to a registry, and unpacking one into a root filesystem for the local provider.
//!
//! # Layout
//! - The OCI formats: [`digest`] (content addresses), [`config`] (index, manifest and config
//!   documents), [`layout`] (an image layout directory, and its tarball form), [`layer`]
//!   (reproducible tar+gzip layers), [`source`] (opening an image on disk for reading).
//! - Building: [`agent`] (finding and checking the static agent), `base` (what an image is
//!   built on), [`build`] (putting it together).
//! - Pushing: [`reference`] (`REGISTRY/NAME:TAG`), `credentials` (the docker config file),
//!   `auth` (answering a registry's challenge), [`registry`] (the distribution API),
//!   [`push`] (uploading an image with progress).
//! - Running locally: [`apply`] (one layer onto a directory, whiteouts honoured), [`unpack`]
//!   (an image to a cached root filesystem and its run settings).
//! - [`constants`]: the agent's place and port in an image, and every tunable;
//!   [`error`]: the module's error.
//!
//! The image contract shared with the providers and `images/`: the agent is at
//! [`constants::AGENT_PATH`], the entrypoint is [`constants::ENTRYPOINT`] (listening on
//! `constants::AGENT_PORT` on all interfaces), and the token comes from the
//! `TETHER_AGENT_TOKEN` variable set per sandbox, never from the image.

#![warn(missing_docs)]

pub mod agent;
pub mod apply;
mod auth;
mod base;
pub mod build;
pub mod config;
pub mod constants;
mod credentials;
pub mod digest;
pub mod error;
pub mod layer;
pub mod layout;
pub mod pull;
mod push;
pub mod reference;
pub mod registry;
pub mod source;
pub mod unpack;

pub use build::{build, BuildOptions, Built};
pub use error::ImageError;
pub use pull::{pull, PullOptions, Pulled};
pub use push::{push, PushOptions, PushProgress, Pushed};
pub use unpack::{prepare_rootfs, PreparedImage};

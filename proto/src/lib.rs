//! Tether's wire contract: everything two parties must agree on to talk, and nothing else.
//!
//! # Layout
//! - [`frame`]: the binary framing of every WebSocket message (a 6-byte header plus payload),
//!   with a two-phase decoder that never panics on hostile input.
//! - [`control`]: the typed control messages (handshake, open, exit, resize, signal, error, ...).
//! - [`op`]: the operations a stream can carry (exec, files, forwarding, watch) and their replies.
//! - `error`: wire error codes ([`ErrorCode`]) and the codec's own error type ([`ProtoError`]).
//! - `path`: [`WireBytes`] (and [`WirePath`], its name for paths): bytes that need not be
//!   UTF-8 (file names, argv, environment), losslessly carried in JSON.
//! - `ids`: newtypes for stream ids, process ids, channels and byte offsets ([`StreamId`],
//!   [`ProcessId`], [`Channel`], [`ByteOffset`]).
//! - [`window`]: credit accounting for per-stream flow control.
//! - [`auth`]: constant-time token comparison.
//! - [`keepalive`]: the upgrade header by which a relay asks a client to ping often enough.
//! - [`names`]: the names reserved in a file tree (Tether's temporaries).
//! - [`limits`]: every tunable of the protocol, with its unit.
//! - `linger` (feature `ws`): the end of a close, reading what the peer still sends so the
//!   close frame reaches it.
//! - `writer` (feature `ws`): the WebSocket writer loop the agent and the client both run,
//!   batching queued frames and pinging.
//! - `sparse` (feature `sparse`): files with holes in the tar streams of `tar_read` and
//!   `tar_write`, written and landed the same way at both ends.
//!
//! Without its features the crate has no sockets, no files, no processes and no async code: it is
//! shared by the agent, the relay and the client, and `PROTOCOL.md` beside it is its
//! specification.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod control;
mod error;
mod exit;
pub mod frame;
mod ids;
pub mod keepalive;
pub mod limits;
#[cfg(feature = "ws")]
pub mod linger;
pub mod names;
pub mod op;
mod path;
#[cfg(feature = "sparse")]
pub mod sparse;
pub mod window;
#[cfg(feature = "ws")]
pub mod writer;

pub use control::{Control, ExitStatus};
pub use error::{ErrorCode, ProtoError};
pub use frame::{Frame, FrameKind};
pub use ids::{ByteOffset, Channel, ProcessId, StreamId};
pub use path::{WireBytes, WirePath};

/// The protocol version this crate speaks. Bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;

/// The version of the Tether release this crate belongs to.
pub const TETHER_VERSION: &str = env!("CARGO_PKG_VERSION");

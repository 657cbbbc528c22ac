//! Newtypes for the numbers that travel on the wire, so they cannot be mixed up.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies one stream (one operation) on one connection. Chosen by the client,
/// non-zero, unique among the connection's open streams. Stream 0 is the connection itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamId(pub u32);

impl StreamId {
    /// The connection-level pseudo stream, used by control frames.
    pub const CONNECTION: StreamId = StreamId(0);
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

/// Identifies a process the agent started. Unlike a pid it is never reused during the
/// agent's lifetime, so a client may safely re-attach to it after a reconnect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProcessId(pub u64);

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process {}", self.0)
    }
}

/// A position in a process's output channel: the number of bytes produced before it.
pub type ByteOffset = u64;

/// Which byte stream of a stream a data frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Channel {
    /// Client to agent: stdin, upload bytes, bytes to a forwarded connection.
    In = 0,
    /// Agent to client: stdout (or merged output, or PTY output), download bytes,
    /// bytes from a forwarded connection.
    Out = 1,
    /// Agent to client: stderr of a piped process.
    Err = 2,
}

impl Channel {
    /// Parses the channel byte of a frame header.
    pub fn from_u8(b: u8) -> Option<Channel> {
        match b {
            0 => Some(Channel::In),
            1 => Some(Channel::Out),
            2 => Some(Channel::Err),
            _ => None,
        }
    }
}

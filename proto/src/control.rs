//! Control messages: the typed, JSON-encoded half of the protocol.
//!
//! Each is one [`crate::FrameKind::Control`] frame. The JSON object has a `"type"` field naming
//! the variant in snake_case; the other fields are the variant's.

use serde::{Deserialize, Serialize};

use crate::error::ErrorCode;
pub use crate::exit::ExitStatus;
use crate::ids::{ByteOffset, Channel, ProcessId, StreamId};
use crate::op::{Op, Reply, WatchEvent};

/// A control message, in either direction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Control {
    /// Client → agent, first message on a connection.
    Hello {
        /// The protocol version the client speaks.
        protocol: u32,
        /// The sandbox token, if it was not given at the WebSocket upgrade.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// Free-form client name and version, for logs.
        #[serde(default)]
        client: String,
    },
    /// Agent → client, answer to a valid `hello`.
    Welcome {
        /// The protocol version the agent speaks (equal to the client's).
        protocol: u32,
        /// The agent's release version.
        agent_version: String,
        /// Names of optional features this agent supports (see `PROTOCOL.md`).
        capabilities: Vec<String>,
    },
    /// Client → agent: start operation `op` on the new stream `stream`.
    Open {
        /// A non-zero id not in use on this connection.
        stream: StreamId,
        /// Credit the client grants for the agent's data on this stream, in bytes.
        /// Defaults to [`crate::limits::INITIAL_WINDOW`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u32>,
        /// What to do.
        #[serde(flatten)]
        op: Op,
    },
    /// Either direction: no more data will be sent on `channel` of `stream` (half-close).
    Eof {
        /// The stream.
        stream: StreamId,
        /// The channel that ended.
        channel: Channel,
    },
    /// Client → agent: the terminal of a PTY stream changed size.
    Resize {
        /// A PTY exec or attach stream.
        stream: StreamId,
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// Client → agent: send a signal to the process of `stream`.
    Signal {
        /// An exec or attach stream.
        stream: StreamId,
        /// Signal name (`"INT"`, `"SIGTERM"`) or number (`"9"`).
        signal: String,
        /// Send it to the whole process group rather than the process alone.
        #[serde(default)]
        group: bool,
    },
    /// Client → agent: abandon `stream`. A foreground process is killed, a background one is
    /// only detached; a transfer stops. The agent answers with `closed`.
    Cancel {
        /// The stream.
        stream: StreamId,
    },
    /// Agent → client: a process stream is running.
    Started {
        /// The exec or attach stream.
        stream: StreamId,
        /// The agent's id for the process, for attach, wait and kill.
        process: ProcessId,
        /// The process id in the sandbox.
        pid: u32,
        /// Offset of the first output byte this stream will deliver, per channel
        /// (`out`, then `err`); non-zero when attaching.
        offsets: [ByteOffset; 2],
    },
    /// Agent → client: bytes `from..to` of a channel were overwritten in the replay ring
    /// before this reader asked for them. Data continues at `to`.
    Dropped {
        /// The attach stream.
        stream: StreamId,
        /// `out` or `err`.
        channel: Channel,
        /// First lost byte offset.
        from: ByteOffset,
        /// First offset still available.
        to: ByteOffset,
    },
    /// Agent → client: the process of `stream` ended. Sent after the eof of every output channel.
    Exit {
        /// The exec, attach or wait stream.
        stream: StreamId,
        /// How it ended.
        status: ExitStatus,
    },
    /// Agent → client: the result of a request/response operation.
    Reply {
        /// The stream.
        stream: StreamId,
        /// The result.
        #[serde(flatten)]
        reply: Reply,
    },
    /// Agent → client: a change seen by a `watch` stream.
    Event {
        /// The watch stream.
        stream: StreamId,
        /// What changed.
        #[serde(flatten)]
        event: WatchEvent,
    },
    /// Either direction: an operation failed (`stream` set) or a frame was rejected
    /// (`stream` absent or 0). A failed operation's stream is closed.
    Error {
        /// The stream the error belongs to, absent for connection-level errors.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream: Option<StreamId>,
        /// The typed reason.
        code: ErrorCode,
        /// A sentence a user can act on.
        message: String,
    },
    /// Agent → client: the stream is finished; its id may be reused.
    Closed {
        /// The stream.
        stream: StreamId,
    },
}

//! Every tunable of the protocol in one place, each with its unit.

/// Version of the frame layout, carried in the high nibble of every frame's first byte.
pub const FRAME_VERSION: u8 = 1;

/// Bytes in a frame header: kind/version (1), stream id (4), channel (1).
pub const HEADER_LEN: usize = 6;

/// Largest payload a frame may carry: 1 MiB. Larger frames are a protocol error.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Largest data payload a sender should produce for bytes as they come: 64 KiB. Keeps
/// latency of interleaved streams low while amortising per-frame costs.
pub const DATA_CHUNK: usize = 64 << 10;

/// Largest data payload a sender should produce when that much is already waiting (a
/// process's buffered output, a file being read): 256 KiB. A quarter of the frames, and of
/// the per-frame work at both ends, for bulk bytes; a frame of it takes about 0.3 ms on a
/// loopback at 1 GB/s, the most another stream waits behind it.
pub const BULK_CHUNK: usize = 256 << 10;

/// Credit each direction of a stream starts with unless the opener asks for another: 4 MiB.
pub const INITIAL_WINDOW: u32 = 4 << 20;

/// Largest window a receiver may grant in one stream direction: 64 MiB.
pub const MAX_WINDOW: u32 = 64 << 20;

/// Default capacity of a process's replay ring, per output channel: 1 MiB.
pub const DEFAULT_RING: usize = 1 << 20;

/// Longest interval between WebSocket pings from either side: 20 s.
/// Provider edge proxies cut connections idle for 60 s.
pub const PING_INTERVAL_SECS: u64 = 20;

/// How long the agent keeps the exit status of an uncollected background process: 10 min.
pub const EXIT_RETENTION_SECS: u64 = 600;

/// How long a side that closes a WebSocket because of the peer's fault (a message over its
/// limit, a protocol violation) keeps reading and discarding what the peer still sends, so
/// the peer finishes sending and reads the close frame (`PROTOCOL.md` section 2): 2 s.
pub const CLOSE_LINGER_MS: u64 = 2_000;

/// Bytes a lingering close discards at most before it gives up on the peer: 64 MiB (a peer
/// still sending past it has its connection reset).
pub const CLOSE_LINGER_BYTES: u64 = 64 << 20;

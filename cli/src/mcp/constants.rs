//! The MCP server's tunables, with their units: what one answer may carry, how long calls
//! wait, and how much each exec session keeps.

use std::time::Duration;

/// Output of `exec` shown inline, head and tail together; the rest goes to a file in the
/// sandbox. Enough for a build log's first errors and its summary.
pub(super) const INLINE_OUTPUT_BYTES: usize = 32 << 10; // 32 KiB

/// Output an `exec` collects at most; the agent stops delivering past it (`truncated`).
pub(super) const EXEC_OUTPUT_LIMIT: u64 = 64 << 20; // 64 MiB

/// Where `exec` keeps whole outputs too long to show, inside the sandbox.
pub(super) const OUTPUT_DIR: &str = "/tmp/tether-mcp";

/// A sandbox's TTL when `sandbox_create` names none: a model that creates sandboxes and
/// forgets them leaves nothing running for long. A policy whose maximum is shorter gets the
/// relay's own default instead.
pub(super) const DEFAULT_TTL: Duration = Duration::from_secs(3600);

/// `exec`'s timeout when the call names none.
pub(super) const EXEC_DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest timeout a call may ask for (`exec`, `exec_start`).
pub(super) const EXEC_MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How long past its own timeout an `exec` may run before this side gives up on an agent
/// that never reports the exit.
pub(super) const EXEC_GRACE: Duration = Duration::from_secs(15);

/// Output an exec session holds that no poll has acknowledged yet. When it is full the
/// session stops reading, and the process blocks on its writes until a poll makes room:
/// output is delayed, never lost.
pub(super) const SESSION_BUFFER_BYTES: usize = 4 << 20; // 4 MiB

/// Exec sessions kept at once; finished ones are forgotten first to make room.
pub(super) const MAX_SESSIONS: usize = 64;

/// How long a session is kept after its process ended, for a late poll to read the rest of
/// its output and its exit.
pub(super) const SESSION_RETENTION: Duration = Duration::from_secs(3600);

/// How long `exec_poll` waits for output when the call names no wait.
pub(super) const POLL_DEFAULT_WAIT: Duration = Duration::from_millis(1000);

/// The longest wait a poll may ask for.
pub(super) const POLL_MAX_WAIT: Duration = Duration::from_secs(60);

/// Output one poll returns when the call names no limit.
pub(super) const POLL_DEFAULT_BYTES: usize = 32 << 10; // 32 KiB

/// The most output one poll may ask for. An answer carries the output twice (structured
/// and as text) and JSON may escape a byte into six: 64 KiB stays under the 1 MiB event
/// limit of common clients (the Python SDK's).
pub(super) const POLL_MAX_BYTES: usize = 64 << 10; // 64 KiB

/// How long `exec_write_stdin` waits for a process to take its input.
pub(super) const STDIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Attempts to re-attach an exec session after its connection to the sandbox was lost.
pub(super) const REATTACH_ATTEMPTS: u32 = 6;

/// The first pause between re-attach attempts; it doubles each time.
pub(super) const REATTACH_BACKOFF: Duration = Duration::from_millis(250);

/// The most bytes `read_file` reads from a file.
pub(super) const READ_MAX_BYTES: u64 = 8 << 20; // 8 MiB

/// Lines `read_file` returns when the call names no limit.
pub(super) const READ_DEFAULT_LINES: usize = 2000;

/// Characters kept of one line in `read_file` and `grep` answers; longer lines are cut.
pub(super) const MAX_LINE_CHARS: usize = 2000;

/// Text one answer of `read_file`, `grep`, `ls` or `glob` carries at most (lines, matches,
/// entries, paths), before JSON escaping. An answer carries its content twice (structured
/// and as text): this keeps it well under the 1 MiB event limit of common clients.
pub(super) const ANSWER_BUDGET: usize = 192 << 10; // 192 KiB

/// Entries `ls` returns at most.
pub(super) const LS_MAX_ENTRIES: usize = 2000;

/// The deepest `ls` may descend.
pub(super) const LS_MAX_DEPTH: u32 = 8;

/// Paths `glob` returns at most.
pub(super) const GLOB_MAX_PATHS: u32 = 5000;

/// Matches `grep` returns when the call names no limit, and the most it may ask for.
pub(super) const GREP_DEFAULT_MATCHES: u32 = 500;
/// See [`GREP_DEFAULT_MATCHES`].
pub(super) const GREP_MAX_MATCHES: u32 = 5000;

/// Bytes buffered between a tar packer and the network when uploading a directory.
pub(super) const UPLOAD_PIPE_BYTES: usize = 1 << 20; // 1 MiB

/// A connection to a sandbox that no tool call used for this long is closed, so that the
/// relay can idle the sandbox out (an open connection counts as activity).
pub(super) const CONNECTION_IDLE: Duration = Duration::from_secs(60);

/// How often idle connections are looked for.
pub(super) const CONNECTION_SWEEP: Duration = Duration::from_secs(15);

/// The path of the streamable HTTP endpoint.
pub(super) const HTTP_PATH: &str = "/mcp";

/// The file, in the relay's data directory, where a generated HTTP token is written.
pub(super) const TOKEN_FILE: &str = "mcp.token";

//! Every tunable of the sync engine, with its unit, in one place.

use std::time::Duration;

/// Quiet time that closes a batch of local changes: an editor's save (write a temporary
/// file, rename it over the original) lands as one batch, and a lone change waits no longer.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(20);
/// Longest a batch keeps collecting while changes keep coming (a build writing for seconds
/// is pushed in slices rather than held back until it stops).
pub(crate) const MAX_BATCH_DELAY: Duration = Duration::from_millis(250);
/// Changed paths above which a batch is handled as a full rescan: one listing of the remote
/// tree is cheaper than this many single-path round trips (a `git checkout`, a `cp -r`).
pub(crate) const LARGE_BATCH: usize = 512;
/// Local change notifications queued before the watcher gives up on them and asks for a
/// rescan instead: bounds memory under a flood, loses nothing.
pub(crate) const WATCH_QUEUE: usize = 16_384;

/// Remote request/response operations (stat, list, remove, rename) in flight at once.
pub(crate) const REMOTE_CONCURRENCY: usize = 32;
/// How long one request/response operation may take before the connection is presumed
/// dead. Transfers are not bounded by it: a multi-GB file takes what it takes.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes buffered between the tar packer (a blocking thread) and the network.
pub(crate) const PIPE_BYTES: usize = 1 << 20; // 1 MiB
/// Bytes the tar packer gathers before handing them to the pipe: one wake-up of the
/// network side per 256 KiB rather than per tar header.
pub(crate) const PACK_BUFFER: usize = 256 << 10; // 256 KiB
/// Tar streams a large push is split into, packed and unpacked side by side: packing and
/// unpacking are each single-threaded, and the cost of a many-file tree is mostly file
/// creation in the sandbox, which then runs on several cores.
pub(crate) const PUSH_STREAMS: usize = 4;
/// Pushes lighter than this (see [`SHARD_FILE_WEIGHT`]) go as one stream: a watch batch
/// of a few edits gains nothing from more.
pub(crate) const SHARD_MIN_BYTES: u64 = 16 << 20; // 16 MiB
/// What one file weighs when a push is split, besides its size: creating a file costs
/// about as much as writing this many bytes into it.
pub(crate) const SHARD_FILE_WEIGHT: u64 = 32 << 10; // 32 KiB
/// Files one `read_batch` asks for; the agent's own limit is 1,024.
pub(crate) const READ_BATCH_FILES: usize = 512;
/// Bytes one `read_batch` asks for, so a pull is several streams, not one huge one.
pub(crate) const READ_BATCH_BYTES: u64 = 256 << 20; // 256 MiB

/// First wait before reconnecting after the connection dropped.
pub(crate) const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
pub(crate) const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How often, at most, the baseline is written to disk while watching.
pub(crate) const BASELINE_SAVE_INTERVAL: Duration = Duration::from_secs(2);
/// Transfers smaller than this show no progress bar.
pub(crate) const PROGRESS_MIN_BYTES: u64 = 8 << 20; // 8 MiB

/// What a remote copy kept aside in a conflict is renamed to: `NAME.tether-conflict-TIME`.
pub(crate) const CONFLICT_MARKER: &str = ".tether-conflict-";
/// Paths never synced, whatever the rules say: version-control metadata, the conflict
/// copies this engine makes, and Tether's temporaries (`.tether-*`, the prefix
/// [`tether_proto::names::TEMP_PREFIX`] reserves: the agent's new versions of files before
/// their rename, a download before it lands), so they are neither pushed, deleted nor kept
/// as conflicts. One may belong to a transfer still running, or to one cut a moment ago
/// whose writer has yet to remove it: only that writer removes it.
pub(crate) const BUILTIN_EXCLUDES: &[&str] = &[".git/", "*.tether-conflict-*", TEMP_PATTERN];
/// The pattern of Tether's temporaries, [`tether_proto::names::TEMP_PREFIX`] and anything.
const TEMP_PATTERN: &str = ".tether-*";
/// The per-directory ignore files honoured, gitignore syntax.
pub(crate) const IGNORE_FILE: &str = ".gitignore";

//! How much each measurement does: the full run, and the `--quick` smoke check that must
//! finish in well under a minute (it checks that every figure can be measured, not how fast).

/// Iterations and sizes of one bench run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sizes {
    /// `true` spawned locally, for the spawn floor.
    pub spawns: usize,
    /// Loopback WebSocket round trips, for that floor.
    pub ws_round_trips: usize,
    /// Keystrokes typed into a PTY, locally and through the sandbox.
    pub keystrokes: usize,
    /// Bytes a process writes to a pipe, per run.
    pub pipe_bytes: u64,
    /// Bytes a process writes to a PTY, per run (a PTY moves tens of MB/s).
    pub pty_bytes: u64,
    /// Runs of each throughput measurement.
    pub throughput_runs: usize,
    /// Warm `exec true` round trips.
    pub execs: usize,
    /// `tether exec ID -- true` processes.
    pub cli_execs: usize,
    /// Bytes of the file uploaded and downloaded, per run.
    pub transfer_bytes: u64,
    /// Runs of each transfer.
    pub transfer_runs: usize,
    /// Sandboxes created for create-to-first-output.
    pub creates: usize,
    /// Concurrent idle PTY sessions.
    pub sessions: usize,
    /// Keystrokes typed across the sessions while they are open.
    pub session_keystrokes: usize,
    /// Pauses, each followed by a resume.
    pub pauses: usize,
}

/// The full run: the figures BENCHMARKS.md quotes.
pub(super) const FULL: Sizes = Sizes {
    spawns: 300,
    ws_round_trips: 2000,
    keystrokes: 1000,
    pipe_bytes: 1 << 30, // 1 GiB
    pty_bytes: 64 << 20, // 64 MiB
    throughput_runs: 5,
    execs: 500,
    cli_execs: 100,
    transfer_bytes: 1 << 30, // 1 GiB
    transfer_runs: 3,
    creates: 20,
    sessions: 10_000,
    session_keystrokes: 2000,
    pauses: 200,
};

/// `--quick`: every figure, small.
pub(super) const QUICK: Sizes = Sizes {
    spawns: 30,
    ws_round_trips: 200,
    keystrokes: 100,
    pipe_bytes: 64 << 20, // 64 MiB
    pty_bytes: 4 << 20,   // 4 MiB
    throughput_runs: 2,
    execs: 30,
    cli_execs: 5,
    transfer_bytes: 32 << 20, // 32 MiB
    transfer_runs: 1,
    creates: 3,
    sessions: 100,
    session_keystrokes: 100,
    pauses: 10,
};

/// Block size of the process whose output is measured: it writes 64 KiB at a time, as a
/// program with a generous stdio buffer does.
const WRITER_BLOCK: u64 = 64 << 10;

/// The command whose output the throughput figures and floors measure: `bytes` of zeros,
/// rounded down to whole blocks, written by `dd` (whose writes are larger than `head`'s 8 KiB,
/// so the writer is not what is measured).
pub(super) fn writer(bytes: u64) -> Vec<String> {
    let blocks = (bytes / WRITER_BLOCK).max(1);
    vec![
        "dd".into(),
        "if=/dev/zero".into(),
        format!("bs={WRITER_BLOCK}"),
        format!("count={blocks}"),
        "status=none".into(),
    ]
}

//! The figures `tether bench` reports, in the order it prints them: each with the floor it
//! is compared with and the target it should meet (issues 5's, 14's and 35's targets, on a
//! 2-core VM; the idle sessions' totals are for 10,000 of them).

use std::time::Duration;

use super::report::Goal;

/// One floor or figure: its key, what it is called, its floor, its target.
pub(crate) struct Spec {
    /// Stable name for scripts (the JSON `key`).
    pub key: &'static str,
    /// What a reader sees.
    pub name: &'static str,
    /// The floor it is compared with.
    pub floor: Option<&'static str>,
    /// The target.
    pub goal: Option<Goal>,
}

const fn spec(
    key: &'static str,
    name: &'static str,
    floor: Option<&'static str>,
    goal: Option<Goal>,
) -> Spec {
    Spec {
        key,
        name,
        floor,
        goal,
    }
}

const MS: Duration = Duration::from_millis(1);
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// This machine's floors.
pub(super) const FLOORS: &[Spec] = &[
    spec("spawn", "process spawn (`true`)", None, None),
    spec("ws", "loopback WebSocket round trip", None, None),
    spec("pty_echo", "local PTY echo (`cat`)", None, None),
    spec("pty", "local PTY throughput", None, None),
    spec("pipe", "local pipe throughput", None, None),
    spec("tmpfs", "local tmpfs write, new file", None, None),
];

/// What Tether does. Keystroke echo's other target, a median no worse than `ssh -tt`, is
/// checked by `bench/compare.sh`, which measures both in one run.
pub(super) const FIGURES: &[Spec] = &[
    spec(
        "exec_warm",
        "1 exec `true`, warm connection",
        Some("spawn"),
        Some(Goal::MedianOverFloor(Duration::from_micros(500))),
    ),
    spec(
        "exec_cli",
        "2 `tether exec ID -- true`, new process",
        Some("spawn"),
        Some(Goal::Median(Duration::from_millis(10))),
    ),
    spec(
        "keystroke",
        "3 keystroke echo through a PTY",
        Some("pty_echo"),
        Some(Goal::P99(MS)),
    ),
    spec(
        "stdout_piped",
        "4 stdout throughput, piped",
        Some("pipe"),
        Some(Goal::Rate(1e9)),
    ),
    spec(
        "stdout_pty",
        "4 stdout throughput, PTY",
        Some("pty"),
        Some(Goal::ShareOfFloor(0.9)),
    ),
    spec(
        "upload",
        "5 upload, host tmpfs to sandbox /tmp",
        Some("tmpfs"),
        Some(Goal::Rate(1e9)),
    ),
    spec(
        "download",
        "5 download, sandbox /tmp to host tmpfs",
        Some("tmpfs"),
        Some(Goal::Rate(1e9)),
    ),
    spec(
        "create",
        "6 local sandbox create to first output",
        Some("spawn"),
        Some(Goal::Median(Duration::from_millis(25))),
    ),
    spec(
        "sessions_keystroke",
        "7 keystroke echo, idle sessions open",
        Some("pty_echo"),
        Some(Goal::P99(Duration::from_millis(5))),
    ),
    spec(
        "sessions_relay_rss",
        "7 relay RSS, idle sessions open",
        None,
        Some(Goal::Size(160 * MIB)),
    ),
    spec(
        "sessions_relay_each",
        "7 … relay RSS added per idle session",
        None,
        Some(Goal::Size(16 * KIB)),
    ),
    spec(
        "sessions_agent_rss",
        "7 agents' RSS, idle sessions open",
        None,
        Some(Goal::Size(640 * MIB)),
    ),
    spec(
        "sessions_agent_each",
        "7 … agent RSS added per idle session",
        None,
        Some(Goal::Size(64 * KIB)),
    ),
    spec(
        "pause",
        "8 pause, REST call, processes starting",
        Some("ws"),
        Some(Goal::Median(Duration::from_millis(5))),
    ),
    spec(
        "resume",
        "8 resume, REST call",
        Some("ws"),
        Some(Goal::Median(Duration::from_millis(5))),
    ),
    spec(
        "agent_idle_rss",
        "agent RSS, idle",
        None,
        Some(Goal::Size(6 * MIB)),
    ),
    spec(
        "agent_binary",
        "agent binary size",
        None,
        Some(Goal::Size(6 * MIB)),
    ),
];

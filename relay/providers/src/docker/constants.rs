//! Every tunable of the Docker provider, with its unit.

use std::time::Duration;

/// The engine's socket when neither `--docker-host` nor `DOCKER_HOST` names one.
pub(super) const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// How long one Engine API call may take, in seconds (bollard's unit); an image load counts
/// as one call.
pub(super) const API_TIMEOUT_SECS: u64 = 300;

/// The TCP port the image's agent listens on (`tether image build` bakes
/// `serve --listen 0.0.0.0:7421` into the entrypoint), reached inside the container's own
/// network namespace.
pub(super) const AGENT_PORT: u16 = 7421;
/// The agent's WebSocket endpoint.
pub(super) const AGENT_URL: &str = "ws://sandbox/v1/agent";
/// The variable that hands the agent its token.
pub(super) const AGENT_TOKEN_ENV: &str = "TETHER_AGENT_TOKEN";

/// The label holding the relay's sandbox id: how Tether's containers are found again.
pub(super) const LABEL_SANDBOX: &str = "dev.tether.sandbox";
/// The label naming the relay that made the container (its data directory).
pub(super) const LABEL_RELAY: &str = "dev.tether.relay";
/// Containers are named `tether-<sandbox id>`, so a second create of one id is refused.
pub(super) const NAME_PREFIX: &str = "tether-";

/// The capabilities the agent keeps (all others dropped): it runs commands as other users
/// (SETUID, SETGID), writes and owns files anywhere in the sandbox as root does (CHOWN,
/// DAC_OVERRIDE, FOWNER, FSETID), signals any process (KILL) and lets servers bind low ports
/// (NET_BIND_SERVICE). Docker's other defaults (MKNOD, NET_RAW, SETFCAP, SETPCAP, SYS_CHROOT,
/// AUDIT_WRITE) go.
pub(super) const CAPABILITIES: [&str; 8] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "NET_BIND_SERVICE",
];
/// The process limit of a sandbox created without `--pids`.
pub(super) const DEFAULT_PIDS: i64 = 4096;
/// The most open files a sandbox's process may have (soft and hard), at most the relay's
/// own hard limit: engines otherwise ask for 1M, which a host with a lower hard limit refuses.
pub(super) const MAX_NOFILE: u64 = 1 << 20;
/// `RLIMIT_NPROC` (soft and hard), at most the relay's own hard limit, for the same reason,
/// and no more than an engine whose own limit is lower than the relay's can give (Podman's
/// service caps itself at 32768). It counts every process of the user id on the whole host,
/// so it is no sandbox limit: the pids limit is.
pub(super) const MAX_NPROC: u64 = 32768;

/// How long a new container's agent may take to accept connections.
pub(super) const AGENT_START_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause between two tries to reach an agent that is starting.
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How many times an inspect whose answer does not parse (a transient state the API's schema
/// lacks) is asked again, [`POLL_INTERVAL`] apart, before its error is reported.
pub(super) const UNREADABLE_TRIES: u32 = 50;
/// How long one TCP connect to the agent may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the agent's WebSocket handshake may take.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);

/// The log lines of a container whose agent never started, quoted in the error.
pub(super) const LOG_TAIL_LINES: &str = "20";
/// The most of those logs read, whatever the container wrote.
pub(super) const MAX_LOG_BYTES: usize = 4096; // bytes

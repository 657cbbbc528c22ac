//! Every tunable of the relay server, with its unit, in one place.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use tether_proto::limits;

/// Where `tether serve` listens unless told otherwise (loopback: no TLS needed).
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7420));
/// How often the reaper looks for expired and idle sandboxes, unless configured.
pub const DEFAULT_REAP_INTERVAL: Duration = Duration::from_secs(1);
/// The provider used when a create names none.
pub(crate) const DEFAULT_PROVIDER: &str = "local";

/// The database file under the data directory.
pub(super) const DB_FILE: &str = "relay.db";
/// The admin token file under the data directory (mode 0600).
pub(super) const ADMIN_TOKEN_FILE: &str = "admin.token";
/// The lock file that keeps two relays off one data directory.
pub(super) const LOCK_FILE: &str = "relay.lock";
/// Random bytes in an API token or an agent token (hex-encoded, so twice as many characters).
pub(super) const TOKEN_BYTES: usize = 32;
/// The prefix of API tokens, so secret scanners and people can tell what one is.
pub(super) const API_TOKEN_PREFIX: &str = "tether_";

/// How often an open tunnel counts as client activity, so an idle timeout means "no client
/// connected for that long" and not "no tunnel opened for that long".
pub(super) const ACTIVITY_INTERVAL: Duration = Duration::from_secs(10);
/// How often the relay asks again about sandboxes whose state is unknown (never more often than
/// the reaper ticks): each ask of a provider in an outage costs its retries and a warning.
pub(super) const UNKNOWN_RECHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How often the relay checks that the agent of each running sandbox on this host is still
/// alive (a read of `/proc` per sandbox), so a dead agent shows as `dead` within this time.
pub(super) const AGENT_WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// Tunnels (client sessions) one sandbox may have open through the relay at once.
pub(super) const MAX_TUNNELS_PER_SANDBOX: usize = 1024;
/// How long a closing tunnel waits for the other side's close before dropping both sockets.
pub(super) const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How long shutdown waits for requests and tunnels to finish before giving up on them.
pub(super) const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Messages forwarded per flush when more are already waiting: a burst costs one write
/// syscall, and a single message waits for nothing.
pub(super) const MAX_BATCH: usize = 64;
/// Largest WebSocket message accepted from a client: the agent's own limit, twice the
/// largest protocol frame, so oversized frames reach the agent's decoder and get its error.
pub(super) const MAX_MESSAGE: usize = 2 * (limits::MAX_PAYLOAD + limits::HEADER_LEN);
/// The shortest peer timeout at which a tunnel is spliced even though its client did not
/// announce that it pings when asked (`x-tether-ping-interval`): twice the 15 s at which the
/// agent pings, and the client answers, so a live session is heard in time without the
/// relay's own pings. Below it such a tunnel forwards frames, and the relay pings.
pub(super) const SPLICE_UNANNOUNCED_MIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Capacity asked of each pipe of the spliced path: 1 MiB (the kernel's default ceiling,
/// `/proc/sys/fs/pipe-max-size`), so one pair of `splice(2)` calls moves up to 1 MiB.
pub(super) const PIPE_BYTES: usize = 1 << 20; // 1 MiB
/// Idle pipes kept for the next burst: each costs two descriptors and no memory.
pub(super) const IDLE_PIPES: usize = 16;
/// A copy buffer of the spliced path (TLS, or a provider's stream): 256 KiB.
pub(super) const COPY_BUFFER: usize = 256 << 10; // 256 KiB
/// Idle copy buffers kept for the next burst: at most 4 MiB held between bursts.
pub(super) const IDLE_BUFFERS: usize = 16;

/// Secrets one tenant's store holds at most: at 64 KiB each, 16 MiB of values.
pub(super) const MAX_SECRETS_PER_TENANT: usize = 256;

/// The longest TTL or idle timeout accepted (about 100 years): keeps every deadline in range.
pub(super) const MAX_LIFETIME: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How long a tunnel's client or agent may be silent (not even answering the relay's pings)
/// before it is taken for dead, unless configured (`tether serve --peer-timeout`).
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client may take to send a request head, or to finish its TLS handshake (or,
/// speaking plain HTTP to the TLS port, to send its request), unless configured (`tether
/// serve --header-timeout`).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an API request's body may take to arrive once its head has, unless configured
/// (`tether serve --body-timeout`): a stalled or trickling body is answered 408 and its
/// connection closed. API bodies are small (at most [`MAX_API_BODY`]), so this is generous.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest body an API request may carry: a larger declared `Content-Length` is answered
/// 413 before any of it is read. Requests are JSON of a few KiB and secrets at most 64 KiB;
/// this is the limit axum's extractors applied before it was one place.
pub(super) const MAX_API_BODY: usize = 2 << 20; // 2 MiB
/// TLS handshakes in progress at once; at the bound, the oldest is dropped for a new one.
pub(super) const MAX_TLS_HANDSHAKES: usize = 1024;
/// Bytes read of a plain HTTP request to the TLS port before it is answered with a 400.
pub(super) const PLAINTEXT_HEAD_BYTES: usize = 16 << 10; // 16 KiB

/// How often a relay records in the database that it is alive, and reads its peers.
pub(super) const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// A relay not heard from for this long counts as down: the sandboxes on its host are
/// `unavailable` (never deleted) until it is back.
pub(super) const NODE_ALIVE_WITHIN: Duration = Duration::from_secs(10);
/// The reaper's lease: only its holder reaps, and another relay takes it over this long after
/// the holder stopped renewing it (it renews on every reaper tick).
pub(super) const REAPER_LEASE: &str = "reaper";
/// How long the reaper's lease lasts unless renewed.
pub(super) const REAPER_LEASE_TTL: Duration = Duration::from_secs(10);
/// How much of its lease a reaper must have left to claim a sandbox: a holder about to lose
/// it leaves the sandbox to the next one.
pub(super) const REAPER_LEASE_MARGIN: Duration = Duration::from_secs(3);
/// How often an open tunnel counts as activity when relays share a database: other relays
/// cannot see this one's tunnels, only the activity it records.
pub(super) const CLUSTER_ACTIVITY_INTERVAL: Duration = Duration::from_secs(2);
/// When relays share a database, a sandbox counts as idle only once no relay has recorded
/// activity on it for this long as well (more than two activity intervals).
pub(super) const CLUSTER_IDLE_QUIET: Duration = Duration::from_secs(5);
/// How long a grant between relays is valid (and how far relays' clocks may disagree).
pub(super) const GRANT_LIFETIME: Duration = Duration::from_secs(30);
/// How long opening a connection to a peer relay may take.
pub(super) const HOP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request to a peer relay (a delete) may take.
pub(super) const HOP_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

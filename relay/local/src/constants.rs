//! Every tunable of the local provider, with its unit, in one place: sizes of the sandbox's
//! file systems, default limits, timeouts, and the fixed names and paths of the contract
//! between the relay, the sandbox init and the agent.

use std::os::fd::RawFd;
use std::time::Duration;

/// The hidden first argument that turns the relay binary into a sandbox init.
pub(crate) const INIT_SUBCOMMAND: &str = "__sandbox-init";

/// The provider's folder under the relay's data directory.
pub(super) const PROVIDER_DIR: &str = "local";
/// The folder under the provider's that caches unpacked OCI images, one per manifest digest.
pub(super) const IMAGE_CACHE_DIR: &str = "images";
/// In a sandbox's directory: the digest of the cached image it runs (keeps it from pruning).
pub(super) const IMAGE_MARKER: &str = "image";
/// Unpacked images that no sandbox uses are removed beyond this many, most recent kept.
pub(super) const IMAGE_CACHE_KEEP_UNUSED: usize = 4;
/// The folder under each cgroup hierarchy that holds one cgroup per sandbox.
pub(super) const CGROUP_PARENT: &str = "tether";

/// The host uid (and gid) that is root inside every sandbox of a root relay; ids `0..count`
/// inside are this and the ones after it. Outside every range that `useradd` (subordinate ids
/// from 100000) and systemd (nspawn containers up to 1879048191, its own ranges from
/// 2147352576) hand out, so no host file or user has these ids.
pub(super) const SANDBOX_ID_BASE: u32 = 2_000_000_000;
/// How many ids a sandbox has: uid and gid 0 to 65535, as a container expects.
pub(super) const SANDBOX_ID_COUNT: u32 = 65_536;
/// The first host uid that owns a sandbox's user namespace (one per sandbox, by id hash).
pub(super) const SANDBOX_OWNER_BASE: u32 = SANDBOX_ID_BASE + SANDBOX_ID_COUNT;
/// How many owner uids there are to spread sandboxes over.
pub(super) const SANDBOX_OWNER_SLOTS: u32 = 1 << 20;
// Owners are no id of any sandbox, and every id stays below systemd's ranges (2147352576).
const _: () = assert!(SANDBOX_OWNER_BASE >= SANDBOX_ID_BASE + SANDBOX_ID_COUNT);
const _: () = assert!(SANDBOX_OWNER_BASE as u64 + SANDBOX_OWNER_SLOTS as u64 <= 2_147_352_576);

/// Processes allowed when the spec sets no limit: enough for builds, small enough to contain
/// a fork bomb.
pub(super) const DEFAULT_PIDS_MAX: u64 = 4096;
/// The CFS period a CPU quota is expressed in (the kernel's default).
pub(super) const CPU_PERIOD: Duration = Duration::from_millis(100);
/// The smallest CPU quota the kernel accepts per period.
pub(super) const MIN_CPU_QUOTA: Duration = Duration::from_millis(1);
/// The smallest memory limit we accept; below it even the agent cannot start.
pub(super) const MIN_MEMORY_BYTES: u64 = 16 << 20; // 16 MiB
/// The host's largest process id: no sandbox can have more processes than this.
pub(super) const PID_MAX_FILE: &str = "/proc/sys/kernel/pid_max";

/// A sandbox's disk (its `/workspace`, `/tmp` and an image's writable layer, together) when
/// the request names no size.
pub(super) const DEFAULT_DISK_BYTES: u64 = 10 << 30; // 10 GiB
/// The smallest disk we accept: an ext4 file system with room for a few hundred files.
pub(super) const MIN_DISK_BYTES: u64 = 16 << 20; // 16 MiB
/// The largest disk we accept: what ext4 holds in 2^32 blocks of 4 KiB.
pub(super) const MAX_DISK_BYTES: u64 = 16 << 40; // 16 TiB
/// A disk's block size.
pub(super) const DISK_BLOCK_BYTES: u64 = 4 << 10; // 4 KiB
/// Disk bytes per inode: the number of files a disk holds grows with its size (ext4's own
/// default ratio; 655,360 files in 10 GiB).
pub(super) const DISK_BYTES_PER_INODE: u64 = 16 << 10; // 16 KiB
/// The size of one inode on disk (room for nanosecond times and small extended attributes).
pub(super) const DISK_INODE_BYTES: u64 = 256;
/// Names the file system options of a disk template; change it with the mkfs options so that
/// old templates are not reused.
pub(super) const DISK_FORMAT: &str = "ext4-v1";
/// The folder under the provider's that keeps one formatted, empty disk image per size.
pub(super) const DISK_TEMPLATE_DIR: &str = "disks";
/// Disk templates kept, most recently used first (each is a few hundred KiB of metadata).
pub(super) const DISK_TEMPLATES_KEEP: usize = 8;
/// How long a create keeps trying to bind its disk to a loop device while other processes
/// take the free ones first (the sandbox init's own start is given [`START_TIMEOUT`]).
pub(super) const LOOP_ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
/// The first pause before binding again after a loop device was taken; doubled each time up
/// to [`LOOP_ATTACH_BACKOFF_MAX`], and each pause drawn at random below it.
pub(super) const LOOP_ATTACH_BACKOFF_MIN: Duration = Duration::from_millis(1);
/// The longest pause between two attempts to bind a loop device.
pub(super) const LOOP_ATTACH_BACKOFF_MAX: Duration = Duration::from_millis(100);
/// The highest loop device number the kernel hands out (minor numbers have 20 bits).
pub(super) const MAX_LOOP_NUMBER: u32 = (1 << 20) - 1;
/// How long a delete waits for the kernel to detach a sandbox's loop device.
pub(super) const LOOP_DETACH_TIMEOUT: Duration = Duration::from_secs(2);
/// The agent's OOM score adjustment, set by the sandbox init before it enters a user namespace
/// (below 0 needs CAP_SYS_RESOURCE in the host's): the OOM killer takes the sandbox's other
/// processes (which the agent starts at 0) first and the agent last, where the agent cannot
/// lower its own score to -1000 (never) itself.
pub(super) const AGENT_OOM_SCORE_ADJ: i32 = -999;
/// The sandbox's `/dev/shm`.
pub(super) const DEV_SHM_SIZE_BYTES: u64 = 64 << 20; // 64 MiB
/// The tmpfs holding `/dev`'s nodes and links (read-only once built).
pub(super) const DEV_SIZE_BYTES: u64 = 64 << 10; // 64 KiB
/// The tmpfs root of a sandbox without an image: mount points and a few generated files.
pub(super) const ROOT_SIZE_BYTES: u64 = 1 << 20; // 1 MiB
/// HOME in a sandbox on the host's system directories, whose root is read-only: a directory
/// in its `/tmp` (on its disk). Image sandboxes keep `/root`, which their overlay makes writable.
pub(super) const HOST_ROOTFS_HOME: &str = "/tmp/home";

/// How long a create waits for the sandbox init to report that the agent is starting.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a delete keeps killing a sandbox's processes before giving up.
pub(super) const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a delete retries removing a cgroup that is still draining.
pub(super) const RMDIR_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a v1 freezer may take to reach FROZEN before we kill anyway.
pub(super) const FREEZE_TIMEOUT: Duration = Duration::from_millis(100);
/// The child cgroup a pause moves a sandbox's processes into and freezes (see `freeze`).
pub(super) const PAUSED_CGROUP: &str = "paused";
/// How long a pause keeps moving processes that fork while they are moved, and waits for the
/// kernel to report them frozen, before it gives up and thaws them again.
pub(super) const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one attempt at freezing waits for every task to be frozen before it thaws them
/// and tries again (a vfork's parent cannot freeze while its child froze before its exec).
pub(super) const FREEZE_ATTEMPT: Duration = Duration::from_millis(20);
/// How long the tasks run between two attempts at freezing them.
pub(super) const FREEZE_RETRY_PAUSE: Duration = Duration::from_millis(2);
/// The pause between two polls of a freezing cgroup: short, as a pause should take a few
/// milliseconds.
pub(super) const FREEZE_POLL_INTERVAL: Duration = Duration::from_micros(100);
/// The pause between two polls of a draining cgroup or a dying process.
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// How long a connect waits for the agent's WebSocket handshake.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest sandbox id: a hostname holds at most 64 bytes.
pub(super) const MAX_ID_LEN: usize = 63;
/// The longest Unix socket path the kernel accepts (`sun_path` minus its NUL).
pub(super) const MAX_SOCKET_PATH_LEN: usize = 107;
/// The longest line the init writes on the status pipe; shorter than `PIPE_BUF` so each
/// report is one atomic write even when the monitor and the sandbox process both report.
pub(super) const MAX_REPORT_LEN: usize = 4000;

/// Where the agent binary appears inside the sandbox (a read-only bind mount).
pub(super) const AGENT_PATH: &str = "/.tether/tether-agent";
/// The agent's command line after its path; the contract with `tether-agent`.
pub(super) const AGENT_ARGS: [&str; 3] = ["serve", "--listen-fd", "3"];
/// The descriptor on which the agent inherits its listening socket.
pub(super) const AGENT_LISTEN_FD: RawFd = 3;
/// The variable that hands the agent its token; the agent removes it from its environment.
pub(super) const AGENT_TOKEN_ENV: &str = "TETHER_AGENT_TOKEN";
/// The URL of the agent's WebSocket endpoint (the host part is ignored over a Unix socket).
pub(super) const AGENT_URL: &str = "ws://sandbox/v1/agent";
/// The working directory of the agent, and the sandbox's writable, persistent folder.
pub(super) const WORKSPACE: &str = "/workspace";
/// `PATH` inside a sandbox.
pub(super) const SANDBOX_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where PID 1 finds the agent binary, relative to the sandbox's directory.
pub(super) const STAGED_AGENT: &str = "agent";
/// Where PID 1 finds the image's root, relative to the sandbox's directory.
pub(super) const STAGED_LOWER: &str = "lower";

//! Every tunable the cloud providers share, with its unit.

use std::time::Duration;

/// The TCP port `tether-agent` listens on inside a cloud sandbox (`--listen 0.0.0.0:7421`).
/// Images bake it into their entrypoint; the providers open it through their edge.
pub(crate) const AGENT_PORT: u16 = 7421;

/// The agent's command line in a cloud sandbox, after the program name. The token comes from
/// `TETHER_AGENT_TOKEN`, which the agent removes from its environment at once.
pub(crate) const AGENT_ARGS: [&str; 3] = ["serve", "--listen", "0.0.0.0:7421"];
/// The agent's program name, looked up in the sandbox's `PATH`.
pub(crate) const AGENT_PROGRAM: &str = "tether-agent";
/// The variable that hands the agent its token.
pub(crate) const AGENT_TOKEN_ENV: &str = "TETHER_AGENT_TOKEN";

/// Tries of one control-plane request in all, the first included.
pub(crate) const RETRY_ATTEMPTS: u32 = 5;
/// The wait before the second try; it doubles with each further try.
pub(crate) const BACKOFF_START: Duration = Duration::from_millis(250);
/// The longest computed wait between two tries.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(8);
/// The longest `Retry-After` we honour; a longer one fails the call instead of hanging it.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How long one control-plane request may take.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting to a control plane or an edge may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent's WebSocket handshake through an edge may take.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a new sandbox's agent may take to start listening.
pub(crate) const AGENT_START_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause between two polls of a sandbox that is starting.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The most of an error body quoted in a message.
pub(crate) const MAX_QUOTED_BODY: usize = 300; // bytes

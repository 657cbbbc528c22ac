//! What the store stores: sandbox ids, tenants, relay node ids, sandbox records and token
//! records.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rand::Rng;

use crate::provider::{SandboxHandle, SandboxSpec, SandboxState};

/// Characters of a generated sandbox id after its prefix: lowercase base32 (RFC 4648 without
/// the easily confused digits), safe in hostnames, paths and URLs.
const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
/// Random characters in a generated sandbox id: 60 bits, so collisions are negligible.
const ID_RANDOM_LEN: usize = 12;
/// The prefix of every sandbox id.
const ID_PREFIX: &str = "sb-";
/// The longest tenant name.
const MAX_TENANT_LEN: usize = 64;
/// The prefix of every generated relay node id.
const NODE_PREFIX: &str = "node-";
/// The longest node id accepted from a file or a flag.
const MAX_NODE_LEN: usize = 64;

/// Random lowercase base32 text of `len` characters.
fn random_id(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len)
        .map(|_| ID_ALPHABET[rng.random_range(0..ID_ALPHABET.len())] as char)
        .collect()
}

/// The relay's id of a sandbox, e.g. `sb-k3x9q2mfa7cd`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(String);

impl SandboxId {
    /// A fresh random id.
    pub fn generate() -> SandboxId {
        SandboxId(format!("{ID_PREFIX}{}", random_id(ID_RANDOM_LEN)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for SandboxId {
    /// Wraps any text: ids from clients are only ever looked up, never trusted.
    fn from(id: String) -> SandboxId {
        SandboxId(id)
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tenant: the owner of tokens and sandboxes. Tenants never see each other's sandboxes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(String);

/// Why a tenant name was refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid tenant name {0:?}: use 1 to 64 letters, digits, `-`, `_` or `.`, e.g. `team-a`")]
pub struct InvalidTenant(pub String);

impl Tenant {
    /// The tenant of the admin token a relay creates on first start.
    pub const DEFAULT: &'static str = "default";

    /// Checks a tenant name.
    pub fn parse(name: &str) -> Result<Tenant, InvalidTenant> {
        let valid = !name.is_empty()
            && name.len() <= MAX_TENANT_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if valid {
            Ok(Tenant(name.to_string()))
        } else {
            Err(InvalidTenant(name.to_string()))
        }
    }

    /// The `default` tenant.
    pub fn default_tenant() -> Tenant {
        Tenant(Self::DEFAULT.to_string())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Wraps a name read back from the store, which only ever stores parsed names.
    pub fn from_stored(name: String) -> Tenant {
        Tenant(name)
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A relay among those sharing one database (its data directory's, kept in `node.id`), e.g.
/// `node-q7m2x4c9ab3d`. Sandboxes on a relay's own host (local ones) belong to it: only it
/// can reach them, and its peers tunnel to it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(String);

/// Why a node id was refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid relay node id {0:?}: use 1 to 64 letters, digits, `-`, `_` or `.`, e.g. `node-a`")]
pub struct InvalidNodeId(pub String);

impl NodeId {
    /// A fresh random id.
    pub fn generate() -> NodeId {
        NodeId(format!("{NODE_PREFIX}{}", random_id(ID_RANDOM_LEN)))
    }

    /// Checks a node id read from a file or given by an operator.
    pub fn parse(text: &str) -> Result<NodeId, InvalidNodeId> {
        let valid = !text.is_empty()
            && text.len() <= MAX_NODE_LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if valid {
            Ok(NodeId(text.to_string()))
        } else {
            Err(InvalidNodeId(text.to_string()))
        }
    }

    /// Wraps an id read back from the store, which only ever stores parsed ids.
    pub fn from_stored(id: String) -> NodeId {
        NodeId(id)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One sandbox as the store keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct SandboxRecord {
    /// The relay's id.
    pub id: SandboxId,
    /// Its owner.
    pub tenant: Tenant,
    /// The provider that runs it.
    pub provider: String,
    /// The provider's own id.
    pub provider_ref: String,
    /// Labels, for listing and get-or-create.
    pub labels: BTreeMap<String, String>,
    /// What it was created from.
    pub spec: SandboxSpec,
    /// The token its agent accepts (never shown to clients).
    pub agent_token: String,
    /// What the provider stored at create.
    pub meta: serde_json::Value,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Last client activity (a tunnel opening, open, or closing), ms since the Unix epoch.
    pub last_active_ms: i64,
    /// The TTL last set (at create or renew).
    pub ttl: Option<Duration>,
    /// When the TTL runs out, ms since the Unix epoch.
    pub expires_ms: Option<i64>,
    /// How long without a client before the sandbox is deleted.
    pub idle_timeout: Option<Duration>,
    /// The state last seen.
    pub state: SandboxState,
    /// The relay that created it; for a sandbox on a relay's own host, the one that owns it
    /// (`None`: recorded before relays had ids, so the relay of the database's only data
    /// directory).
    pub node: Option<NodeId>,
}

impl SandboxRecord {
    /// What the provider needs for every call after create.
    pub fn handle(&self) -> SandboxHandle {
        SandboxHandle {
            id: self.id.to_string(),
            provider_ref: self.provider_ref.clone(),
            agent_token: self.agent_token.clone(),
            meta: self.meta.clone(),
        }
    }

    /// Whether its TTL has run out at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        self.expires_ms.is_some_and(|at| at <= now_ms)
    }

    /// Whether it has had no client activity for its idle timeout at `now_ms` (ignoring
    /// tunnels that are open right now, which the caller knows about).
    pub fn idle(&self, now_ms: i64) -> bool {
        self.idle_timeout
            .is_some_and(|t| self.last_active_ms.saturating_add(millis(t)) <= now_ms)
    }
}

/// What an API token grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRecord {
    /// The tenant it acts for.
    pub tenant: Tenant,
    /// What it may do beyond using the tenant's sandboxes.
    pub role: Role,
}

/// How much a token is trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Uses its tenant's sandboxes within the tenant's policy.
    Member,
    /// An admin of its tenant: mints member tokens for that tenant only, and may use what
    /// the policy keeps for admins (host directories as images, the host's network,
    /// an unconfined seccomp filter).
    Admin,
    /// The relay's own admin token (the one in `admin.token`): an admin that also mints
    /// tokens for any tenant, admin tokens included.
    RelayAdmin,
}

impl Role {
    /// The role stored as the `admin` and `relay_admin` flags.
    pub fn from_flags(admin: bool, relay_admin: bool) -> Role {
        match (admin, relay_admin) {
            (_, true) => Role::RelayAdmin,
            (true, false) => Role::Admin,
            (false, false) => Role::Member,
        }
    }

    /// Whether the policy's admin-only options are open to it.
    pub fn is_admin(self) -> bool {
        self != Role::Member
    }
}

/// A duration in whole milliseconds, saturating.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The state's name, as stored and as shown to clients.
pub fn state_name(state: SandboxState) -> &'static str {
    match state {
        SandboxState::Running => "running",
        SandboxState::Paused => "paused",
        SandboxState::Stopped => "stopped",
        SandboxState::Gone => "gone",
        SandboxState::Dead => "dead",
        SandboxState::Unknown => "unknown",
    }
}

/// The state a stored name stands for; `None` for a name no state has.
pub fn parse_state(name: &str) -> Option<SandboxState> {
    match name {
        "running" => Some(SandboxState::Running),
        "paused" => Some(SandboxState::Paused),
        "stopped" => Some(SandboxState::Stopped),
        "gone" => Some(SandboxState::Gone),
        "dead" => Some(SandboxState::Dead),
        "unknown" => Some(SandboxState::Unknown),
        _ => None,
    }
}

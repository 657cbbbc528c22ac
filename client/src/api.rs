//! The relay's REST/JSON contract: request and response bodies shared by the server and the
//! client library, so the two cannot drift apart.
//!
//! Routes (all under `/v1`, all authenticated with `Authorization: Bearer <api token>`):
//! - `POST   /v1/sandboxes`            create ([`CreateRequest`] → 201 [`SandboxInfo`]);
//!   with `get_or_create: true`, returns 200 and the tenant's existing sandbox with exactly
//!   these labels if there is one.
//! - `GET    /v1/sandboxes?label=k=v`  list the tenant's sandboxes (labels must all match).
//! - `GET    /v1/sandboxes/{id}`       one sandbox.
//! - `DELETE /v1/sandboxes/{id}`       delete (204).
//! - `POST   /v1/sandboxes/{id}/renew` extend the TTL ([`RenewRequest`] → [`SandboxInfo`]).
//! - `POST   /v1/sandboxes/{id}/pause` freeze its processes, memory kept (→ [`SandboxInfo`],
//!   state `paused`); 409 `conflict` if paused already, 501 `unsupported` if its provider
//!   cannot pause ([`Capabilities`]).
//! - `POST   /v1/sandboxes/{id}/resume` continue a paused sandbox (→ [`SandboxInfo`]); 409 if
//!   it is not paused. A session (`/ws`) or preview request resumes a paused sandbox first,
//!   unless it was created with `auto_resume: false` (then 409).
//! - `GET    /v1/sandboxes/{id}/ws`    WebSocket: the Tether protocol, tunneled to the agent.
//! - `GET    /v1/sandboxes/{id}/preview` the sandbox's preview URLs and token ([`PreviewInfo`]).
//! - `POST   /v1/tokens`               admin only: mint a token for a tenant ([`TokenRequest`]).
//! - `PUT    /v1/secrets/{name}`       store a secret in the tenant's store ([`SecretRequest`] →
//!   201 [`SecretInfo`] when new, 200 when it replaced one); names and values follow
//!   [`check_secret_name`] and [`check_secret_value`].
//! - `GET    /v1/secrets`              the tenant's secrets: names and times, never values
//!   (`[SecretInfo]`, by name).
//! - `DELETE /v1/secrets/{name}`       delete a stored secret (204; 404 if there is none).
//!   The three secret routes act on the caller's tenant; the relay's admin token may name
//!   another with `?tenant=T`.
//! - `GET    /v1/health`               unauthenticated liveness.
//!
//! Errors are [`ErrorBody`] with a status code: 400 invalid (an unknown field, a number out of
//! range: the message names it), 401 bad token, 403 not allowed by the token's role or the
//! relay's policy (`forbidden`, naming the limit), 404 not found (also for another tenant's
//! sandbox), 409 conflict (the sandbox's state forbids it: pausing a paused one), 410 deleted by
//! the relay or dead, 501 unsupported by the sandbox's provider, 502 provider failure, 503
//! unavailable.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use std::time::Duration;

/// `POST /v1/sandboxes`. The server refuses unknown fields (naming them), as every body
/// here; this one checks them by hand because `deny_unknown_fields` does not work through
/// `flatten`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CreateRequest {
    /// Provider name; the relay's default (`local`) when absent.
    #[serde(default)]
    pub provider: Option<String>,
    /// What to create.
    #[serde(flatten)]
    pub spec: SandboxSpec,
    /// Return the tenant's existing sandbox with exactly these labels, if any.
    #[serde(default)]
    pub get_or_create: bool,
}

/// A sandbox at a provider that carries Tether's label but that this relay's registry does
/// not know (`GET /v1/orphans`, relay admin only): left behind by a relay that crashed or
/// lost its data directory. `DELETE /v1/sandboxes/{id}` by the relay admin removes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    /// The relay id in its label.
    pub id: String,
    /// The provider it runs on.
    pub provider: String,
    /// The provider's own id.
    pub provider_ref: String,
}

/// What `GET /v1/orphans` answers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrphanList {
    /// The orphans found.
    pub orphans: Vec<Orphan>,
    /// Providers that could not be asked, with why (a provider without credentials is
    /// skipped silently: it can have no sandboxes of ours).
    #[serde(default)]
    pub unreachable: Vec<ProviderProblem>,
}

/// A provider that could not be listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderProblem {
    /// The provider.
    pub provider: String,
    /// What went wrong.
    pub error: String,
}

/// A sandbox as clients see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// The relay's id.
    pub id: String,
    /// Provider name.
    pub provider: String,
    /// The provider's own id.
    pub provider_ref: String,
    /// `running`, `paused` (`resume` continues it), `stopped`, `dead` (its agent exited; `rm`
    /// removes it), `gone` or `unknown`.
    pub state: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// The image it was created from.
    #[serde(default)]
    pub image: Option<String>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// Last client activity, milliseconds since the Unix epoch.
    pub last_active_ms: i64,
    /// When the TTL deletes it, milliseconds since the Unix epoch.
    #[serde(default)]
    pub expires_ms: Option<i64>,
    /// Idle timeout in seconds.
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    /// Whether it was just created (false when get-or-create found an existing one).
    #[serde(default)]
    pub created: bool,
    /// What it may reach on the network, and what enforces that on its provider (absent from
    /// relays older than this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkInfo>,
    /// What its provider can do with it beyond create, connect and delete (absent from relays
    /// older than this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    /// Whether traffic (a session, a preview) resumes it when it is paused.
    #[serde(default = "yes")]
    pub auto_resume: bool,
    /// What its idle timeout does: `delete`, `pause` or `stop`.
    #[serde(default)]
    pub on_idle: IdleAction,
}

fn yes() -> bool {
    true
}

/// What a sandbox's provider can do with it beyond create, connect and delete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Pause (processes frozen, memory kept) and resume.
    #[serde(default)]
    pub pause: bool,
    /// Stop (processes ended, disk kept) and start.
    #[serde(default)]
    pub stop: bool,
}

/// A change of a sandbox's power state: `POST /v1/sandboxes/{id}/{action}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Power {
    /// Freeze its processes, memory kept.
    Pause,
    /// Continue a paused sandbox.
    Resume,
    /// End its processes, disk kept.
    Stop,
    /// Boot a stopped sandbox again.
    Start,
}

impl Power {
    /// The action's name, as in its route and the CLI's command.
    pub fn as_str(self) -> &'static str {
        match self {
            Power::Pause => "pause",
            Power::Resume => "resume",
            Power::Stop => "stop",
            Power::Start => "start",
        }
    }
}

/// What a sandbox's idle timeout does when it runs out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Delete it, with everything in it.
    #[default]
    Delete,
    /// Pause it: its processes and memory are kept, and the next session resumes it.
    Pause,
    /// Stop it: its processes end, its disk is kept, and the next session starts it.
    Stop,
}

impl IdleAction {
    /// The action's name, as on the wire and in `--on-idle`.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Delete => "delete",
            IdleAction::Pause => "pause",
            IdleAction::Stop => "stop",
        }
    }
}

impl std::str::FromStr for IdleAction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "delete" => Ok(IdleAction::Delete),
            "pause" => Ok(IdleAction::Pause),
            "stop" => Ok(IdleAction::Stop),
            _ => Err(format!(
                "unknown idle action {s:?}: use `delete`, `pause` or `stop`"
            )),
        }
    }
}

/// A sandbox's network access as created, and the guarantees its provider gives for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkInfo {
    /// The mode asked for.
    pub mode: NetworkPolicy,
    /// With [`NetworkPolicy::Allowlist`]: the hosts and networks allowed.
    #[serde(default)]
    pub egress: EgressSpec,
    /// The secrets bound to it: names and hosts only, never values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretBinding>,
    /// Who enforces the mode: `relay` (the relay's own egress proxy and rules) or the
    /// provider's name (its native egress controls).
    pub enforced_by: String,
    /// What holds for this sandbox, one sentence each.
    #[serde(default)]
    pub guarantees: Vec<String>,
    /// What does not hold, or is not enforced, one sentence each.
    #[serde(default)]
    pub not_guaranteed: Vec<String>,
}

/// A secret bound to a sandbox, as shown to clients: never its value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretBinding {
    /// The environment variable holding the placeholder.
    pub name: String,
    /// Hosts the real value is sent to.
    pub hosts: Vec<String>,
}

/// `POST /v1/sandboxes/{id}/renew`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    /// New TTL from now, in seconds.
    pub ttl_secs: u64,
}

/// `POST /v1/tokens`. The relay's admin token mints for any tenant, admin tokens included;
/// a tenant's admin token mints member tokens for its own tenant only.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The tenant the token acts for.
    pub tenant: String,
    /// Whether the token is an admin of its tenant: it may mint member tokens for it and use
    /// what the relay's policy keeps for admins.
    #[serde(default)]
    pub admin: bool,
}

/// Answer to `POST /v1/tokens`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TokenResponse {
    /// The token; shown once, stored hashed.
    pub token: String,
    /// Its tenant.
    pub tenant: String,
}

/// Every error response.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Machine-readable: `unauthorized`, `forbidden`, `not_found`, `invalid_argument`,
    /// `conflict`, `provider_error`, `unavailable`, `internal`.
    pub code: String,
    /// A sentence saying what to do.
    pub message: String,
}

/// Answer to `GET /v1/sandboxes/{id}/preview`: how a browser reaches ports inside the sandbox.
///
/// Preview requests are not authenticated with an API token but with the sandbox's preview
/// token: the `X-Tether-Preview-Token` header, the `tether_preview_token` query parameter
/// (answered with a cookie and a redirect that drops it), or that cookie.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewInfo {
    /// The sandbox's preview token.
    pub token: String,
    /// The URL of port `{port}` by host name, e.g. `http://{port}-sb-1.localhost:7420/`.
    pub host_url: String,
    /// The same by path, for clients that cannot resolve `*.localhost`:
    /// `http://127.0.0.1:7420/preview/sb-1/{port}/`.
    pub path_url: String,
}

impl PreviewInfo {
    /// The host-form URL of `port`, carrying the token so a browser can open it as is.
    pub fn url(&self, port: u16) -> String {
        format!(
            "{}?tether_preview_token={}",
            self.host_url.replace("{port}", &port.to_string()),
            self.token
        )
    }

    /// The path-form URL of `port`, carrying the token.
    pub fn path(&self, port: u16) -> String {
        format!(
            "{}?tether_preview_token={}",
            self.path_url.replace("{port}", &port.to_string()),
            self.token
        )
    }
}

/// Whether a sandbox may reach the network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// Its own loopback only.
    #[default]
    None,
    /// The host's network, shared (an explicit opt-in).
    Host,
    /// Only the host names and networks in the spec's `egress` (and the hosts its `secrets`
    /// are bound to): through the relay's egress proxy for local sandboxes, through the
    /// provider's own egress controls for cloud sandboxes.
    Allowlist,
}

/// What a sandbox with [`NetworkPolicy::Allowlist`] may reach.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSpec {
    /// Host names it may reach by name: exact (`api.openai.com`), or `*.pypi.org` for every
    /// name below `pypi.org` (not `pypi.org` itself).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
    /// Networks it may reach by address, as CIDRs (`10.1.0.0/16`, `192.0.2.7/32`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_cidrs: Vec<String>,
}

impl EgressSpec {
    /// Whether nothing is allowed by this spec itself.
    pub fn is_empty(&self) -> bool {
        self.allow_hosts.is_empty() && self.allow_cidrs.is_empty()
    }
}

/// A secret the sandbox uses without ever holding it: the sandbox's environment variable
/// `name` holds a placeholder, which the egress proxy replaces with the real value in requests
/// to `hosts` only.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// The environment variable inside the sandbox, and the secret's name in the relay's store.
    pub name: String,
    /// Hosts the real value may be sent to (exact, or `*.` for the names below a domain).
    pub hosts: Vec<String>,
    /// The value, from the caller (for example its own environment); absent: the relay's
    /// secret store. Sent once at create, never stored in the sandbox, never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<SecretValue>,
}

/// A secret's value: serialized only on its way to the relay, never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretValue(String);

impl SecretValue {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// The longest secret name, in bytes.
pub const MAX_SECRET_NAME_BYTES: usize = 128;
/// The largest secret value: 64 KiB.
pub const MAX_SECRET_VALUE_BYTES: usize = 64 * 1024;

/// Checks a secret's name: an environment variable's (`[A-Za-z_][A-Za-z0-9_]*`, at most
/// [`MAX_SECRET_NAME_BYTES`]), since the sandbox sees the secret's placeholder under it.
/// The error is a sentence naming the rule.
pub fn check_secret_name(name: &str) -> Result<(), String> {
    let starts_well = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    let rest_ok = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !starts_well || !rest_ok || name.len() > MAX_SECRET_NAME_BYTES {
        // A name is quoted escaped, and cut short: it may be anything a client sent.
        let shown: String = name.chars().take(MAX_SECRET_NAME_BYTES).collect();
        let cut = if shown.len() < name.len() { "..." } else { "" };
        return Err(format!(
            "invalid secret name {:?}{cut}: a secret is named like an environment variable (a \
             letter or `_`, then letters, digits and `_`; at most {MAX_SECRET_NAME_BYTES} \
             bytes), e.g. OPENAI_API_KEY",
            crate::escape::escape_str(&shown)
        ));
    }
    Ok(())
}

/// Checks the value of secret `name`: not empty, at most [`MAX_SECRET_VALUE_BYTES`], no NUL
/// byte (nothing that carries it could hold one). The error never quotes the value.
pub fn check_secret_value(name: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!(
            "the value of secret {name} is empty; give its value"
        ));
    }
    if value.len() > MAX_SECRET_VALUE_BYTES {
        return Err(format!(
            "the value of secret {name} has {} bytes; a secret holds at most {} bytes (64 KiB)",
            value.len(),
            MAX_SECRET_VALUE_BYTES
        ));
    }
    if value.contains('\0') {
        return Err(format!(
            "the value of secret {name} contains a NUL byte, which no environment variable, \
             header or query can carry; store the value without it"
        ));
    }
    Ok(())
}

/// `PUT /v1/secrets/{name}`: the value to store.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRequest {
    /// The value; kept sealed under the relay's key, never returned.
    pub value: SecretValue,
}

/// A stored secret as clients see it: never its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    /// Its name, which is also the environment variable a sandbox sees its placeholder under.
    pub name: String,
    /// The tenant whose store holds it.
    pub tenant: String,
    /// When it was first stored, milliseconds since the Unix epoch.
    pub created_ms: i64,
    /// When its value was last set, milliseconds since the Unix epoch.
    pub updated_ms: i64,
}

/// What a caller asks for when creating a sandbox.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The provider's image name (local: a root filesystem directory or `oci:PATH`).
    #[serde(default)]
    pub image: Option<String>,
    /// Labels for lookup (`tether ls --label`, get-or-create).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Environment of every process in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Delete the sandbox this long after creation (renewable).
    #[serde(default, with = "opt_secs")]
    pub ttl: Option<Duration>,
    /// Delete (or, with `on_idle`, pause) the sandbox after this long without client activity.
    #[serde(default, with = "opt_secs")]
    pub idle_timeout: Option<Duration>,
    /// What the idle timeout does; `delete` when absent.
    #[serde(default)]
    pub on_idle: IdleAction,
    /// Whether traffic to the sandbox while it is paused (a new session, a preview request)
    /// resumes it; absent means yes. With `false`, such traffic is refused (409) until an
    /// explicit resume.
    #[serde(default)]
    pub auto_resume: Option<bool>,
    /// CPU limit in cores (may be fractional).
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Memory limit in bytes.
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// Limit on the number of processes.
    #[serde(default)]
    pub pids: Option<u64>,
    /// Disk quota in bytes: everything the sandbox can write, together (local: its
    /// `/workspace`, `/tmp` and an image's writable layer).
    #[serde(default)]
    pub disk_bytes: Option<u64>,
    /// Network access.
    #[serde(default)]
    pub network: NetworkPolicy,
    /// With [`NetworkPolicy::Allowlist`]: the hosts and networks the sandbox may reach.
    #[serde(default)]
    pub egress: EgressSpec,
    /// Secrets by placeholder (with [`NetworkPolicy::Allowlist`]); their hosts are allowed.
    #[serde(default)]
    pub secrets: Vec<SecretSpec>,
    /// Run user code without the seccomp filter (admin tokens only).
    #[serde(default)]
    pub seccomp_unconfined: bool,
}

mod opt_secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        match Option::<f64>::deserialize(d)? {
            None => Ok(None),
            Some(secs) => Duration::try_from_secs_f64(secs).map(Some).map_err(|_| {
                serde::de::Error::custom(format!(
                    "{secs} is not a valid duration in seconds (must be 0 or more)"
                ))
            }),
        }
    }
}

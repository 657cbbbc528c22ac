//! `sandbox_create`, `sandbox_list`, `sandbox_delete`, `sandbox_info`, and `sandbox_pause`,
//! `_resume`, `_stop`, `_start`: sandboxes through the relay's REST API, on whichever
//! provider the relay serves.

use std::collections::BTreeMap;

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use tether_client::api::{CreateRequest, Power};
use tether_client::ClientError;

use super::connections::check_id;
use super::constants::DEFAULT_TTL;
use super::error::{invalid, ToolError};
use super::Server;

/// Arguments of `sandbox_create`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateArgs {
    /// Labels to find the sandbox by later (sandbox_list), e.g. {"thread": "42"}.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Delete the sandbox this many seconds after creation: 3600 (one hour) when absent, or
    /// the relay's default when its policy allows less; renew it with `tether renew`.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub ttl_seconds: Option<u64>,
    /// Delete the sandbox after this many seconds without any client activity.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub idle_timeout_seconds: Option<u64>,
    /// The image: for the local provider `oci:PATH` (an OCI layout on the relay's host) or
    /// a directory under the relay's image roots; for a cloud provider its template name.
    /// The provider's default when absent.
    #[serde(default)]
    pub image: Option<String>,
    /// The provider: `local` (Linux namespaces on the relay's host), `e2b`, `daytona` or
    /// `modal`, as the relay is configured. The relay's default when absent.
    #[serde(default)]
    pub provider: Option<String>,
    /// Environment variables of every process in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Return the existing sandbox with exactly these labels instead of creating another.
    #[serde(default)]
    pub get_or_create: bool,
}

/// Arguments of `sandbox_list`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ListArgs {
    /// Only sandboxes carrying all of these labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Arguments of the tools that name only a sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SandboxArgs {
    /// The sandbox's id, as sandbox_create or sandbox_list gave it (e.g. `sb-3f9a2c`).
    pub sandbox_id: String,
}

pub(super) async fn create(server: &Server, args: CreateArgs) -> Result<Value, ToolError> {
    let seconds = |v: Option<u64>, what: &str| match v {
        Some(0) => Err(invalid(format!("{what} must be at least 1 second"))),
        v => Ok(v.map(Duration::from_secs)),
    };
    // What the call leaves out, the relay's policy fills in.
    let mut req = CreateRequest {
        provider: args.provider,
        get_or_create: args.get_or_create,
        ..CreateRequest::default()
    };
    req.spec.image = args.image;
    req.spec.labels = args.labels;
    req.spec.env = args.env;
    let asked = seconds(args.ttl_seconds, "ttl_seconds")?;
    req.spec.ttl = asked.or(Some(DEFAULT_TTL));
    req.spec.idle_timeout = seconds(args.idle_timeout_seconds, "idle_timeout_seconds")?;
    let relay = server.connections.relay();
    let info = match relay.create(&req).await {
        // Our default, not the caller's TTL, is above the tenant's maximum: the relay's own
        // default is within it.
        Err(ClientError::Http {
            status: 403,
            message,
            ..
        }) if asked.is_none() && message.starts_with("ttl ") => {
            req.spec.ttl = None;
            relay.create(&req).await?
        }
        other => other?,
    };
    Ok(serde_json::to_value(info).expect("sandbox info serializes"))
}

pub(super) async fn list(server: &Server, args: ListArgs) -> Result<Value, ToolError> {
    let all = server.connections.relay().list(&args.labels).await?;
    Ok(json!({ "sandboxes": all }))
}

pub(super) async fn delete(server: &Server, args: SandboxArgs) -> Result<Value, ToolError> {
    check_id(&args.sandbox_id)?;
    server.connections.relay().delete(&args.sandbox_id).await?;
    server.connections.forget(&args.sandbox_id);
    let ended = server.sessions.forget_sandbox(&args.sandbox_id);
    Ok(json!({ "deleted": args.sandbox_id, "exec_sessions_ended": ended }))
}

/// Pauses, resumes, stops or starts a sandbox; answers it as the relay now has it.
pub(super) async fn power(
    server: &Server,
    args: SandboxArgs,
    power: Power,
) -> Result<Value, ToolError> {
    check_id(&args.sandbox_id)?;
    let relay = server.connections.relay();
    let id = &args.sandbox_id;
    let info = relay.power(id, power).await?;
    if matches!(power, Power::Pause | Power::Stop) {
        // The next tool call opens a new session, which wakes the sandbox: the cached one
        // would not (a session open across a pause is no wake trigger, and a stop ends it).
        // Exec sessions keep theirs, so their output goes on after a resume.
        server.connections.forget(id);
    }
    Ok(serde_json::to_value(info).expect("sandbox info serializes"))
}

pub(super) async fn info(server: &Server, args: SandboxArgs) -> Result<Value, ToolError> {
    check_id(&args.sandbox_id)?;
    let relay = server.connections.relay();
    let (sandbox, preview) =
        tokio::join!(relay.get(&args.sandbox_id), relay.preview(&args.sandbox_id));
    let sandbox = sandbox?;
    let preview = preview?;
    // A sandbox whose agent cannot be reached (stopped, starting) is still shown.
    let agent = async {
        let session = server.connections.get(&args.sandbox_id).await?;
        let (agent, ports) = tokio::join!(session.info(), session.ports());
        Ok::<_, ToolError>((agent?, ports?))
    };
    // A session would wake a paused or stopped sandbox: looking at it must not.
    let (agent, ports, agent_error) = match sandbox.state.as_str() {
        "paused" | "stopped" => (None, Vec::new(), None),
        _ => match agent.await {
            Ok((agent, ports)) => (Some(agent), ports, None),
            Err(e) => (None, Vec::new(), Some(e.to_string())),
        },
    };
    let ports: Vec<Value> = ports
        .into_iter()
        .map(|p| {
            json!({
                "port": p.port,
                "address": p.address,
                "url": preview.url(p.port),
                "path_url": preview.path(p.port),
            })
        })
        .collect();
    Ok(json!({
        "sandbox": sandbox,
        "agent": agent,
        "agent_error": agent_error,
        "listening_ports": ports,
        "preview": {
            "token": preview.token,
            "host_url": preview.host_url,
            "path_url": preview.path_url,
            "how": "open a listening port's `url` in a browser; {port} in host_url/path_url is \
                    any port, reached with the token (header X-Tether-Preview-Token or query \
                    parameter tether_preview_token)",
        },
    }))
}

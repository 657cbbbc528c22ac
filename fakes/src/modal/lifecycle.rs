//! Making and ending the fake's sandboxes: create (V1 and V2 alike) with its tunnels and its
//! entrypoint, the sandbox's task, and carrying tunnel traffic into the sandbox.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Request as HttpRequest, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tonic::Status;

use super::pb::generic_result::GenericStatus;
use super::pb::{SandboxGetTaskIdResponse, SandboxTag, TunnelData};
use super::service::{Service, BASE62};
use super::{result, Modal, Sandbox};
use crate::edge::{self, Activity, PortListener};
use crate::sandboxes::random_id;

/// Refuses a `network_access` Modal would not run: allowlists outside `ALLOWLIST`, a CIDR
/// that is not one, open ports on a `BLOCKED` sandbox (which the SDK refuses before sending).
fn check_network(def: &super::pb::Sandbox) -> Result<(), Status> {
    use super::pb::network_access::NetworkAccessType;
    let Some(network) = &def.network_access else {
        return Ok(());
    };
    let kind = NetworkAccessType::try_from(network.network_access_type)
        .map_err(|_| Status::invalid_argument("unknown network access type"))?;
    let lists = !network.allowed_cidrs.is_empty() || !network.allowed_domains.is_empty();
    if lists && kind != NetworkAccessType::Allowlist {
        return Err(Status::invalid_argument(
            "allowed CIDRs and domains need network access type ALLOWLIST",
        ));
    }
    if let Some(bad) = network
        .allowed_cidrs
        .iter()
        .find(|c| c.parse::<ipnet::IpNet>().is_err())
    {
        return Err(Status::invalid_argument(format!("invalid CIDR: {bad}")));
    }
    let ports = def.open_ports.as_ref().is_some_and(|p| !p.ports.is_empty());
    if kind == NetworkAccessType::Blocked && ports {
        return Err(Status::invalid_argument(
            "Cannot specify open ports when `block_network` is enabled",
        ));
    }
    Ok(())
}

impl Service {
    /// Creates a sandbox (V1 and V2 alike) and starts its entrypoint with `env` (from its
    /// Secrets).
    pub(super) async fn create(
        &self,
        app_id: String,
        definition: Option<super::pb::Sandbox>,
        tags: Vec<SandboxTag>,
        env: BTreeMap<String, String>,
    ) -> Result<String, Status> {
        let fake = &self.0;
        if !fake
            .apps
            .lock()
            .expect("apps")
            .values()
            .any(|id| *id == app_id)
        {
            return Err(Status::not_found(format!("App {} not found", app_id)));
        }
        let def = definition.ok_or_else(|| Status::invalid_argument("definition is required"))?;
        check_network(&def)?;
        let root = super::images::sandbox_root(fake, &def.image_id)?;
        let id = format!("sb-{}", random_id(22, BASE62));
        let activity = Activity::new();
        {
            let mut table = fake.table.lock().expect("sandbox table");
            if let Some(name) = &def.name {
                let taken = table.values().any(|s| {
                    s.result.is_none() && s.app_id == app_id && s.name.as_ref() == Some(name)
                });
                if taken {
                    return Err(Status::already_exists(format!(
                        "Sandbox with name '{name}' already exists"
                    )));
                }
            }
            table.insert(
                id.clone(),
                Sandbox {
                    app_id: app_id.clone(),
                    name: def.name.clone(),
                    image_id: def.image_id.clone(),
                    tags: tags
                        .into_iter()
                        .map(|t| (t.tag_name, t.tag_value))
                        .collect(),
                    created_at: SystemTime::now(),
                    timeout_secs: if def.timeout_secs == 0 {
                        300
                    } else {
                        def.timeout_secs
                    },
                    idle_timeout_secs: def.idle_timeout_secs.filter(|secs| *secs > 0),
                    activity: activity.clone(),
                    result: None,
                    tunnels: Vec::new(),
                    network_access: def.network_access.clone(),
                },
            );
        }
        if let Err(e) = fake.sandboxes.create_from(&id, root.as_deref()).await {
            fake.finish(
                &id,
                result(GenericStatus::InitFailure, 0, &format!("{e:#}")),
            )
            .await;
            return Ok(id);
        }
        let mut tunnels = Vec::new();
        for spec in def.open_ports.map(|p| p.ports).unwrap_or_default() {
            let port = u16::try_from(spec.port)
                .map_err(|_| Status::invalid_argument("port out of range"))?;
            let target = (Arc::downgrade(fake), id.clone(), port);
            let router = Router::new().fallback(tunnel).with_state(target);
            let listener = PortListener::bind_counted(router, activity.clone())
                .await
                .map_err(|e| Status::internal(format!("cannot open a tunnel: {e}")))?;
            let data = TunnelData {
                host: "127.0.0.1".into(),
                port: u32::from(listener.addr.port()),
                container_port: spec.port,
            };
            tunnels.push((data, listener));
        }
        if let Some(s) = fake.table.lock().expect("sandbox table").get_mut(&id) {
            s.tunnels = tunnels;
        }
        let argv = if def.entrypoint_args.is_empty() {
            vec!["sleep".into(), "infinity".into()]
        } else {
            def.entrypoint_args
        };
        match fake.sandboxes.start(&id, argv, env, None).await {
            Ok(mut process) => {
                let fake = fake.clone();
                let id = id.clone();
                tokio::spawn(async move {
                    let mut code = -1;
                    while let Some(event) = process.next().await {
                        if let Ok(tether_client::ProcessEvent::Exit(status)) = event {
                            code = status.shell_code();
                        }
                    }
                    let status = if code == 0 {
                        GenericStatus::Success
                    } else {
                        GenericStatus::Failure
                    };
                    fake.finish(&id, result(status, code, "")).await;
                });
            }
            Err(e) => {
                fake.finish(
                    &id,
                    result(GenericStatus::InitFailure, 0, &format!("{e:#}")),
                )
                .await
            }
        }
        Ok(id)
    }

    /// A sandbox's task: its id while it runs, its result once it has finished.
    pub(super) fn task(&self, sandbox_id: &str) -> Result<SandboxGetTaskIdResponse, Status> {
        let table = self.0.table.lock().expect("sandbox table");
        let s = table
            .get(sandbox_id)
            .ok_or_else(|| Status::not_found(format!("Sandbox {sandbox_id} not found")))?;
        Ok(SandboxGetTaskIdResponse {
            task_id: Some(task_id(sandbox_id)),
            task_result: s.result.clone(),
        })
    }
}

/// The task id of a sandbox (one task per sandbox in the fake).
pub(super) fn task_id(sandbox_id: &str) -> String {
    format!("ta-{}", sandbox_id.trim_start_matches("sb-"))
}

/// A request through a tunnel: carried to the port inside (Modal's tunnels are open; the
/// server inside authenticates).
async fn tunnel(
    State((fake, id, port)): State<(std::sync::Weak<Modal>, String, u16)>,
    req: HttpRequest,
) -> Response {
    let Some(fake) = fake.upgrade() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    match edge::proxy(&fake.sandboxes, &id, port, req).await {
        Ok(resp) => resp,
        Err(e) => (StatusCode::BAD_GATEWAY, format!("{e}\n")).into_response(),
    }
}

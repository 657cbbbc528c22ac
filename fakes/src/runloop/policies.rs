//! The fake's network policies (`/v1/network-policies`): create, get, list, delete, with
//! Runloop's checks (a name; `allowed_cidrs` IPv4 blocks in canonical form, host bits zero;
//! `allowed_hostnames` names with an optional leading `*.`) and its `NetworkPolicyView`. A
//! policy a live devbox uses cannot be deleted. The fake's devboxes have no network, so a
//! policy is kept and read back, not enforced.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ipnet::Ipv4Net;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{error, millis, new_id, page, Runloop};

/// One policy.
#[derive(Clone, Debug)]
pub(super) struct Policy {
    id: String,
    seq: u64,
    name: String,
    description: Option<String>,
    allow_all: bool,
    allow_devbox_to_devbox: bool,
    allow_runloop_mirrors: bool,
    allow_agent_gateway: bool,
    allow_mcp_gateway: bool,
    allowed_hostnames: Vec<String>,
    allowed_cidrs: Vec<Value>,
    created: SystemTime,
}

/// The policy routes.
pub(super) fn routes() -> Router<Arc<Runloop>> {
    Router::new()
        .route("/v1/network-policies", post(create).get(list))
        .route("/v1/network-policies/{id}", get(detail))
        .route("/v1/network-policies/{id}/delete", post(remove))
}

#[derive(Debug, Deserialize)]
struct CreatePolicy {
    name: Option<String>,
    description: Option<String>,
    allow_all: Option<bool>,
    allow_devbox_to_devbox: Option<bool>,
    allow_runloop_mirrors: Option<bool>,
    allow_agent_gateway: Option<bool>,
    allow_mcp_gateway: Option<bool>,
    allowed_hostnames: Option<Vec<String>>,
    allowed_cidrs: Option<Vec<Value>>,
}

fn hostname_ok(name: &str) -> bool {
    let name = name.strip_prefix("*.").unwrap_or(name);
    let labels: Vec<&str> = name.split('.').collect();
    labels.len() >= 2
        && labels.iter().all(|l| {
            let b = l.as_bytes();
            (1..=63).contains(&b.len())
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

/// Why an `allowed_cidrs` entry is refused, if it is.
fn cidr_error(entry: &Value) -> Option<String> {
    let Some(cidr) = entry.get("cidr").and_then(Value::as_str) else {
        return Some("each allowed_cidrs entry needs a cidr".into());
    };
    let Ok(net) = cidr.parse::<Ipv4Net>() else {
        return Some(format!("invalid CIDR {cidr}: must be an IPv4 CIDR block"));
    };
    if net.network() != net.addr() {
        return Some(format!(
            "CIDR {cidr} is not in canonical form (host bits must be zero): use {}",
            net.trunc()
        ));
    }
    if net.addr() == Ipv4Addr::UNSPECIFIED && net.prefix_len() != 0 {
        return Some(format!("invalid CIDR {cidr}"));
    }
    None
}

async fn create(State(fake): State<Arc<Runloop>>, body: axum::body::Bytes) -> Response {
    let req: CreatePolicy = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("invalid request body: {e}"),
            )
        }
    };
    let Some(name) = req.name.filter(|n| !n.trim().is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "name is required");
    };
    let hostnames = req.allowed_hostnames.unwrap_or_default();
    if let Some(bad) = hostnames.iter().find(|h| !hostname_ok(h)) {
        return error(StatusCode::BAD_REQUEST, &format!("invalid hostname {bad}"));
    }
    let cidrs = req.allowed_cidrs.unwrap_or_default();
    if let Some(message) = cidrs.iter().find_map(cidr_error) {
        return error(StatusCode::BAD_REQUEST, &message);
    }
    let allow_all = req.allow_all.unwrap_or(false);
    let policy = Policy {
        id: new_id("npol"),
        seq: fake.next_sequence(),
        name,
        description: req.description,
        allow_all,
        allow_devbox_to_devbox: allow_all || req.allow_devbox_to_devbox.unwrap_or(false),
        allow_runloop_mirrors: allow_all || req.allow_runloop_mirrors.unwrap_or(false),
        allow_agent_gateway: req.allow_agent_gateway.unwrap_or(false),
        allow_mcp_gateway: req.allow_mcp_gateway.unwrap_or(false),
        allowed_hostnames: hostnames,
        allowed_cidrs: cidrs,
        created: SystemTime::now(),
    };
    fake.policies
        .lock()
        .expect("policies")
        .insert(policy.id.clone(), policy.clone());
    Json(view(&policy)).into_response()
}

fn view(p: &Policy) -> Value {
    json!({
        "id": p.id,
        "name": p.name,
        "description": p.description,
        "create_time_ms": millis(p.created),
        "update_time_ms": millis(p.created),
        "egress": {
            "allow_all": p.allow_all,
            "allow_devbox_to_devbox": p.allow_devbox_to_devbox,
            "allow_runloop_mirrors": p.allow_runloop_mirrors,
            "allow_agent_gateway": p.allow_agent_gateway,
            "allow_mcp_gateway": p.allow_mcp_gateway,
            "allowed_hostnames": p.allowed_hostnames,
            "allowed_cidrs": p.allowed_cidrs,
        },
    })
}

fn not_found(id: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("NetworkPolicy {id} not found"),
    )
}

async fn detail(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    match fake.policies.lock().expect("policies").get(&id) {
        Some(p) => Json(view(p)).into_response(),
        None => not_found(&id),
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    starting_after: Option<String>,
    name: Option<String>,
}

/// `GET /v1/network-policies`: `{network_policies, has_more, total_count}`.
async fn list(State(fake): State<Arc<Runloop>>, Query(q): Query<ListQuery>) -> Response {
    let items: Vec<(u64, String, Policy)> = fake
        .policies
        .lock()
        .expect("policies")
        .values()
        .filter(|p| q.name.as_deref().is_none_or(|n| p.name == n))
        .map(|p| (p.seq, p.id.clone(), p.clone()))
        .collect();
    let (items, more, total) = page(items, q.limit, q.starting_after.as_deref());
    let policies: Vec<Value> = items.iter().map(view).collect();
    Json(json!({ "network_policies": policies, "has_more": more, "total_count": total }))
        .into_response()
}

/// `POST /v1/network-policies/{id}/delete`: refused while a live devbox uses it.
async fn remove(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    let in_use = fake.devboxes.lock().expect("devboxes").values().any(|d| {
        d.network_policy_id.as_deref() == Some(&id) && !matches!(d.status, "shutdown" | "failure")
    });
    if in_use {
        return error(
            StatusCode::CONFLICT,
            &format!("NetworkPolicy {id} is in use by a running devbox"),
        );
    }
    match fake.policies.lock().expect("policies").remove(&id) {
        Some(p) => Json(view(&p)).into_response(),
        None => not_found(&id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_checked_as_runloop_checks_them() {
        assert!(cidr_error(&json!({"cidr": "10.12.0.0/16"})).is_none());
        assert!(cidr_error(&json!({"cidr": "10.12.0.1/16"}))
            .unwrap()
            .contains("canonical"));
        assert!(cidr_error(&json!({"cidr": "2001:db8::/32"}))
            .unwrap()
            .contains("IPv4"));
        assert!(cidr_error(&json!({})).is_some());
        assert!(hostname_ok("github.com") && hostname_ok("*.npmjs.org"));
        assert!(!hostname_ok("localhost") && !hostname_ok("a_b.com") && !hostname_ok("*.*.a.io"));
    }
}

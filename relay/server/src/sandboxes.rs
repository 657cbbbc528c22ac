//! The sandbox lifecycle routes: create (and get-or-create), list, get, delete and renew.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use ipnet::IpNet;

use super::auth::mint_agent_token;
use super::bodies::JsonBody;
use super::cluster::Place;
use super::constants::{DEFAULT_PROVIDER, MAX_LIFETIME};
use super::error::ApiError;
use super::policy::check_lifetime;
use super::state::{find, now_ms, Relay};
use crate::bound_secrets;
use crate::caller::Caller;
use tether_client::api::{CreateRequest, RenewRequest, SandboxInfo};
use tether_relay_core::egress::policy::{Allowlist, BoundSecret};
use tether_relay_core::egress::route::{self, RelayEntry, PROXY_VARIABLES};
use tether_relay_core::provider::{
    NetworkPolicy, Provider, ProviderError, SandboxSpec, SandboxState,
};
use tether_store::{millis, state_name, PendingCreate, SandboxId, SandboxRecord, Tenant};

/// The state shown for a sandbox on the host of a relay that is down.
const UNAVAILABLE: &str = "unavailable";

/// `POST /v1/sandboxes`.
pub(super) async fn create(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    let mut req = parse_create(body)?;
    let provider = relay.provider(req.provider.as_deref().unwrap_or(DEFAULT_PROVIDER))?;
    super::power::check_idle_action(&*provider, &req.spec)?;
    relay.policy.admit(&caller, &*provider, &mut req.spec)?;
    let work_relay = relay.clone();
    let (status, info) = relay
        .detached(async move {
            let relay = &work_relay;
            if req.get_or_create {
                get_or_create(relay, provider, caller.tenant, req.spec).await
            } else {
                let sandbox = create_new(relay, provider, caller.tenant, req.spec).await?;
                Ok((StatusCode::CREATED, info(relay, &sandbox, true)))
            }
        })
        .await?;
    Ok((status, Json(info)))
}

/// `GET /v1/sandboxes?label=k=v...`.
pub(super) async fn list(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<SandboxInfo>>, ApiError> {
    let labels = label_filters(query.as_deref().unwrap_or(""))?;
    let found = relay.store.list(&caller.tenant, &labels).await?;
    Ok(Json(found.iter().map(|s| info(&relay, s, false)).collect()))
}

/// `GET /v1/sandboxes/{id}`, with the state fresh from the provider.
pub(super) async fn get(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let mut sandbox = find(&relay, &caller, id).await?;
    if let Ok(provider) = relay.provider_of(&sandbox) {
        relay.refresh_state(&*provider, &mut sandbox).await;
    }
    Ok(Json(info(&relay, &sandbox, false)))
}

/// `DELETE /v1/sandboxes/{id}`: idempotent, so an unknown id also answers 204. For the relay
/// admin, an id the store does not know may be an orphan's (`GET /v1/orphans`), which is
/// removed at its provider.
pub(super) async fn delete(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let Some(sandbox) = relay.store.get(&caller.tenant, &id.clone().into()).await? else {
        super::orphans::remove(&relay, &caller, &id).await?;
        return Ok(StatusCode::NO_CONTENT);
    };
    let provider = relay.provider_of(&sandbox)?;
    let work_relay = relay.clone();
    relay
        .detached(async move { work_relay.destroy(&*provider, &sandbox).await })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sandboxes/{id}/renew`: the TTL becomes `ttl_secs` from now.
pub(super) async fn renew(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<RenewRequest>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let ttl = Duration::from_secs(req.ttl_secs);
    check_lifetime("ttl_secs", ttl).map_err(ApiError::Invalid)?;
    relay.policy.check_renew(&caller.tenant, ttl)?;
    let mut sandbox = find(&relay, &caller, id).await?;
    let provider = relay.provider_of(&sandbox)?;
    // A sandbox on another relay's host has no provider-side lifetime to extend (those
    // providers keep a sandbox until it is deleted); the TTL is the store's.
    let renewed = match relay.is_here(&sandbox) {
        true => provider.renew(&sandbox.handle(), ttl).await,
        false => Ok(()),
    };
    if let Err(e) = renewed {
        if matches!(e, ProviderError::Gone(_)) {
            relay
                .store
                .set_state(&sandbox.id, SandboxState::Gone)
                .await?;
        }
        return Err(ApiError::provider(&sandbox.provider, Some(&sandbox.id), e));
    }
    let expires_ms = now_ms().saturating_add(millis(ttl));
    if !relay.store.set_ttl(&sandbox.id, ttl, expires_ms).await? {
        return Err(ApiError::Deleted(format!(
            "sandbox {} is being deleted by the relay (its TTL ran out, it sat idle, or its \
             provider reported it gone); create a new one",
            sandbox.id
        )));
    }
    (sandbox.ttl, sandbox.expires_ms) = (Some(ttl), Some(expires_ms));
    Ok(Json(info(&relay, &sandbox, false)))
}

/// Returns the tenant's sandbox with exactly `spec.labels`, creating it if there is none.
/// Callers with the same tenant and labels take turns, so two concurrent calls get one sandbox.
async fn get_or_create(
    relay: &Relay,
    provider: Arc<dyn Provider>,
    tenant: Tenant,
    spec: SandboxSpec,
) -> Result<(StatusCode, SandboxInfo), ApiError> {
    if spec.labels.is_empty() {
        return Err(ApiError::Invalid(
            "get_or_create finds a sandbox by its labels: give at least one label".into(),
        ));
    }
    let key = format!(
        "{tenant}\n{}",
        serde_json::to_string(&spec.labels).unwrap_or_default()
    );
    // Across every relay sharing the database (for SQLite, within this relay).
    let _turn = relay.store.lock_labels(&key).await?;
    if let Some(mut found) = relay.store.find_by_labels(&tenant, &spec.labels).await? {
        if let Ok(found_provider) = relay.provider_of(&found) {
            relay.refresh_state(&*found_provider, &mut found).await;
        }
        // A dead sandbox is kept for the client to see and remove, never handed out again.
        if !matches!(found.state, SandboxState::Gone | SandboxState::Dead) {
            return Ok((StatusCode::OK, info(relay, &found, false)));
        }
    }
    let sandbox = create_new(relay, provider, tenant, spec).await?;
    Ok((StatusCode::CREATED, info(relay, &sandbox, true)))
}

/// Creates a sandbox at the provider and records it.
async fn create_new(
    relay: &Relay,
    provider: Arc<dyn Provider>,
    tenant: Tenant,
    mut spec: SandboxSpec,
) -> Result<SandboxRecord, ApiError> {
    // Held until the sandbox is in the store, which then counts it.
    let _place = relay.policy.reserve(&relay.store, &tenant).await?;
    // Every sandbox has a TTL, which the reaper enforces: the request's, else the tenant's
    // default. The provider sees only one that was asked for, so it otherwise keeps its own
    // lifetime rules (E2B extends its timeout on every connect).
    let ttl = spec.ttl.unwrap_or_else(|| relay.policy.limits(&tenant).ttl);
    let id = SandboxId::generate();
    let agent_token = mint_agent_token();
    // Journaled before anything of it exists, so a relay killed from here on finds it at its
    // next start and removes what it made (see `recovery`).
    relay
        .store
        .begin_create(PendingCreate {
            id: id.clone(),
            tenant: tenant.clone(),
            provider: provider.name().to_string(),
            provider_ref: None,
            labels: spec.labels.clone(),
            started_ms: now_ms(),
            node: Some(relay.node.clone()),
        })
        .await?;
    let egress = match prepare_egress(relay, &*provider, &tenant, &id, &mut spec).await {
        Ok(egress) => egress,
        Err(e) => {
            abandon_create(relay, &id).await;
            return Err(e);
        }
    };
    // A sandbox elsewhere whose secrets go through the egress listener: the provider sees the
    // route (proxy variables, the listener in its allowlist), not the secrets.
    let routed = egress
        .as_ref()
        .and_then(|plan| routed_spec(relay, &spec, &id, &agent_token, plan));
    let provider_spec = routed.as_ref().unwrap_or(&spec);
    let created = match provider
        .create(id.as_str(), &agent_token, provider_spec)
        .await
    {
        Ok(created) => created,
        Err(e) => {
            if egress.is_some() {
                undo_egress(relay, &id).await;
            }
            // The provider undid its part of a failed create.
            abandon_create(relay, &id).await;
            return Err(ApiError::provider(provider.name(), Some(&id), e));
        }
    };
    if let Err(e) = relay.store.create_made(&id, &created.provider_ref).await {
        // Only a crash before the insert needs it; the insert will likely fail the same way.
        tracing::warn!(sandbox = %id, "cannot journal the provider's id of a new sandbox: {e}");
    }
    let now = now_ms();
    let sandbox = SandboxRecord {
        id,
        tenant,
        provider: provider.name().to_string(),
        provider_ref: created.provider_ref,
        labels: spec.labels.clone(),
        agent_token,
        meta: created.meta,
        created_ms: now,
        last_active_ms: now,
        ttl: Some(ttl),
        expires_ms: Some(now.saturating_add(millis(ttl))),
        idle_timeout: spec.idle_timeout,
        state: SandboxState::Running,
        node: Some(relay.node.clone()),
        spec,
    };
    // Nothing inside may run unconfined: the proxy is attached before anyone can reach the
    // sandbox, and a sandbox it cannot attach to is taken down.
    let attached = match egress {
        Some(plan) => attach_egress(relay, &*provider, &sandbox, plan).await,
        None => Ok(()),
    };
    let recorded = match attached {
        Ok(()) => relay
            .store
            .insert(sandbox.clone())
            .await
            .map_err(ApiError::from),
        Err(e) => Err(e),
    };
    if let Err(e) = recorded {
        // Unrecorded, nobody could reach or delete it: take it down now.
        let deleted = provider.delete(&sandbox.handle()).await;
        if sandbox.spec.network == NetworkPolicy::Allowlist {
            undo_egress(relay, &sandbox.id).await;
        }
        match deleted {
            Ok(()) | Err(ProviderError::Gone(_)) => abandon_create(relay, &sandbox.id).await,
            // Left journaled: the relay's next start removes it.
            Err(d) => tracing::warn!(
                sandbox = %sandbox.id,
                "cannot take down a sandbox that could not be registered: {d}; the relay \
                 removes it at its next start"
            ),
        }
        return Err(e);
    }
    Ok(sandbox)
}

/// Forgets the journaled create of `id`, which did not register its sandbox and whose
/// provider has undone its part. If that fails, the relay's next start removes it again.
async fn abandon_create(relay: &Relay, id: &SandboxId) {
    if let Err(e) = relay.store.finish_create(id).await {
        tracing::warn!(sandbox = %id, "cannot finish the journal of a failed create: {e}");
    }
}

/// What [`prepare_egress`] set up for a sandbox with an allowlist, for [`attach_egress`].
struct EgressPlan {
    /// What it may reach.
    allowlist: Allowlist,
    /// Its secrets, bound.
    secrets: Vec<BoundSecret>,
    /// For a sandbox elsewhere whose secrets go through the relay's egress listener: what its
    /// provider's allowlist must also hold to reach the listener.
    route: Option<RelayEntry>,
}

/// For a sandbox with an allowlist, before its provider creates it: checks the relay can serve
/// it, binds its secrets (their placeholders go into `spec.env`) and makes its CA. `None` for
/// a sandbox elsewhere without secrets, which its provider's egress controls alone serve.
async fn prepare_egress(
    relay: &Relay,
    provider: &dyn Provider,
    tenant: &Tenant,
    id: &SandboxId,
    spec: &mut SandboxSpec,
) -> Result<Option<EgressPlan>, ApiError> {
    let Some(allowlist) = Allowlist::from_spec(spec).map_err(ApiError::Invalid)? else {
        return Ok(None);
    };
    let route = if provider.runs_here() {
        check_local_egress(&allowlist)?;
        None
    } else if spec.secrets.is_empty() {
        // A cloud provider enforces the allowlist with its own egress controls, and refuses
        // at create what it cannot express.
        return Ok(None);
    } else {
        Some(check_route(relay, provider, id, spec)?)
    };
    let secrets = bound_secrets::bind(&relay.store, tenant, id, spec).await?;
    if let Err(e) = relay.egress.prepare(id, &secrets).await {
        let _ = bound_secrets::unbind(&relay.store, id).await;
        return Err(ApiError::Internal(e.to_string()));
    }
    Ok(Some(EgressPlan {
        allowlist,
        secrets,
        route,
    }))
}

/// Whether the relay can fence in a local sandbox with `allowlist`.
fn check_local_egress(allowlist: &Allowlist) -> Result<(), ApiError> {
    if let Some(net) = allowlist
        .networks
        .iter()
        .find(|n| matches!(n, IpNet::V6(_)))
    {
        return Err(ApiError::Invalid(format!(
            "the IPv6 network {net} cannot be allowed: local sandboxes reach the outside over \
             IPv4 only (IPv6 is refused whatever the allowlist); remove it, or allow the \
             service by name with --allow-host"
        )));
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(ApiError::Unavailable(
            "allowlisted egress on local sandboxes needs a relay running as root (it sets the \
             sandbox's firewall rules from inside its network namespace); run `tether serve` \
             as root, or create the sandbox with --network none"
                .into(),
        ));
    }
    Ok(())
}

/// For a sandbox elsewhere with secrets: whether the relay has an egress listener it can
/// reach, and what its provider's allowlist must hold for that.
fn check_route(
    relay: &Relay,
    provider: &dyn Provider,
    id: &SandboxId,
    spec: &SandboxSpec,
) -> Result<RelayEntry, ApiError> {
    let name = provider.name();
    let Some(url) = relay.egress.url() else {
        let names: Vec<&str> = spec.secrets.iter().map(|s| s.name.as_str()).collect();
        return Err(ApiError::Invalid(format!(
            "a sandbox on {name} gets secrets ({}) through the relay's egress proxy, and this \
             relay has no address at which sandboxes elsewhere can reach it: start it with \
             --egress-url URL (e.g. --egress-url https://relay.example.com; docs/secrets.md, \
             \"Secrets on cloud sandboxes\", says more), create the sandbox with --provider \
             local, or leave --secret out",
            names.join(", ")
        )));
    };
    if let Some(var) = PROXY_VARIABLES.iter().find(|v| spec.env.contains_key(**v)) {
        return Err(ApiError::Invalid(format!(
            "{var} is set by the relay in a sandbox on {name} with secrets (its HTTP clients \
             reach the relay's egress proxy with it); drop --env {var}"
        )));
    }
    provider
        .relay_egress_entry(spec, url)
        .map_err(|e| ApiError::provider(name, Some(id), e))
}

/// The spec a sandbox elsewhere is created from at its provider, when `plan` routes it: `spec`
/// with its secrets taken out (their placeholders stay in its environment), the proxy
/// variables and CA paths added to its environment, and the egress listener to its allowlist.
fn routed_spec(
    relay: &Relay,
    spec: &SandboxSpec,
    id: &SandboxId,
    agent_token: &str,
    plan: &EgressPlan,
) -> Option<SandboxSpec> {
    let entry = plan.route.as_ref()?;
    let url = relay.egress.url()?;
    let mut routed = spec.clone();
    routed.secrets.clear();
    entry.add_to(&mut routed.egress);
    let credential = route::credential(agent_token, id.as_str());
    let networks = &plan.allowlist.networks;
    for (name, value) in route::environment(url, id.as_str(), &credential, networks) {
        routed.env.insert(name.to_string(), value);
    }
    Some(routed)
}

/// Attaches the egress proxy to a sandbox just created: a local sandbox's network namespace,
/// or, for a sandbox elsewhere, its CA installed through its agent and its place on the
/// egress listener.
async fn attach_egress(
    relay: &Relay,
    provider: &dyn Provider,
    sandbox: &SandboxRecord,
    plan: EgressPlan,
) -> Result<(), ApiError> {
    if plan.route.is_none() {
        return attach_local(relay, provider, sandbox, plan.allowlist, plan.secrets).await;
    }
    let unavailable = |e: tether_egress::EgressError| ApiError::Unavailable(e.to_string());
    let ca = match relay.egress.take_trust(&sandbox.id) {
        Some(ca) => ca,
        None => relay
            .store
            .egress_ca(&sandbox.id)
            .await?
            .map(|ca| ca.cert_pem)
            .ok_or_else(|| unavailable(tether_egress::EgressError::NoCa(sandbox.id.to_string())))?,
    };
    let agent = provider
        .connect(&sandbox.handle())
        .await
        .map_err(|e| ApiError::provider(provider.name(), Some(&sandbox.id), e))?;
    let session = tether_client::Session::handshake(agent.into_websocket().await)
        .await
        .map_err(|e| {
            ApiError::Provider(format!(
                "the agent of sandbox {} did not answer, so its egress CA cannot be installed: {e}",
                sandbox.id
            ))
        })?;
    relay
        .egress
        .install_trust(&sandbox.id, &session, &ca)
        .await
        .map_err(unavailable)?;
    relay
        .egress
        .attach_remote(
            &sandbox.id,
            &sandbox.agent_token,
            plan.allowlist,
            plan.secrets,
        )
        .await
        .map_err(unavailable)
}

/// Attaches the egress proxy to a local sandbox's network namespace.
async fn attach_local(
    relay: &Relay,
    provider: &dyn Provider,
    sandbox: &SandboxRecord,
    allowlist: Allowlist,
    secrets: Vec<BoundSecret>,
) -> Result<(), ApiError> {
    let ns = provider
        .network_namespace(&sandbox.handle())
        .map_err(|e| ApiError::provider(provider.name(), Some(&sandbox.id), e))?
        .ok_or_else(|| {
            ApiError::Internal(format!(
                "provider `{}` has no network namespace for sandbox {}",
                provider.name(),
                sandbox.id
            ))
        })?;
    relay
        .egress
        .attach(&sandbox.id, ns, allowlist, secrets)
        .await
        .map_err(|e| ApiError::Unavailable(e.to_string()))
}

/// Forgets what [`prepare_egress`] recorded for a sandbox that was not created.
async fn undo_egress(relay: &Relay, id: &SandboxId) {
    relay.egress.unprepare(id).await;
    if let Err(e) = bound_secrets::unbind(&relay.store, id).await {
        tracing::warn!(sandbox = %id, "cannot forget the secrets bound to a failed create: {e}");
    }
}

/// At relay start: forgets the egress state of sandboxes the store no longer has (deleted
/// while the relay was down), then attaches the egress proxy again to every running sandbox
/// with an allowlist that the relay serves, with its secrets and CA from the store: local
/// ones, and ones elsewhere with secrets (their CA is installed already). Failures are
/// logged; a local sandbox stays cut off (its rules refuse everything), never open, and a
/// sandbox elsewhere gets no secret into its requests.
pub(super) async fn reattach_egress(relay: &Relay) {
    let all = match relay.store.all().await {
        Ok(all) => all,
        Err(e) => {
            tracing::warn!("cannot list sandboxes to re-attach their egress proxy: {e}");
            return;
        }
    };
    let known: std::collections::HashSet<String> =
        all.iter().map(|s| s.id.as_str().to_string()).collect();
    let swept = relay.egress.sweep(&known);
    if swept > 0 {
        tracing::info!("removed the egress state of {swept} sandboxes that no longer exist");
    }
    for sandbox in all {
        // Another relay's host runs the egress proxy of its own sandboxes.
        if sandbox.spec.network != NetworkPolicy::Allowlist
            || matches!(
                sandbox.state,
                SandboxState::Gone | SandboxState::Dead | SandboxState::Stopped
            )
            || !relay.is_here(&sandbox)
        {
            continue;
        }
        let Ok(provider) = relay.provider_of(&sandbox) else {
            continue;
        };
        if !provider.runs_here() && sandbox.spec.secrets.is_empty() {
            continue;
        }
        let result = reattach_one(relay, &*provider, &sandbox).await;
        if let Err(e) = result {
            tracing::warn!(sandbox = %sandbox.id, "cannot re-attach the egress proxy: {e}");
        }
    }
}

/// Attaches the relay's egress proxy to allowlisted `sandbox` again, with its allowlist and
/// bound secrets from the store: after a relay restart, or a start gave it a new network
/// namespace.
pub(super) async fn reattach_one(
    relay: &Relay,
    provider: &dyn Provider,
    sandbox: &SandboxRecord,
) -> Result<(), ApiError> {
    let allowlist = Allowlist::from_spec(&sandbox.spec)
        .map_err(ApiError::Invalid)?
        .unwrap_or_default();
    let secrets = bound_secrets::load(&relay.store, &sandbox.id).await?;
    if provider.runs_here() {
        attach_local(relay, provider, sandbox, allowlist, secrets).await
    } else {
        relay
            .egress
            .attach_remote(&sandbox.id, &sandbox.agent_token, allowlist, secrets)
            .await
            .map_err(|e| ApiError::Unavailable(e.to_string()))
    }
}

/// Reads a create request: unknown fields first (a typo must not silently become a default),
/// then durations (out-of-range seconds must be a 400, not a panic in the conversion to
/// [`Duration`]), then the rest.
fn parse_create(body: serde_json::Value) -> Result<CreateRequest, ApiError> {
    let serde_json::Value::Object(fields) = &body else {
        // Named by its kind, not quoted: it may hold secrets' values.
        let kind = match body {
            serde_json::Value::Array(_) => "an array",
            serde_json::Value::String(_) => "a string",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::Bool(_) => "a boolean",
            _ => "null",
        };
        return Err(ApiError::Invalid(format!(
            "the request body must be a JSON object, e.g. {{\"memory_bytes\": 536870912}}; got {kind}"
        )));
    };
    // Every field serializes (absent ones as null), so the default's keys are all the keys.
    let known = match serde_json::to_value(CreateRequest::default()) {
        Ok(serde_json::Value::Object(known)) => known,
        _ => {
            return Err(ApiError::Internal(
                "cannot list the create request's fields".into(),
            ))
        }
    };
    if let Some(unknown) = fields.keys().find(|k| !known.contains_key(*k)) {
        let expected: Vec<&str> = known.keys().map(String::as_str).collect();
        return Err(ApiError::Invalid(format!(
            "unknown field `{unknown}` in the request body; the fields are: {}",
            expected.join(", ")
        )));
    }
    for field in ["ttl", "idle_timeout"] {
        match body.get(field) {
            None | Some(serde_json::Value::Null) => {}
            Some(value) => {
                let secs = value.as_f64().filter(|s| s.is_finite() && *s > 0.0);
                let ok = secs.is_some_and(|s| s <= MAX_LIFETIME.as_secs_f64());
                if !ok {
                    return Err(ApiError::Invalid(format!(
                        "`{field}` must be a positive number of seconds, at most {}; got {value}",
                        MAX_LIFETIME.as_secs()
                    )));
                }
            }
        }
    }
    let req: CreateRequest = serde_json::from_value(body)
        .map_err(|e| ApiError::Invalid(format!("invalid request body: {e}")))?;
    if let Some(key) = req
        .spec
        .labels
        .keys()
        .find(|k| k.is_empty() || k.contains('='))
    {
        return Err(ApiError::Invalid(format!(
            "label key {key:?} must be non-empty and contain no `=`"
        )));
    }
    Ok(req)
}

/// Parses `label=KEY=VALUE` query parameters (repeatable, all must match).
fn label_filters(query: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
        .map_err(|e| ApiError::Invalid(format!("malformed query string: {e}")))?;
    let mut labels = BTreeMap::new();
    for (name, value) in pairs {
        if name != "label" {
            return Err(ApiError::Invalid(format!(
                "unknown query parameter `{name}`; filter with label=KEY=VALUE"
            )));
        }
        let Some((key, value)) = value.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            return Err(ApiError::Invalid(format!(
                "label filter `{value}` must be KEY=VALUE, e.g. label=app=web"
            )));
        };
        if let Some(other) = labels.insert(key.to_string(), value.to_string()) {
            if other != value {
                return Err(ApiError::Invalid(format!(
                    "label `{key}` is filtered as both `{other}` and `{value}`; no sandbox \
                     can match both"
                )));
            }
        }
    }
    Ok(labels)
}

/// A sandbox as clients see it, with what its provider guarantees of its network.
pub(super) fn info(relay: &Relay, sandbox: &SandboxRecord, created: bool) -> SandboxInfo {
    SandboxInfo {
        id: sandbox.id.to_string(),
        provider: sandbox.provider.clone(),
        provider_ref: sandbox.provider_ref.clone(),
        // A sandbox whose relay is down is not gone: it is unavailable until that relay is back.
        state: match relay.place(sandbox) {
            Place::Away { .. } => UNAVAILABLE.to_string(),
            _ => state_name(sandbox.state).to_string(),
        },
        labels: sandbox.labels.clone(),
        image: sandbox.spec.image.clone(),
        created_ms: sandbox.created_ms,
        last_active_ms: sandbox.last_active_ms,
        expires_ms: sandbox.expires_ms,
        // Rounded up, so a sub-second timeout never reads as 0 ("none").
        idle_timeout_secs: sandbox
            .idle_timeout
            .map(|d| d.as_millis().div_ceil(1000) as u64),
        created,
        network: relay
            .providers
            .get(sandbox.provider.as_str())
            .map(|p| p.network_info(&sandbox.spec)),
        capabilities: relay
            .providers
            .get(sandbox.provider.as_str())
            .map(|p| p.capabilities()),
        auto_resume: sandbox.spec.auto_resume.unwrap_or(true),
        on_idle: sandbox.spec.on_idle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_label_filters() {
        let got = label_filters("label=app%3Dweb&label=env=dev=1").unwrap();
        let want: BTreeMap<String, String> = [("app", "web"), ("env", "dev=1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
        assert!(label_filters("").unwrap().is_empty());
        for bad in [
            "label=novalue",
            "label==x",
            "lable=a=b",
            "label=a=1&label=a=2",
        ] {
            let err = label_filters(bad).unwrap_err().to_string();
            assert!(err.contains("label"), "{bad}: {err}");
        }
    }

    #[test]
    fn rejects_durations_that_would_panic() {
        for bad in [
            serde_json::json!({"ttl": -1}),
            serde_json::json!({"ttl": 1e300}),
            serde_json::json!({"idle_timeout": "10"}),
            serde_json::json!({"idle_timeout": 0}),
        ] {
            let err = parse_create(bad.clone()).unwrap_err();
            assert!(matches!(err, ApiError::Invalid(_)), "{bad}: {err}");
        }
        let ok = parse_create(serde_json::json!({"ttl": 1.5, "labels": {"a": "b"}})).unwrap();
        assert_eq!(ok.spec.ttl, Some(Duration::from_millis(1500)));
        let err = parse_create(serde_json::json!({"labels": {"a": 1}})).unwrap_err();
        assert!(err.to_string().contains("invalid request body"), "{err}");
    }
}

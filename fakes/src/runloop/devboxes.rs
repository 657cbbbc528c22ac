//! The fake's devboxes: `/v1/devboxes` (create, get, update, list), their lifecycle
//! (`shutdown`, `suspend`, `resume`, `keep_alive`, `wait_for_status`), tunnels
//! (`enable_tunnel`, `remove_tunnel`) and `execute_async` with its executions, with Runloop's
//! field names and states, and the timers Runloop enforces.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{error, millis, new_id, page, Lie, Runloop};

/// Runloop's keep-alive time when a create names none.
const DEFAULT_KEEP_ALIVE_SECS: u64 = 3600;
/// The longest keep-alive time Runloop takes.
const MAX_KEEP_ALIVE_SECS: u64 = 172_800;
/// The longest hold of `wait_for_status` (Runloop's server caps it at 30 s).
const MAX_WAIT: Duration = Duration::from_secs(30);
/// How often a held `wait_for_status` looks again.
const WAIT_POLL: Duration = Duration::from_millis(50);
/// The most output an execution keeps, per stream.
const MAX_EXEC_OUTPUT: usize = 64 << 10; // 64 KiB
/// Every status, as `DevboxView.status` has them.
const STATUSES: [&str; 10] = [
    "scheduled",
    "queued",
    "provisioning",
    "initializing",
    "running",
    "suspending",
    "suspended",
    "resuming",
    "failure",
    "shutdown",
];

/// One devbox.
#[derive(Clone, Debug)]
pub(super) struct Devbox {
    pub(super) id: String,
    seq: u64,
    name: Option<String>,
    pub(super) status: &'static str,
    blueprint_id: Option<String>,
    /// The image its local sandbox runs; `None`: the host-like default root.
    image: Option<PathBuf>,
    entrypoint: Option<String>,
    launch_commands: Vec<String>,
    env: BTreeMap<String, String>,
    metadata: BTreeMap<String, String>,
    /// `launch_parameters` as given, read back as given.
    launch: Value,
    keep_alive_secs: u64,
    /// `after_idle`: seconds and action.
    idle: Option<(u64, String)>,
    pub(super) network_policy_id: Option<String>,
    pub(super) tunnel: Option<Tunnel>,
    failure_reason: Option<&'static str>,
    shutdown_reason: Option<&'static str>,
    create_time: SystemTime,
    end_time: Option<SystemTime>,
    transitions: Vec<(&'static str, SystemTime)>,
    /// The keep-alive timer's start: create, or the last `keep_alive`.
    alive_since: Instant,
    /// The idle timer's start: the last activity.
    pub(super) active_since: Instant,
    /// Bumped at every boot, so a process of an earlier boot cannot end a later one.
    boot: u64,
}

/// A devbox's V2 tunnel.
#[derive(Clone, Debug)]
pub(super) struct Tunnel {
    pub(super) key: String,
    pub(super) auth_token: Option<String>,
    pub(super) http_keep_alive: bool,
    pub(super) wake_on_http: bool,
    create_time: SystemTime,
}

/// One `execute_async`.
#[derive(Clone, Debug)]
pub(super) struct Execution {
    devbox_id: String,
    status: &'static str,
    exit_status: Option<i32>,
    stdout: String,
    stderr: String,
}

/// The devbox routes.
pub(super) fn routes() -> Router<Arc<Runloop>> {
    Router::new()
        .route("/v1/devboxes", post(create).get(list))
        // The SDK's create_and_await_running: a create, then its own wait for `running`.
        .route("/v1/devboxes/create_and_await_running", post(create))
        .route("/v1/devboxes/{id}", get(detail).post(update))
        .route("/v1/devboxes/{id}/shutdown", post(shutdown))
        .route("/v1/devboxes/{id}/suspend", post(suspend))
        .route("/v1/devboxes/{id}/resume", post(resume))
        .route("/v1/devboxes/{id}/keep_alive", post(keep_alive))
        .route("/v1/devboxes/{id}/wait_for_status", post(wait_for_status))
        .route("/v1/devboxes/{id}/enable_tunnel", post(enable_tunnel))
        .route("/v1/devboxes/{id}/remove_tunnel", post(remove_tunnel))
        .route("/v1/devboxes/{id}/execute_async", post(execute_async))
        .route("/v1/devboxes/{id}/executions/{execution}", get(execution))
}

fn not_found(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, &format!("Devbox {id} not found"))
}

fn bad_request(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

impl Devbox {
    /// Whether HTTP traffic through its tunnel resumes it
    /// (`launch_parameters.lifecycle.resume_triggers.http`).
    pub(super) fn wakes_on_http(&self) -> Option<bool> {
        self.launch
            .pointer("/lifecycle/resume_triggers/http")
            .and_then(Value::as_bool)
    }
}

impl Runloop {
    fn devbox(&self, id: &str) -> Option<Devbox> {
        self.devboxes.lock().expect("devboxes").get(id).cloned()
    }

    fn change(&self, id: &str, change: impl FnOnce(&mut Devbox)) -> Option<Devbox> {
        let mut table = self.devboxes.lock().expect("devboxes");
        let d = table.get_mut(id)?;
        change(d);
        Some(d.clone())
    }

    /// Moves devbox `id` to `status`, recording the transition.
    pub(super) fn set_status(&self, id: &str, status: &'static str) -> Option<Devbox> {
        self.change(id, |d| {
            d.status = status;
            d.transitions.push((status, SystemTime::now()));
        })
    }

    /// Ends devbox `id` (`shutdown` or `failure`, with its reason) and removes its sandbox.
    pub(super) async fn end(
        &self,
        id: &str,
        status: &'static str,
        reason: &'static str,
    ) -> Option<Devbox> {
        let ended = self.change(id, |d| {
            if matches!(d.status, "shutdown" | "failure") {
                return;
            }
            d.status = status;
            d.transitions.push((status, SystemTime::now()));
            d.end_time = Some(SystemTime::now());
            match status {
                "failure" => d.failure_reason = Some(reason),
                _ => d.shutdown_reason = Some(reason),
            }
        });
        if let Err(e) = self.sandboxes.delete(id).await {
            tracing::warn!("cannot remove the local sandbox behind {id}: {e}");
        }
        ended
    }

    /// Boots devbox `id`: its local sandbox, its launch commands, and (`with_entrypoint`) its
    /// entrypoint, then `running`; `failure` if any of it fails.
    pub(super) async fn boot(self: &Arc<Self>, id: &str, with_entrypoint: bool) {
        let Some(d) = self.change(id, |d| d.boot += 1) else {
            return;
        };
        if let Err(e) = self.sandboxes.create_from(id, d.image.as_deref()).await {
            tracing::info!("devbox {id} failed to boot: {e:#}");
            self.end(id, "failure", "execution_failed").await;
            return;
        }
        let still = self.change(id, |d| {
            if d.status == "provisioning" {
                d.status = "initializing";
                d.transitions.push(("initializing", SystemTime::now()));
            }
        });
        if still.is_none_or(|d| !matches!(d.status, "initializing" | "resuming")) {
            // Shut down (or suspended) while booting: nothing of this boot may stay.
            let _ = self.sandboxes.delete(id).await;
            return;
        }
        for command in &d.launch_commands {
            let argv = vec!["sh".into(), "-c".into(), command.clone()];
            let ran = match self.sandboxes.start(id, argv, d.env.clone(), None).await {
                Ok(process) => process_exit(process).await.0,
                Err(_) => -1,
            };
            if ran != 0 {
                tracing::info!("devbox {id}: launch command {command:?} exited {ran}");
                self.end(id, "failure", "execution_failed").await;
                return;
            }
        }
        if let (true, Some(entrypoint)) = (with_entrypoint, d.entrypoint.clone()) {
            let argv = vec!["sh".into(), "-c".into(), entrypoint];
            match self.sandboxes.start(id, argv, d.env.clone(), None).await {
                Ok(process) => {
                    let fake = Arc::downgrade(self);
                    let (id, boot) = (id.to_string(), d.boot);
                    tokio::spawn(async move {
                        process_exit(process).await;
                        let Some(fake) = fake.upgrade() else { return };
                        // The devbox's lifecycle is bound to its entrypoint (this boot's), even one that
                        // exits before the devbox is marked running.
                        if fake.devbox(&id).is_some_and(|d| {
                            d.boot == boot && matches!(d.status, "initializing" | "running")
                        }) {
                            fake.end(&id, "shutdown", "entrypoint_exit").await;
                        }
                    });
                }
                Err(e) => {
                    tracing::info!("devbox {id}: cannot start its entrypoint: {e:#}");
                    self.end(id, "failure", "execution_failed").await;
                    return;
                }
            }
        }
        let now = Instant::now();
        self.change(id, |d| {
            if matches!(d.status, "initializing" | "resuming") {
                d.status = "running";
                d.transitions.push(("running", SystemTime::now()));
                d.alive_since = now;
                d.active_since = now;
            }
        });
    }

    /// Counts activity on devbox `id` (its idle timer starts again).
    pub(super) fn touch(&self, id: &str) {
        self.change(id, |d| d.active_since = Instant::now());
    }

    /// The DevboxView of `d`, lying as told.
    fn view(&self, d: &Devbox) -> Value {
        let lie = self.lie();
        let id = match lie {
            Lie::DevboxId => format!("../../v1/objects/{}", d.id),
            _ => d.id.clone(),
        };
        let tunnel = d.tunnel.as_ref().map(|t| {
            let key = match lie {
                Lie::TunnelKey => "evil.example.com/x".to_string(),
                _ => t.key.clone(),
            };
            tunnel_view(t, &key)
        });
        let mut launch = d.launch.clone();
        if !launch.is_object() {
            launch = json!({});
        }
        json!({
            "id": id,
            "name": d.name,
            "status": d.status,
            "capabilities": [],
            "create_time_ms": millis(d.create_time),
            "end_time_ms": d.end_time.map(millis),
            "blueprint_id": d.blueprint_id,
            "snapshot_id": null,
            "launch_parameters": launch,
            "metadata": d.metadata,
            "state_transitions": d.transitions.iter().map(|(s, at)| json!({
                "status": s, "transition_time_ms": millis(*at),
            })).collect::<Vec<_>>(),
            "failure_reason": d.failure_reason,
            "shutdown_reason": d.shutdown_reason,
            "initiator_type": "api",
            "tunnel": tunnel,
        })
    }

    fn answer(&self, d: &Devbox) -> Response {
        Json(self.view(d)).into_response()
    }
}

fn tunnel_view(t: &Tunnel, key: &str) -> Value {
    json!({
        "tunnel_key": key,
        "auth_mode": if t.auth_token.is_some() { "authenticated" } else { "open" },
        "auth_token": t.auth_token,
        "http_keep_alive": t.http_keep_alive,
        "wake_on_http": t.wake_on_http,
        "create_time_ms": millis(t.create_time),
    })
}

/// Waits for `process` to end; its exit code (-1 when unknown) and its output, bounded.
async fn process_exit(mut process: tether_client::Process) -> (i32, String, String) {
    let (mut code, mut out, mut err) = (-1, Vec::new(), Vec::new());
    while let Some(event) = process.next().await {
        match event {
            Ok(tether_client::ProcessEvent::Stdout(b)) if out.len() < MAX_EXEC_OUTPUT => {
                out.extend_from_slice(&b)
            }
            Ok(tether_client::ProcessEvent::Stderr(b)) if err.len() < MAX_EXEC_OUTPUT => {
                err.extend_from_slice(&b)
            }
            Ok(tether_client::ProcessEvent::Exit(status)) => code = status.shell_code(),
            _ => {}
        }
    }
    out.truncate(MAX_EXEC_OUTPUT);
    err.truncate(MAX_EXEC_OUTPUT);
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// `tunnel` of a create, and `enable_tunnel`'s body.
#[derive(Debug, Default, Deserialize)]
struct TunnelParams {
    auth_mode: Option<String>,
    http_keep_alive: Option<bool>,
    wake_on_http: Option<bool>,
}

/// A new tunnel, or Runloop's 400 message.
fn new_tunnel(p: &TunnelParams) -> Result<Tunnel, String> {
    let authenticated = match p.auth_mode.as_deref() {
        None | Some("open") => false,
        Some("authenticated") => true,
        Some(other) => {
            return Err(format!(
                "auth_mode must be one of open, authenticated, not {other}"
            ))
        }
    };
    Ok(Tunnel {
        key: crate::sandboxes::random_id(24, b"abcdefghijklmnopqrstuvwxyz0123456789"),
        auth_token: authenticated.then(|| crate::sandboxes::random_hex(24)),
        http_keep_alive: p.http_keep_alive.unwrap_or(true),
        wake_on_http: p.wake_on_http.unwrap_or(false),
        create_time: SystemTime::now(),
    })
}

#[derive(Debug, Deserialize)]
struct CreateDevbox {
    name: Option<String>,
    blueprint_id: Option<String>,
    blueprint_name: Option<String>,
    snapshot_id: Option<String>,
    entrypoint: Option<String>,
    #[serde(default)]
    environment_variables: Option<BTreeMap<String, String>>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    launch_parameters: Option<Value>,
    tunnel: Option<TunnelParams>,
}

/// `LaunchParameters`, the part the fake acts on.
#[derive(Debug, Default, Deserialize)]
struct Launch {
    keep_alive_time_seconds: Option<u64>,
    launch_commands: Option<Vec<String>>,
    network_policy_id: Option<String>,
    resource_size_request: Option<String>,
    custom_cpu_cores: Option<f64>,
    custom_gb_memory: Option<u64>,
    custom_disk_size: Option<u64>,
    after_idle: Option<AfterIdle>,
    lifecycle: Option<Lifecycle>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
struct AfterIdle {
    idle_time_seconds: u64,
    on_idle: String,
}

#[derive(Debug, Deserialize)]
struct Lifecycle {
    after_idle: Option<AfterIdle>,
}

/// Runloop's checks of a size: the presets, or a custom size within its rules.
fn check_size(l: &Launch) -> Result<(), String> {
    const SIZES: [&str; 7] = [
        "X_SMALL",
        "SMALL",
        "MEDIUM",
        "LARGE",
        "X_LARGE",
        "XX_LARGE",
        "CUSTOM_SIZE",
    ];
    let custom = l.custom_cpu_cores.is_some()
        || l.custom_gb_memory.is_some()
        || l.custom_disk_size.is_some();
    match l.resource_size_request.as_deref() {
        None if custom => return Err("custom sizes need resource_size_request CUSTOM_SIZE".into()),
        None => return Ok(()),
        Some(s) if !SIZES.contains(&s) => return Err(format!("unknown resource_size_request {s}")),
        Some("CUSTOM_SIZE") => {}
        Some(_) if custom => {
            return Err(
                "custom_cpu_cores, custom_gb_memory and custom_disk_size need CUSTOM_SIZE".into(),
            )
        }
        Some(_) => return Ok(()),
    }
    let (Some(cpu), Some(mem)) = (l.custom_cpu_cores, l.custom_gb_memory) else {
        return Err("CUSTOM_SIZE needs custom_cpu_cores and custom_gb_memory".into());
    };
    if !(cpu == 0.5 || cpu == 1.0 || (cpu.fract() == 0.0 && (cpu as u64).is_multiple_of(2)))
        || cpu <= 0.0
        || cpu > 16.0
    {
        return Err("CPU must be 0.5, 1, or a multiple of 2 (max 16)".into());
    }
    if mem == 0 || (mem != 1 && !mem.is_multiple_of(2)) || mem > 64 {
        return Err("Memory must be 1 or a multiple of 2 (max 64GiB)".into());
    }
    let ratio = mem as f64 / cpu;
    if !(2.0..=8.0).contains(&ratio) {
        return Err("The cpu:memory ratio must be between 1:2 and 1:8 inclusive".into());
    }
    if let Some(disk) = l.custom_disk_size {
        if !disk.is_multiple_of(2) || !(2..=64).contains(&disk) {
            return Err("Disk must be a multiple of 2 (min 2GiB, max 64GiB)".into());
        }
    }
    Ok(())
}

async fn create(State(fake): State<Arc<Runloop>>, body: axum::body::Bytes) -> Response {
    let req: CreateDevbox = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&format!("invalid request body: {e}")),
    };
    let sources = [&req.blueprint_id, &req.blueprint_name, &req.snapshot_id]
        .iter()
        .filter(|s| s.is_some())
        .count();
    if sources > 1 {
        return bad_request(
            "Only one of snapshot_id, blueprint_id, blueprint_name may be specified",
        );
    }
    if req.snapshot_id.is_some() {
        return bad_request("this fake keeps no disk snapshots: create from a blueprint");
    }
    let launch_value = req.launch_parameters.clone().unwrap_or_else(|| json!({}));
    let launch: Launch = match serde_json::from_value(launch_value.clone()) {
        Ok(l) => l,
        Err(e) => return bad_request(&format!("invalid launch_parameters: {e}")),
    };
    if let Err(message) = check_size(&launch) {
        return bad_request(&message);
    }
    let keep_alive_secs = launch
        .keep_alive_time_seconds
        .unwrap_or(DEFAULT_KEEP_ALIVE_SECS);
    if keep_alive_secs == 0 || keep_alive_secs > MAX_KEEP_ALIVE_SECS {
        return bad_request("keep_alive_time_seconds must be between 1 and 172800");
    }
    let nested = launch.lifecycle.as_ref().and_then(|l| l.after_idle.clone());
    if let (Some(top), Some(nested)) = (&launch.after_idle, &nested) {
        if top != nested {
            return bad_request("after_idle and lifecycle.after_idle must have the same value");
        }
    }
    let idle = nested.or(launch.after_idle.clone());
    if let Some(idle) = &idle {
        if !matches!(idle.on_idle.as_str(), "shutdown" | "suspend") || idle.idle_time_seconds == 0 {
            return bad_request(
                "after_idle needs idle_time_seconds > 0 and on_idle shutdown or suspend",
            );
        }
    }
    if let Some(policy) = &launch.network_policy_id {
        if !fake.policies.lock().expect("policies").contains_key(policy) {
            return error(
                StatusCode::NOT_FOUND,
                &format!("NetworkPolicy {policy} not found"),
            );
        }
    }
    let (blueprint_id, image) = match super::blueprints::resolve(
        &fake,
        req.blueprint_id.as_deref(),
        req.blueprint_name.as_deref(),
    ) {
        Ok(found) => found,
        Err((status, message)) => return error(status, &message),
    };
    let tunnel = match req.tunnel.as_ref().map(new_tunnel).transpose() {
        Ok(t) => t,
        Err(message) => return bad_request(&message),
    };
    let now = SystemTime::now();
    let devbox = Devbox {
        id: new_id("dbx"),
        seq: fake.next_sequence(),
        name: req.name,
        status: "provisioning",
        blueprint_id,
        image,
        entrypoint: req.entrypoint.filter(|e| !e.trim().is_empty()),
        launch_commands: launch.launch_commands.clone().unwrap_or_default(),
        env: req.environment_variables.unwrap_or_default(),
        metadata: req.metadata.unwrap_or_default(),
        launch: launch_value,
        keep_alive_secs,
        idle: idle.map(|i| (i.idle_time_seconds, i.on_idle)),
        network_policy_id: launch.network_policy_id.clone(),
        tunnel,
        failure_reason: None,
        shutdown_reason: None,
        create_time: now,
        end_time: None,
        transitions: vec![("provisioning", now)],
        alive_since: Instant::now(),
        active_since: Instant::now(),
        boot: 0,
    };
    let id = devbox.id.clone();
    fake.devboxes
        .lock()
        .expect("devboxes")
        .insert(id.clone(), devbox.clone());
    let booting = fake.clone();
    tokio::spawn(async move { booting.boot(&id, true).await });
    fake.answer(&devbox)
}

async fn detail(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    match fake.devbox(&id) {
        Some(d) => fake.answer(&d),
        None => not_found(&id),
    }
}

#[derive(Debug, Deserialize)]
struct Update {
    metadata: Option<BTreeMap<String, String>>,
    name: Option<String>,
}

/// `POST /v1/devboxes/{id}`: omitted fields stay; an empty name or map clears them.
async fn update(
    State(fake): State<Arc<Runloop>>,
    Path(id): Path<String>,
    Json(body): Json<Update>,
) -> Response {
    let changed = fake.change(&id, |d| {
        if let Some(metadata) = body.metadata {
            d.metadata = metadata;
        }
        if let Some(name) = body.name {
            d.name = (!name.is_empty()).then_some(name);
        }
    });
    match changed {
        Some(d) => fake.answer(&d),
        None => not_found(&id),
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    starting_after: Option<String>,
    status: Option<String>,
    include_total_count: Option<bool>,
}

/// `GET /v1/devboxes`: newest first, `{devboxes, has_more, total_count}`.
async fn list(State(fake): State<Arc<Runloop>>, Query(q): Query<ListQuery>) -> Response {
    if let Some(status) = &q.status {
        if !STATUSES.contains(&status.as_str()) {
            return bad_request(&format!("unknown status {status}"));
        }
    }
    let items: Vec<(u64, String, Devbox)> = fake
        .devboxes
        .lock()
        .expect("devboxes")
        .values()
        .filter(|d| q.status.as_deref().is_none_or(|s| d.status == s))
        .map(|d| (d.seq, d.id.clone(), d.clone()))
        .collect();
    let (items, more, total) = page(items, q.limit, q.starting_after.as_deref());
    let devboxes: Vec<Value> = items.iter().map(|d| fake.view(d)).collect();
    let total = q.include_total_count.unwrap_or(true).then_some(total);
    Json(json!({ "devboxes": devboxes, "has_more": more, "total_count": total })).into_response()
}

#[derive(Debug, Deserialize)]
struct ShutdownQuery {
    force: Option<String>,
}

/// `POST /v1/devboxes/{id}/shutdown`: ends it for good; a devbox that ended already is
/// answered as it is.
async fn shutdown(
    State(fake): State<Arc<Runloop>>,
    Path(id): Path<String>,
    Query(q): Query<ShutdownQuery>,
) -> Response {
    // The fake takes no snapshots, so nothing is in progress for `force` to override.
    if q.force
        .as_deref()
        .is_some_and(|f| f != "true" && f != "false")
    {
        return bad_request("force must be true or false");
    }
    if fake.devbox(&id).is_none() {
        return not_found(&id);
    }
    match fake.end(&id, "shutdown", "api_shutdown").await {
        Some(d) => fake.answer(&d),
        None => not_found(&id),
    }
}

/// Suspends a running devbox: `suspending`, its local sandbox discarded, `suspended`.
pub(super) async fn suspend_now(fake: &Arc<Runloop>, id: &str) -> Option<Devbox> {
    fake.set_status(id, "suspending")?;
    if let Err(e) = fake.sandboxes.delete(id).await {
        tracing::warn!("cannot remove the local sandbox behind {id}: {e}");
    }
    fake.change(id, |d| {
        if d.status == "suspending" {
            d.status = "suspended";
            d.transitions.push(("suspended", SystemTime::now()));
        }
    })
}

async fn suspend(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    let Some(d) = fake.devbox(&id) else {
        return not_found(&id);
    };
    if d.status != "running" {
        return bad_request(&format!(
            "Devbox {id} is {} and cannot be suspended",
            d.status
        ));
    }
    match suspend_now(&fake, &id).await {
        Some(d) => fake.answer(&d),
        None => not_found(&id),
    }
}

/// Resumes a suspended devbox: `resuming`, then booted again in the background, without
/// its entrypoint (Runloop restarts no process at a resume).
pub(super) fn resume_now(fake: &Arc<Runloop>, id: &str) -> Option<Devbox> {
    let d = fake.set_status(id, "resuming")?;
    let booting = fake.clone();
    let id = id.to_string();
    tokio::spawn(async move {
        booting.boot(&id, false).await;
    });
    Some(d)
}

async fn resume(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    let Some(d) = fake.devbox(&id) else {
        return not_found(&id);
    };
    if d.status != "suspended" {
        return bad_request(&format!(
            "Devbox {id} is {} and cannot be resumed",
            d.status
        ));
    }
    // `initializing` comes first in boot; `resuming` is what the answer shows.
    match resume_now(&fake, &id) {
        Some(d) => fake.answer(&d),
        None => not_found(&id),
    }
}

/// `POST /v1/devboxes/{id}/keep_alive`: both timers start again; a devbox that is not
/// running cannot be kept alive.
async fn keep_alive(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    let Some(d) = fake.devbox(&id) else {
        return not_found(&id);
    };
    if d.status != "running" {
        return bad_request(&format!("Devbox {id} is {}, not running", d.status));
    }
    let now = Instant::now();
    fake.change(&id, |d| {
        d.alive_since = now;
        d.active_since = now;
    });
    Json(json!({})).into_response()
}

#[derive(Debug, Deserialize)]
struct WaitFor {
    statuses: Vec<String>,
    timeout_seconds: Option<f64>,
}

/// `POST /v1/devboxes/{id}/wait_for_status`: the devbox once its status is one of those
/// asked for, or 408 when the hold ends first.
async fn wait_for_status(
    State(fake): State<Arc<Runloop>>,
    Path(id): Path<String>,
    Json(body): Json<WaitFor>,
) -> Response {
    if let Some(bad) = body
        .statuses
        .iter()
        .find(|s| !STATUSES.contains(&s.as_str()))
    {
        return bad_request(&format!("unknown status {bad}"));
    }
    let hold = Duration::from_secs_f64(body.timeout_seconds.unwrap_or(30.0).clamp(0.0, 30.0))
        .min(MAX_WAIT);
    let deadline = Instant::now() + hold;
    loop {
        let Some(d) = fake.devbox(&id) else {
            return not_found(&id);
        };
        if body.statuses.iter().any(|s| s == d.status) {
            return fake.answer(&d);
        }
        if Instant::now() >= deadline {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                &format!("Devbox {id} is still {}", d.status),
            );
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

async fn enable_tunnel(
    State(fake): State<Arc<Runloop>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let params: TunnelParams = if body.is_empty() {
        TunnelParams::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(p) => p,
            Err(e) => return bad_request(&format!("invalid request body: {e}")),
        }
    };
    let Some(d) = fake.devbox(&id) else {
        return not_found(&id);
    };
    if matches!(d.status, "shutdown" | "failure") {
        return bad_request(&format!("Devbox {id} is {}", d.status));
    }
    if d.tunnel.is_some() {
        return bad_request(&format!("Devbox {id} already has a tunnel"));
    }
    let tunnel = match new_tunnel(&params) {
        Ok(t) => t,
        Err(message) => return bad_request(&message),
    };
    fake.change(&id, |d| d.tunnel = Some(tunnel.clone()));
    Json(tunnel_view(&tunnel, &tunnel.key)).into_response()
}

async fn remove_tunnel(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    match fake.change(&id, |d| d.tunnel = None) {
        Some(_) => Json(json!({})).into_response(),
        None => not_found(&id),
    }
}

#[derive(Debug, Deserialize)]
struct Execute {
    command: String,
}

/// `POST /v1/devboxes/{id}/execute_async`: the command in the devbox's shell with its
/// environment; `{devbox_id, execution_id, status}`.
async fn execute_async(
    State(fake): State<Arc<Runloop>>,
    Path(id): Path<String>,
    Json(body): Json<Execute>,
) -> Response {
    let Some(d) = fake.devbox(&id) else {
        return not_found(&id);
    };
    if d.status != "running" {
        return bad_request(&format!("Devbox {id} is {}, not running", d.status));
    }
    fake.touch(&id);
    let argv = vec!["sh".into(), "-c".into(), body.command];
    let process = match fake.sandboxes.start(&id, argv, d.env.clone(), None).await {
        Ok(p) => p,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    };
    let execution_id = new_id("exe");
    let execution = Execution {
        devbox_id: id.clone(),
        status: "running",
        exit_status: None,
        stdout: String::new(),
        stderr: String::new(),
    };
    fake.executions
        .lock()
        .expect("executions")
        .insert(execution_id.clone(), execution.clone());
    let weak: Weak<Runloop> = Arc::downgrade(&fake);
    let eid = execution_id.clone();
    tokio::spawn(async move {
        let (code, stdout, stderr) = process_exit(process).await;
        let Some(fake) = weak.upgrade() else { return };
        let mut executions = fake.executions.lock().expect("executions");
        if let Some(e) = executions.get_mut(&eid) {
            e.status = "completed";
            e.exit_status = Some(code);
            e.stdout = stdout;
            e.stderr = stderr;
        }
    });
    Json(execution_view(&execution_id, &execution)).into_response()
}

fn execution_view(id: &str, e: &Execution) -> Value {
    json!({
        "devbox_id": e.devbox_id,
        "execution_id": id,
        "status": e.status,
        "exit_status": e.exit_status,
        "stdout": (e.status == "completed").then_some(&e.stdout),
        "stderr": (e.status == "completed").then_some(&e.stderr),
    })
}

async fn execution(
    State(fake): State<Arc<Runloop>>,
    Path((id, execution)): Path<(String, String)>,
) -> Response {
    let found = fake
        .executions
        .lock()
        .expect("executions")
        .get(&execution)
        .filter(|e| e.devbox_id == id)
        .cloned();
    match found {
        Some(e) => Json(execution_view(&execution, &e)).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            &format!("Execution {execution} not found"),
        ),
    }
}

/// Enforces Runloop's timers every `every`, until the fake is dropped: a running devbox
/// whose keep-alive time has passed shuts down (`keep_alive_timeout`); one with `after_idle`
/// is shut down (`idle`) or suspended once idle that long (it then ignores the keep-alive
/// time, as Runloop does).
pub(super) async fn reap(fake: Weak<Runloop>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(fake) = fake.upgrade() else { return };
        let now = Instant::now();
        let due: Vec<(String, &'static str)> = fake
            .devboxes
            .lock()
            .expect("devboxes")
            .values()
            .filter(|d| d.status == "running")
            .filter_map(|d| match &d.idle {
                Some((secs, action)) => {
                    (now.duration_since(d.active_since) >= Duration::from_secs(*secs)).then(|| {
                        let action = if action == "suspend" {
                            "suspend"
                        } else {
                            "idle"
                        };
                        (d.id.clone(), action)
                    })
                }
                None => (now.duration_since(d.alive_since)
                    >= Duration::from_secs(d.keep_alive_secs))
                .then(|| (d.id.clone(), "keep_alive_timeout")),
            })
            .collect();
        for (id, action) in due {
            tracing::info!("devbox {id}: Runloop's timer ran out ({action})");
            match action {
                "suspend" => drop(suspend_now(&fake, &id).await),
                reason => drop(fake.end(&id, "shutdown", reason).await),
            }
        }
    }
}

/// The headers a tunnel request is authorized by, checked against devbox `d`'s tunnel.
pub(super) fn tunnel_authorized(t: &Tunnel, headers: &HeaderMap) -> bool {
    let Some(token) = &t.auth_token else {
        return true;
    };
    let given = headers
        .get("x-runloop-tunnel-authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    given == Some(token.as_str())
}

/// The devbox behind tunnel `key`.
pub(super) fn by_tunnel(fake: &Runloop, key: &str) -> Option<Devbox> {
    fake.devboxes
        .lock()
        .expect("devboxes")
        .values()
        .find(|d| d.tunnel.as_ref().is_some_and(|t| t.key == key))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(size: &str, cpu: f64, mem: u64, disk: Option<u64>) -> Launch {
        Launch {
            resource_size_request: Some(size.into()),
            custom_cpu_cores: Some(cpu),
            custom_gb_memory: Some(mem),
            custom_disk_size: disk,
            ..Launch::default()
        }
    }

    #[test]
    fn sizes_follow_runloop() {
        assert!(check_size(&Launch::default()).is_ok());
        assert!(check_size(&launch("CUSTOM_SIZE", 2.0, 8, Some(16))).is_ok());
        assert!(check_size(&launch("CUSTOM_SIZE", 0.5, 1, None)).is_ok());
        for (cpu, mem, disk, says) in [
            (3.0, 8, None, "CPU"),
            (2.0, 3, None, "Memory"),
            (2.0, 32, None, "ratio"),
            (2.0, 8, Some(3), "Disk"),
        ] {
            let err = check_size(&launch("CUSTOM_SIZE", cpu, mem, disk)).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        assert!(check_size(&launch("SMALL", 2.0, 8, None)).is_err());
    }
}

//! The fake's blueprints (`/v1/blueprints`): create from a Dockerfile with an object as its
//! build context, built in the background (`provisioning`, `building`, then
//! `build_complete` or `failed` with `failure_reason: build_failed` and the reason in the
//! build log), get, list by name, logs, delete. The build is real: `FROM` is pulled from a
//! registry into the fake's image store, `COPY` takes files from the context (a `tgz` or `tar`
//! object), `ENV`, `WORKDIR`, `USER`, `ENTRYPOINT` and `CMD` edit the config (the fakes'
//! shared builder, `crate::dockerfile`), and devboxes of the blueprint run the result. There
//! is no builder to run commands in: `RUN`, `ADD` and `system_setup_commands` fail the build. A blueprint without a Dockerfile is Runloop's
//! default image (the host-like root here); a `blueprint_name` the fake never built is taken
//! to be one built elsewhere, on that image too.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Component, Path as FsPath, PathBuf};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use anyhow::{bail, Context};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{error, millis, new_id, page, Runloop};
use crate::dockerfile::{self, ContextEntry, Inputs};

/// The most build log lines kept.
const MAX_LOG_LINES: usize = 10_000;

/// One blueprint.
#[derive(Clone, Debug)]
pub(super) struct Blueprint {
    id: String,
    seq: u64,
    name: String,
    status: &'static str,
    failure_reason: Option<&'static str>,
    parameters: Value,
    metadata: BTreeMap<String, String>,
    /// The built image's layout; `None` for Runloop's default image.
    image: Option<PathBuf>,
    logs: Vec<(String, String, SystemTime)>,
    created: SystemTime,
    finished: Option<SystemTime>,
}

/// The blueprint routes.
pub(super) fn routes() -> Router<Arc<Runloop>> {
    Router::new()
        .route("/v1/blueprints", post(create).get(list))
        .route("/v1/blueprints/{id}", get(detail))
        .route("/v1/blueprints/{id}/logs", get(logs))
        .route("/v1/blueprints/{id}/delete", post(remove))
}

/// The blueprint a devbox create names (by id, else by name: the latest successful build),
/// as its id and image; Runloop's 400 or 404 and message when it cannot be used.
pub(super) fn resolve(
    fake: &Runloop,
    id: Option<&str>,
    name: Option<&str>,
) -> Result<(Option<String>, Option<PathBuf>), (StatusCode, String)> {
    let table = fake.blueprints.lock().expect("blueprints");
    if let Some(id) = id {
        let Some(b) = table.get(id) else {
            return Err((StatusCode::NOT_FOUND, format!("Blueprint {id} not found")));
        };
        if b.status != "build_complete" {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("Blueprint {id} is {}, not build_complete", b.status),
            ));
        }
        return Ok((Some(b.id.clone()), b.image.clone()));
    }
    let Some(name) = name else {
        return Ok((None, None));
    };
    let named: Vec<&Blueprint> = table.values().filter(|b| b.name == name).collect();
    if named.is_empty() {
        // Built elsewhere (not through this fake): Runloop's default image.
        return Ok((None, None));
    }
    match named
        .into_iter()
        .filter(|b| b.status == "build_complete")
        .max_by_key(|b| b.seq)
    {
        Some(b) => Ok((Some(b.id.clone()), b.image.clone())),
        None => Err((
            StatusCode::BAD_REQUEST,
            format!("No successfully built Blueprint named {name}"),
        )),
    }
}

#[derive(Debug, Deserialize)]
struct CreateBlueprint {
    name: Option<String>,
    dockerfile: Option<String>,
    build_context: Option<BuildContext>,
    system_setup_commands: Option<Vec<String>>,
    base_blueprint_id: Option<String>,
    base_blueprint_name: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
struct BuildContext {
    #[serde(rename = "type")]
    kind: String,
    object_id: String,
}

async fn create(State(fake): State<Arc<Runloop>>, body: axum::body::Bytes) -> Response {
    let parameters: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let req: CreateBlueprint = match serde_json::from_slice(&body) {
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
    if req.base_blueprint_id.is_some() && req.base_blueprint_name.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "Only one of base_blueprint_id, base_blueprint_name may be specified",
        );
    }
    let context = match &req.build_context {
        None => None,
        Some(c) if c.kind != "object" => {
            return error(StatusCode::BAD_REQUEST, "build_context type must be object")
        }
        Some(c) => match fake.object(&c.object_id) {
            None => {
                return error(
                    StatusCode::NOT_FOUND,
                    &format!("Object {} not found", c.object_id),
                )
            }
            Some(o) if o.state != "READ_ONLY" => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "Object {} is {}: complete its upload first",
                        c.object_id, o.state
                    ),
                )
            }
            Some(o) if !matches!(o.content_type.as_str(), "tgz" | "tar") => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "a build context must be a tar or tgz object",
                )
            }
            Some(o) => Some((fake.object_path(&c.object_id), o.content_type == "tgz")),
        },
    };
    let blueprint = Blueprint {
        id: new_id("bpt"),
        seq: fake.next_sequence(),
        name,
        status: "provisioning",
        failure_reason: None,
        parameters,
        metadata: req.metadata.unwrap_or_default(),
        image: None,
        logs: Vec::new(),
        created: SystemTime::now(),
        finished: None,
    };
    fake.blueprints
        .lock()
        .expect("blueprints")
        .insert(blueprint.id.clone(), blueprint.clone());
    let job = Job {
        dockerfile: req.dockerfile,
        context,
        setup: req.system_setup_commands.unwrap_or_default(),
    };
    tokio::spawn(build(Arc::downgrade(&fake), blueprint.id.clone(), job));
    Json(view(&blueprint)).into_response()
}

/// What a build needs.
struct Job {
    dockerfile: Option<String>,
    /// The context's file, and whether it is gzipped.
    context: Option<(PathBuf, bool)>,
    setup: Vec<String>,
}

impl Runloop {
    fn blueprint_log(&self, id: &str, level: &str, message: String) {
        if let Some(b) = self.blueprints.lock().expect("blueprints").get_mut(id) {
            if b.logs.len() < MAX_LOG_LINES {
                b.logs.push((level.to_string(), message, SystemTime::now()));
            }
        }
    }

    fn blueprint_change(&self, id: &str, change: impl FnOnce(&mut Blueprint)) {
        if let Some(b) = self.blueprints.lock().expect("blueprints").get_mut(id) {
            change(b);
        }
    }
}

async fn build(fake: Weak<Runloop>, id: String, job: Job) {
    let Some(runloop) = fake.upgrade() else {
        return;
    };
    runloop.blueprint_change(&id, |b| b.status = "building");
    let built = run(&runloop, &id, job).await;
    runloop.blueprint_change(&id, |b| {
        b.finished = Some(SystemTime::now());
        match built {
            Ok(image) => {
                b.image = image;
                b.status = "build_complete";
            }
            Err(e) => {
                b.status = "failed";
                b.failure_reason = Some("build_failed");
                if b.logs.len() < MAX_LOG_LINES {
                    b.logs.push((
                        "error".into(),
                        format!("build failed: {e:#}"),
                        SystemTime::now(),
                    ));
                }
            }
        }
    });
}

async fn run(fake: &Arc<Runloop>, id: &str, job: Job) -> anyhow::Result<Option<PathBuf>> {
    if let Some(command) = job.setup.first() {
        bail!(
            "system_setup_commands cannot run here (the fake has no builder to run `{command}` in)"
        );
    }
    let Some(dockerfile) = job.dockerfile else {
        fake.blueprint_log(id, "info", "no Dockerfile: Runloop's default image".into());
        return Ok(None);
    };
    let context = match job.context {
        Some((file, gzipped)) => tokio::task::spawn_blocking(move || context(&file, gzipped))
            .await
            .context("the unpacker stopped")??,
        None => HashMap::new(),
    };
    let inputs = Inputs {
        bases: HashMap::new(),
        context,
    };
    let log = |line: String| fake.blueprint_log(id, "info", line);
    let layout =
        dockerfile::run(&fake.images, &dockerfile::lines(&dockerfile), inputs, &log).await?;
    fake.blueprint_log(id, "info", "build complete".into());
    Ok(Some(layout))
}

/// A build context's files (a `tar`, gzipped or not), by their path in it with its mode;
/// directories, links and anything else are left out, as are paths that climb out.
fn context(file: &FsPath, gzipped: bool) -> anyhow::Result<HashMap<String, ContextEntry>> {
    let reader = std::fs::File::open(file).context("opening the build context")?;
    let reader: Box<dyn Read> = if gzipped {
        Box::new(flate2::read::GzDecoder::new(reader))
    } else {
        Box::new(reader)
    };
    let mut archive = tar::Archive::new(reader);
    let mut files = HashMap::new();
    for entry in archive.entries().context("reading the build context")? {
        let mut entry = entry.context("reading the build context")?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path().context("a build context path")?.into_owned();
        if path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
        {
            bail!(
                "the build context holds {}, which leaves it",
                path.display()
            );
        }
        let mode = entry.header().mode().ok().map(|m| m & 0o7777);
        let mut data = Vec::new();
        entry
            .read_to_end(&mut data)
            .context("reading the build context")?;
        files.insert(
            path.to_string_lossy().into_owned(),
            ContextEntry {
                data: data.into(),
                mode,
            },
        );
    }
    Ok(files)
}

/// A `BlueprintView`.
fn view(b: &Blueprint) -> Value {
    json!({
        "id": b.id,
        "name": b.name,
        "status": b.status,
        "state": "created",
        "create_time_ms": millis(b.created),
        "build_finish_time_ms": b.finished.map(millis),
        "failure_reason": b.failure_reason,
        "parameters": b.parameters,
        "metadata": b.metadata,
        "is_public": false,
        "devbox_capabilities": [],
    })
}

fn not_found(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, &format!("Blueprint {id} not found"))
}

async fn detail(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    match fake.blueprints.lock().expect("blueprints").get(&id) {
        Some(b) => Json(view(b)).into_response(),
        None => not_found(&id),
    }
}

/// `GET /v1/blueprints/{id}/logs`: `{blueprint_id, logs: [{level, message, timestamp_ms}]}`.
async fn logs(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    let table = fake.blueprints.lock().expect("blueprints");
    let Some(b) = table.get(&id) else {
        return not_found(&id);
    };
    let logs: Vec<Value> = b
        .logs
        .iter()
        .map(|(level, message, at)| json!({"level": level, "message": message, "timestamp_ms": millis(*at)}))
        .collect();
    Json(json!({ "blueprint_id": b.id, "logs": logs })).into_response()
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    starting_after: Option<String>,
    name: Option<String>,
    status: Option<String>,
}

/// `GET /v1/blueprints`: `{blueprints, has_more, total_count}`.
async fn list(State(fake): State<Arc<Runloop>>, Query(q): Query<ListQuery>) -> Response {
    let items: Vec<(u64, String, Blueprint)> = fake
        .blueprints
        .lock()
        .expect("blueprints")
        .values()
        .filter(|b| q.name.as_deref().is_none_or(|n| b.name == n))
        .filter(|b| q.status.as_deref().is_none_or(|s| b.status == s))
        .map(|b| (b.seq, b.id.clone(), b.clone()))
        .collect();
    let (items, more, total) = page(items, q.limit, q.starting_after.as_deref());
    let blueprints: Vec<Value> = items.iter().map(view).collect();
    Json(json!({ "blueprints": blueprints, "has_more": more, "total_count": total }))
        .into_response()
}

async fn remove(State(fake): State<Arc<Runloop>>, Path(id): Path<String>) -> Response {
    match fake.blueprints.lock().expect("blueprints").remove(&id) {
        Some(_) => Json(json!({})).into_response(),
        None => not_found(&id),
    }
}

//! A fake Modal: the gRPC service `modal.client.ModalClient` (the RPCs Tether's provider and
//! the SDK's basic sandbox calls use) over HTTP/2 without TLS, and tunnels: one plain
//! `127.0.0.1` listener per open port of a sandbox, reported as `TunnelData{host, port}`.
//!
//! A sandbox runs its `entrypoint_args` with its `environment_variables` in a local sandbox
//! (on its image's file system, or the fake's default one for an image that only names a
//! registry tag), and finishes when that process exits (SUCCESS or FAILURE with its code),
//! when terminated (TERMINATED) or when `timeout_secs` passes (TIMEOUT). Images: [`images`]
//! (ids, builds and their logs, published names) and [`build`] (running a definition's
//! Dockerfile commands). Calls need the token id and secret headers; an auth token, when
//! sent, must be one `AuthTokenGet` issued.

mod build;
mod images;
mod lifecycle;
mod service;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{Request, State};
use axum::response::Response;
use axum::Router;

use crate::edge::PortListener;
use crate::faults::Faults;
use crate::images::Images;
use crate::sandboxes::Sandboxes;

/// The generated service.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("modal.client");
}

/// How often expired sandboxes are looked for.
const REAP_INTERVAL: Duration = Duration::from_secs(1);
/// The largest message accepted: Modal's limit, which an image definition carrying its
/// context files inline must fit in.
const MAX_MESSAGE_BYTES: usize = 100 << 20; // 100 MiB

/// How the fake is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// The only token id accepted.
    pub token_id: String,
    /// Its secret.
    pub token_secret: String,
}

/// One fake sandbox.
struct Sandbox {
    app_id: String,
    name: Option<String>,
    image_id: String,
    tags: BTreeMap<String, String>,
    created_at: SystemTime,
    timeout_secs: u32,
    /// Set once it has finished.
    result: Option<pb::GenericResult>,
    tunnels: Vec<(pb::TunnelData, PortListener)>,
}

/// The fake's state.
pub struct Modal {
    config: Config,
    sandboxes: Arc<Sandboxes>,
    faults: Faults,
    /// App name (in the default environment) → app id.
    apps: Mutex<HashMap<String, String>>,
    /// Images, their builds and names.
    images: Mutex<images::ImageTable>,
    /// Bumped whenever a build logs or ends, for `ImageJoinStreaming` to wake on.
    image_changes: tokio::sync::watch::Sender<()>,
    /// Where built and pulled images are kept.
    store: Images,
    table: Mutex<BTreeMap<String, Sandbox>>,
    auth_tokens: Mutex<HashSet<String>>,
}

impl Modal {
    /// A fake running its sandboxes in `sandboxes`, and keeping its images beside them.
    pub fn new(config: Config, sandboxes: Arc<Sandboxes>) -> Arc<Modal> {
        let store = Images::new(sandboxes.data_dir());
        Arc::new(Modal {
            config,
            sandboxes,
            faults: Faults::default(),
            apps: Mutex::new(HashMap::new()),
            images: Mutex::new(images::ImageTable::default()),
            image_changes: tokio::sync::watch::Sender::new(()),
            store,
            table: Mutex::new(BTreeMap::new()),
            auth_tokens: Mutex::new(HashSet::new()),
        })
    }

    /// The gRPC service plus `/__fake/faults`, and the reaper of timed-out sandboxes.
    pub fn router(self: &Arc<Self>) -> Router {
        tokio::spawn(reap(Arc::downgrade(self)));
        let grpc = tonic::service::Routes::new(
            pb::modal_client_server::ModalClientServer::new(service::Service(self.clone()))
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
        )
        .into_axum_router();
        let controls = Router::new()
            .route(
                "/__fake/faults",
                axum::routing::post(control).delete(control),
            )
            .with_state(self.clone());
        grpc.merge(controls)
    }

    /// Ends sandbox `id` with `result` (if it is still running) and removes its local sandbox.
    async fn finish(&self, id: &str, result: pb::GenericResult) {
        let tunnels = {
            let mut table = self.table.lock().expect("sandbox table");
            let Some(s) = table.get_mut(id) else { return };
            if s.result.is_some() {
                return;
            }
            s.result = Some(result);
            std::mem::take(&mut s.tunnels)
        };
        drop(tunnels);
        if let Err(e) = self.sandboxes.delete(id).await {
            tracing::warn!("cannot remove the local sandbox behind {id}: {e}");
        }
    }
}

async fn control(State(fake): State<Arc<Modal>>, req: Request) -> Response {
    fake.faults.control(req).await
}

/// A finished sandbox's result.
fn result(
    status: pb::generic_result::GenericStatus,
    exitcode: i32,
    exception: &str,
) -> pb::GenericResult {
    pb::GenericResult {
        status: status as i32,
        exception: exception.to_string(),
        exitcode,
    }
}

/// Times out sandboxes whose `timeout_secs` have passed, until the fake is dropped.
async fn reap(fake: std::sync::Weak<Modal>) {
    loop {
        tokio::time::sleep(REAP_INTERVAL).await;
        let Some(fake) = fake.upgrade() else { return };
        let now = SystemTime::now();
        let expired: Vec<String> = fake
            .table
            .lock()
            .expect("sandbox table")
            .iter()
            .filter(|(_, s)| {
                s.result.is_none()
                    && s.created_at + Duration::from_secs(u64::from(s.timeout_secs)) <= now
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            let timeout = result(
                pb::generic_result::GenericStatus::Timeout,
                0,
                "Sandbox timed out",
            );
            fake.finish(&id, timeout).await;
        }
    }
}

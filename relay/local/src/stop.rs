//! Stopping a local sandbox and starting it again. A stop ends every process (the agent too)
//! and unmounts the disk, keeping the disk's image, the sandbox's directory and what the init
//! needs to boot it again (`restart.json`, written at create). A start mounts the disk again,
//! makes a fresh cgroup and runs the init as a create does: the sandbox boots with its files
//! as they were, and new processes.
//!
//! The `stopped` marker in the sandbox's directory is written before anything is killed: an
//! agent that ended with the marker there was stopped, without it the sandbox is dead. A
//! start removes the marker only once the new agent runs, so a failed start leaves a stopped
//! sandbox that can be started again.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::config::InitConfig;
use super::disk;
use super::error::{IoContext, LocalError};
use super::layout::Layout;
use super::meta::Meta;
use super::own_binary;
use super::plan::Limits;
use super::spawn;
use super::teardown::Teardown;

/// The marker of a stopped sandbox, in its directory.
const STOPPED_MARKER: &str = "stopped";
/// What a start needs, in the sandbox's directory.
const RESTART_FILE: &str = "restart.json";

/// What the init was given at create, and the limits of the cgroup it ran in.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Restart {
    /// The init's configuration (the agent's token and environment included: the file is
    /// the relay's alone, in a directory only it may enter).
    pub config: InitConfig,
    /// The cgroup's limits.
    pub limits: Limits,
}

/// Writes `restart` for sandbox `layout`, atomically and readable by the relay's user only.
pub(super) fn save(layout: &Layout, restart: &Restart) -> Result<(), LocalError> {
    let path = layout.dir().join(RESTART_FILE);
    let partial = layout.dir().join(format!(".{RESTART_FILE}.partial"));
    let json = serde_json::to_vec(restart)
        .map_err(|e| LocalError::io("encode the restart file", e.into()))?;
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|mut f| f.write_all(&json).and_then(|()| f.sync_all()))
        .and_then(|()| fs::rename(&partial, &path))
        .context(|| format!("write {}", path.display()))
}

/// Whether the sandbox in `layout` was stopped (and not started since).
pub(super) fn is_stopped(layout: &Layout) -> bool {
    marker(layout).exists()
}

fn marker(layout: &Layout) -> PathBuf {
    layout.dir().join(STOPPED_MARKER)
}

/// Ends every process of sandbox `id` and unmounts its disk; blocking.
pub(super) fn stop(id: &str, meta: &Meta, layout: &Layout) -> Result<(), LocalError> {
    if is_stopped(layout) {
        return Err(LocalError::Conflict(format!(
            "sandbox {id} is already stopped; `tether start {id}` starts it"
        )));
    }
    if !layout.dir().join(RESTART_FILE).exists() {
        return Err(LocalError::Unsupported(format!(
            "sandbox {id} was created by a relay older than stop and start, so it cannot be \
             started again once stopped; it can be paused (`tether pause {id}`)"
        )));
    }
    fs::write(marker(layout), b"").context(|| format!("write {}", marker(layout).display()))?;
    let teardown = Teardown {
        id: id.to_string(),
        layout: layout.clone(),
        cgroup: Some(meta.cgroup.clone()),
        process: Some(meta.process),
    };
    teardown.end_processes()?;
    disk::release(layout)?;
    remove_if_present(&layout.socket())
}

/// Boots stopped sandbox `id` again; answers its metadata with the new first process.
pub(super) async fn start(id: &str, meta: &Meta, layout: &Layout) -> Result<Meta, LocalError> {
    if !is_stopped(layout) {
        return Err(LocalError::Conflict(format!(
            "sandbox {id} is not stopped; `tether stop {id}` stops it"
        )));
    }
    let path = layout.dir().join(RESTART_FILE);
    let restart: Restart = fs::read(&path)
        .context(|| format!("read {}", path.display()))
        .and_then(|json| {
            serde_json::from_slice(&json).map_err(|e| LocalError::BadMeta {
                id: id.to_string(),
                reason: format!("{}: {e}", path.display()),
            })
        })?;
    let program = own_binary::own_program()?;
    let prepared = {
        let layout = layout.clone();
        tokio::task::spawn_blocking(move || {
            disk::remount(&layout)?;
            remove_if_present(&layout.socket())
        })
        .await
        .map_err(|e| LocalError::io("mount the disk again", io::Error::other(e)))?
    };
    let started = match prepared.and_then(|()| meta.cgroup.create(&restart.limits)) {
        Ok(()) => spawn::start(&program, &restart.config, &layout.log()).await,
        Err(e) => Err(e),
    };
    match started {
        Ok(process) => {
            remove_if_present(&marker(layout))?;
            Ok(Meta {
                process,
                ..meta.clone()
            })
        }
        Err(e) => {
            // Back to stopped: nothing runs, the disk is unmounted, the marker stays.
            let teardown = Teardown {
                id: id.to_string(),
                layout: layout.clone(),
                cgroup: Some(meta.cgroup.clone()),
                process: None,
            };
            let layout = layout.clone();
            let undone = tokio::task::spawn_blocking(move || {
                teardown.end_processes()?;
                disk::release(&layout)
            })
            .await;
            if let Ok(Err(undo)) = undone {
                tracing::warn!("cleaning up after a failed start of sandbox {id}: {undo}");
            }
            Err(e)
        }
    }
}

fn remove_if_present(path: &std::path::Path) -> Result<(), LocalError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other.context(|| format!("remove {}", path.display())),
    }
}

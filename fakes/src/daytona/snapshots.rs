//! The fake's snapshots and their lifecycle, as Daytona's snapshot service keeps them: made
//! from a registry image, `pending` → `pulling` → `active`, or `error` with `errorReason` when
//! the pull fails; or built from a Dockerfile (`buildInfo`, what the SDK's `Image` sends),
//! `pending` → `building` → `active`, or `build_failed`, with a build log. The pull and the
//! build are real: the image goes into the fake's image store ([`crate::images`], the build
//! by [`crate::dockerfile`], which takes no RUN), and sandboxes made from the snapshot run it
//! ([`Boot`]). The entrypoint is the one given, else the image's ENTRYPOINT, else `sleep
//! infinity`, as Daytona decides it. The HTTP side is [`super::snapshot_api`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use super::Daytona;

/// What Daytona runs when neither the snapshot nor its image has an entrypoint.
const FALLBACK_ENTRYPOINT: [&str; 2] = ["sleep", "infinity"];

/// A snapshot's lifecycle (Daytona's `SnapshotState` values this fake reaches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SnapshotState {
    Pending,
    Pulling,
    Building,
    Active,
    Error,
    BuildFailed,
}

impl SnapshotState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Pending => "pending",
            SnapshotState::Pulling => "pulling",
            SnapshotState::Building => "building",
            SnapshotState::Active => "active",
            SnapshotState::Error => "error",
            SnapshotState::BuildFailed => "build_failed",
        }
    }

    /// Whether the snapshot will change no more.
    pub(super) fn is_final(self) -> bool {
        matches!(
            self,
            SnapshotState::Active | SnapshotState::Error | SnapshotState::BuildFailed
        )
    }
}

/// What a snapshot built from a Dockerfile was built from (Daytona's `BuildInfo`).
#[derive(Clone, Debug)]
pub(super) struct BuildInfo {
    pub(super) dockerfile: String,
    pub(super) created_at: SystemTime,
    /// Its log, a line each.
    pub(super) log: Vec<String>,
}

/// One snapshot.
#[derive(Clone, Debug)]
pub(super) struct Snapshot {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) image_name: String,
    pub(super) entrypoint: Option<Vec<String>>,
    pub(super) cpu: i64,
    pub(super) gpu: i64,
    pub(super) mem: i64,
    pub(super) disk: i64,
    pub(super) state: SnapshotState,
    pub(super) error_reason: Option<String>,
    /// The pulled (or built) image's layout directory in the fake's store, once there.
    pub(super) layout: Option<PathBuf>,
    /// For a snapshot built from a Dockerfile.
    pub(super) build_info: Option<BuildInfo>,
    pub(super) created_at: SystemTime,
    pub(super) updated_at: SystemTime,
}

/// What a sandbox made from a snapshot runs.
#[derive(Clone, Debug)]
pub(super) struct Boot {
    /// The image's layout directory; `None` for the host-like default root file system.
    pub image: Option<PathBuf>,
    /// Started as Daytona's daemon starts a snapshot's entrypoint.
    pub entrypoint: Vec<String>,
}

impl Boot {
    /// Daytona's default snapshot (none named), whose entrypoint sleeps: the host-like root
    /// file system here.
    pub(super) fn default_snapshot() -> Boot {
        Boot {
            image: None,
            entrypoint: fallback_entrypoint(),
        }
    }
}

/// Every snapshot, by id, and the names of those deleted.
#[derive(Default)]
pub(super) struct Snapshots {
    pub(super) table: Mutex<BTreeMap<String, Snapshot>>,
    /// Names deleted through the API (gone for new sandboxes).
    pub(super) removed: Mutex<BTreeSet<String>>,
}

impl Snapshots {
    pub(super) fn by_id_or_name(&self, id_or_name: &str) -> Option<Snapshot> {
        let table = self.table.lock().expect("snapshot table");
        table
            .get(id_or_name)
            .or_else(|| table.values().find(|s| s.name == id_or_name))
            .cloned()
    }

    pub(super) fn update(&self, id: &str, change: impl FnOnce(&mut Snapshot)) {
        if let Some(s) = self.table.lock().expect("snapshot table").get_mut(id) {
            change(s);
            s.updated_at = SystemTime::now();
        }
    }

    /// What a sandbox created with `snapshot` runs, or Daytona's 400 message. A name this
    /// fake never saw is taken to be a snapshot added through the Dashboard that starts the
    /// agent (`legacy`); one deleted through the API is gone.
    pub(super) fn boot(&self, snapshot: &str, legacy: &[String]) -> Result<Boot, String> {
        match self.by_id_or_name(snapshot) {
            Some(s) if s.state == SnapshotState::Active => Ok(Boot {
                image: s.layout.clone(),
                entrypoint: s.entrypoint.clone().unwrap_or_else(fallback_entrypoint),
            }),
            Some(s) => Err(format!("Snapshot {snapshot} is {}", s.state.as_str())),
            None if self.removed.lock().expect("removed").contains(snapshot) => Err(format!(
                "Snapshot {snapshot} not found. Did you add it through the Daytona Dashboard?"
            )),
            None => Ok(Boot {
                image: None,
                entrypoint: legacy.to_vec(),
            }),
        }
    }
}

pub(super) fn fallback_entrypoint() -> Vec<String> {
    FALLBACK_ENTRYPOINT.iter().map(|s| s.to_string()).collect()
}

/// Pulls the snapshot's image into the store and makes it `active` (or `error`).
pub(super) async fn pull(fake: std::sync::Weak<Daytona>, id: String, image_name: String) {
    let Some(daytona) = fake.upgrade() else {
        return;
    };
    daytona
        .snapshots
        .update(&id, |s| s.state = SnapshotState::Pulling);
    let pulled = daytona.images.pull(&image_name).await;
    let found = match pulled {
        Ok(layout) => {
            let dir = layout.clone();
            let entrypoint = tokio::task::spawn_blocking(move || image_entrypoint(&dir))
                .await
                .map_err(anyhow::Error::new)
                .and_then(|e| e);
            entrypoint.map(|e| (layout, e))
        }
        Err(e) => Err(e),
    };
    daytona.snapshots.update(&id, |s| match found {
        Ok((layout, image_entrypoint)) => {
            s.entrypoint = s
                .entrypoint
                .take()
                .or(image_entrypoint)
                .or_else(|| Some(fallback_entrypoint()));
            s.layout = Some(layout);
            s.state = SnapshotState::Active;
        }
        Err(e) => {
            tracing::info!("snapshot {id}: cannot pull {image_name}: {e:#}");
            s.state = SnapshotState::Error;
            s.error_reason = Some(format!("Failed to pull image {image_name}: {e:#}"));
        }
    });
}

/// Builds the snapshot's Dockerfile into the store and makes it `active` (or `build_failed`
/// with the reason), logging each step in its build info.
pub(super) async fn build(fake: std::sync::Weak<Daytona>, id: String, dockerfile: String) {
    let Some(daytona) = fake.upgrade() else {
        return;
    };
    daytona
        .snapshots
        .update(&id, |s| s.state = SnapshotState::Building);
    let log = |line: String| {
        daytona.snapshots.update(&id, |s| {
            if let Some(info) = s.build_info.as_mut() {
                info.log.push(line);
            }
        });
    };
    let commands = crate::dockerfile::lines(&dockerfile);
    let built = crate::dockerfile::run(&daytona.images, &commands, Default::default(), &log).await;
    let found = match built {
        Ok(layout) => {
            let dir = layout.clone();
            tokio::task::spawn_blocking(move || image_entrypoint(&dir))
                .await
                .map_err(anyhow::Error::new)
                .and_then(|e| e)
                .map(|e| (layout, e))
        }
        Err(e) => Err(e),
    };
    match &found {
        Ok(_) => log("Snapshot built".into()),
        Err(e) => log(format!("Build failed: {e:#}")),
    }
    daytona.snapshots.update(&id, |s| match found {
        Ok((layout, image_entrypoint)) => {
            s.entrypoint = image_entrypoint.or_else(|| Some(fallback_entrypoint()));
            s.layout = Some(layout);
            s.state = SnapshotState::Active;
        }
        Err(e) => {
            s.state = SnapshotState::BuildFailed;
            s.error_reason = Some(format!("{e:#}"));
        }
    });
}

/// The ENTRYPOINT in the config of the image at `layout`.
fn image_entrypoint(layout: &Path) -> anyhow::Result<Option<Vec<String>>> {
    let scratch = layout.parent().unwrap_or(layout);
    let source = tether_oci::source::ImageSource::open(layout, None, scratch)?;
    Ok(source
        .config
        .config
        .and_then(|run| run.entrypoint)
        .filter(|e| !e.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_snapshots_are_dashboard_ones_and_deleted_ones_are_gone() {
        let snapshots = Snapshots::default();
        let legacy = vec!["agent".to_string()];
        let boot = snapshots.boot("from-dashboard", &legacy).unwrap();
        assert_eq!(boot.entrypoint, legacy);
        assert!(boot.image.is_none());
        snapshots.removed.lock().unwrap().insert("gone".into());
        let err = snapshots.boot("gone", &legacy).unwrap_err();
        assert!(
            err.contains("Did you add it through the Daytona Dashboard?"),
            "{err}"
        );
    }
}

//! What the local provider stores with each sandbox (`Created.meta`) so that later calls, even
//! from a restarted relay, can find and remove it: its first process, paths and cgroup. Stored
//! values are checked against where this provider would have put them before any is trusted
//! for a kill or a removal.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cgroup::SandboxCgroup;
use super::constants::CGROUP_PARENT;
use super::error::LocalError;
use super::layout::Layout;
use super::plan::Rootfs;
use super::process::ProcessIdentity;
use tether_relay_core::provider::{NetworkPolicy, SandboxHandle};

/// The facts a local sandbox is found and removed by.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Meta {
    /// The sandbox's PID 1 (the agent), as seen from the host.
    pub process: ProcessIdentity,
    /// `<data_dir>/local/<id>`.
    pub sandbox_dir: PathBuf,
    /// The agent's listening socket.
    pub socket: PathBuf,
    /// The sandbox's output.
    pub log: PathBuf,
    /// Its cgroup(s).
    pub cgroup: SandboxCgroup,
    /// Its network.
    pub network: NetworkPolicy,
    /// What its root is made of.
    pub rootfs: Rootfs,
    /// Whether it runs in a user namespace (the relay was not root).
    pub user_namespace: bool,
}

impl Meta {
    /// Reads and checks the metadata of `sandbox`, created under `data_dir`.
    pub(super) fn load(
        sandbox: &SandboxHandle,
        data_dir: &Path,
    ) -> Result<(Meta, Layout), LocalError> {
        let bad = |reason: String| LocalError::BadMeta {
            id: sandbox.id.clone(),
            reason,
        };
        let meta: Meta =
            serde_json::from_value(sandbox.meta.clone()).map_err(|e| bad(e.to_string()))?;
        let layout =
            Layout::from_stored(data_dir, &sandbox.id, &meta.sandbox_dir).ok_or_else(|| {
                bad(format!(
                    "its directory {} is not under {}",
                    meta.sandbox_dir.display(),
                    data_dir.display()
                ))
            })?;
        if meta.socket != layout.socket() {
            return Err(bad(format!(
                "its socket {} is not in its directory",
                meta.socket.display()
            )));
        }
        for dir in meta.cgroup.dirs() {
            if !is_sandbox_cgroup(dir, &sandbox.id) {
                return Err(bad(format!(
                    "{} is not a tether sandbox cgroup",
                    dir.display()
                )));
            }
        }
        Ok((meta, layout))
    }
}

/// Whether `dir` is `.../tether/<id>`: only such cgroups are ever killed or removed.
fn is_sandbox_cgroup(dir: &Path, id: &str) -> bool {
    dir.file_name() == Some(id.as_ref())
        && dir.parent().and_then(Path::file_name) == Some(CGROUP_PARENT.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(meta: &Meta) -> SandboxHandle {
        SandboxHandle {
            id: "sb-1".into(),
            provider_ref: "sb-1".into(),
            agent_token: "t".into(),
            meta: serde_json::to_value(meta).unwrap(),
        }
    }

    fn meta(data: &Path) -> Meta {
        let layout = Layout::new(data, "sb-1");
        Meta {
            process: ProcessIdentity {
                pid: 10,
                start_time: 20,
            },
            sandbox_dir: layout.dir().to_path_buf(),
            socket: layout.socket(),
            log: layout.log(),
            cgroup: SandboxCgroup::V2 {
                dir: "/sys/fs/cgroup/tether/sb-1".into(),
            },
            network: NetworkPolicy::None,
            rootfs: Rootfs::Host,
            user_namespace: false,
        }
    }

    #[test]
    fn round_trips_and_checks_paths() {
        let data = Path::new("/var/lib/tether");
        let m = meta(data);
        let (loaded, layout) = Meta::load(&handle(&m), data).unwrap();
        assert_eq!(loaded, m);
        assert_eq!(layout.dir(), m.sandbox_dir);

        assert!(Meta::load(&handle(&m), Path::new("/elsewhere")).is_err());
        let foreign = Meta {
            cgroup: SandboxCgroup::V2 {
                dir: "/sys/fs/cgroup/system.slice".into(),
            },
            ..m.clone()
        };
        assert!(Meta::load(&handle(&foreign), data).is_err());
        let mut garbage = handle(&m);
        garbage.meta = serde_json::json!({"pid": 1});
        assert!(matches!(
            Meta::load(&garbage, data),
            Err(LocalError::BadMeta { .. })
        ));
    }
}

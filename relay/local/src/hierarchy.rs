//! Finding the host's cgroup hierarchies at run time: cgroup v2 (one unified hierarchy whose
//! root offers the memory, cpu and pids controllers) or v1 (one hierarchy per controller, as on
//! hybrid hosts whose `/sys/fs/cgroup/unified` is a v2 mount without controllers).

use std::path::{Path, PathBuf};

use super::cgroup::SandboxCgroup;
use super::constants::CGROUP_PARENT;
use super::error::LocalError;
use tether_mountinfo::{self as mountinfo, Mount};

/// The controllers every sandbox is limited by.
const REQUIRED: [&str; 3] = ["memory", "cpu", "pids"];

/// The cgroup hierarchies the provider creates sandbox cgroups in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Hierarchy {
    /// A unified hierarchy rooted here, with every required controller.
    V2 {
        /// Its mount point, e.g. `/sys/fs/cgroup`.
        root: PathBuf,
    },
    /// One v1 hierarchy per controller.
    V1 {
        /// The `memory` hierarchy's mount point.
        memory: PathBuf,
        /// The `cpu` hierarchy's mount point (possibly shared with `cpuacct`).
        cpu: PathBuf,
        /// The `pids` hierarchy's mount point.
        pids: PathBuf,
        /// The `freezer` hierarchy's mount point, if mounted; delete freezes before killing.
        freezer: Option<PathBuf>,
    },
}

impl Hierarchy {
    /// Finds the hierarchies from the current mount table.
    pub(super) fn detect() -> Result<Self, LocalError> {
        Self::from_mounts(&mountinfo::current(), |p| std::fs::read_to_string(p).ok())
    }

    /// Finds the hierarchies among `mounts`, reading v2 controller lists with `read`.
    fn from_mounts(
        mounts: &[Mount],
        read: impl Fn(&Path) -> Option<String>,
    ) -> Result<Self, LocalError> {
        let mut v2_notes = Vec::new();
        for m in mounts.iter().filter(|m| m.fs_type == "cgroup2") {
            let controllers = read(&m.mount_point.join("cgroup.controllers")).unwrap_or_default();
            let has: Vec<&str> = controllers.split_whitespace().collect();
            if REQUIRED.iter().all(|c| has.contains(c)) {
                return Ok(Hierarchy::V2 {
                    root: m.mount_point.clone(),
                });
            }
            v2_notes.push(format!(
                "cgroup v2 at {} offers [{}]",
                m.mount_point.display(),
                has.join(" ")
            ));
        }

        let v1 = |controller: &str| {
            mounts
                .iter()
                .find(|m| {
                    m.fs_type == "cgroup" && m.super_options.split(',').any(|o| o == controller)
                })
                .map(|m| m.mount_point.clone())
        };
        if let (Some(memory), Some(cpu), Some(pids)) = (v1("memory"), v1("cpu"), v1("pids")) {
            return Ok(Hierarchy::V1 {
                memory,
                cpu,
                pids,
                freezer: v1("freezer"),
            });
        }

        let missing_v1: Vec<&str> = REQUIRED.into_iter().filter(|c| v1(c).is_none()).collect();
        v2_notes.push(format!(
            "no cgroup v1 hierarchy for [{}]",
            missing_v1.join(" ")
        ));
        Err(LocalError::Unavailable(format!(
            "the local provider needs the memory, cpu and pids cgroup controllers, but {}; mount \
             cgroup v2 at /sys/fs/cgroup with those controllers (or the v1 hierarchies), or use \
             another provider",
            v2_notes.join(", ")
        )))
    }

    /// The cgroup of sandbox `id`: `<hierarchy>/tether/<id>` in each hierarchy.
    pub(super) fn sandbox(&self, id: &str) -> SandboxCgroup {
        let dir = |root: &Path| root.join(CGROUP_PARENT).join(id);
        match self {
            Hierarchy::V2 { root } => SandboxCgroup::V2 { dir: dir(root) },
            Hierarchy::V1 {
                memory,
                cpu,
                pids,
                freezer,
            } => SandboxCgroup::V1 {
                memory: dir(memory),
                cpu: dir(cpu),
                pids: dir(pids),
                freezer: freezer.as_deref().map(dir),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_mountinfo::parse;

    /// This repository's CI machine: v1 per controller plus a controller-less v2 mount.
    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const UNIFIED: &str = "\
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
";

    fn controllers(list: &'static str) -> impl Fn(&Path) -> Option<String> {
        move |_| Some(list.to_string())
    }

    #[test]
    fn hybrid_host_uses_v1_when_v2_has_no_controllers() {
        let h = Hierarchy::from_mounts(&parse(HYBRID), controllers("")).unwrap();
        assert_eq!(
            h,
            Hierarchy::V1 {
                memory: "/sys/fs/cgroup/memory".into(),
                cpu: "/sys/fs/cgroup/cpu".into(),
                pids: "/sys/fs/cgroup/pids".into(),
                freezer: Some("/sys/fs/cgroup/freezer".into()),
            }
        );
    }

    #[test]
    fn combined_v1_hierarchies_are_found_by_option() {
        let text = "1 0 0:1 / /cg/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                    2 0 0:2 / /cg/memory rw - cgroup cgroup rw,memory\n\
                    3 0 0:3 / /cg/pids rw - cgroup cgroup rw,pids\n";
        let h = Hierarchy::from_mounts(&parse(text), controllers("")).unwrap();
        let Hierarchy::V1 { cpu, freezer, .. } = h else {
            panic!("expected v1")
        };
        assert_eq!(cpu, Path::new("/cg/cpu,cpuacct"));
        assert_eq!(freezer, None);
    }

    #[test]
    fn unified_host_uses_v2() {
        let h = Hierarchy::from_mounts(&parse(UNIFIED), controllers("cpuset cpu io memory pids"))
            .unwrap();
        assert_eq!(
            h,
            Hierarchy::V2 {
                root: "/sys/fs/cgroup".into()
            }
        );
        let SandboxCgroup::V2 { dir } = h.sandbox("sb-1") else {
            panic!("expected v2")
        };
        assert_eq!(dir, Path::new("/sys/fs/cgroup/tether/sb-1"));
    }

    #[test]
    fn missing_controllers_are_named() {
        let err = Hierarchy::from_mounts(&parse(UNIFIED), controllers("cpu memory")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("offers [cpu memory]"), "{text}");
        assert!(
            text.contains("no cgroup v1 hierarchy for [memory cpu pids]"),
            "{text}"
        );
    }
}

//! One sandbox's cgroup, in v2 or v1 hierarchies: creating it with its limits (memory with
//! swap held at zero, CPU quota, process count), killing everything in it, and removing it.
//! The sandbox init joins it before forking, so every sandbox process is counted from birth.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::constants::{CPU_PERIOD, FREEZE_TIMEOUT, PAUSED_CGROUP, POLL_INTERVAL};
use super::error::{IoContext, LocalError};
use super::plan::Limits;

/// The cgroup(s) of one sandbox; stored in the sandbox's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "version", rename_all = "snake_case")]
pub(super) enum SandboxCgroup {
    /// One directory in the unified hierarchy.
    V2 {
        /// `<root>/tether/<id>`.
        dir: PathBuf,
    },
    /// One directory per v1 hierarchy.
    V1 {
        /// In the memory hierarchy.
        memory: PathBuf,
        /// In the cpu hierarchy.
        cpu: PathBuf,
        /// In the pids hierarchy.
        pids: PathBuf,
        /// In the freezer hierarchy, when it is mounted.
        freezer: Option<PathBuf>,
    },
}

impl SandboxCgroup {
    /// Every directory of this cgroup.
    pub(super) fn dirs(&self) -> Vec<&Path> {
        match self {
            SandboxCgroup::V2 { dir } => vec![dir],
            SandboxCgroup::V1 {
                memory,
                cpu,
                pids,
                freezer,
            } => [Some(memory), Some(cpu), Some(pids), freezer.as_ref()]
                .into_iter()
                .flatten()
                .map(PathBuf::as_path)
                .collect(),
        }
    }

    /// The `cgroup.procs` files a process writes its pid to in order to join.
    pub(super) fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs().iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// The child cgroup a pause moves the sandbox's processes into and freezes (`freeze`):
    /// in the freezer hierarchy (v1, when it is mounted) or the unified one. It exists only
    /// once the sandbox was first paused.
    pub(super) fn paused_dir(&self) -> Option<PathBuf> {
        match self {
            SandboxCgroup::V2 { dir } => Some(dir.join(PAUSED_CGROUP)),
            SandboxCgroup::V1 { freezer, .. } => freezer.as_ref().map(|f| f.join(PAUSED_CGROUP)),
        }
    }

    /// The directory whose `cgroup.procs` lists the processes a pause has not moved yet, in
    /// the hierarchy [`Self::paused_dir`] is in.
    pub(super) fn freezer_dir(&self) -> Option<&Path> {
        match self {
            SandboxCgroup::V2 { dir } => Some(dir),
            SandboxCgroup::V1 { freezer, .. } => freezer.as_deref(),
        }
    }

    /// Creates the cgroup and sets its limits.
    pub(super) fn create(&self, limits: &Limits) -> Result<(), LocalError> {
        if let SandboxCgroup::V2 { dir } = self {
            enable_v2_controllers(dir)?;
        }
        for dir in self.dirs() {
            make_dir(dir)?;
        }
        let quota = limits.cpu_quota.map(|q| q.as_micros());
        let period = CPU_PERIOD.as_micros();
        match self {
            SandboxCgroup::V2 { dir } => {
                if let Some(m) = limits.memory_bytes {
                    write(&dir.join("memory.max"), &m.to_string())?;
                    // Absent when the kernel does not account swap; then no swap is charged.
                    write_if_present(&dir.join("memory.swap.max"), "0")?;
                }
                if let Some(q) = quota {
                    write(&dir.join("cpu.max"), &format!("{q} {period}"))?;
                }
                write(&dir.join("pids.max"), &limits.pids_max.to_string())?;
            }
            SandboxCgroup::V1 {
                memory, cpu, pids, ..
            } => {
                if let Some(m) = limits.memory_bytes {
                    write(&memory.join("memory.limit_in_bytes"), &m.to_string())?;
                    // memsw is memory plus swap: equal to the limit means no swap at all. Without
                    // swap accounting, swappiness 0 keeps the cgroup from swapping instead.
                    if !write_if_present(
                        &memory.join("memory.memsw.limit_in_bytes"),
                        &m.to_string(),
                    )? {
                        write_if_present(&memory.join("memory.swappiness"), "0")?;
                    }
                }
                if let Some(q) = quota {
                    write(&cpu.join("cpu.cfs_period_us"), &period.to_string())?;
                    write(&cpu.join("cpu.cfs_quota_us"), &q.to_string())?;
                }
                write(&pids.join("pids.max"), &limits.pids_max.to_string())?;
            }
        }
        Ok(())
    }

    /// The pids of every process in the cgroup.
    pub(super) fn pids(&self) -> Vec<i32> {
        let paused = self.paused_dir().map(|d| d.join("cgroup.procs"));
        let mut all: Vec<i32> = self
            .procs_files()
            .iter()
            .chain(paused.as_ref())
            .flat_map(|f| read_pids(f))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Kills every process in the cgroup and waits until it is empty. On timeout, returns the
    /// survivors' pids.
    pub(super) fn kill_all(&self, timeout: Duration) -> Result<(), Vec<i32>> {
        let start = Instant::now();
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(pids);
            }
            match self {
                SandboxCgroup::V2 { dir } if dir.join("cgroup.kill").exists() => {
                    let _ = write(&dir.join("cgroup.kill"), "1");
                }
                SandboxCgroup::V2 { dir } => {
                    // Frozen processes cannot fork between our read and our kill.
                    let _ = write(&dir.join("cgroup.freeze"), "1");
                    wait_for(|| read(&dir.join("cgroup.events")).contains("frozen 1"));
                    kill_each(&self.pids());
                    let _ = write(&dir.join("cgroup.freeze"), "0");
                }
                SandboxCgroup::V1 { freezer, .. } => {
                    if let Some(f) = freezer {
                        let _ = write(&f.join("freezer.state"), "FROZEN");
                        wait_for(|| read(&f.join("freezer.state")).trim() == "FROZEN");
                    }
                    kill_each(&self.pids());
                    if let Some(f) = freezer {
                        let _ = write(&f.join("freezer.state"), "THAWED");
                    }
                    // A v1 task frozen by a pause dies of SIGKILL only once thawed, and
                    // thawing the parent leaves a child that froze itself frozen.
                    if let Some(paused) = self.paused_dir() {
                        let _ = write_if_present(&paused.join("freezer.state"), "THAWED");
                    }
                }
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Removes every directory of the cgroup, retrying while the kernel drains it. A missing
    /// directory counts as removed.
    pub(super) fn remove(&self, timeout: Duration) -> Result<(), LocalError> {
        let start = Instant::now();
        // The paused child first: a cgroup with a child cannot be removed.
        let paused = self.paused_dir();
        for dir in paused.iter().map(PathBuf::as_path).chain(self.dirs()) {
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < timeout =>
                    {
                        std::thread::sleep(POLL_INTERVAL)
                    }
                    Err(e) => {
                        return Err(LocalError::io(
                            format!("remove cgroup {}", dir.display()),
                            e,
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}

/// Makes `dir`'s parents delegate memory, cpu and pids to their children (v2 only enables a
/// controller in a cgroup if its parent lists it in `cgroup.subtree_control`).
fn enable_v2_controllers(dir: &Path) -> Result<(), LocalError> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    let root = parent.parent().unwrap_or(parent);
    for cg in [root, parent] {
        fs::create_dir_all(cg).context(|| format!("create cgroup {}", cg.display()))?;
        let control = cg.join("cgroup.subtree_control");
        let enabled = read(&control);
        let enabled: Vec<&str> = enabled.split_whitespace().collect();
        if ["memory", "cpu", "pids"]
            .iter()
            .all(|c| enabled.contains(c))
        {
            continue;
        }
        write(&control, "+memory +cpu +pids").map_err(|e| match e {
            LocalError::Io { source, .. } if source.raw_os_error() == Some(libc::EBUSY) => {
                LocalError::Unavailable(format!(
                    "cannot enable the memory, cpu and pids controllers in {}: that cgroup has \
                     processes of its own; run the relay in a leaf cgroup (for example a systemd \
                     unit with Delegate=yes) so {} is free for sandboxes",
                    control.display(),
                    parent.display()
                ))
            }
            other => other,
        })?;
    }
    Ok(())
}

/// Creates a sandbox's cgroup directory; a leftover empty one from a crashed relay is replaced.
fn make_dir(dir: &Path) -> Result<(), LocalError> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).context(|| format!("create cgroup {}", parent.display()))?;
    }
    match fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_dir(dir).map_err(|_| {
                LocalError::BadSpec(format!(
                    "cgroup {} already exists and still has processes: a sandbox with this id \
                     is running; delete it first",
                    dir.display()
                ))
            })?;
            fs::create_dir(dir)
        }
        other => other,
    }
    .context(|| format!("create cgroup {}", dir.display()))
}

/// Writes a cgroup control file (never creating it: cgroupfs files exist or are unsupported).
pub(super) fn write(path: &Path, value: &str) -> Result<(), LocalError> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .context(|| format!("write {value:?} to {}", path.display()))
}

/// Writes a control file the kernel may not offer; returns whether it was there.
fn write_if_present(path: &Path, value: &str) -> Result<bool, LocalError> {
    if !path.exists() {
        return Ok(false);
    }
    write(path, value).map(|()| true)
}

pub(super) fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

pub(super) fn read_pids(procs: &Path) -> Vec<i32> {
    read(procs)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn kill_each(pids: &[i32]) {
    for &pid in pids {
        // ESRCH only means it died on its own in the meantime.
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Polls `done` until it holds or the freeze timeout passes; killing proceeds either way.
fn wait_for(done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() && start.elapsed() < FREEZE_TIMEOUT {
        std::thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_mountinfo as mountinfo;

    #[test]
    fn v1_lists_every_hierarchy_and_its_procs_file() {
        let cg = SandboxCgroup::V1 {
            memory: "/cg/memory/tether/a".into(),
            cpu: "/cg/cpu/tether/a".into(),
            pids: "/cg/pids/tether/a".into(),
            freezer: None,
        };
        assert_eq!(cg.dirs().len(), 3);
        assert_eq!(
            cg.procs_files()[0],
            Path::new("/cg/memory/tether/a/cgroup.procs")
        );
    }

    #[test]
    fn metadata_round_trips() {
        let cg = SandboxCgroup::V2 {
            dir: "/sys/fs/cgroup/tether/a".into(),
        };
        let json = serde_json::to_value(&cg).unwrap();
        assert_eq!(json["version"], "v2");
        assert_eq!(serde_json::from_value::<SandboxCgroup>(json).unwrap(), cg);
    }

    /// A child process to put in a cgroup; killed and reaped on drop.
    struct Sleeper(std::process::Child);

    impl Sleeper {
        fn start() -> Self {
            Sleeper(
                std::process::Command::new("sleep")
                    .arg("60")
                    .spawn()
                    .unwrap(),
            )
        }
        fn join(&self, cg: &SandboxCgroup) {
            for procs in cg.procs_files() {
                fs::write(procs, self.0.id().to_string()).unwrap();
            }
        }
    }

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Root-only: real cgroups cannot be made otherwise.
    fn can_make_cgroups() -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            eprintln!("skipped: needs root to create cgroups");
        }
        root
    }

    #[test]
    fn real_cgroup_limits_kill_and_remove() {
        let Ok(hierarchy) = crate::hierarchy::Hierarchy::detect() else {
            return eprintln!("skipped: no memory, cpu and pids cgroup controllers");
        };
        if !can_make_cgroups() {
            return;
        }
        let cg = hierarchy.sandbox(&format!("test-limits-{}", std::process::id()));
        let limits = Limits {
            memory_bytes: Some(64 << 20),
            cpu_quota: Some(Duration::from_millis(50)),
            pids_max: 32,
        };
        cg.create(&limits).unwrap();
        let memory = match &cg {
            SandboxCgroup::V2 { dir } => read(&dir.join("memory.max")),
            SandboxCgroup::V1 { memory, .. } => read(&memory.join("memory.limit_in_bytes")),
        };
        assert_eq!(memory.trim(), (64u64 << 20).to_string());

        let sleeper = Sleeper::start();
        sleeper.join(&cg);
        assert_eq!(cg.pids(), vec![sleeper.0.id() as i32]);
        cg.kill_all(Duration::from_secs(5)).unwrap();
        assert!(cg.pids().is_empty());
        cg.remove(Duration::from_secs(2)).unwrap();
        assert!(cg.dirs().iter().all(|d| !d.exists()));
    }

    #[test]
    fn real_v2_cgroup_kill_and_remove() {
        let Some(mount) = mountinfo::current()
            .into_iter()
            .find(|m| m.fs_type == "cgroup2")
        else {
            return eprintln!("skipped: no cgroup2 mount");
        };
        if !can_make_cgroups() {
            return;
        }
        let dir = mount
            .mount_point
            .join(format!("tether-test-{}", std::process::id()));
        fs::create_dir(&dir).unwrap();
        let cg = SandboxCgroup::V2 { dir: dir.clone() };
        let sleeper = Sleeper::start();
        sleeper.join(&cg);
        cg.kill_all(Duration::from_secs(5)).unwrap();
        cg.remove(Duration::from_secs(2)).unwrap();
        assert!(!dir.exists());
    }

    #[test]
    fn removing_a_missing_cgroup_succeeds() {
        let cg = SandboxCgroup::V2 {
            dir: "/nonexistent/tether/none".into(),
        };
        cg.remove(Duration::ZERO).unwrap();
        assert!(cg.pids().is_empty());
        cg.kill_all(Duration::ZERO).unwrap();
    }
}

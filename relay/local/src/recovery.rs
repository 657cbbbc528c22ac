//! What a crash of the relay may leave on this host, found when it starts again: the remains
//! of interrupted creates (by id, from the create journal), removed, and sandboxes no store
//! row or journaled create accounts for, listed and kept.
//!
//! The sandbox directory is the anchor: a create makes it before the cgroup, the disk and the
//! processes, and a teardown removes it after them, so every sandbox of this data directory
//! that left anything has one. Only a create this relay journaled is proof that a directory is
//! its own half-made work; a directory nothing accounts for may be a sandbox whose row is in
//! another store or a database restored later, so it is reported (`tether ls --orphans`
//! lists it) and removed only when an admin asks (`tether rm ID`). Cgroups and processes are
//! never judged on their own: the `tether` cgroup parent is shared with every other relay of
//! the host, whose sandboxes are not ours to remove. Nothing is listed as complete that could
//! not be read (no descriptor left, an unreadable directory or `/proc`): that is an error,
//! which the relay logs and acts on at its next start.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::constants::DISK_TEMPLATE_DIR;
use super::error::{IoContext, LocalError};
use super::hierarchy::Hierarchy;
use super::layout::{self, Layout};
use super::plan;
use super::teardown::Teardown;

/// The prefix of every id the relay gives a sandbox; other names under the provider's
/// directory (the image cache, disk templates) are not sandboxes.
const SANDBOX_PREFIX: &str = "sb-";
/// The prefix of a disk template being formatted (see `disk::template`).
const PARTIAL_TEMPLATE_PREFIX: &str = ".partial-";

/// Removes everything sandbox `id` may have on this host, whatever step its create reached:
/// processes started before it joined its cgroup (found by their working directory, the
/// sandbox's), its cgroup and what runs in it, its disk and loop device, and its directory.
/// Blocking.
pub(super) fn remove(data_dir: &Path, id: &str) -> Result<(), LocalError> {
    if plan::check_id(id).is_err() {
        // Never a directory name this provider made: nothing of ours to remove.
        return Ok(());
    }
    let layout = Layout::new(data_dir, id);
    let cgroup = match Hierarchy::detect() {
        Ok(hierarchy) => hierarchy.sandbox(id),
        // A create makes the directory before the cgroup: without one it made neither (a
        // host without usable cgroups fails every create before its directory).
        Err(_) if !layout.dir().exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    // /proc names working directories by their real path.
    if let Ok(dir) = fs::canonicalize(layout.dir()) {
        for pid in processes_in(&dir)? {
            // The sandbox init and its monitor run outside the cgroup; killing them ends the
            // sandbox's PID 1 (which waits for its monitor, or dies with its PID namespace).
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    Teardown {
        id: id.to_string(),
        layout,
        cgroup: Some(cgroup),
        process: None,
    }
    .run()
}

/// The sandboxes under `data_dir` that `accounted` does not name, with their directories.
/// Fails, naming what it could not read, rather than return a partial list.
pub(super) fn orphans(
    data_dir: &Path,
    accounted: &HashSet<String>,
) -> Result<Vec<(String, PathBuf)>, LocalError> {
    Ok(sandboxes(data_dir)?
        .into_iter()
        .filter(|(id, _)| !accounted.contains(id))
        .collect())
}

/// Every sandbox directory under `data_dir`, by id, sorted. Fails, naming what it could not
/// read, rather than return a partial list.
pub(super) fn sandboxes(data_dir: &Path) -> Result<Vec<(String, PathBuf)>, LocalError> {
    let dir = layout::provider_dir(data_dir);
    let entries = match fs::read_dir(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other.context(|| format!("list {}", dir.display()))?,
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.context(|| format!("list {}", dir.display()))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let is_dir = entry
            .file_type()
            .context(|| format!("inspect {}", entry.path().display()))?
            .is_dir();
        if is_dir && name.starts_with(SANDBOX_PREFIX) && plan::check_id(&name).is_ok() {
            found.push((name, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Removes disk templates a crash left half formatted. Only safe before any create runs.
pub(super) fn remove_partial_templates(data_dir: &Path) -> Result<usize, LocalError> {
    let dir = layout::provider_dir(data_dir).join(DISK_TEMPLATE_DIR);
    let entries = match fs::read_dir(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        other => other.context(|| format!("list {}", dir.display()))?,
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.context(|| format!("list {}", dir.display()))?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(PARTIAL_TEMPLATE_PREFIX)
        {
            fs::remove_file(entry.path())
                .context(|| format!("remove {}", entry.path().display()))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// The host processes whose working directory is `dir` or under it. Fails if `/proc` cannot
/// be listed; a process that ends while being looked at is skipped.
fn processes_in(dir: &Path) -> Result<Vec<i32>, LocalError> {
    let entries = fs::read_dir("/proc").context(|| "list /proc".to_string())?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.context(|| "list /proc".to_string())?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        match fs::read_link(entry.path().join("cwd")) {
            Ok(cwd) if cwd.starts_with(dir) => found.push(pid),
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                return Err(LocalError::io("read the working directories in /proc", e));
            }
            // Ended meanwhile, or a kernel thread, or another user's: not a sandbox's.
            Err(_) => {}
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unaccounted_sandbox_dirs_are_orphans_and_are_kept() {
        let data = tempfile::tempdir().unwrap();
        let local = layout::provider_dir(data.path());
        for dir in [
            "sb-kept",
            "sb-lost",
            "sb-journaled",
            "images",
            "disks",
            ".sb-hidden",
        ] {
            fs::create_dir_all(local.join(dir)).unwrap();
        }
        fs::write(local.join("sb-a-file"), b"").unwrap();
        let accounted: HashSet<String> = ["sb-kept", "sb-journaled"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(
            orphans(data.path(), &accounted).unwrap(),
            [("sb-lost".to_string(), local.join("sb-lost"))]
        );
        // Listing removes nothing.
        assert!(local.join("sb-lost").is_dir());
        assert_eq!(sandboxes(data.path()).unwrap().len(), 3);
        // A data directory with no local sandboxes yet has none.
        let empty = tempfile::tempdir().unwrap();
        assert!(orphans(empty.path(), &accounted).unwrap().is_empty());
    }

    #[test]
    fn an_unreadable_listing_is_an_error_not_an_empty_list() {
        let data = tempfile::tempdir().unwrap();
        // The provider's directory is a file: listing it fails (ENOTDIR), as an exhausted
        // descriptor table (EMFILE) would.
        fs::write(layout::provider_dir(data.path()), b"").unwrap();
        assert!(orphans(data.path(), &HashSet::new()).is_err());
    }

    #[test]
    fn half_formatted_templates_are_removed_and_whole_ones_kept() {
        let data = tempfile::tempdir().unwrap();
        let disks = layout::provider_dir(data.path()).join(DISK_TEMPLATE_DIR);
        fs::create_dir_all(&disks).unwrap();
        fs::write(disks.join(".partial-abc"), b"x").unwrap();
        fs::write(disks.join("ext4-v1-1048576.img"), b"x").unwrap();
        assert_eq!(remove_partial_templates(data.path()).unwrap(), 1);
        assert!(disks.join("ext4-v1-1048576.img").exists());
        assert!(!disks.join(".partial-abc").exists());
    }

    #[test]
    fn processes_are_found_by_their_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(dir.path())
            .spawn()
            .unwrap();
        let found = processes_in(&fs::canonicalize(dir.path()).unwrap()).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, [child.id() as i32]);
    }
}

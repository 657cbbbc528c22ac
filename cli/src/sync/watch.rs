//! Local change notifications, batched: one inotify watch per synced directory (ignored
//! directories are never watched), notifications turned into relative paths, and a batch
//! closed after [`DEBOUNCE`] of quiet (or [`MAX_BATCH_DELAY`] at most).
//!
//! A notification says only *where* to look; the engine stats what is there now. So
//! coalescing, reordering or duplicates cannot make the sync wrong, and a lost notification
//! (queue overflow) becomes a rescan.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::constants::{DEBOUNCE, MAX_BATCH_DELAY, WATCH_QUEUE};
use super::error::SyncError;
use super::scan::relative;

/// One batch of local changes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    /// Paths where something changed (relative to the root).
    pub paths: BTreeSet<String>,
    /// Paths that appeared (created, or renamed to): a directory among them is walked
    /// whole, since what was put in it before its watch existed sent no notification.
    pub fresh: BTreeSet<String>,
    /// Renames within the tree, in order: (from, to).
    pub renames: Vec<(String, String)>,
    /// Notifications were lost: only a full rescan is safe.
    pub rescan: bool,
}

impl Changes {
    fn add(&mut self, note: Note) {
        match note {
            Note::Changed(p) => {
                self.paths.insert(p);
            }
            Note::Appeared(p) => {
                self.paths.insert(p.clone());
                self.fresh.insert(p);
            }
            Note::Renamed(from, to) => {
                self.paths.insert(from.clone());
                self.paths.insert(to.clone());
                self.fresh.insert(to.clone());
                self.renames.push((from, to));
            }
            Note::Rescan => self.rescan = true,
        }
    }
}

/// What the notification thread sends.
#[derive(Debug)]
enum Note {
    Changed(String),
    Appeared(String),
    Renamed(String, String),
    Rescan,
}

/// Adds a watch on one directory; cheap to clone and callable from any thread.
#[derive(Clone)]
pub(crate) struct DirWatches {
    watcher: Arc<Mutex<RecommendedWatcher>>,
    problems: Arc<Mutex<Vec<String>>>,
    full: Arc<AtomicBool>,
}

impl DirWatches {
    /// Watches `dir` (not recursively: every synced directory gets its own watch).
    pub(crate) fn add(&self, dir: &Path) {
        let mut watcher = self.watcher.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
            // One report is enough: at the limit every later directory fails the same way.
            if !self.full.swap(true, Ordering::Relaxed) {
                let mut problems = self.problems.lock().unwrap_or_else(|p| p.into_inner());
                problems.push(format!(
                    "cannot watch {} ({e}); changes there will be picked up only by a rescan. \
                     If the limit was reached, raise it: sysctl fs.inotify.max_user_watches=1048576",
                    dir.display()
                ));
            }
        }
    }
}

/// The local watcher of one synced directory.
pub(crate) struct Watcher {
    watches: DirWatches,
    notes: mpsc::Receiver<Note>,
    overflow: Arc<AtomicBool>,
}

impl Watcher {
    /// Starts watching notifications under `root` (watches are added with [`Watcher::dirs`]).
    pub(crate) fn start(root: &Path) -> Result<Watcher, SyncError> {
        let (tx, notes) = mpsc::channel(WATCH_QUEUE);
        let overflow = Arc::new(AtomicBool::new(false));
        let root_owned: PathBuf = root.to_path_buf();
        let lost = overflow.clone();
        let handler = move |event: notify::Result<Event>| {
            for note in notes_of(&root_owned, event) {
                if tx.try_send(note).is_err() {
                    lost.store(true, Ordering::Relaxed);
                }
            }
        };
        let watcher = RecommendedWatcher::new(handler, notify::Config::default()).map_err(|e| {
            SyncError::Watch {
                path: root.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
        Ok(Watcher {
            watches: DirWatches {
                watcher: Arc::new(Mutex::new(watcher)),
                problems: Arc::default(),
                full: Arc::default(),
            },
            notes,
            overflow,
        })
    }

    /// The handle that adds directory watches.
    pub(crate) fn dirs(&self) -> DirWatches {
        self.watches.clone()
    }

    /// Watch failures not yet reported.
    pub(crate) fn take_problems(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .watches
                .problems
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Waits for the next batch; `None` if the watcher stopped.
    pub(crate) async fn next(&mut self) -> Option<Changes> {
        let mut changes = Changes::default();
        changes.add(self.notes.recv().await?);
        let deadline = Instant::now() + MAX_BATCH_DELAY;
        loop {
            let quiet = (Instant::now() + DEBOUNCE).min(deadline);
            match tokio::time::timeout_at(quiet, self.notes.recv()).await {
                Ok(Some(note)) => changes.add(note),
                Ok(None) | Err(_) => break,
            }
        }
        if self.overflow.swap(false, Ordering::Relaxed) {
            changes.rescan = true;
        }
        Some(changes)
    }

    /// Drops the notifications queued so far (a rescan is about to cover them).
    pub(crate) fn drain(&mut self) {
        while self.notes.try_recv().is_ok() {}
        self.overflow.store(false, Ordering::Relaxed);
    }
}

/// The notes one notification gives: nothing for reads and opens (the sync's own reads
/// cause those), a rescan for an overflow or an error.
fn notes_of(root: &Path, event: notify::Result<Event>) -> Vec<Note> {
    let event = match event {
        Ok(event) => event,
        Err(_) => return vec![Note::Rescan],
    };
    if event.need_rescan() {
        return vec![Note::Rescan];
    }
    let rel = |p: &PathBuf| relative(root, p).filter(|r| !r.is_empty());
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
        EventKind::Access(_) => return Vec::new(),
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) if event.paths.len() == 2 => {
            return match (rel(&event.paths[0]), rel(&event.paths[1])) {
                (Some(from), Some(to)) => vec![Note::Renamed(from, to)],
                (Some(from), None) => vec![Note::Changed(from)],
                (None, Some(to)) => vec![Note::Appeared(to)],
                (None, None) => Vec::new(),
            };
        }
        _ => {}
    }
    let appeared = matches!(
        event.kind,
        EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To))
    );
    event
        .paths
        .iter()
        .filter_map(rel)
        .map(|p| {
            if appeared {
                Note::Appeared(p)
            } else {
                Note::Changed(p)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::CreateKind;

    #[test]
    fn notifications_become_relative_notes() {
        let root = Path::new("/r");
        let ev = |kind, paths: &[&str]| {
            let mut e = Event::new(kind);
            for p in paths {
                e = e.add_path(PathBuf::from(p));
            }
            Ok(e)
        };
        let mut c = Changes::default();
        for note in notes_of(root, ev(EventKind::Create(CreateKind::File), &["/r/a/new"]))
            .into_iter()
            .chain(notes_of(
                root,
                ev(EventKind::Access(AccessKind::Read), &["/r/x"]),
            ))
            .chain(notes_of(
                root,
                ev(
                    EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
                    &["/r/old", "/r/new"],
                ),
            ))
            .chain(notes_of(
                root,
                ev(EventKind::Modify(ModifyKind::Any), &["/elsewhere"]),
            ))
        {
            c.add(note);
        }
        assert_eq!(c.paths.iter().collect::<Vec<_>>(), ["a/new", "new", "old"]);
        assert_eq!(c.fresh.iter().collect::<Vec<_>>(), ["a/new", "new"]);
        assert_eq!(c.renames, [("old".to_string(), "new".to_string())]);
        assert!(!c.rescan);
        assert!(matches!(
            notes_of(root, Err(notify::Error::generic("x")))[..],
            [Note::Rescan]
        ));
    }

    #[tokio::test]
    async fn local_changes_arrive_as_one_batch() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let mut w = Watcher::start(&root).unwrap();
        w.dirs().add(&root);
        std::fs::write(root.join("a"), "1").unwrap();
        std::fs::write(root.join("b"), "2").unwrap();
        std::fs::rename(root.join("b"), root.join("c")).unwrap();
        let c = tokio::time::timeout(std::time::Duration::from_secs(10), w.next())
            .await
            .unwrap()
            .unwrap();
        assert!(c.paths.contains("a") && c.paths.contains("c"), "{c:?}");
        assert_eq!(c.renames, [("b".to_string(), "c".to_string())]);
        assert!(w.take_problems().is_empty());
    }
}

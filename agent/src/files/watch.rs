//! `watch`: report changes under a directory as `event` messages until the client cancels.
//!
//! One inotify watch per directory; with `recursive`, directories that appear are watched
//! as they appear, and what they already hold by then is reported as created (it can beat
//! the new watch). Events are gathered for [`WATCH_BATCH`] and coalesced before sending:
//! `IN_MODIFY` fires on every write(2), so a path's modifies (and its `IN_CLOSE_WRITE` and
//! `IN_ATTRIB`) become one `modify` per batch; a `moved_from`/`moved_to` pair with one
//! cookie becomes `rename`, an unpaired one `remove` or `create`. Sending waits on the
//! connection's bounded outbox; meanwhile the kernel queues events, and when its queue
//! overflows the client is told `overflow` (and new directories are picked up by a rescan).
//!
//! The stream replies `ok` once the watches are in place: changes after it are reported.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use futures_util::StreamExt;
use inotify::{EventMask, EventOwned, Inotify, WatchDescriptor, WatchMask, Watches};
use std::os::unix::ffi::OsStrExt;

use tether_proto::op::{Reply, WatchEvent};
use tether_proto::{ErrorCode, WirePath};
use tokio::time::Instant;
use walkdir::WalkDir;

use super::{blocking, fail, refuse, WATCH_BATCH, WATCH_BATCH_EVENTS, WATCH_BUFFER};
use crate::stream::{Inbound, OpError, OpResult, StreamCtx};

/// `watch`: runs until the client cancels or the connection ends.
pub(super) async fn watch(mut ctx: StreamCtx, root: PathBuf, recursive: bool) -> OpResult {
    let inotify = Inotify::init().map_err(|e| OpError::io("inotify", &e))?;
    let mut events = inotify
        .into_event_stream(vec![0u8; WATCH_BUFFER])
        .map_err(|e| OpError::io("inotify", &e))?;
    let mut tree = Tree {
        watches: events.watches(),
        dirs: HashMap::new(),
        root,
        recursive,
        pending: None,
    };
    tree = blocking(move || {
        let meta = std::fs::metadata(&tree.root).map_err(fail(&tree.root))?;
        if !meta.is_dir() {
            return Err(refuse(
                ErrorCode::NotADirectory,
                &tree.root,
                "Not a directory",
            ));
        }
        tree.scan(&WirePath::default(), None)?;
        Ok(tree)
    })
    .await?;
    ctx.out.reply(Reply::Ok).await?;

    let mut batch = Batch::default();
    let mut deadline: Option<Instant> = None;
    loop {
        let flush = tokio::select! {
            event = events.next() => {
                let event = match event {
                    Some(Ok(event)) => event,
                    Some(Err(e)) => return Err(OpError::io("inotify", &e)),
                    None => return Ok(()),
                };
                match tree.apply(event, &mut batch) {
                    Change::None => {}
                    Change::NewDir(rel) => {
                        let (t, created) = blocking(move || {
                            let mut created = Vec::new();
                            tree.scan(&rel, Some(&mut created))?;
                            Ok((tree, created))
                        })
                        .await?;
                        tree = t;
                        for event in created {
                            batch.push(event);
                        }
                    }
                    Change::Overflow => {
                        tree = blocking(move || tree.scan(&WirePath::default(), None).map(|()| tree)).await?;
                    }
                    Change::RootGone => {
                        send(&ctx, &mut batch).await?;
                        return Err(refuse(
                            ErrorCode::NotFound,
                            &tree.root,
                            "the watched directory was removed",
                        ));
                    }
                }
                if deadline.is_none() && !batch.events.is_empty() {
                    deadline = Some(Instant::now() + WATCH_BATCH);
                }
                batch.events.len() >= WATCH_BATCH_EVENTS
            }
            () = sleep_until(deadline), if deadline.is_some() => true,
            msg = ctx.input.recv() => match msg {
                Some(Inbound::Cancel) | None => return Ok(()),
                Some(_) => false,
            },
        };
        if flush {
            tree.settle(&mut batch);
            send(&ctx, &mut batch).await?;
            deadline = None;
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    if let Some(at) = deadline {
        tokio::time::sleep_until(at).await;
    }
}

async fn send(ctx: &StreamCtx, batch: &mut Batch) -> OpResult {
    for event in batch.take() {
        ctx.out.event(event).await?;
    }
    Ok(())
}

/// What an inotify event asks of the watch loop beyond the events it queued.
#[derive(Debug, PartialEq)]
enum Change {
    None,
    /// A directory appeared at this relative path: watch it and report its contents.
    NewDir(WirePath),
    /// The kernel dropped events: pick up directories we missed.
    Overflow,
    /// The watched directory itself was deleted.
    RootGone,
}

/// A move whose `moved_to` has not been seen yet.
#[derive(Debug)]
struct Moved {
    cookie: u32,
    path: WirePath,
    dir: bool,
}

/// The watched directories and the state that turns inotify events into paths.
struct Tree {
    watches: Watches,
    /// Each watched directory's path relative to the root (`""` for the root).
    dirs: HashMap<WatchDescriptor, WirePath>,
    root: PathBuf,
    recursive: bool,
    pending: Option<Moved>,
}

const MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MODIFY)
    .union(WatchMask::ATTRIB)
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::ONLYDIR)
    .union(WatchMask::EXCL_UNLINK);

impl Tree {
    /// Watches the directory `rel` and, when recursive, every directory beneath it,
    /// recording what is beneath as `create` events in `created` if given.
    fn scan(
        &mut self,
        rel: &WirePath,
        mut created: Option<&mut Vec<WatchEvent>>,
    ) -> Result<(), OpError> {
        let top = self.root.join(rel.as_path());
        let depth = if self.recursive { usize::MAX } else { 0 };
        for entry in WalkDir::new(&top).max_depth(depth).into_iter().flatten() {
            let is_dir = entry.file_type().is_dir();
            let path = join(rel, super::relative(&top, entry.path()).as_bytes());
            if entry.depth() > 0 {
                if let Some(created) = created.as_deref_mut() {
                    created.push(WatchEvent::Create {
                        path: path.clone(),
                        dir: is_dir,
                    });
                }
            }
            if !is_dir {
                continue;
            }
            let mask = if entry.depth() == 0 && rel.is_empty() {
                MASK
            } else {
                MASK | WatchMask::DONT_FOLLOW
            };
            match self.watches.add(entry.path(), mask) {
                Ok(wd) => {
                    self.dirs.insert(wd, path);
                }
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) => {
                    return Err(refuse(
                        ErrorCode::TooLarge,
                        &self.root,
                        "too many directories to watch (fs.inotify.max_user_watches reached); \
                         watch a smaller tree",
                    ));
                }
                // A directory that vanished or cannot be read is simply not watched.
                Err(e) if entry.depth() == 0 && rel.is_empty() => {
                    return Err(fail(&self.root)(e));
                }
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Turns one inotify event into queued events.
    fn apply(&mut self, event: EventOwned, batch: &mut Batch) -> Change {
        if event.mask.contains(EventMask::Q_OVERFLOW) {
            self.settle(batch);
            batch.push(WatchEvent::Overflow);
            return Change::Overflow;
        }
        let Some(base) = self.dirs.get(&event.wd).cloned() else {
            return Change::None;
        };
        if event.mask.contains(EventMask::IGNORED) {
            self.dirs.remove(&event.wd);
            return Change::None;
        }
        // Events about a watched directory itself also reach its parent's watch, with a
        // name; only the root's own deletion has no parent to report it.
        let Some(name) = event.name else {
            if base.is_empty() && event.mask.contains(EventMask::DELETE_SELF) {
                self.settle(batch);
                return Change::RootGone;
            }
            return Change::None;
        };
        let path = join(&base, name.as_bytes());
        let dir = event.mask.contains(EventMask::ISDIR);
        if let Some(from) = self.pending.take() {
            if event.mask.contains(EventMask::MOVED_TO) && event.cookie == from.cookie {
                if from.dir {
                    self.rename_dirs(&from.path, &path);
                }
                batch.push(WatchEvent::Rename {
                    from: from.path,
                    to: path,
                });
                return Change::None;
            }
            self.moved_out(from, batch);
        }
        if event.mask.contains(EventMask::MOVED_FROM) {
            self.pending = Some(Moved {
                cookie: event.cookie,
                path,
                dir,
            });
            return Change::None;
        }
        if event
            .mask
            .intersects(EventMask::CREATE | EventMask::MOVED_TO)
        {
            batch.push(WatchEvent::Create {
                path: path.clone(),
                dir,
            });
            if dir && self.recursive {
                return Change::NewDir(path);
            }
        } else if event.mask.contains(EventMask::DELETE) {
            batch.push(WatchEvent::Remove { path, dir });
        } else if event
            .mask
            .intersects(EventMask::MODIFY | EventMask::ATTRIB | EventMask::CLOSE_WRITE)
        {
            batch.modify(path);
        }
        Change::None
    }

    /// Resolves a `moved_from` still waiting for its pair: it left the tree.
    fn settle(&mut self, batch: &mut Batch) {
        if let Some(from) = self.pending.take() {
            self.moved_out(from, batch);
        }
    }

    fn moved_out(&mut self, from: Moved, batch: &mut Batch) {
        if from.dir {
            // The kernel keeps watching a directory moved elsewhere; stop, its events would
            // carry stale paths.
            let gone: Vec<WatchDescriptor> = self
                .dirs
                .iter()
                .filter(|(_, p)| under(p, &from.path))
                .map(|(wd, _)| wd.clone())
                .collect();
            for wd in gone {
                self.dirs.remove(&wd);
                let _ = self.watches.remove(wd);
            }
        }
        batch.push(WatchEvent::Remove {
            path: from.path,
            dir: from.dir,
        });
    }

    /// A watched directory moved within the tree: its watches now report new paths.
    fn rename_dirs(&mut self, from: &WirePath, to: &WirePath) {
        for path in self.dirs.values_mut() {
            if under(path, from) {
                let mut moved = to.as_bytes().to_vec();
                moved.extend_from_slice(&path.as_bytes()[from.as_bytes().len()..]);
                *path = WirePath::from(moved);
            }
        }
    }
}

/// True when `path` is `dir` or lies beneath it.
fn under(path: &WirePath, dir: &WirePath) -> bool {
    path.as_bytes()
        .strip_prefix(dir.as_bytes())
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
}

fn join(base: &WirePath, name: &[u8]) -> WirePath {
    match (base.is_empty(), name.is_empty()) {
        (true, _) => WirePath::from(name),
        (_, true) => base.clone(),
        _ => {
            let mut joined = base.as_bytes().to_vec();
            joined.push(b'/');
            joined.extend_from_slice(name);
            WirePath::from(joined)
        }
    }
}

/// Events gathered for one send, with each path's `modify` queued at most once.
#[derive(Default)]
struct Batch {
    events: Vec<WatchEvent>,
    /// Paths with a `modify` queued and no later event about them.
    modified: HashSet<WirePath>,
}

impl Batch {
    fn push(&mut self, event: WatchEvent) {
        // A later modify of the same path must be reported after this event, not merged.
        match &event {
            WatchEvent::Create { path, .. } | WatchEvent::Remove { path, .. } => {
                self.modified.remove(path);
            }
            WatchEvent::Rename { from, to } => {
                self.modified.remove(from);
                self.modified.remove(to);
            }
            WatchEvent::Modify { .. } | WatchEvent::Overflow => {}
        }
        self.events.push(event);
    }

    fn modify(&mut self, path: WirePath) {
        if self.modified.insert(path.clone()) {
            self.events.push(WatchEvent::Modify { path });
        }
    }

    fn take(&mut self) -> Vec<WatchEvent> {
        self.modified.clear();
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_coalesce_modifies_in_order() {
        let mut b = Batch::default();
        b.push(WatchEvent::Create {
            path: "f".into(),
            dir: false,
        });
        b.modify("f".into());
        b.modify("f".into());
        b.modify("g".into());
        b.push(WatchEvent::Remove {
            path: "f".into(),
            dir: false,
        });
        b.modify("f".into());
        let kinds: Vec<String> = b
            .take()
            .into_iter()
            .map(|e| match e {
                WatchEvent::Create { path, .. } => format!("create {path}"),
                WatchEvent::Modify { path } => format!("modify {path}"),
                WatchEvent::Remove { path, .. } => format!("remove {path}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            ["create f", "modify f", "modify g", "remove f", "modify f"]
        );
        assert!(b.take().is_empty());
    }

    #[test]
    fn paths_under_and_joined() {
        assert!(under(&"a/b".into(), &"a".into()));
        assert!(under(&"a".into(), &"a".into()));
        assert!(!under(&"ab".into(), &"a".into()));
        assert_eq!(join(&"".into(), b"x"), "x");
        assert_eq!(join(&"a".into(), b"x"), "a/x");
    }
}

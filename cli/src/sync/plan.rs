//! Deciding what moves: the difference between the local tree, the remote tree and the
//! baseline (what the last sync left in the sandbox), as a [`Plan`]. Pure: no I/O.
//!
//! # The policy when both sides changed
//! The local tree wins for every path under sync: the sandbox ends up holding what the local
//! tree holds. But nothing the sandbox changed is silently lost: a remote file or symlink
//! that is about to be overwritten or deleted, and that differs from what the last sync
//! left there (it was edited or created inside the sandbox), is first renamed to
//! `NAME.tether-conflict-<UTC time>` beside it. Conflict copies and ignored paths are never
//! synced, so they stay until someone removes them. A remote directory is removed wholesale
//! only when nothing under it needs keeping; otherwise its synced files go one by one and
//! the directory stays with whatever must be kept.

use std::collections::HashSet;

use super::remote::Listing;
use super::tree::{ancestors, same_as, Entry, Tree};

/// What one push does, in this order.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Remote paths renamed to conflict copies first: changed in the sandbox since the last
    /// sync, and about to be replaced or deleted.
    pub set_aside: Vec<String>,
    /// Remote files and symlinks to delete (what the last sync left there).
    pub remove: Vec<String>,
    /// Remote directories to delete with everything in them (nothing there needs keeping).
    pub remove_trees: Vec<String>,
    /// Local paths to send, parents before children.
    pub upload: Vec<String>,
    /// Remote directories to remove afterwards if they are empty by then, deepest first.
    pub prune: Vec<String>,
}

impl Plan {
    /// Whether there is nothing to do.
    pub(crate) fn is_empty(&self) -> bool {
        self.set_aside.is_empty()
            && self.remove.is_empty()
            && self.remove_trees.is_empty()
            && self.upload.is_empty()
            && self.prune.is_empty()
    }

    /// Bytes of file content the upload carries, by the local sizes.
    pub(crate) fn upload_bytes(&self, local: &Tree) -> u64 {
        self.upload
            .iter()
            .filter_map(|p| local.get(p))
            .map(|e| e.size)
            .sum()
    }
}

/// The plan that makes the remote side of `remote` hold `local`, given the `baseline`.
/// `local` and `remote` cover the same scope (the whole tree, or the paths of one batch).
pub(crate) fn plan(local: &Tree, remote: &Listing, baseline: &Tree) -> Plan {
    let mut plan = Plan::default();

    // Directories with something under them that must not be deleted outright.
    let mut dirty: HashSet<&str> = HashSet::new();
    for (path, r) in &remote.tree {
        if !r.is_dir() && !same_as(r, baseline.get(path)) {
            for dir in ancestors(path) {
                if !dirty.insert(dir) {
                    break;
                }
            }
        }
    }
    let keeps_something = |dir: &str| dirty.contains(dir) || remote.pinned.contains(dir);

    // Remote subtrees already dealt with as a whole.
    let mut handled: HashSet<&str> = HashSet::new();
    let mut keys: Vec<&String> = local.keys().chain(remote.tree.keys()).collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        if !handled.is_empty() && ancestors(key).any(|a| handled.contains(a)) {
            continue;
        }
        let known = baseline.get(key);
        match (local.get(key), remote.tree.get(key)) {
            (None, None) => {}
            (Some(_), None) => plan.upload.push(key.clone()),
            (Some(l), Some(r))
                if l.same(r)
                    && !edited_within_the_second(l, known)
                    && !edited_within_the_second_there(r, known) => {}
            (Some(l), Some(r)) if l.kind == r.kind => {
                // Same kind, different content or mode: replace (a directory keeps its
                // contents; its entry only carries the mode).
                if !r.is_dir() && !same_as(r, known) {
                    plan.set_aside.push(key.clone());
                }
                plan.upload.push(key.clone());
            }
            (Some(_), Some(r)) => {
                // The kind changed: what is in the way goes first.
                clear(&mut plan, key, r, known, keeps_something(key));
                if r.is_dir() {
                    handled.insert(key);
                }
                plan.upload.push(key.clone());
            }
            (None, Some(r)) if r.is_dir() => {
                if keeps_something(key) {
                    plan.prune.push(key.clone());
                } else {
                    plan.remove_trees.push(key.clone());
                    handled.insert(key);
                }
            }
            (None, Some(r)) => clear(&mut plan, key, r, known, false),
        }
    }
    // Deepest first: a child sorts after its parent, so reverse order works.
    plan.prune.reverse();
    plan
}

/// Whether the local file changed since the last sync although the quick check cannot
/// tell (same size, same mtime second): the baseline remembers the nanoseconds.
fn edited_within_the_second(local: &Entry, known: Option<&Entry>) -> bool {
    known.is_some_and(|k| k.same(local) && !local.unchanged_since(k))
}

/// Whether the remote file changed since the last sync although the quick check cannot
/// tell: the baseline remembers the sub-second part of the mtime the sync left there.
fn edited_within_the_second_there(remote: &Entry, known: Option<&Entry>) -> bool {
    known.is_some_and(|k| k.same(remote) && !same_as(remote, Some(k)))
}

/// Removes the remote `r` at `key`, or keeps it as a conflict copy when the sandbox changed
/// it since the last sync (a directory: when something under it must be kept).
fn clear(plan: &mut Plan, key: &str, r: &Entry, known: Option<&Entry>, dir_keeps: bool) {
    match (r.is_dir(), dir_keeps) {
        (true, true) => plan.set_aside.push(key.to_string()),
        (true, false) => plan.remove_trees.push(key.to_string()),
        (false, _) if same_as(r, known) => plan.remove.push(key.to_string()),
        (false, _) => plan.set_aside.push(key.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::tree::Kind;

    fn file(size: u64) -> Entry {
        Entry {
            kind: Kind::File,
            size,
            mtime_s: 100,
            mtime_ns: 0,
            remote_ns: 0,
            mode: 0o644,
            target: None,
        }
    }

    fn dir() -> Entry {
        Entry {
            kind: Kind::Dir,
            size: 0,
            mtime_s: 1,
            mtime_ns: 0,
            remote_ns: 0,
            mode: 0o755,
            target: None,
        }
    }

    fn tree(entries: &[(&str, Entry)]) -> Tree {
        entries
            .iter()
            .map(|(p, e)| (p.to_string(), e.clone()))
            .collect()
    }

    fn listing(entries: &[(&str, Entry)], pinned: &[&str]) -> Listing {
        Listing {
            tree: tree(entries),
            pinned: pinned.iter().map(|p| p.to_string()).collect(),
            problems: Vec::new(),
            ..Listing::default()
        }
    }

    #[test]
    fn an_empty_remote_gets_everything() {
        let local = tree(&[("a", dir()), ("a/x", file(1)), ("b", file(2))]);
        let p = plan(&local, &listing(&[], &[]), &Tree::new());
        assert_eq!(p.upload, ["a", "a/x", "b"]);
        assert_eq!(p.upload_bytes(&local), 3);
        assert!(p.remove.is_empty() && p.set_aside.is_empty());
    }

    #[test]
    fn only_what_differs_moves() {
        let local = tree(&[("same", file(1)), ("edited", file(5)), ("new", file(3))]);
        let remote = tree(&[("same", file(1)), ("edited", file(4))]);
        let p = plan(
            &local,
            &listing(&[("same", file(1)), ("edited", file(4))], &[]),
            &remote,
        );
        assert_eq!(p.upload, ["edited", "new"]);
        assert!(
            p.set_aside.is_empty(),
            "the remote copy is what the last sync left"
        );
    }

    #[test]
    fn local_deletions_delete_what_the_last_sync_left() {
        let base = tree(&[("gone", file(1)), ("d", dir()), ("d/x", file(1))]);
        let remote = listing(&[("gone", file(1)), ("d", dir()), ("d/x", file(1))], &[]);
        let p = plan(&Tree::new(), &remote, &base);
        assert_eq!(p.remove, ["gone"]);
        assert_eq!(
            p.remove_trees,
            ["d"],
            "one request for a whole clean directory"
        );
        assert!(p.set_aside.is_empty() && p.upload.is_empty());
    }

    #[test]
    fn remote_changes_are_kept_as_conflict_copies() {
        // The sandbox edited `both` and `deleted`, and created `theirs`, since the last sync.
        let base = tree(&[("both", file(1)), ("deleted", file(1))]);
        let local = tree(&[("both", file(2))]);
        let remote = listing(
            &[("both", file(9)), ("deleted", file(9)), ("theirs", file(7))],
            &[],
        );
        let p = plan(&local, &remote, &base);
        assert_eq!(p.set_aside, ["both", "deleted", "theirs"]);
        assert_eq!(p.upload, ["both"]);
        assert!(p.remove.is_empty());
    }

    #[test]
    fn directories_holding_kept_things_are_pruned_not_removed() {
        let base = tree(&[
            ("d", dir()),
            ("d/old", file(1)),
            ("d/sub", dir()),
            ("d/sub/a", file(1)),
        ]);
        let remote = listing(
            &[
                ("d", dir()),
                ("d/old", file(1)),
                ("d/sub", dir()),
                ("d/sub/a", file(1)),
                ("d/mine", file(3)),
            ],
            &[],
        );
        let p = plan(&Tree::new(), &remote, &base);
        assert_eq!(p.set_aside, ["d/mine"]);
        assert_eq!(p.remove, ["d/old"]);
        assert_eq!(p.remove_trees, ["d/sub"]);
        assert_eq!(p.prune, ["d"]);

        // Ignored content (pinned) is never deleted either.
        let remote = listing(&[("e", dir()), ("e/x", file(1))], &["e", ""]);
        let base = tree(&[("e", dir()), ("e/x", file(1))]);
        let p = plan(&Tree::new(), &remote, &base);
        assert_eq!(p.remove, ["e/x"]);
        assert_eq!(p.prune, ["e"]);
    }

    #[test]
    fn kind_changes_clear_the_way_first() {
        // A remote directory where the local side now has a file.
        let local = tree(&[("p", file(1))]);
        let remote = listing(&[("p", dir()), ("p/x", file(1))], &[]);
        let base = tree(&[("p", dir()), ("p/x", file(1))]);
        let p = plan(&local, &remote, &base);
        assert_eq!(p.remove_trees, ["p"]);
        assert_eq!(p.upload, ["p"]);

        // ... and one with a file the sandbox made: the directory is set aside whole.
        let remote = listing(&[("p", dir()), ("p/x", file(1)), ("p/y", file(1))], &[]);
        let p = plan(&local, &remote, &base);
        assert_eq!(p.set_aside, ["p"]);
        assert!(p.remove_trees.is_empty() && p.remove.is_empty());
        assert_eq!(p.upload, ["p"]);

        // A remote file where the local side now has a directory.
        let local = tree(&[("q", dir()), ("q/z", file(1))]);
        let remote = listing(&[("q", file(1))], &[]);
        let p = plan(&local, &remote, &tree(&[("q", file(1))]));
        assert_eq!(p.remove, ["q"]);
        assert_eq!(p.upload, ["q", "q/z"]);
    }

    #[test]
    fn an_edit_within_the_same_second_still_moves() {
        let sent = Entry {
            mtime_ns: 100,
            ..file(5)
        };
        let edited = Entry {
            mtime_ns: 900,
            ..file(5)
        };
        let remote = listing(&[("f", file(5))], &[]);
        let p = plan(
            &tree(&[("f", edited)]),
            &remote,
            &tree(&[("f", sent.clone())]),
        );
        assert_eq!(p.upload, ["f"]);
        assert!(p.set_aside.is_empty());
        let p = plan(
            &tree(&[("f", sent.clone())]),
            &remote,
            &tree(&[("f", sent)]),
        );
        assert!(p.is_empty());
    }

    #[test]
    fn a_remote_edit_within_the_same_second_is_kept_aside() {
        // The sync left `f` with a whole-second mtime; the sandbox rewrote it at the same
        // size within that second.
        let known = file(5);
        let edited_there = Entry {
            mtime_ns: 250_000_000,
            ..file(5)
        };
        let remote = listing(&[("f", edited_there.clone())], &[]);
        let p = plan(
            &tree(&[("f", file(5))]),
            &remote,
            &tree(&[("f", known.clone())]),
        );
        assert_eq!(p.set_aside, ["f"]);
        assert_eq!(p.upload, ["f"]);
        // Deleted locally: kept aside rather than deleted.
        let p = plan(&Tree::new(), &remote, &tree(&[("f", known.clone())]));
        assert_eq!(p.set_aside, ["f"]);
        assert!(p.remove.is_empty());
        // The copy the last sync left, untouched, is left alone.
        let p = plan(
            &tree(&[("f", file(5))]),
            &listing(&[("f", file(5))], &[]),
            &tree(&[("f", known)]),
        );
        assert!(p.is_empty());
    }

    #[test]
    fn directory_modes_are_carried() {
        let mut private = dir();
        private.mode = 0o700;
        let p = plan(
            &tree(&[("d", private)]),
            &listing(&[("d", dir())], &[]),
            &Tree::new(),
        );
        assert_eq!(p.upload, ["d"]);
        assert!(p.set_aside.is_empty());
    }
}

//! The vocabulary both sides share: a tree is a map from relative path (`/`-separated, no
//! leading slash, `""` never present) to an [`Entry`], sorted, so a directory's descendants
//! are one contiguous range of keys.
//!
//! A file name is bytes, and the keys are `String`s (the rules, the plan and the baseline
//! file all work on text). [`key`] maps a name's bytes into a key losslessly and [`bytes`]
//! maps it back: UTF-8 passes through, and each byte that is not part of valid UTF-8, like
//! the marker [`BYTE_MARK`] itself, is written as the marker and two hex digits. Every place
//! that names a file (on disk, in a request, in a tar entry) goes through [`bytes`]; what is
//! shown to a person goes through [`shown`].

use std::collections::BTreeMap;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};
use tether_proto::op::{FileKind, FileStat};

/// Marks a byte of a name that is not UTF-8 inside a key: U+10FFFD, the last private-use
/// code point (no real name has any business holding it; one that does still round-trips).
pub(crate) const BYTE_MARK: char = '\u{10FFFD}';

/// The key of a relative path given as its bytes.
pub(crate) fn key(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    let mark = |out: &mut String, b: u8| {
        out.push(BYTE_MARK);
        out.push_str(&format!("{b:02x}"));
    };
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == BYTE_MARK {
                let mut buf = [0; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    mark(&mut out, b);
                }
            } else {
                out.push(c);
            }
        }
        for &b in chunk.invalid() {
            mark(&mut out, b);
        }
    }
    out
}

/// The bytes a key stands for: the inverse of [`key`].
pub(crate) fn bytes(key: &str) -> Vec<u8> {
    if !key.contains(BYTE_MARK) {
        return key.as_bytes().to_vec();
    }
    let mut out = Vec::with_capacity(key.len());
    let mut chars = key.chars();
    while let Some(c) = chars.next() {
        if c == BYTE_MARK {
            let hex: String = chars.by_ref().take(2).collect();
            match u8::from_str_radix(&hex, 16) {
                Ok(b) => out.push(b),
                // Not a key [`key`] made: keep the text as it is.
                Err(_) => {
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    out.extend_from_slice(hex.as_bytes());
                }
            }
        } else {
            let mut buf = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
    out
}

/// The key as a local path (the same bytes).
pub(crate) fn local_path(key: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    std::path::PathBuf::from(std::ffi::OsString::from_vec(bytes(key)))
}

/// A key for a person to read: its real bytes, escaped like every name the CLI shows.
pub(crate) fn shown(key: &str) -> String {
    tether_client::escape::escape(&bytes(key)).into_owned()
}

/// A tree: relative path to entry.
pub(crate) type Tree = BTreeMap<String, Entry>;

/// What kind of thing a synced path is. Anything else (sockets, fifos, devices) is not synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
}

/// What the sync knows of one path on one side.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The kind.
    pub kind: Kind,
    /// Size in bytes (files only; 0 otherwise).
    #[serde(default)]
    pub size: u64,
    /// Modification time in whole seconds since the Unix epoch: what a tar header carries,
    /// so it is the precision the remote copy gets.
    #[serde(default)]
    pub mtime_s: i64,
    /// The nanoseconds of the modification time: a local file's own; a remote file's to the
    /// millisecond (what the agent's listing carries). Locally they tell a file edited twice
    /// within one second (same size) from one left alone since it was sent.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtime_ns: u32,
    /// In the baseline only: the nanoseconds of the remote copy's mtime as the last sync left
    /// it (0 for a file a push landed: tar carries whole seconds). They tell a remote edit
    /// within the same second, at the same size, from the copy the sync left.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub remote_ns: u32,
    /// Permission bits.
    #[serde(default)]
    pub mode: u32,
    /// A symlink's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl Entry {
    /// A local path's entry from its (not followed) metadata; `None` for what is not synced.
    pub(crate) fn from_metadata(meta: &Metadata, target: Option<String>) -> Option<Entry> {
        let kind = match meta.file_type() {
            t if t.is_symlink() => Kind::Symlink,
            t if t.is_dir() => Kind::Dir,
            t if t.is_file() => Kind::File,
            _ => return None,
        };
        Some(Entry::normalized(Entry {
            kind,
            size: meta.len(),
            mtime_s: meta.mtime(),
            mtime_ns: meta.mtime_nsec() as u32,
            remote_ns: 0,
            mode: meta.mode() & 0o7777,
            target,
        }))
    }

    /// A remote path's entry from the agent's listing; `None` for what is not synced.
    pub(crate) fn from_stat(stat: &FileStat) -> Option<Entry> {
        let kind = match stat.kind {
            FileKind::File => Kind::File,
            FileKind::Dir => Kind::Dir,
            FileKind::Symlink => Kind::Symlink,
            FileKind::Other => return None,
        };
        Some(Entry::normalized(Entry {
            kind,
            size: stat.size,
            mtime_s: stat.mtime_ms.div_euclid(1000),
            mtime_ns: stat.mtime_ms.rem_euclid(1000) as u32 * NANOS_PER_MILLI,
            remote_ns: 0,
            mode: stat.mode & 0o7777,
            target: stat.target.as_ref().map(|t| key(t.as_bytes())),
        }))
    }

    /// Keeps only what the comparison uses. An mtime of 0 becomes 1, as the tar unpacker
    /// writes it, so such files do not look changed forever.
    fn normalized(mut e: Entry) -> Entry {
        if e.kind != Kind::File {
            e.size = 0;
        }
        if e.kind != Kind::Symlink {
            e.target = None;
        }
        if e.mtime_s == 0 {
            e.mtime_s = 1;
        }
        e
    }

    /// Whether the two sides hold the same thing, as far as metadata can tell: the quick
    /// check rsync makes. Files: size, mtime second and mode. Symlinks: the target.
    /// Directories: the mode (their mtimes change with their contents).
    pub(crate) fn same(&self, other: &Entry) -> bool {
        if self.kind != other.kind {
            return false;
        }
        match self.kind {
            Kind::File => {
                self.size == other.size && self.mtime_s == other.mtime_s && self.mode == other.mode
            }
            Kind::Symlink => self.target == other.target,
            Kind::Dir => self.mode == other.mode,
        }
    }

    /// Whether this local file is exactly as it was when `sent` was recorded, to the
    /// nanosecond: the quick check alone cannot see an edit within the same second.
    pub(crate) fn unchanged_since(&self, sent: &Entry) -> bool {
        self.same(sent) && (self.kind != Kind::File || self.mtime_ns == sent.mtime_ns)
    }

    /// Whether this is a directory.
    pub(crate) fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Whether the remote `entry` is still what the last sync left there (`known`, from the
/// baseline; `None`, never synced, matches nothing): the quick check, and for a file the
/// sub-second part of its mtime too, so an edit within the same second is seen.
pub(crate) fn same_as(entry: &Entry, known: Option<&Entry>) -> bool {
    known.is_some_and(|k| {
        entry.same(k) && (entry.kind != Kind::File || entry.mtime_ns == k.remote_ns)
    })
}

/// `local` as the baseline records it once the remote side holds `remote` (a listing's
/// entry), or a copy a push landed (`None`: whole seconds).
pub(crate) fn recorded(local: &Entry, remote: Option<&Entry>) -> Entry {
    Entry {
        remote_ns: remote.map_or(0, |r| r.mtime_ns),
        ..local.clone()
    }
}

const NANOS_PER_MILLI: u32 = 1_000_000;

/// `parent/name`, or `name` at the top.
pub(crate) fn join(parent: &str, name: &str) -> String {
    match (parent.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (_, true) => parent.to_string(),
        _ => format!("{parent}/{name}"),
    }
}

/// The paths strictly above `path`, nearest first: `a/b/c` gives `a/b`, `a`.
pub(crate) fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let mut rest = path;
    std::iter::from_fn(move || {
        let cut = rest.rfind('/')?;
        rest = &rest[..cut];
        Some(rest)
    })
}

/// The entries of `tree` at or below `root`, in order.
pub(crate) fn subtree<'a>(
    tree: &'a Tree,
    root: &'a str,
) -> impl Iterator<Item = (&'a String, &'a Entry)> {
    let own = tree.get_key_value(root).filter(|_| !root.is_empty());
    // Descendants are the keys from `root/` up to (excluding) `root0`: '0' follows '/'.
    let below = if root.is_empty() {
        tree.range::<str, _>(..)
    } else {
        tree.range::<str, _>((
            std::ops::Bound::Excluded(format!("{root}/").as_str()),
            std::ops::Bound::Excluded(format!("{root}0").as_str()),
        ))
    };
    own.into_iter().chain(below)
}

/// Removes every entry at or below `root`.
pub(crate) fn remove_subtree(tree: &mut Tree, root: &str) {
    if root.is_empty() {
        tree.clear();
        return;
    }
    let keys: Vec<String> = subtree(tree, root).map(|(k, _)| k.clone()).collect();
    for k in keys {
        tree.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_every_name_apart_and_give_its_bytes_back() {
        let names: [&[u8]; 6] = [
            b"plain/name.rs",
            b"bad\xfe",
            b"bad\xff",
            "unicod\u{e9} \u{10FFFD}fe".as_bytes(),
            b"\xf4\x8f\xbf",
            b"",
        ];
        let keys: Vec<String> = names.iter().map(|n| key(n)).collect();
        for (name, k) in names.iter().zip(&keys) {
            assert_eq!(&bytes(k), name, "{k:?}");
        }
        let distinct: std::collections::HashSet<&String> = keys.iter().collect();
        assert_eq!(distinct.len(), names.len());
        assert_eq!(keys[0], "plain/name.rs");
        assert_eq!(shown(&keys[1]), "bad\\xfe");
    }

    fn file(size: u64, mtime_s: i64) -> Entry {
        Entry {
            kind: Kind::File,
            size,
            mtime_s,
            mtime_ns: 0,
            remote_ns: 0,
            mode: 0o644,
            target: None,
        }
    }

    #[test]
    fn the_quick_check_compares_what_each_kind_keeps() {
        assert!(file(3, 10).same(&file(3, 10)));
        assert!(!file(3, 10).same(&file(4, 10)));
        assert!(!file(3, 10).same(&file(3, 11)));
        let mut exec = file(3, 10);
        exec.mode = 0o755;
        assert!(!file(3, 10).same(&exec));
        let link = |t: &str| Entry {
            kind: Kind::Symlink,
            size: 0,
            mtime_s: 5,
            mtime_ns: 0,
            remote_ns: 0,
            mode: 0o777,
            target: Some(t.into()),
        };
        assert!(link("a").same(&Entry {
            mtime_s: 99,
            ..link("a")
        }));
        assert!(!link("a").same(&link("b")));
        assert!(!same_as(&file(1, 1), None));
        let later = Entry {
            mtime_ns: 5,
            ..file(3, 10)
        };
        assert!(later.same(&file(3, 10)) && !later.unchanged_since(&file(3, 10)));
    }

    #[test]
    fn remote_edits_within_the_second_are_seen() {
        let stat = |mtime_ms| FileStat {
            path: "x".into(),
            kind: FileKind::File,
            size: 3,
            mode: 0o100644,
            mtime_ms,
            target: None,
            file_id: None,
            allocated: None,
        };
        let landed = Entry::from_stat(&stat(10_000)).unwrap();
        let edited = Entry::from_stat(&stat(10_250)).unwrap();
        let known = recorded(&file(3, 10), None);
        assert!(same_as(&landed, Some(&known)));
        assert!(edited.same(&known) && !same_as(&edited, Some(&known)));
        // A copy the sync found equal and left alone keeps the sub-second part it had.
        assert!(same_as(
            &edited,
            Some(&recorded(&file(3, 10), Some(&edited)))
        ));
    }

    #[test]
    fn remote_stats_lose_the_milliseconds() {
        let stat = FileStat {
            path: "x".into(),
            kind: FileKind::File,
            size: 3,
            mode: 0o100644,
            mtime_ms: 10_999,
            target: None,
            file_id: None,
            allocated: None,
        };
        assert!(Entry::from_stat(&stat).unwrap().same(&file(3, 10)));
    }

    #[test]
    fn subtrees_are_contiguous_ranges() {
        let mut tree = Tree::new();
        for p in ["a", "a-b", "a/x", "a/y/z", "ab", "b"] {
            tree.insert(p.into(), file(0, 1));
        }
        let keys: Vec<&str> = subtree(&tree, "a").map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "a/x", "a/y/z"]);
        assert_eq!(subtree(&tree, "").count(), 6);
        remove_subtree(&mut tree, "a");
        assert_eq!(tree.keys().collect::<Vec<_>>(), ["a-b", "ab", "b"]);
    }

    #[test]
    fn paths_know_their_ancestors() {
        assert_eq!(ancestors("a/b/c").collect::<Vec<_>>(), ["a/b", "a"]);
        assert_eq!(ancestors("a").count(), 0);
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a/b");
    }
}

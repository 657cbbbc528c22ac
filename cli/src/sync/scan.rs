//! Walking the local tree: every path the rules do not ignore, with the metadata the plan
//! compares. Ignored directories are pruned, never entered. Runs on a blocking thread.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use ignore::WalkBuilder;

use super::rules::Rules;
use super::tree::{key, local_path, Entry, Tree};
use tether_client::escape::escape_os;

/// What a walk found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// The entries, relative to the synced root.
    pub tree: Tree,
    /// Paths that could not be read, in words, to report.
    pub problems: Vec<String>,
}

/// Walks `root/under` (the whole tree when `under` is empty; then the root itself is not an
/// entry), calling `on_dir` with each directory's absolute path as it is found, the root
/// included: the watcher adds a watch there before its contents are read, so nothing
/// created meanwhile is missed.
pub(crate) fn scan(
    root: &Path,
    under: &str,
    rules: &Arc<Rules>,
    mut on_dir: impl FnMut(&Path),
) -> Scan {
    let mut out = Scan::default();
    let start = if under.is_empty() {
        root.to_path_buf()
    } else {
        root.join(under)
    };
    let filter_rules = rules.clone();
    let filter_root = root.to_path_buf();
    let walk = WalkBuilder::new(&start)
        .standard_filters(false)
        .follow_links(false)
        .filter_entry(move |e| match relative(&filter_root, e.path()) {
            Some(rel) => {
                let is_dir = e.file_type().is_some_and(|t| t.is_dir());
                !filter_rules.ignored_entry(&rel, is_dir)
            }
            None => false,
        })
        .build();
    for item in walk {
        let entry = match item {
            Ok(entry) => entry,
            Err(e) => {
                out.problems.push(e.to_string());
                continue;
            }
        };
        let path = entry.path();
        let Some(rel) = relative(root, path) else {
            continue;
        };
        let meta = match fs::symlink_metadata(path) {
            Ok(meta) => meta,
            // Vanished since it was listed: the watcher will report it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                out.problems.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        if meta.is_dir() {
            on_dir(path);
        }
        if rel.is_empty() {
            continue;
        }
        let target = match meta.file_type().is_symlink() {
            true => match fs::read_link(path) {
                Ok(t) => Some(key(t.as_os_str().as_bytes())),
                Err(_) => continue,
            },
            false => None,
        };
        match Entry::from_metadata(&meta, target) {
            Some(e) => {
                out.tree.insert(rel, e);
            }
            None => out.problems.push(format!(
                "{}: a FIFO, socket or device; not synced",
                escape_os(path.as_os_str())
            )),
        }
    }
    out
}

/// One local path's entry, if it exists and is something the sync carries.
pub(crate) fn stat(root: &Path, rel: &str) -> Option<Entry> {
    let path = root.join(local_path(rel));
    let meta = fs::symlink_metadata(&path).ok()?;
    let target = match meta.file_type().is_symlink() {
        true => Some(key(fs::read_link(&path).ok()?.as_os_str().as_bytes())),
        false => None,
    };
    Entry::from_metadata(&meta, target)
}

/// The key of `path` relative to `root` ([`key`]: any name, UTF-8 or not); `None` outside it.
pub(crate) fn relative(root: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(root).ok()?;
    let raw = rel.as_os_str().as_bytes();
    let end = raw.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
    Some(key(&raw[..end]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::tree::Kind;

    #[test]
    fn walks_what_the_rules_keep_and_reports_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("src/deep")).unwrap();
        fs::create_dir_all(root.join("target/debug")).unwrap();
        fs::create_dir_all(root.join(".git")).unwrap();
        fs::write(root.join(".gitignore"), "target/\n").unwrap();
        fs::write(root.join("src/deep/a.rs"), "fn a() {}").unwrap();
        fs::write(root.join("target/debug/app"), "bin").unwrap();
        fs::write(root.join(".git/HEAD"), "ref").unwrap();
        std::os::unix::fs::symlink("src", root.join("link")).unwrap();
        let rules = Arc::new(Rules::new(root, &["*.tmp".into()]).unwrap());
        fs::write(root.join("x.tmp"), "").unwrap();

        let mut dirs = Vec::new();
        let found = scan(root, "", &rules, |d| dirs.push(relative(root, d).unwrap()));
        let keys: Vec<&str> = found.tree.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [".gitignore", "link", "src", "src/deep", "src/deep/a.rs"]
        );
        assert_eq!(found.tree["src/deep/a.rs"].size, 9);
        assert_eq!(found.tree["link"].kind, Kind::Symlink);
        assert_eq!(found.tree["link"].target.as_deref(), Some("src"));
        dirs.sort();
        assert_eq!(dirs, ["", "src", "src/deep"]);

        let sub = scan(root, "src", &rules, |_| {});
        let keys: Vec<&str> = sub.tree.keys().map(String::as_str).collect();
        assert_eq!(keys, ["src", "src/deep", "src/deep/a.rs"]);
        assert!(stat(root, "src/deep/a.rs").is_some());
        assert!(stat(root, "nope").is_none());
    }
}

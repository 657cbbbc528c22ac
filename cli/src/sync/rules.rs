//! Which paths the sync leaves alone: `.gitignore` files (in every directory, gitignore
//! semantics: the deepest match decides, and nothing below an ignored directory comes
//! back), `--exclude` patterns (gitignore syntax, rooted at the synced directory; `!PATTERN`
//! re-includes what a `.gitignore` drops), and the built-in excludes.
//!
//! The same rules judge both sides, so an ignored path is neither pushed nor deleted: a
//! `node_modules` installed inside the sandbox survives a sync from a tree that ignores it.
//! `.gitignore` files are read from the local tree, lazily, and cached per directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;

use super::constants::{BUILTIN_EXCLUDES, IGNORE_FILE};
use super::error::SyncError;
use super::tree::ancestors;

/// The ignore rules of one synced directory.
pub(crate) struct Rules {
    root: PathBuf,
    builtin: Gitignore,
    user: Gitignore,
    /// Each directory's parsed `.gitignore`, `None` when it has none.
    dirs: Mutex<HashMap<String, Option<Arc<Gitignore>>>>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules").field("root", &self.root).finish()
    }
}

impl Rules {
    /// Rules for the local directory `root` with these `--exclude` patterns.
    pub(crate) fn new(root: &Path, excludes: &[String]) -> Result<Rules, SyncError> {
        let builtin = patterns(root, BUILTIN_EXCLUDES.iter().copied())?;
        let user = patterns(root, excludes.iter().map(String::as_str))?;
        Ok(Rules {
            root: root.to_path_buf(),
            builtin,
            user,
            dirs: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `rel` (a directory when `is_dir`) is ignored by its own name, assuming its
    /// parent directory is not: what a walk that prunes ignored directories asks.
    pub(crate) fn ignored_entry(&self, rel: &str, is_dir: bool) -> bool {
        if rel.is_empty() {
            return false;
        }
        if self.builtin.matched(rel, is_dir).is_ignore() {
            return true;
        }
        match self.user.matched(rel, is_dir) {
            Match::Ignore(_) => return true,
            Match::Whitelist(_) => return false,
            Match::None => {}
        }
        // The deepest .gitignore with an opinion decides.
        for dir in ancestors(rel).chain(std::iter::once("")) {
            let Some(rules) = self.gitignore(dir) else {
                continue;
            };
            let below = if dir.is_empty() {
                rel
            } else {
                &rel[dir.len() + 1..]
            };
            match rules.matched(below, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }

    /// Whether `rel` is ignored by its own name or because a directory above it is: what a
    /// path from a remote listing or a change notification asks.
    pub(crate) fn ignored_path(&self, rel: &str, is_dir: bool) -> bool {
        let mut above: Vec<&str> = ancestors(rel).collect();
        above.reverse();
        above.iter().any(|dir| self.ignored_entry(dir, true)) || self.ignored_entry(rel, is_dir)
    }

    /// Forgets the cached `.gitignore` of directory `dir` (it changed).
    pub(crate) fn forget(&self, dir: &str) {
        self.lock().remove(dir);
    }

    fn gitignore(&self, dir: &str) -> Option<Arc<Gitignore>> {
        if let Some(cached) = self.lock().get(dir) {
            return cached.clone();
        }
        let base = if dir.is_empty() {
            self.root.clone()
        } else {
            self.root.join(dir)
        };
        let file = base.join(IGNORE_FILE);
        let parsed = file.is_file().then(|| {
            let mut builder = GitignoreBuilder::new(&base);
            // A malformed line is skipped, as git does; the rest still applies.
            let _ = builder.add(&file);
            builder.build().ok().map(Arc::new)
        });
        let parsed = parsed.flatten();
        self.lock().insert(dir.to_string(), parsed.clone());
        parsed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<Arc<Gitignore>>>> {
        // The cache is consistent after every statement; a poisoned lock is safe to use.
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Answers [`Rules::ignored_path`] for many paths, remembering each directory's answer, so a
/// listing of 100,000 paths costs one rule check per path rather than one per ancestor.
pub(crate) struct PathFilter<'a> {
    rules: &'a Rules,
    dirs: HashMap<String, bool>,
}

impl<'a> PathFilter<'a> {
    /// A filter with an empty memory.
    pub(crate) fn new(rules: &'a Rules) -> PathFilter<'a> {
        PathFilter {
            rules,
            dirs: HashMap::new(),
        }
    }

    /// Whether `rel` or a directory above it is ignored.
    pub(crate) fn ignored(&mut self, rel: &str, is_dir: bool) -> bool {
        if rel.is_empty() {
            return false;
        }
        if let Some(known) = self.dirs.get(rel).filter(|_| is_dir) {
            return *known;
        }
        let parent = ancestors(rel).next().unwrap_or("");
        let parent_ignored = match self.dirs.get(parent) {
            _ if parent.is_empty() => false,
            Some(known) => *known,
            None => self.ignored(parent, true),
        };
        let ignored = parent_ignored || self.rules.ignored_entry(rel, is_dir);
        if is_dir {
            self.dirs.insert(rel.to_string(), ignored);
        }
        ignored
    }
}

/// A matcher for gitignore-syntax `lines` rooted at `root`.
fn patterns<'a>(root: &Path, lines: impl Iterator<Item = &'a str>) -> Result<Gitignore, SyncError> {
    let mut builder = GitignoreBuilder::new(root);
    for line in lines {
        builder
            .add_line(None, line)
            .map_err(|e| SyncError::Pattern {
                pattern: line.to_string(),
                reason: e.to_string(),
            })?;
    }
    builder.build().map_err(|e| SyncError::Pattern {
        pattern: "(all)".into(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(gitignores: &[(&str, &str)], excludes: &[&str]) -> (tempfile::TempDir, Rules) {
        let dir = tempfile::tempdir().unwrap();
        for (at, text) in gitignores {
            let d = dir.path().join(at);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(".gitignore"), text).unwrap();
        }
        let excludes: Vec<String> = excludes.iter().map(|s| s.to_string()).collect();
        let rules = Rules::new(dir.path(), &excludes).unwrap();
        (dir, rules)
    }

    #[test]
    fn gitignores_apply_below_their_directory_and_the_deepest_decides() {
        let (_d, r) = rules(&[("", "*.log\ntarget/\n"), ("sub", "!keep.log\n")], &[]);
        assert!(r.ignored_entry("a.log", false));
        assert!(r.ignored_entry("x/a.log", false));
        assert!(!r.ignored_entry("sub/keep.log", false));
        assert!(r.ignored_entry("sub/other.log", false));
        assert!(r.ignored_entry("target", true));
        // `target/` names directories only.
        assert!(!r.ignored_entry("target", false));
        assert!(r.ignored_path("target/debug/app", false));
        assert!(!r.ignored_path("src/main.rs", false));
    }

    #[test]
    fn excludes_and_builtins_apply_everywhere() {
        let (_d, r) = rules(&[("", "dist/\n")], &["node_modules", "/top.txt", "!dist"]);
        assert!(r.ignored_path("a/node_modules/x/y.js", false));
        assert!(r.ignored_entry("top.txt", false));
        assert!(!r.ignored_entry("a/top.txt", false));
        assert!(
            !r.ignored_entry("dist", true),
            "an exclude's `!` re-includes"
        );
        assert!(r.ignored_path(".git/HEAD", false));
        assert!(r.ignored_entry("src/a.rs.tether-conflict-20250101T000000Z", false));
        // Tether's temporaries, at any depth: the agent's and a landing download's.
        for temp in [
            ".tether-1f2e3d.main.rs",
            "src/.tether-1f2e3d.main.rs",
            ".tether-0a1b2c",
        ] {
            assert!(tether_proto::names::is_temporary(
                temp.rsplit('/').next().unwrap().as_bytes()
            ));
            assert!(r.ignored_entry(temp, false), "{temp}");
        }
        assert!(!r.ignored_entry("src/.tether", false));
        assert!(!r.ignored_entry(".github", true));
    }

    #[test]
    fn the_path_filter_agrees_with_the_rules() {
        let (_d, r) = rules(&[("", "build/\n*.o\n")], &["vendor"]);
        let mut f = PathFilter::new(&r);
        for (path, dir) in [
            ("build", true),
            ("build/x/y", false),
            ("src", true),
            ("src/a.o", false),
            ("src/a.c", false),
            ("lib/vendor/z", false),
            ("deep/er/build/q", false),
        ] {
            assert_eq!(f.ignored(path, dir), r.ignored_path(path, dir), "{path}");
        }
    }

    #[test]
    fn a_changed_gitignore_is_read_again_once_forgotten() {
        let (d, r) = rules(&[("", "a\n")], &[]);
        assert!(r.ignored_entry("a", false));
        std::fs::write(d.path().join(".gitignore"), "b\n").unwrap();
        assert!(r.ignored_entry("a", false), "cached");
        r.forget("");
        assert!(!r.ignored_entry("a", false));
        assert!(r.ignored_entry("b", false));
    }

    #[test]
    fn bad_patterns_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let err = Rules::new(dir.path(), &["[z-a]".into()]).unwrap_err();
        assert!(err.to_string().contains("[z-a]"), "{err}");
    }
}

//! The baseline: what the last sync left in the sandbox, path by path. It is how the plan
//! tells "the sandbox changed this since" (keep a conflict copy) from "this is our own old
//! copy" (replace or delete it).
//!
//! Kept in memory while a sync runs and saved under the client's data directory
//! (`sync/<key>.json`, one file per sandbox, remote directory and local directory), so the
//! next `tether sync` or `tether dev` knows it too. A lost or stale baseline is safe: it only
//! makes the plan keep more conflict copies than needed.

use std::io::BufWriter;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::error::SyncError;
use super::tree::{remove_subtree, subtree, Entry, Tree};
use tether_client::local::data_dir as default_data_dir;

/// The baseline of one sync pair.
#[derive(Debug)]
pub(crate) struct Baseline {
    file: PathBuf,
    /// The entries.
    pub tree: Tree,
    dirty: bool,
}

impl Baseline {
    /// The saved baseline of `sandbox:remote` ⇄ `local` (empty if there is none yet).
    pub(crate) fn load(sandbox: &str, remote: &str, local: &Path) -> Baseline {
        let file = location(sandbox, remote, local);
        let tree = std::fs::read(&file)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Vec<(String, Entry)>>(&bytes).ok())
            .map(|entries| entries.into_iter().collect())
            .unwrap_or_default();
        Baseline {
            file,
            tree,
            dirty: false,
        }
    }

    /// An empty baseline that is never saved.
    #[cfg(test)]
    pub(crate) fn in_memory() -> Baseline {
        Baseline {
            file: PathBuf::new(),
            tree: Tree::new(),
            dirty: false,
        }
    }

    /// Records that the remote side at and below `root` now holds `entries` (all within
    /// `root`), and nothing else there.
    pub(crate) fn replace(
        &mut self,
        root: &str,
        entries: impl IntoIterator<Item = (String, Entry)>,
    ) {
        remove_subtree(&mut self.tree, root);
        self.tree.extend(entries);
        self.dirty = true;
    }

    /// Records the remote side of exactly one path.
    pub(crate) fn set(&mut self, path: &str, entry: Option<Entry>) {
        match entry {
            Some(e) => self.tree.insert(path.to_string(), e),
            None => self.tree.remove(path),
        };
        self.dirty = true;
    }

    /// Moves `from` and everything below it to `to` (a rename done in the sandbox).
    pub(crate) fn rename(&mut self, from: &str, to: &str) {
        let moved: Vec<(String, Entry)> = subtree(&self.tree, from)
            .map(|(k, e)| (format!("{to}{}", &k[from.len()..]), e.clone()))
            .collect();
        remove_subtree(&mut self.tree, from);
        remove_subtree(&mut self.tree, to);
        self.tree.extend(moved);
        self.dirty = true;
    }

    /// Whether there are changes not yet saved.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Writes the baseline (atomically: a temporary file renamed over the old one).
    pub(crate) fn save(&mut self) -> Result<(), SyncError> {
        if !self.dirty || self.file.as_os_str().is_empty() {
            return Ok(());
        }
        let dir = self.file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(SyncError::local(dir))?;
        let write = || -> std::io::Result<()> {
            let mut out = BufWriter::new(tempfile::NamedTempFile::new_in(dir)?);
            let entries: Vec<(&String, &Entry)> = self.tree.iter().collect();
            serde_json::to_writer(&mut out, &entries)?;
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.persist(&self.file).map(drop).map_err(|e| e.error)
        };
        write().map_err(SyncError::local(&self.file))?;
        self.dirty = false;
        Ok(())
    }
}

/// `<data dir>/sync/<hash>.json`: one file per sandbox, remote directory and local directory.
fn location(sandbox: &str, remote: &str, local: &Path) -> PathBuf {
    let mut hash = Sha256::new();
    for part in [
        sandbox.as_bytes(),
        remote.as_bytes(),
        local.as_os_str().as_encoded_bytes(),
    ] {
        hash.update(part);
        hash.update([0]);
    }
    let name = hex::encode(&hash.finalize()[..12]);
    default_data_dir().join("sync").join(format!("{name}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::tree::Kind;

    fn file() -> Entry {
        Entry {
            kind: Kind::File,
            size: 1,
            mtime_s: 1,
            mtime_ns: 0,
            remote_ns: 0,
            mode: 0o644,
            target: None,
        }
    }

    #[test]
    fn renames_move_whole_subtrees() {
        let mut b = Baseline::in_memory();
        b.replace(
            "",
            [
                ("a".into(), file()),
                ("a/x".into(), file()),
                ("ab".into(), file()),
            ],
        );
        b.rename("a", "z");
        assert_eq!(b.tree.keys().collect::<Vec<_>>(), ["ab", "z", "z/x"]);
        b.replace("z", [("z".into(), file())]);
        assert_eq!(b.tree.keys().collect::<Vec<_>>(), ["ab", "z"]);
    }

    #[test]
    fn saves_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = Baseline::in_memory();
        b.file = dir.path().join("sync/x.json");
        b.set("a", Some(file()));
        b.save().unwrap();
        assert!(!b.is_dirty());
        let bytes = std::fs::read(&b.file).unwrap();
        let back: Vec<(String, Entry)> = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, vec![("a".to_string(), file())]);
    }
}

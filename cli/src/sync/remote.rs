//! What the sandbox holds: the remote tree under the synced directory, listed with the
//! agent's `list`, and single paths with `stat`.
//!
//! A `list` reply must fit in one frame (about 10,000 entries), so a large tree is listed
//! piecewise: a whole subtree in one request when it fits, else its directory alone and then
//! each subdirectory the same way, pruning ignored ones, several requests in flight. Only
//! a single directory with more direct entries than a reply holds cannot be listed; it is
//! pinned (left alone) and reported.

use std::collections::{HashMap, HashSet};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tether_proto::op::FileId;
use tether_proto::{ErrorCode, WirePath};

use super::constants::{REMOTE_CONCURRENCY, REQUEST_TIMEOUT};
use super::error::SyncError;
use super::rules::{PathFilter, Rules};
use super::tree::{ancestors, bytes, join, key, shown, Entry, Tree};
use tether_client::escape::escape;
use tether_client::hostfs::SandboxPath;
use tether_client::{ClientError, Session};

/// The remote side under one directory.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// The entries the rules keep.
    pub tree: Tree,
    /// Directories holding something the sync must not touch (ignored paths, special files,
    /// directories too large to list): never removed wholesale.
    pub pinned: HashSet<String>,
    /// What could not be listed, in words.
    pub problems: Vec<String>,
    /// Files with more than one name, by key: names with the same id are one file.
    pub ids: HashMap<String, FileId>,
    /// Files with holes (sparse), by key.
    pub sparse: HashSet<String>,
}

impl Listing {
    fn pin(&mut self, dir: &str) {
        let mut next = Some(dir);
        while let Some(d) = next {
            if !self.pinned.insert(d.to_string()) {
                break;
            }
            next = if d.is_empty() {
                None
            } else {
                Some(ancestors(d).next().unwrap_or(""))
            };
        }
    }
}

/// The absolute remote path of `rel` (a [key](super::tree::key)) under `root`.
pub(crate) fn absolute(root: &str, rel: &str) -> WirePath {
    let mut path = root.as_bytes().to_vec();
    if !rel.is_empty() {
        path.truncate(root.trim_end_matches('/').len());
        path.push(b'/');
        path.extend_from_slice(&bytes(rel));
    }
    WirePath::from(path)
}

/// Lists `root/under` (and everything below it) as the rules see it. A missing directory
/// is an empty listing.
pub(crate) async fn list(
    session: &Session,
    root: &str,
    under: &str,
    rules: &Rules,
) -> Result<Listing, SyncError> {
    let mut out = Listing::default();
    let mut filter = PathFilter::new(rules);
    let mut queue: Vec<(String, u32)> = vec![(under.to_string(), u32::MAX)];
    let mut running = FuturesUnordered::new();
    loop {
        while running.len() < REMOTE_CONCURRENCY {
            let Some((dir, depth)) = queue.pop() else {
                break;
            };
            let path = absolute(root, &dir);
            running.push(async move {
                let reply = timed(&path, session.list(&path, depth)).await;
                (dir, depth, path, reply)
            });
        }
        let Some((dir, depth, path, reply)) = running.next().await else {
            break;
        };
        let entries = match reply {
            Ok(entries) => entries,
            Err(SyncError::Remote { source, context }) => match source.code() {
                Some(ErrorCode::TooLarge) if depth > 1 => {
                    queue.push((dir, 1));
                    continue;
                }
                Some(ErrorCode::TooLarge) => {
                    out.problems.push(format!(
                        "{path} in the sandbox has too many entries to list; left as it is"
                    ));
                    out.pin(&dir);
                    continue;
                }
                Some(ErrorCode::NotFound) => continue,
                Some(ErrorCode::NotADirectory) if dir == under => {
                    return Err(SyncError::RemoteNotADirectory(
                        escape(path.as_bytes()).into_owned(),
                    ))
                }
                _ => return Err(SyncError::Remote { context, source }),
            },
            Err(e) => return Err(e),
        };
        for stat in entries {
            // The agent's word: a path that would leave the synced directory ends the sync
            // before anything is written, in either direction.
            SandboxPath::parse(stat.path.as_bytes())?;
            let rel = join(&dir, &key(stat.path.as_bytes()));
            let entry = Entry::from_stat(&stat);
            if entry.is_none() {
                out.problems.push(format!(
                    "{}: a FIFO, socket or device in the sandbox; not synced",
                    shown(&rel)
                ));
            }
            let is_dir = entry.as_ref().is_some_and(Entry::is_dir);
            if entry.is_none() || filter.ignored(&rel, is_dir) {
                // Pin from the topmost ignored path only: below it, the pins are there.
                let parent = ancestors(&rel).next().unwrap_or("");
                if !filter.ignored(parent, true) {
                    out.pin(parent);
                }
                continue;
            }
            if depth == 1 && is_dir {
                queue.push((rel.clone(), u32::MAX));
            }
            if let Some(id) = stat.file_id.filter(|id| id.links > 1) {
                out.ids.insert(rel.clone(), id);
            }
            if stat.allocated.is_some_and(|a| a < stat.size) {
                out.sparse.insert(rel.clone());
            }
            if let Some(entry) = entry {
                out.tree.insert(rel, entry);
            }
        }
    }
    Ok(out)
}

/// The remote entries of `paths` (relative to `root`), `None` where nothing is there.
pub(crate) async fn stat_many(
    session: &Session,
    root: &str,
    paths: Vec<String>,
) -> Result<HashMap<String, Option<Entry>>, SyncError> {
    let lookups = futures_util::stream::iter(paths.into_iter().map(|rel| async move {
        let path = absolute(root, &rel);
        match timed(&path, session.stat(&path)).await {
            Ok(stat) => Ok((rel, Entry::from_stat(&stat))),
            Err(SyncError::Remote { source, .. })
                if matches!(
                    source.code(),
                    Some(ErrorCode::NotFound | ErrorCode::NotADirectory)
                ) =>
            {
                Ok((rel, None))
            }
            Err(e) => Err(e),
        }
    }));
    let mut found = HashMap::new();
    let mut results = lookups.buffer_unordered(REMOTE_CONCURRENCY);
    while let Some(result) = results.next().await {
        let (rel, entry) = result?;
        found.insert(rel, entry);
    }
    Ok(found)
}

/// Runs one request/response operation on `path` within [`REQUEST_TIMEOUT`].
pub(crate) async fn timed<T>(
    path: &WirePath,
    request: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, SyncError> {
    let path = escape(path.as_bytes());
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(result) => result.map_err(SyncError::remote(format!("{path} in the sandbox"))),
        Err(_) => Err(SyncError::Timeout(format!("{path} in the sandbox"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_climb_to_the_root_once() {
        let mut l = Listing::default();
        l.pin("a/b/c");
        l.pin("a/b/d");
        let mut pins: Vec<&str> = l.pinned.iter().map(String::as_str).collect();
        pins.sort();
        assert_eq!(pins, ["", "a", "a/b", "a/b/c", "a/b/d"]);
        assert_eq!(absolute("/w/", "x/y"), "/w/x/y");
        let odd = super::super::tree::key(b"x/\xfe");
        assert_eq!(absolute("/w", &odd).as_bytes(), b"/w/x/\xfe");
        assert_eq!(absolute("/w", ""), "/w");
    }
}

//! One sync pair's state and the two ways of bringing the sandbox in line with the local
//! tree: [`Engine::converge`] compares everything (a scan and a listing of both trees), and
//! [`Engine::apply`] only the paths of one batch of local changes (a `stat` each, and
//! renames carried out as renames). Both plan with [`plan`], push with [`push`], and then
//! record in the baseline what the sandbox now holds.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::baseline::Baseline;
use super::constants::{IGNORE_FILE, LARGE_BATCH};
use super::error::SyncError;
use super::plan::{plan, Plan};
use super::push::{push, Pushed, Target};
use super::remote::{self, absolute, timed, Listing};
use super::report::{Phase, Reporter, Stats};
use super::rules::Rules;
use super::scan::{self, Scan};
use super::tree::{ancestors, recorded, same_as, subtree, Kind, Tree};
use super::watch::{Changes, DirWatches};
use super::SyncSpec;
use tether_client::Session;

/// The state of one sync pair while it runs.
pub(crate) struct Engine {
    target: Target,
    rules: Arc<Rules>,
    baseline: Baseline,
    reporter: Reporter,
    watches: Option<DirWatches>,
}

/// One path of a batch, and how much of what is below it the batch covers.
struct Root {
    path: String,
    /// The batch covers everything below the path (it appeared, vanished or changed kind),
    /// not just the path itself.
    deep: bool,
}

impl Engine {
    /// An engine for `spec`, with the saved baseline. The local directory must exist.
    pub(crate) fn new(spec: &SyncSpec, reporter: Reporter) -> Result<Engine, SyncError> {
        let local = spec
            .local
            .canonicalize()
            .map_err(SyncError::local(&spec.local))?;
        if !local.is_dir() {
            return Err(SyncError::LocalNotADirectory(local));
        }
        let rules = Arc::new(Rules::new(&local, &spec.excludes)?);
        let baseline = Baseline::load(&spec.sandbox, &spec.remote, &local);
        Ok(Engine {
            target: Target {
                local,
                remote: spec.remote.clone(),
                gzip: spec.gzip,
            },
            rules,
            baseline,
            reporter,
            watches: None,
        })
    }

    /// The local root, canonical.
    pub(crate) fn local(&self) -> &Path {
        &self.target.local
    }

    /// From now on, every local directory found gets a watch.
    pub(crate) fn watch_with(&mut self, watches: DirWatches) {
        self.watches = Some(watches);
    }

    /// Saves the baseline, reporting (not failing on) a write error.
    pub(crate) fn save(&mut self) {
        if let Err(e) = self.baseline.save() {
            self.reporter
                .problem(&format!("cannot save the sync state: {e}"));
        }
    }

    /// Whether the baseline has unsaved changes.
    pub(crate) fn unsaved(&self) -> bool {
        self.baseline.is_dirty()
    }

    /// Compares both whole trees and pushes the difference.
    pub(crate) async fn converge(
        &mut self,
        session: &Session,
        phase: Phase,
    ) -> Result<Stats, SyncError> {
        let started = Instant::now();
        let scanning = self.scan_blocking(String::new());
        let listing = remote::list(session, &self.target.remote, "", &self.rules);
        let (scanned, listing) = tokio::join!(scanning, listing);
        let (scanned, listing) = (scanned?, listing?);
        self.report_problems(&scanned.problems, &listing);
        let plan = plan(&scanned.tree, &listing, &self.baseline.tree);
        let roots = [Root {
            path: String::new(),
            deep: true,
        }];
        let mut stats = self
            .execute(session, &plan, &scanned.tree, &listing.tree, &roots)
            .await?;
        stats.checked = scanned.tree.len() as u64;
        stats.ms = started.elapsed().as_millis() as u64;
        self.reporter.synced(phase, &stats);
        Ok(stats)
    }

    /// Pushes one batch of local changes.
    pub(crate) async fn apply(
        &mut self,
        session: &Session,
        changes: Changes,
    ) -> Result<Stats, SyncError> {
        let is_ignore_file = |p: &&String| p.rsplit('/').next() == Some(IGNORE_FILE);
        let ignore_files_changed = changes.paths.iter().any(|p| is_ignore_file(&p));
        if changes.rescan || ignore_files_changed || changes.paths.len() > LARGE_BATCH {
            for p in changes.paths.iter().filter(is_ignore_file) {
                self.rules.forget(ancestors(p).next().unwrap_or(""));
            }
            return self.converge(session, Phase::Rescan).await;
        }
        let started = Instant::now();
        let mut stats = Stats::default();
        for (from, to) in &changes.renames {
            if self.try_rename(session, from, to).await? {
                stats.renamed += 1;
            }
        }

        let (local, roots) = self.local_roots(&changes.paths, &changes.fresh).await?;
        let listing = self.remote_roots(session, &roots).await?;
        let plan = plan(&local, &listing, &self.baseline.tree);
        let pushed = self
            .execute(session, &plan, &local, &listing.tree, &roots)
            .await?;
        stats = Stats {
            renamed: stats.renamed,
            ..pushed
        };
        stats.checked = local.len() as u64;
        stats.ms = started.elapsed().as_millis() as u64;
        self.reporter.synced(Phase::Change, &stats);
        Ok(stats)
    }

    /// Carries out a rename in the sandbox instead of a delete and a re-send, when the
    /// sandbox still holds exactly what the last sync put at `from` and nothing at `to`.
    /// Anything less certain is left to the ordinary comparison.
    async fn try_rename(
        &mut self,
        session: &Session,
        from: &str,
        to: &str,
    ) -> Result<bool, SyncError> {
        let Some(known) = self.baseline.tree.get(from).cloned() else {
            return Ok(false);
        };
        let root = self.target.local.clone();
        let (old_here, new_here) = (scan::stat(&root, from), scan::stat(&root, to));
        let moved = old_here.is_none() && new_here.as_ref().is_some_and(|e| e.kind == known.kind);
        if !moved || self.rules.ignored_path(to, known.is_dir()) {
            return Ok(false);
        }
        let found = remote::stat_many(
            session,
            &self.target.remote,
            vec![from.to_string(), to.to_string()],
        )
        .await?;
        let there = found.get(from).cloned().flatten();
        let unchanged = there.is_some_and(|r| {
            if known.is_dir() {
                r.is_dir()
            } else {
                same_as(&r, Some(&known))
            }
        });
        if !unchanged || found.get(to).cloned().flatten().is_some() {
            return Ok(false);
        }
        let (a, b) = (
            absolute(&self.target.remote, from),
            absolute(&self.target.remote, to),
        );
        match timed(&a, session.rename(&a, &b, false)).await {
            Ok(()) => {
                self.baseline.rename(from, to);
                Ok(true)
            }
            Err(e) if e.is_disconnect() => Err(e),
            Err(_) => Ok(false),
        }
    }

    /// What the local side holds at the batch's paths, and how deep each path goes. A path
    /// below one covered deeply is covered by it; below one that is not (a directory that
    /// only changed its mode), it stands on its own.
    async fn local_roots(
        &self,
        paths: &BTreeSet<String>,
        fresh: &BTreeSet<String>,
    ) -> Result<(Tree, Vec<Root>), SyncError> {
        let root = self.target.local.clone();
        let rules = self.rules.clone();
        let watches = self.watches.clone();
        let paths: Vec<String> = paths.iter().cloned().collect();
        let fresh = fresh.clone();
        let known_dirs: BTreeSet<String> = paths
            .iter()
            .filter(|p| self.baseline.tree.get(*p).is_some_and(|e| e.is_dir()))
            .cloned()
            .collect();
        tokio::task::spawn_blocking(move || {
            let mut found = Vec::new();
            for path in paths {
                let here = scan::stat(&root, &path);
                let is_dir = here.as_ref().is_some_and(|e| e.is_dir());
                if rules.ignored_path(&path, is_dir) {
                    continue;
                }
                let deep = match &here {
                    Some(e) if e.is_dir() => fresh.contains(&path) || !known_dirs.contains(&path),
                    _ => true,
                };
                found.push((path, here, deep));
            }
            let deep: BTreeSet<String> =
                found.iter().filter(|f| f.2).map(|f| f.0.clone()).collect();
            let mut local = Tree::new();
            let mut roots = Vec::new();
            for (path, here, is_deep) in found {
                if ancestors(&path).any(|a| deep.contains(a)) {
                    continue;
                }
                match here {
                    Some(e) if e.is_dir() && is_deep => {
                        let scanned = scan::scan(&root, &path, &rules, |d| {
                            if let Some(w) = &watches {
                                w.add(d)
                            }
                        });
                        local.extend(scanned.tree);
                    }
                    Some(e) => {
                        local.insert(path.clone(), e);
                    }
                    None => {}
                }
                roots.push(Root {
                    path,
                    deep: is_deep,
                });
            }
            (local, roots)
        })
        .await
        .map_err(|e| SyncError::Worker(e.to_string()))
    }

    /// What the sandbox holds at the batch's paths: a `stat` each, and a listing below
    /// those the batch covers deeply and that are directories there.
    async fn remote_roots(&self, session: &Session, roots: &[Root]) -> Result<Listing, SyncError> {
        let found = remote::stat_many(
            session,
            &self.target.remote,
            roots.iter().map(|r| r.path.clone()).collect(),
        )
        .await?;
        let mut listing = Listing::default();
        for root in roots {
            let Some(entry) = found.get(&root.path).cloned().flatten() else {
                continue;
            };
            if root.deep && entry.is_dir() {
                let below =
                    remote::list(session, &self.target.remote, &root.path, &self.rules).await?;
                listing.tree.extend(below.tree);
                listing.pinned.extend(below.pinned);
                listing.problems.extend(below.problems);
            }
            if !self.rules.ignored_path(&root.path, entry.is_dir()) {
                listing.tree.insert(root.path.clone(), entry);
            }
        }
        Ok(listing)
    }

    /// Pushes `plan` and records the outcome under `roots` in the baseline; `remote` is
    /// what the sandbox held there before.
    async fn execute(
        &mut self,
        session: &Session,
        plan: &Plan,
        local: &Tree,
        remote: &Tree,
        roots: &[Root],
    ) -> Result<Stats, SyncError> {
        if plan.is_empty() {
            self.record(local, remote, roots, &Pushed::default());
            return Ok(Stats::default());
        }
        let progress = self.reporter.progress(plan.upload_bytes(local));
        let pushed = push(session, &self.target, plan, local, &progress).await;
        progress.finish_and_clear();
        let pushed = pushed?;
        for problem in &pushed.problems {
            self.reporter.problem(problem);
        }
        for (path, kept) in &pushed.conflicts {
            self.reporter.conflict(path, kept);
        }
        self.record(local, remote, roots, &pushed);
        let (mut files, mut dirs, mut bytes) = (0, 0, 0);
        for e in pushed.sent.values() {
            match e.kind {
                Kind::Dir => dirs += 1,
                Kind::File => {
                    files += 1;
                    bytes += e.size;
                }
                Kind::Symlink => files += 1,
            }
        }
        Ok(Stats {
            files,
            dirs,
            bytes,
            deleted: pushed.deleted,
            conflicts: pushed.conflicts.len() as u64,
            wire_bytes: pushed.wire_bytes,
            ..Stats::default()
        })
    }

    /// The sandbox now holds, under each root, the local entries: as sent, for those sent;
    /// for the others, which it already held, with the mtime it has (`remote`). A path that
    /// could not be sent keeps its old baseline.
    fn record(&mut self, local: &Tree, remote: &Tree, roots: &[Root], pushed: &Pushed) {
        let skipped: BTreeSet<&String> = pushed.skipped.iter().collect();
        for root in roots {
            let entries: Vec<_> = if root.deep {
                subtree(local, &root.path).collect()
            } else {
                local.get_key_value(&root.path).into_iter().collect()
            };
            let now: Vec<(String, _)> = entries
                .into_iter()
                .filter_map(|(k, e)| {
                    let e = match (pushed.sent.get(k), skipped.contains(k)) {
                        (Some(sent), _) => recorded(sent, None),
                        (None, true) => self.baseline.tree.get(k)?.clone(),
                        (None, false) => recorded(e, remote.get(k)),
                    };
                    Some((k.clone(), e))
                })
                .collect();
            if root.deep {
                self.baseline.replace(&root.path, now);
            } else {
                let entry = now.into_iter().next().map(|(_, e)| e);
                self.baseline.set(&root.path, entry);
            }
        }
    }

    fn report_problems(&self, scanned: &[String], listing: &Listing) {
        for p in scanned.iter().chain(&listing.problems) {
            self.reporter.problem(p);
        }
    }

    /// Scans `under` on a blocking thread, adding watches as directories are found.
    async fn scan_blocking(&self, under: String) -> Result<Scan, SyncError> {
        let (root, rules, watches) = (
            self.target.local.clone(),
            self.rules.clone(),
            self.watches.clone(),
        );
        tokio::task::spawn_blocking(move || {
            scan::scan(&root, &under, &rules, |d| {
                if let Some(w) = &watches {
                    w.add(d)
                }
            })
        })
        .await
        .map_err(|e| SyncError::Worker(e.to_string()))
    }
}

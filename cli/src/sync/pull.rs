//! `tether sync ID:/path LOCAL`: a one-shot copy from the sandbox, moving only what differs.
//!
//! The sandbox wins for every path it holds; a local file in the way that differs from
//! what the last sync left (edited here since) is first renamed to
//! `NAME.tether-conflict-<UTC time>`, and a local directory in the way of a file is renamed
//! likewise. A pull never deletes a local path the sandbox lacks.
//!
//! Everything the sandbox sends is hostile input: its listing's paths are checked when they
//! are listed ([`super::remote`]), and every local change goes through [`tether_client::hostfs`]:
//! the local directory is opened once and walked by fd without following symlinks, files
//! arrive through `read_batch` streams into short random temporary names (`O_EXCL |
//! O_NOFOLLOW`) renamed into place, symlinks are created only once every file has landed,
//! and setuid/setgid/sticky bits are dropped unless `--preserve-mode` keeps them.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tether_proto::op::{FileId, Op, Reply};
use tether_proto::{Channel, ErrorCode, WirePath};
use tokio::sync::mpsc;

use super::baseline::Baseline;
use super::constants::{CONFLICT_MARKER, READ_BATCH_BYTES, READ_BATCH_FILES};
use super::error::SyncError;
use super::push::conflict_stamp;
use super::remote::{self, absolute};
use super::report::{Phase, Reporter, Stats};
use super::rules::Rules;
use super::scan;
use super::tree::{self, key, recorded, Entry, Kind, Tree};
use super::SyncSpec;
use tether_client::hostfs::path::MAX_NAME_BYTES;
use tether_client::hostfs::{Dest, Landing, Links, SandboxPath};
use tether_client::{ClientError, Event, Session};

/// Pulls `spec.remote` into `spec.local` (created if missing).
pub async fn pull(
    session: &Session,
    spec: &SyncSpec,
    reporter: &Reporter,
) -> Result<Stats, SyncError> {
    let started = Instant::now();
    // A missing remote directory is a mistake to report, not an empty tree to mirror (which
    // would create the local directory and say "up to date").
    let root_path = WirePath::from(spec.remote.as_str());
    match remote::timed(&root_path, session.stat(&root_path)).await {
        Ok(stat) if stat.kind == tether_proto::op::FileKind::Dir => {}
        Ok(_) => return Err(SyncError::RemoteNotADirectory(spec.remote.clone())),
        Err(SyncError::Remote { source, .. }) if source.code() == Some(ErrorCode::NotFound) => {
            return Err(SyncError::RemoteMissing(spec.remote.clone()))
        }
        Err(e) => return Err(e),
    }
    fs::create_dir_all(&spec.local).map_err(SyncError::local(&spec.local))?;
    let root = spec
        .local
        .canonicalize()
        .map_err(SyncError::local(&spec.local))?;
    let dest = Arc::new(Dest::open(&root, false)?);
    let rules = std::sync::Arc::new(Rules::new(&root, &spec.excludes)?);
    let mut baseline = Baseline::load(&spec.sandbox, &spec.remote, &root);
    let mut listing = remote::list(session, &spec.remote, "", &rules).await?;
    for p in &listing.problems {
        reporter.problem(p);
    }
    // Compared and landed with the bits this side keeps, so a dropped setuid bit does not
    // make the file look changed forever.
    for entry in listing.tree.values_mut() {
        entry.mode = spec.modes.apply(entry.mode);
    }
    let local = {
        let (root, rules) = (root.clone(), rules.clone());
        tokio::task::spawn_blocking(move || scan::scan(&root, "", &rules, |_| {}))
            .await
            .map_err(|e| SyncError::Worker(e.to_string()))?
    };
    for p in &local.problems {
        reporter.problem(p);
    }

    let stamp = conflict_stamp(SystemTime::now());
    let mut stats = Stats {
        checked: listing.tree.len() as u64,
        ..Stats::default()
    };
    let mut fetch: Vec<(Fetch, Entry)> = Vec::new();
    let mut links = Links::default();
    // A file with several names is fetched once, by its first; the others become links.
    let mut first_names: HashMap<FileId, SandboxPath> = HashMap::new();
    let mut hard_links: Vec<(SandboxPath, SandboxPath)> = Vec::new();
    for (rel, r) in &listing.tree {
        let path = SandboxPath::parse(&tree::bytes(rel))?;
        match local.tree.get(rel) {
            Some(l) if l.same(r) => continue,
            Some(l) if l.is_dir() && r.is_dir() => {}
            Some(l)
                if !l.is_dir() && baseline.tree.get(rel).is_some_and(|k| l.unchanged_since(k)) =>
            {
                dest.unlink(&path)?;
            }
            Some(_) => {
                let kept = conflict_name(rel, &stamp);
                dest.rename(&path, &SandboxPath::parse(&tree::bytes(&kept))?)?;
                reporter.conflict(rel, &kept);
                stats.conflicts += 1;
            }
            None => {}
        }
        match r.kind {
            Kind::Dir => {
                dest.mkdir_all(&path)?;
                stats.dirs += 1;
            }
            Kind::Symlink => {
                links.add(path, &tree::bytes(r.target.as_deref().unwrap_or_default()))?;
                stats.files += 1;
            }
            Kind::File => {
                if let Some(id) = listing.ids.get(rel) {
                    if let Some(first) = first_names.get(id) {
                        hard_links.push((first.clone(), path));
                        continue;
                    }
                    first_names.insert(*id, path.clone());
                }
                let sparse = listing.sparse.contains(rel);
                fetch.push((Fetch { path, sparse }, r.clone()));
            }
        }
    }

    let total = fetch
        .iter()
        .fold(0u64, |sum, (_, e)| sum.saturating_add(e.size));
    let progress = reporter.progress(total);
    for chunk in batches(&fetch) {
        let (files, bytes) = read_batch(session, &spec.remote, &dest, chunk, &progress).await?;
        stats.files += files;
        stats.bytes += bytes;
        stats.wire_bytes += bytes;
    }
    progress.finish_and_clear();
    for (first, path) in &hard_links {
        dest.hard_link(first, path)?;
        stats.files += 1;
    }
    // Only now: no file of this pull can be written through a link it creates.
    links.create(&dest)?;

    // Directory modes last, deepest first: a read-only directory must not block its contents.
    for (rel, r) in listing.tree.iter().rev().filter(|(_, r)| r.is_dir()) {
        dest.chmod_dir(&SandboxPath::parse(&tree::bytes(rel))?, r.mode)?;
    }
    let now: Tree = listing
        .tree
        .iter()
        .filter_map(|(rel, r)| scan::stat(&root, rel).map(|e| (rel.clone(), recorded(&e, Some(r)))))
        .collect();
    baseline.replace("", now);
    baseline.save()?;
    stats.ms = started.elapsed().as_millis() as u64;
    reporter.synced(Phase::Pull, &stats);
    Ok(stats)
}

/// Where a local path in the way is kept: `NAME.tether-conflict-TIME` beside it, the name
/// shortened (at a character boundary) when the whole would pass the 255-byte limit.
fn conflict_name(rel: &str, stamp: &str) -> String {
    let suffix = format!("{CONFLICT_MARKER}{stamp}");
    let (dir, name) = match rel.rsplit_once('/') {
        Some((dir, name)) => (Some(dir), name),
        None => (None, rel),
    };
    let mut keep = name.len().min(MAX_NAME_BYTES.saturating_sub(suffix.len()));
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    let kept = format!("{}{suffix}", &name[..keep]);
    match dir {
        Some(dir) => format!("{dir}/{kept}"),
        None => kept,
    }
}

/// Splits the files to fetch into `read_batch`-sized groups.
fn batches<P>(files: &[(P, Entry)]) -> Vec<&[(P, Entry)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, (_, e)) in files.iter().enumerate() {
        // Sizes are the sandbox's word: saturating, so a lying one cannot overflow them.
        if i > start
            && (i - start == READ_BATCH_FILES || bytes.saturating_add(e.size) > READ_BATCH_BYTES)
        {
            out.push(&files[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(e.size);
    }
    if start < files.len() {
        out.push(&files[start..]);
    }
    out
}

/// A file to fetch: where it lands, and whether it has holes to keep.
struct Fetch {
    path: SandboxPath,
    sparse: bool,
}

/// What the writer thread is told.
enum ToWriter {
    Begin {
        path: SandboxPath,
        size: u64,
        mode: u32,
        mtime_s: i64,
        sparse: bool,
    },
    Data(Bytes),
}

/// While the current file has all its bytes (`left` is 0), tells the writer to begin the next
/// announced one; returns the bytes the file now being written still expects.
async fn begin_next(
    queue: &mut std::collections::VecDeque<(&Fetch, u64, &Entry)>,
    mut left: u64,
    tx: &mpsc::Sender<ToWriter>,
) -> Result<u64, SyncError> {
    while left == 0 {
        let Some((rel, size, e)) = queue.pop_front() else {
            break;
        };
        tx.send(ToWriter::Begin {
            path: rel.path.clone(),
            sparse: rel.sparse,
            size,
            mode: e.mode,
            mtime_s: e.mtime_s,
        })
        .await
        .map_err(|_| SyncError::Worker("the file writer stopped".into()))?;
        left = size;
    }
    Ok(left)
}

/// Fetches one group of files; returns the files and bytes written.
async fn read_batch(
    session: &Session,
    remote_root: &str,
    dest: &Arc<Dest>,
    files: &[(Fetch, Entry)],
    progress: &indicatif::ProgressBar,
) -> Result<(u64, u64), SyncError> {
    let paths: Vec<WirePath> = files
        .iter()
        .map(|(rel, _)| absolute(remote_root, &key(rel.path.as_bytes())))
        .collect();
    let mut stream = session
        .open(Op::ReadBatch { paths })
        .await
        .map_err(SyncError::remote("reading files from the sandbox"))?;
    let (tx, rx) = mpsc::channel::<ToWriter>(64);
    let writer_dest = dest.clone();
    let writer = tokio::task::spawn_blocking(move || write_files(&writer_dest, rx));
    let mut bytes = 0u64;
    let pumped = async {
        let mut queue = std::collections::VecDeque::new();
        let mut left = 0u64;
        let lost = |_| SyncError::Worker("the file writer stopped".into());
        loop {
            // Zero-length files (and any file whose bytes are all in) need no data to begin.
            left = begin_next(&mut queue, left, &tx).await?;
            match stream.next().await {
                Some(Event::Reply(Reply::Batch { results })) => {
                    for ((rel, e), result) in files.iter().zip(results) {
                        if let Some(size) = result.size {
                            queue.push_back((rel, size, e));
                        }
                    }
                }
                Some(Event::Data(Channel::Out, mut data)) => {
                    bytes += data.len() as u64;
                    progress.inc(data.len() as u64);
                    while !data.is_empty() {
                        let take = (left as usize).min(data.len());
                        if take == 0 {
                            // More bytes than announced: a protocol error.
                            return Err(SyncError::remote("reading files from the sandbox")(
                                ClientError::Protocol(
                                    "read_batch sent more bytes than its sizes announced".into(),
                                ),
                            ));
                        }
                        tx.send(ToWriter::Data(data.split_to(take)))
                            .await
                            .map_err(lost)?;
                        left -= take as u64;
                        left = begin_next(&mut queue, left, &tx).await?;
                    }
                }
                Some(Event::Error(e)) => {
                    return Err(SyncError::remote("reading files from the sandbox")(e))
                }
                Some(Event::Closed) | None => break,
                Some(_) => {}
            }
        }
        Ok::<(), SyncError>(())
    }
    .await;
    drop(tx);
    let written = writer.await.map_err(|e| SyncError::Worker(e.to_string()))?;
    // A writer that stopped on an error is why sending to it failed: report its error.
    let files = written?;
    pumped?;
    Ok((files, bytes))
}

/// The file being written: its [`Landing`], its final name, and what is still to come.
struct Open {
    landing: Landing,
    name: OsString,
    left: u64,
    mode: u32,
    mtime_s: i64,
    /// The file's length, when it has holes: zeros are skipped, not written, and the
    /// length set at the end.
    sparse: Option<u64>,
}

impl Open {
    fn start(
        dest: &Dest,
        path: SandboxPath,
        size: u64,
        mode: u32,
        mtime_s: i64,
        sparse: bool,
    ) -> Result<Open, SyncError> {
        let (dir, name) = dest.parent(&path, true)?;
        let name = name.to_os_string();
        let landing = Landing::create(dir, dest.shown(&path))?;
        Ok(Open {
            landing,
            name,
            left: size,
            mode,
            mtime_s,
            sparse: sparse.then_some(size),
        })
    }

    /// Lands the file if all of it came; a file cut short is dropped, and its temporary
    /// file with it. Returns whether it landed.
    fn finish(mut self) -> Result<bool, SyncError> {
        if self.left != 0 {
            return Ok(false);
        }
        if let Some(size) = self.sparse {
            let shown = self.landing.shown().to_string();
            self.landing
                .file()
                .set_len(size)
                .map_err(|e| SyncError::Local {
                    path: shown.into(),
                    source: e,
                })?;
        }
        // The sandbox's number: one beyond what a time can hold is left out.
        let mtime = UNIX_EPOCH.checked_add(Duration::from_secs(self.mtime_s.max(0) as u64));
        self.landing.land(&self.name, self.mode, mtime)?;
        Ok(true)
    }
}

/// Writes the files announced on `rx` into `dest`, each landing only once whole; returns
/// how many were written.
fn write_files(dest: &Dest, mut rx: mpsc::Receiver<ToWriter>) -> Result<u64, SyncError> {
    let mut current: Option<Open> = None;
    let mut written = 0;
    while let Some(msg) = rx.blocking_recv() {
        match msg {
            ToWriter::Begin {
                path,
                size,
                mode,
                mtime_s,
                sparse,
            } => {
                if let Some(open) = current.take() {
                    written += u64::from(open.finish()?);
                }
                current = Some(Open::start(dest, path, size, mode, mtime_s, sparse)?);
            }
            ToWriter::Data(bytes) => {
                let Some(open) = current.as_mut() else {
                    continue;
                };
                let shown = open.landing.shown().to_string();
                let file = open.landing.file();
                let wrote = if open.sparse.is_some() && bytes.iter().all(|&b| b == 0) {
                    // A hole: left unwritten, and the length set when the file is whole.
                    file.seek(SeekFrom::Current(bytes.len() as i64)).map(drop)
                } else {
                    file.write_all(&bytes)
                };
                wrote.map_err(|e| SyncError::Local {
                    path: shown.into(),
                    source: e,
                })?;
                open.left = open.left.saturating_sub(bytes.len() as u64);
            }
        }
    }
    // The last file lands only if all of it came; a cut stream leaves it out.
    if let Some(open) = current.take() {
        written += u64::from(open.finish()?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_land_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        let path = dir.path().join("f");
        fs::write(&path, "old").unwrap();
        let send = |msgs: Vec<ToWriter>| {
            let (tx, rx) = mpsc::channel(8);
            for m in msgs {
                tx.blocking_send(m).unwrap();
            }
            drop(tx);
            write_files(&dest, rx).unwrap()
        };
        let begin = |size| ToWriter::Begin {
            path: SandboxPath::parse(b"f").unwrap(),
            size,
            mode: 0o600,
            mtime_s: 5,
            sparse: false,
        };
        // Cut after 3 of 10 bytes: the old file stays, and no temporary file is left.
        let cut = send(vec![begin(10), ToWriter::Data(Bytes::from_static(b"new"))]);
        assert_eq!(cut, 0);
        assert_eq!(fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        let whole = send(vec![begin(3), ToWriter::Data(Bytes::from_static(b"new"))]);
        assert_eq!(whole, 1);
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn conflict_copies_of_long_names_stay_names() {
        assert_eq!(
            conflict_name("a/b.txt", "T"),
            format!("a/b.txt{CONFLICT_MARKER}T")
        );
        let long = "é".repeat(127) + "x";
        let kept = conflict_name(&format!("d/{long}"), "20260101T000000Z");
        let name = kept.strip_prefix("d/").unwrap();
        assert!(name.len() <= MAX_NAME_BYTES, "{}", name.len());
        assert!(name.ends_with("20260101T000000Z") && name.starts_with('é'));
    }

    #[test]
    fn batches_respect_both_limits() {
        let file = |size| Entry {
            kind: Kind::File,
            size,
            mtime_s: 1,
            mtime_ns: 0,
            remote_ns: 0,
            mode: 0o644,
            target: None,
        };
        let files: Vec<(String, Entry)> = (0..READ_BATCH_FILES + 3)
            .map(|i| (i.to_string(), file(1)))
            .collect();
        let sizes: Vec<usize> = batches(&files).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [READ_BATCH_FILES, 3]);
        let big = vec![
            ("a".to_string(), file(READ_BATCH_BYTES)),
            ("b".to_string(), file(1)),
        ];
        assert_eq!(batches(&big).len(), 2);
        assert!(batches::<String>(&[]).is_empty());
        // Sizes a lying sandbox announces cannot overflow the sums.
        let huge = vec![
            ("a".to_string(), file(u64::MAX)),
            ("b".to_string(), file(u64::MAX)),
        ];
        assert_eq!(batches(&huge).len(), 2);
    }
}

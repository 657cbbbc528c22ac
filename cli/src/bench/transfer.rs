//! Upload and download throughput of one large file between a tmpfs on this machine
//! (`/dev/shm`) and the sandbox's `/tmp`. In a local sandbox that is its own disk (ext4 on a
//! loop device whose backing file sits in the host's page cache): no physical disk, but a
//! download that has to read the file back through the loop device pays for it (about a core
//! on a 2-core machine), so the bench reads the file once before each timed download.
//!
//! The file is pseudo-random, so nothing along the way could compress it. The local side is
//! read and written in place ([`MemFile`]): on a memory file system that is a copy that never
//! blocks, which is cheaper than handing each chunk to a blocking thread as `tokio::fs` does.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use anyhow::Context;
use tether_proto::op::{IfExists, Op, Reply, WriteSpec};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::stats::Throughput;
use tether_client::Session;

/// The file in the sandbox.
const REMOTE: &str = "/tmp/tether-bench.bin";
/// Where the local copies live: memory, when this machine has it mounted.
const LOCAL_TMPFS: &str = "/dev/shm";
/// The local file is generated in pieces of 1 MiB.
const FILL_CHUNK: usize = 1 << 20;

/// The local side of the transfers: the file to upload and where downloads go.
pub(super) struct Files {
    dir: tempfile::TempDir,
    bytes: u64,
}

impl Files {
    /// Creates a pseudo-random file of `bytes` bytes in a tmpfs (or the temp directory).
    pub(super) async fn create(bytes: u64) -> anyhow::Result<Files> {
        let base = tmpfs_dir();
        let dir = tempfile::Builder::new()
            .prefix("tether-bench-")
            .tempdir_in(&base)
            .with_context(|| format!("cannot create a directory in {}", base.display()))?;
        let path = dir.path().join("upload.bin");
        tokio::task::spawn_blocking(move || fill(&path, bytes))
            .await
            .context("the filling thread panicked")??;
        Ok(Files { dir, bytes })
    }

    fn upload(&self) -> PathBuf {
        self.dir.path().join("upload.bin")
    }

    fn download(&self) -> PathBuf {
        self.dir.path().join("download.bin")
    }
}

/// Where the local side of a transfer lives: memory, when this machine has it mounted.
pub(super) fn tmpfs_dir() -> PathBuf {
    if Path::new(LOCAL_TMPFS).is_dir() {
        PathBuf::from(LOCAL_TMPFS)
    } else {
        std::env::temp_dir()
    }
}

/// Writes `bytes` pseudo-random bytes (xorshift64) to a new file at `path`.
fn fill(path: &Path, bytes: u64) -> anyhow::Result<()> {
    let mut file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut chunk = vec![0u8; FILL_CHUNK];
    let mut left = bytes;
    while left > 0 {
        for word in chunk.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        let n = left.min(FILL_CHUNK as u64) as usize;
        file.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Uploads the file to the sandbox's `/tmp` `runs` times.
pub(super) async fn upload(
    session: &Session,
    files: &Files,
    runs: usize,
) -> anyhow::Result<Throughput> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        // The write lands in a temp file renamed over the target: make room for it first,
        // since the sandbox's /tmp may not hold two copies.
        let _ = session.remove(REMOTE, false).await;
        let source = MemFile(std::fs::File::open(files.upload())?);
        let spec = WriteSpec {
            path: REMOTE.into(),
            mode: None,
            create_parents: true,
            if_exists: IfExists::Overwrite,
        };
        let start = Instant::now();
        let reply = session.upload(Op::Write(spec), source, |_| {}).await?;
        times.push(start.elapsed());
        match reply {
            Reply::Written { bytes } if bytes == files.bytes => {}
            other => anyhow::bail!("the upload of {} bytes ended with {other:?}", files.bytes),
        }
    }
    Throughput::of(files.bytes, &times).context("no runs")
}

/// Downloads the uploaded file from the sandbox `runs` times (see [`clean`]).
pub(super) async fn download(
    session: &Session,
    files: &Files,
    runs: usize,
) -> anyhow::Result<Throughput> {
    let mut times = Vec::with_capacity(runs);
    // One download first, untimed: it waits out the write-back the uploads left and leaves
    // the file in the sandbox's page cache, so the timed runs measure the data path.
    for run in 0..=runs {
        let sink = MemFile(std::fs::File::create(files.download())?);
        let op = Op::Read {
            path: REMOTE.into(),
            offset: 0,
            len: None,
        };
        let start = Instant::now();
        let got = session.download(op, sink, |_| {}).await?;
        if run > 0 {
            times.push(start.elapsed());
        }
        anyhow::ensure!(
            got == files.bytes,
            "downloaded {got} of {} bytes",
            files.bytes
        );
    }
    Throughput::of(files.bytes, &times).context("no runs")
}

/// Removes the uploaded file from the sandbox.
pub(super) async fn clean(session: &Session) {
    let _ = session.remove(REMOTE, false).await;
}

/// A file on a memory file system, read and written on the calling thread.
struct MemFile(std::fs::File);

impl AsyncRead for MemFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.0.read(buf.initialize_unfilled())?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for MemFile {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(self.0.write(buf))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

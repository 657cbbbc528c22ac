//! Moving one file's bytes: `read` streams a file (or a range of it) to the client, `write`
//! receives one and replaces the target atomically, or appends to it.
//!
//! Both run their file I/O on a blocking thread through [`super::pump`]: reads go in
//! [`READ_CHUNK`] pieces a few chunks ahead of the network, read straight into the data
//! frames that carry them; writes return credit to the client only as the bytes reach the
//! file.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bytes::BytesMut;
use tether_proto::limits::{BULK_CHUNK, HEADER_LEN};
use tether_proto::op::{IfExists, Reply, WriteSpec};
use tether_proto::{frame, Channel, ErrorCode, WirePath};

use super::atomic::{AtomicFile, Options};
use super::meta::file_stat;
use super::pump::{self, Incoming, Outgoing};
use super::{blocking, fail, refuse, DEFAULT_FILE_MODE, READ_CHUNK};
use crate::stream::{OpError, OpResult, StreamCtx};

/// `read`: replies with the file's `stat`, streams the bytes on `out`, then `eof`.
pub(super) async fn read(
    mut ctx: StreamCtx,
    asked: WirePath,
    path: PathBuf,
    offset: u64,
    len: Option<u64>,
) -> OpResult {
    let shown = path.clone();
    let (file, stat, limit) = blocking(move || {
        let mut file = File::open(&path).map_err(fail(&path))?;
        let meta = file.metadata().map_err(fail(&path))?;
        if meta.is_dir() {
            return Err(refuse(ErrorCode::IsDirectory, &path, "Is a directory"));
        }
        // Read to end-of-file (or `len`): a file that grows while being read yields the
        // bytes read, as the protocol says; the stat reply carries its size at open.
        if offset > 0 {
            file.seek(SeekFrom::Start(offset)).map_err(fail(&path))?;
        }
        Ok((file, file_stat(asked, &meta, None), len))
    })
    .await?;
    ctx.out.reply(Reply::Stat(stat)).await?;
    let sent = pump::download(&ctx.out, &mut ctx.input, move |out| {
        send_file(file, limit.unwrap_or(u64::MAX), out).map_err(fail(&shown))
    })
    .await?;
    match sent {
        Some(_) => ctx.out.eof(Channel::Out).await,
        None => Ok(()),
    }
}

/// Sends up to `limit` bytes of `file` from its current offset; fewer if it ends first.
/// Returns how many were sent.
pub(super) fn send_file(mut file: File, limit: u64, out: &mut Outgoing) -> io::Result<u64> {
    let mut sent = 0;
    while sent < limit {
        let want = (limit - sent).min(READ_CHUNK as u64) as usize;
        let (frames, n) = read_frames(&mut file, want)?;
        out.send_frames(frames)?;
        sent += n as u64;
        if n < want {
            break;
        }
    }
    Ok(sent)
}

/// Reads up to `want` bytes of `file` straight into data frames of at most [`BULK_CHUNK`]
/// bytes each, so they reach the socket without another copy. Returns the frames and the
/// bytes they hold: fewer than `want` only at the end of the file.
fn read_frames(file: &mut File, want: usize) -> io::Result<(Vec<BytesMut>, usize)> {
    let mut frames = Vec::with_capacity(want.div_ceil(BULK_CHUNK));
    let mut total = 0;
    while total < want {
        let size = (want - total).min(BULK_CHUNK);
        let mut frame = frame::data_buffer(size);
        frame.resize(HEADER_LEN + size, 0);
        let n = read_full(file, &mut frame[HEADER_LEN..])?;
        if n == 0 {
            break;
        }
        frame.truncate(HEADER_LEN + n);
        frames.push(frame);
        total += n;
        if n < size {
            break;
        }
    }
    Ok((frames, total))
}

/// Reads until `buf` is full or the file ends; returns how many bytes were read.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// `write`: receives the file on `in` until eof; replies `written`.
pub(super) async fn write(mut ctx: StreamCtx, path: PathBuf, spec: WriteSpec) -> OpResult {
    let written = pump::upload(&mut ctx.input, move |input| match spec.if_exists {
        IfExists::Append => append(&path, &spec, input),
        IfExists::Overwrite | IfExists::Fail => replace(&path, &spec, input),
    })
    .await?;
    match written {
        Some(bytes) => ctx.out.reply(Reply::Written { bytes }).await,
        None => Ok(()),
    }
}

/// Writes the new content to a temp file and renames it over the target at eof.
fn replace(path: &Path, spec: &WriteSpec, input: &mut Incoming) -> Result<u64, OpError> {
    let mut file = AtomicFile::create(
        path,
        Options {
            mode: spec.mode,
            create_parents: spec.create_parents,
            no_replace: spec.if_exists == IfExists::Fail,
        },
    )?;
    let bytes = copy_in(input, file.file(), u64::MAX).map_err(fail(path))?;
    file.commit()?;
    Ok(bytes)
}

/// Appends bytes to the file as they arrive, creating it if needed.
fn append(path: &Path, spec: &WriteSpec, input: &mut Incoming) -> Result<u64, OpError> {
    if spec.create_parents {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(fail(parent))?;
        }
    }
    let mode = spec.mode.unwrap_or(DEFAULT_FILE_MODE) & 0o7777;
    let created = OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(mode)
        .open(path);
    let mut file = match created {
        Ok(file) => {
            // Exactly the asked mode, whatever the umask.
            file.set_permissions(Permissions::from_mode(mode))
                .map_err(fail(path))?;
            file
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let file = OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(fail(path))?;
            if let Some(mode) = spec.mode {
                file.set_permissions(Permissions::from_mode(mode & 0o7777))
                    .map_err(fail(path))?;
            }
            file
        }
        Err(e) => return Err(fail(path)(e)),
    };
    copy_in(input, &mut file, u64::MAX).map_err(fail(path))
}

/// Copies up to `limit` input bytes into `to`; stops early at the client's eof.
/// Returns how many were copied.
pub(super) fn copy_in(input: &mut Incoming, to: &mut File, limit: u64) -> io::Result<u64> {
    let mut copied = 0;
    while copied < limit {
        let want = usize::try_from(limit - copied).unwrap_or(usize::MAX);
        let Some(chunk) = input.next(want)? else {
            break;
        };
        to.write_all(&chunk)?;
        copied += chunk.len() as u64;
    }
    Ok(copied)
}

//! Many files in one stream: `write_batch` and `read_batch`.
//!
//! The files' bytes travel on one stream, concatenated in request order, so a batch of small
//! files costs one round trip instead of one per file. Each file succeeds or fails on its
//! own and the `batch` reply says which.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use tether_proto::op::{BatchFile, BatchResult, Reply};
use tether_proto::{Channel, ErrorCode, WirePath};

use super::atomic::{AtomicFile, Options};
use super::pump::{self, Incoming};
use super::transfer::send_file;
use super::{blocking, encoded_len, fail, refuse, MAX_READ_BATCH, REPLY_BUDGET};
use crate::stream::{OpError, OpResult, StreamCtx};

/// A batch entry: what the client asked for, and its validated path (or why it is invalid).
pub(super) type Entry<T> = (T, Result<PathBuf, OpError>);

/// `write_batch`: writes each file atomically from the concatenated `in` bytes, creating
/// parent directories; replies `batch`.
pub(super) async fn write_batch(mut ctx: StreamCtx, files: Vec<Entry<BatchFile>>) -> OpResult {
    let declared: u64 = files.iter().map(|(f, _)| f.size).sum();
    let results = pump::upload(&mut ctx.input, move |input| {
        let mut results = Vec::with_capacity(files.len());
        for (spec, path) in files {
            results.push(write_one(input, &spec, path)?);
        }
        if input.next(1).map_err(stream_error)?.is_some() {
            return Err(OpError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "the in stream carries more than the {declared} bytes the batch declares; \
                     send exactly the files' sizes"
                ),
            ));
        }
        fit(&mut results)?;
        Ok(results)
    })
    .await?;
    match results {
        Some(results) => ctx.out.reply(Reply::Batch { results }).await,
        None => Ok(()),
    }
}

/// Takes exactly `spec.size` input bytes for one file. A file that cannot be written, or
/// whose bytes the upload ends before, gets an error result (its bytes are discarded).
fn write_one(
    input: &mut Incoming,
    spec: &BatchFile,
    path: Result<PathBuf, OpError>,
) -> Result<BatchResult, OpError> {
    let opts = Options {
        mode: spec.mode,
        create_parents: true,
        no_replace: false,
    };
    let mut file = path.and_then(|p| Ok((AtomicFile::create(&p, opts)?, p)));
    let mut left = spec.size;
    while left > 0 {
        let want = usize::try_from(left).unwrap_or(usize::MAX);
        let Some(chunk) = input.next(want).map_err(stream_error)? else {
            // Dropping the AtomicFile removes its temp file: the target is untouched.
            let err = OpError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "the upload ended {left} bytes short of this file's {} bytes; \
                     it was not written",
                    spec.size
                ),
            );
            return Ok(failure(spec.path.clone(), err));
        };
        left -= chunk.len() as u64;
        let failed = match &mut file {
            Ok((f, p)) => f.file().write_all(&chunk).err().map(fail(p)),
            Err(_) => None,
        };
        if let Some(err) = failed {
            file = Err(err);
        }
    }
    let outcome = file.and_then(|(f, _)| f.commit());
    Ok(match outcome {
        Ok(()) => BatchResult {
            path: spec.path.clone(),
            size: Some(spec.size),
            error: None,
            message: None,
        },
        Err(e) => failure(spec.path.clone(), e),
    })
}

/// `read_batch`: opens every file, replies `batch` with each size (from the open file, so
/// it is what will be sent) or error, then streams the opened files' bytes on `out`.
pub(super) async fn read_batch(mut ctx: StreamCtx, paths: Vec<Entry<WirePath>>) -> OpResult {
    if paths.len() > MAX_READ_BATCH {
        return Err(OpError::new(
            ErrorCode::TooLarge,
            format!(
                "read_batch names {} files, more than {MAX_READ_BATCH}; split it",
                paths.len()
            ),
        ));
    }
    let (mut results, files) = blocking(move || Ok(open_all(paths))).await?;
    fit(&mut results)?;
    ctx.out.reply(Reply::Batch { results }).await?;
    let sent = pump::download(&ctx.out, &mut ctx.input, move |out| {
        for (file, size, path) in files {
            let n = send_file(file, size, out).map_err(fail(&path))?;
            // A file that shrank since it was opened cannot be sent as announced, and
            // padding would hand the client bytes the file never had: fail, naming it.
            // One that grew is sent as announced (its first `size` bytes).
            if n < size {
                return Err(OpError::new(
                    ErrorCode::Internal,
                    format!(
                        "{}: the file changed size while reading \
                         ({size} bytes announced, {n} read)",
                        path.display()
                    ),
                ));
            }
        }
        Ok(())
    })
    .await?;
    match sent {
        Some(()) => ctx.out.eof(Channel::Out).await,
        None => Ok(()),
    }
}

/// Opens each path; the results in request order, and the opened files with their sizes.
fn open_all(paths: Vec<Entry<WirePath>>) -> (Vec<BatchResult>, Vec<(File, u64, PathBuf)>) {
    let mut results = Vec::with_capacity(paths.len());
    let mut files = Vec::new();
    for (asked, path) in paths {
        let opened = path.and_then(|path| {
            let file = File::open(&path).map_err(fail(&path))?;
            let meta = file.metadata().map_err(fail(&path))?;
            if meta.is_dir() {
                return Err(refuse(ErrorCode::IsDirectory, &path, "Is a directory"));
            }
            Ok((file, meta.len(), path))
        });
        match opened {
            Ok((file, size, path)) => {
                results.push(BatchResult {
                    path: asked,
                    size: Some(size),
                    error: None,
                    message: None,
                });
                files.push((file, size, path));
            }
            Err(e) => results.push(failure(asked, e)),
        }
    }
    (results, files)
}

fn failure(path: WirePath, err: OpError) -> BatchResult {
    BatchResult {
        path,
        size: None,
        error: Some(err.code),
        message: Some(err.message),
    }
}

/// The input failed: the stream was cancelled, and the pump discards this error.
fn stream_error(err: std::io::Error) -> OpError {
    OpError::new(ErrorCode::Internal, err.to_string())
}

/// Makes the results fit one reply, dropping failure messages (the codes stay) if needed.
fn fit(results: &mut [BatchResult]) -> Result<(), OpError> {
    if encoded_len(results) <= REPLY_BUDGET {
        return Ok(());
    }
    for r in results.iter_mut() {
        r.message = None;
    }
    if encoded_len(results) <= REPLY_BUDGET {
        return Ok(());
    }
    Err(OpError::new(
        ErrorCode::TooLarge,
        "the batch's results do not fit in one reply; send fewer files per batch",
    ))
}

//! `tether cp`: files and directories between this machine and a sandbox, one side written
//! `ID:/path`. Files move as `read`/`write` streams (the agent writes atomically); directories
//! as tar streams (`tar_read` / `tar_write`), packed and unpacked as they flow, never whole in
//! memory; modes and symlinks are kept, setuid/setgid/sticky bits only with
//! `--preserve-mode`. Downloads go through [`tether_client::hostfs`], which writes nothing outside
//! the destination whatever the sandbox sends. Destinations follow `cp -r`: an existing
//! directory receives the source inside it under its own name.

use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio_util::io::SyncIoBridge;

use tether_proto::op::{FileKind, IfExists, Op, WriteSpec};
use tether_proto::{ErrorCode, WirePath};

use super::location::Location;
use super::remote::Remote;
use tether_client::escape::{escape, escape_os, escape_str};
use tether_client::hostfs::pack::Packer;
use tether_client::hostfs::{self, HostFsError, ModePolicy};
use tether_client::{ClientError, Session};

/// Bytes buffered between the network and the tar packer or unpacker.
const PIPE_BYTES: usize = 1 << 20; // 1 MiB
/// Read buffer of a file being uploaded: each read of a tokio file is a trip through the
/// blocking pool, so few large reads beat many frame-sized ones.
const FILE_READ_BYTES: usize = 1 << 20; // 1 MiB
/// Transfers smaller than this never show a progress bar.
const PROGRESS_MIN_BYTES: u64 = 8 << 20; // 8 MiB
/// The progress bar's redraws per second.
const PROGRESS_HZ: u8 = 10;
/// How a transfer of known size is drawn.
const SIZED_TEMPLATE: &str = "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}";

/// `tether cp`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  tether cp ./src sb-1a2b:/workspace\n  \
                        tether cp sb-1a2b:/workspace/out.log .")]
pub(super) struct CpArgs {
    /// What to copy: a local path, or ID:/path in a sandbox.
    #[arg(value_name = "SRC")]
    src: String,
    /// Where to: a local path, or ID:/path in a sandbox.
    #[arg(value_name = "DST")]
    dst: String,
    /// Keep the setuid, setgid and sticky bits of files from the sandbox (dropped by default).
    #[arg(long)]
    preserve_mode: bool,
}

pub(super) async fn run(remote: Remote, args: CpArgs) -> anyhow::Result<()> {
    match (Location::parse(&args.src), Location::parse(&args.dst)) {
        (Location::Remote { id, path }, Location::Local(dst)) => {
            let session = connect(&remote, &id, &args.src).await?;
            let bar = progress(None);
            let modes = ModePolicy::from_flag(args.preserve_mode);
            let copied = hostfs::download(&session, &path, &dst, modes, &|total, n| {
                bar.advance(total, n)
            })
            .await;
            bar.finish();
            let copied = copied.map_err(|e| match e {
                HostFsError::Remote(e) => remote_context(e.into(), &id),
                other => other.into(),
            })?;
            report_special(&copied.special);
            Ok(())
        }
        (Location::Local(src), Location::Remote { id, path }) => {
            let session = connect(&remote, &id, &args.dst).await?;
            upload(&session, &id, &src, &path)
                .await
                .map_err(|e| remote_context(e, &id))
        }
        (Location::Remote { .. }, Location::Remote { .. }) => {
            let said = "both sides are in sandboxes: copy to this machine first, then from it";
            match Location::colon_hint(&args.src).or_else(|| Location::colon_hint(&args.dst)) {
                Some(hint) => anyhow::bail!("{said}; {hint}"),
                None => anyhow::bail!("{said}"),
            }
        }
        (Location::Local(_), Location::Local(_)) => anyhow::bail!(
            "neither side is in a sandbox: write one side as ID:/path (see `tether ls`)"
        ),
    }
}

/// Connects to sandbox `id`, which the user wrote as part of `written`; when that fails and
/// `written` is also a local name, the error says how it was read and how to write it.
async fn connect(remote: &Remote, id: &str, written: &str) -> anyhow::Result<Session> {
    remote
        .connect(id)
        .await
        .map_err(|e| match Location::colon_hint(written) {
            Some(hint) => e.context(hint),
            None => e,
        })
}

/// The summary line of what was left out: FIFOs, sockets and devices are never copied.
fn report_special(names: &[String]) {
    if names.is_empty() {
        return;
    }
    let count = names.len();
    let what = if count == 1 { "file" } else { "files" };
    eprintln!(
        "skipped {count} special {what} (FIFOs, sockets and devices are not copied): {}",
        names.join(", ")
    );
}

/// Says where an error the agent reported happened (its message names the path).
fn remote_context(err: anyhow::Error, id: &str) -> anyhow::Error {
    match err.downcast_ref::<ClientError>() {
        Some(ClientError::Remote { .. }) => err.context(format!("in sandbox {}", escape_str(id))),
        _ => err,
    }
}

async fn upload(session: &Session, id: &str, src: &Path, dst: &str) -> anyhow::Result<()> {
    let meta = std::fs::metadata(src).with_context(|| format!("cannot read {}", src.display()))?;
    // A trailing slash says the destination is a directory that must exist, as with `cp`.
    let wants_dir = dst.ends_with('/') && !dst.trim_end_matches('/').is_empty();
    let into_dir = match session.stat(dst).await {
        Ok(stat) => stat.kind == FileKind::Dir,
        Err(e) if e.code() == Some(ErrorCode::NotFound) && wants_dir => {
            return Err(missing_dir(id, dst.trim_end_matches('/').as_bytes()))
        }
        Err(e) if e.code() == Some(ErrorCode::NotFound) => false,
        Err(e) => return Err(e.into()),
    };
    if wants_dir && !into_dir {
        anyhow::bail!(
            "{} in sandbox {} is not a directory, so nothing can be copied into it; name the \
             destination without the trailing slash to replace it",
            escape_str(dst.trim_end_matches('/')),
            escape_str(id)
        );
    }
    let target = match (into_dir, src.file_name()) {
        (true, Some(name)) => {
            let mut path = dst.trim_end_matches('/').as_bytes().to_vec();
            path.push(b'/');
            path.extend_from_slice(name.as_bytes());
            WirePath::from(path)
        }
        _ => WirePath::from(dst),
    };
    if meta.is_dir() {
        upload_dir(session, src, &target).await
    } else if meta.is_file() {
        upload_file(session, id, src, &meta, &target).await
    } else {
        anyhow::bail!("{} is not a regular file or a directory", src.display())
    }
}

async fn upload_file(
    session: &Session,
    id: &str,
    src: &Path,
    meta: &std::fs::Metadata,
    target: &WirePath,
) -> anyhow::Result<()> {
    let file = tokio::fs::File::open(src)
        .await
        .with_context(|| format!("cannot read {}", src.display()))?;
    let file = tokio::io::BufReader::with_capacity(FILE_READ_BYTES, file);
    let spec = WriteSpec {
        path: target.clone(),
        mode: Some(meta.permissions().mode() & 0o7777),
        create_parents: false,
        if_exists: IfExists::Overwrite,
    };
    let bar = progress(Some(meta.len()));
    let written = session
        .upload(Op::Write(spec), file, |n| bar.advance_to(n))
        .await;
    bar.finish();
    match written {
        // The agent's hint names the write op's field; the CLI has no such flag.
        Err(ClientError::Remote {
            code: ErrorCode::NotFound,
            ..
        }) => {
            let bytes = target.as_bytes();
            let parent = &bytes[..bytes.iter().rposition(|&b| b == b'/').unwrap_or(0)];
            Err(missing_dir(
                id,
                if parent.is_empty() { b"." } else { parent },
            ))
        }
        written => {
            written?;
            Ok(())
        }
    }
}

/// The error for a destination directory `dir` that does not exist in sandbox `id`: it says
/// so and how to create it (the agent's own "Not a directory" or hint about the write op's
/// field says neither).
fn missing_dir(id: &str, dir: &[u8]) -> anyhow::Error {
    let dir = escape(dir);
    let id = escape_str(id);
    anyhow::Error::new(ClientError::Remote {
        code: ErrorCode::NotFound,
        message: format!(
            "{dir}: no such directory; create it first with `tether exec {id} -- mkdir -p \
             {dir}`"
        ),
    })
}

async fn upload_dir(session: &Session, src: &Path, target: &WirePath) -> anyhow::Result<()> {
    let (writer, reader) = tokio::io::duplex(PIPE_BYTES);
    let bridge = SyncIoBridge::new(writer);
    let root = src.to_path_buf();
    let pack = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<String>> {
        let mut builder = tar::Builder::new(bridge);
        let mut packer = Packer::default();
        pack_dir(&mut builder, &mut packer, &root, Path::new(""))?;
        let mut bridge = builder.into_inner()?;
        // Shutting the pipe down is the archive's end-of-file for the upload.
        bridge.shutdown()?;
        Ok(packer
            .skipped
            .iter()
            .map(|p| escape_os(p.as_os_str()).into_owned())
            .collect())
    });
    let bar = progress(None);
    let op = Op::TarWrite {
        path: target.clone(),
        gzip: false,
    };
    let (sent, packed) = tokio::join!(session.upload(op, reader, |n| bar.advance_to(n)), pack);
    bar.finish();
    // A failed upload is the cause: the packer then only saw its pipe close ("broken pipe").
    sent?;
    let skipped = packed?.with_context(|| format!("cannot pack {}", src.display()))?;
    report_special(&skipped);
    Ok(())
}

/// Archives everything below `dir` (not following symlinks), named under `rel`, parents
/// before their contents and siblings in name order.
fn pack_dir<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    packer: &mut Packer,
    dir: &Path,
    rel: &Path,
) -> std::io::Result<()> {
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort();
    for name in names {
        let (path, name) = (dir.join(&name), rel.join(&name));
        let meta = std::fs::symlink_metadata(&path)?;
        packer.append(tar, &path, &name, &meta)?;
        if meta.is_dir() {
            pack_dir(tar, packer, &path, &name)?;
        }
    }
    Ok(())
}

/// A progress bar on stderr, drawn only on a terminal and only once a transfer is large.
struct Progress {
    bar: ProgressBar,
    terminal: bool,
}

fn progress(len: Option<u64>) -> Progress {
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::hidden());
    let template = match len {
        Some(_) => SIZED_TEMPLATE,
        None => "{spinner} {bytes} {bytes_per_sec} {elapsed}",
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    Progress {
        bar,
        terminal: std::io::stderr().is_terminal(),
    }
}

impl Progress {
    /// Records that `n` bytes of `total` (when known) have moved.
    fn advance(&self, total: Option<u64>, n: u64) {
        if let (Some(total), None) = (total, self.bar.length()) {
            self.bar.set_length(total);
            if let Ok(style) = ProgressStyle::with_template(SIZED_TEMPLATE) {
                self.bar.set_style(style);
            }
        }
        self.advance_to(n);
    }

    /// Records that `n` bytes have moved.
    fn advance_to(&self, n: u64) {
        let large = self.bar.length().unwrap_or(n).max(n) >= PROGRESS_MIN_BYTES;
        if self.terminal && large && self.bar.is_hidden() {
            self.bar
                .set_draw_target(ProgressDrawTarget::stderr_with_hz(PROGRESS_HZ));
        }
        self.bar.set_position(n);
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

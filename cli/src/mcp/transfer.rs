//! `upload` and `download`: files and directory trees between this machine and a sandbox,
//! only under the `--allow-dir` directories ([`super::allow::AllowedDirs`]). Downloads land
//! through [`tether_client::hostfs`]'s pieces, which never write outside the destination whatever
//! the sandbox sends (symlinks in a tree are recreated as symlinks, never followed), into a
//! destination resolved and checked here first.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::io::SyncIoBridge;

use tether_proto::op::{FileKind, FileStat, Op, Reply, WriteSpec};

use tether_client::hostfs::download::{download_dir, download_file, Progress};
use tether_client::hostfs::unpack::Unpacked;
use tether_client::hostfs::{self, ModePolicy};
use tether_client::Session;

use super::constants::UPLOAD_PIPE_BYTES;
use super::error::{invalid, ToolError};
use super::Server;

/// Arguments of `upload`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct UploadArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The file or directory on this machine: inside one of the server's --allow-dir
    /// directories (a relative path starts from the first of them). Symlinks are resolved
    /// before the check; `..` is refused.
    pub host_path: String,
    /// Where it goes in the sandbox: the file's new path, or the directory to create or
    /// fill with the directory's contents. Parents are created.
    pub sandbox_path: String,
}

/// Arguments of `download`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DownloadArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The file or directory in the sandbox.
    pub sandbox_path: String,
    /// Where it lands on this machine: inside one of the server's --allow-dir directories
    /// (a relative path starts from the first of them). An existing directory receives it
    /// under its own name, as `cp -r` does; the parent directory must exist.
    pub host_path: String,
}

fn check_sandbox_path(path: &str) -> Result<(), ToolError> {
    if path.is_empty() || path.contains('\0') {
        return Err(invalid(
            "sandbox_path must be non-empty and contain no NUL byte",
        ));
    }
    Ok(())
}

pub(super) async fn upload(server: &Server, args: UploadArgs) -> Result<Value, ToolError> {
    check_sandbox_path(&args.sandbox_path)?;
    let source = server.allowed.existing(&args.host_path)?;
    let shown = source.display().to_string();
    let session = server.connections.get(&args.sandbox_id).await?;
    let meta = std::fs::metadata(&source)
        .map_err(|e| ToolError::HostIo(format!("cannot read {shown}: {e}")))?;
    if meta.is_dir() {
        let (writer, reader) = tokio::io::duplex(UPLOAD_PIPE_BYTES);
        let dir = source.clone();
        let packing = tokio::task::spawn_blocking(move || {
            let mut tar = tar::Builder::new(SyncIoBridge::new(writer));
            // Links are archived as links, never followed: a symlink inside the allowed
            // directory cannot carry a file from outside it into the sandbox.
            tar.follow_symlinks(false);
            tar.append_dir_all(".", &dir)?;
            tar.into_inner()?;
            Ok::<_, std::io::Error>(())
        });
        let op = Op::TarWrite {
            path: args.sandbox_path.as_str().into(),
            gzip: false,
        };
        let (sent, packed) = tokio::join!(session.upload(op, reader, |_| {}), packing);
        packed
            .map_err(|e| ToolError::HostIo(format!("packing {shown} stopped: {e}")))?
            .map_err(|e| ToolError::HostIo(format!("cannot pack {shown}: {e}")))?;
        sent?;
        return Ok(json!({
            "host_path": shown,
            "sandbox_path": args.sandbox_path,
            "kind": "dir",
        }));
    }
    if !meta.is_file() {
        return Err(invalid(format!(
            "{shown} is neither a regular file nor a directory; only those are uploaded"
        )));
    }
    // The path is canonical; O_NOFOLLOW refuses a symlink swapped in since the check.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&source)
        .map_err(|e| ToolError::HostIo(format!("cannot open {shown}: {e}")))?;
    let mode = file_mode(&file);
    let spec = WriteSpec {
        path: args.sandbox_path.as_str().into(),
        mode: Some(mode),
        create_parents: true,
        if_exists: Default::default(),
    };
    let reply = session
        .upload(Op::Write(spec), tokio::fs::File::from_std(file), |_| {})
        .await?;
    let bytes = match reply {
        Reply::Written { bytes } => bytes,
        other => {
            return Err(ToolError::Client(tether_client::ClientError::Protocol(
                format!("the agent answered a write with {other:?}"),
            )))
        }
    };
    Ok(json!({
        "host_path": shown,
        "sandbox_path": args.sandbox_path,
        "kind": "file",
        "bytes": bytes,
    }))
}

fn file_mode(file: &File) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    file.metadata()
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(0o644)
}

pub(super) async fn download(server: &Server, args: DownloadArgs) -> Result<Value, ToolError> {
    check_sandbox_path(&args.sandbox_path)?;
    let mut target = server.allowed.target(&args.host_path)?;
    let session = server.connections.get(&args.sandbox_id).await?;
    let stat = session.stat(&args.sandbox_path).await?;
    if target.is_dir() {
        // `cp -r` into an existing directory: under the source's own name, checked again,
        // since a link planted there (by an earlier download, say) may point anywhere.
        let Some(name) = remote_name(&args.sandbox_path) else {
            return Err(invalid(format!(
                "{} names no file to put inside {}: give host_path the new name",
                tether_client::escape::escape_str(&args.sandbox_path),
                target.display()
            )));
        };
        let inside = target.join(name);
        target = server.allowed.target(&inside.to_string_lossy())?;
    }
    let shown = target.display().to_string();
    let is_dir = match stat.kind {
        FileKind::Dir => true,
        FileKind::File => false,
        // A link named by the caller is followed, as `cp` does.
        FileKind::Symlink => session.list(&args.sandbox_path, 1).await.is_ok(),
        FileKind::Other => {
            return Err(invalid(format!(
                "{} is a special file (socket, fifo, device); only files and directories are \
                 downloaded",
                tether_client::escape::escape_str(&args.sandbox_path)
            )))
        }
    };
    let landed = if is_dir {
        land_dir(&session, &args.sandbox_path, &target).await?
    } else {
        land_file(&session, &args.sandbox_path, &stat, &target).await?
    };
    Ok(json!({
        "sandbox_path": args.sandbox_path,
        "host_path": shown,
        "files": landed.files,
        "dirs": landed.dirs,
        "symlinks": landed.links,
    }))
}

/// The last component of a sandbox path, when it is a plain name.
fn remote_name(path: &str) -> Option<&str> {
    let name = path.trim_end_matches('/').rsplit('/').next()?;
    hostfs::SandboxPath::parse_str(name).ok().map(|_| name)
}

/// A file from the sandbox, through the lander `tether cp` uses: written under a temporary
/// name in its (checked, canonical) directory and renamed into place, so a symlink standing
/// at the name is replaced, not followed.
async fn land_file(
    session: &Session,
    src: &str,
    stat: &FileStat,
    target: &Path,
) -> Result<Unpacked, ToolError> {
    let mode = ModePolicy::DropSpecial;
    let quiet: Progress<'_> = &|_, _| {};
    Ok(download_file(session, src, stat.size, stat.mode, target, mode, quiet).await?)
}

/// A directory tree from the sandbox, unpacked as it streams into `target` (created if
/// missing; its parent is checked and canonical), through the unpacker `tether cp` uses.
async fn land_dir(session: &Session, src: &str, target: &Path) -> Result<Unpacked, ToolError> {
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(ToolError::HostIo(format!(
                "{} exists and is not a directory; choose another host_path",
                target.display()
            )))
        }
        Err(_) => std::fs::create_dir(target)
            .map_err(|e| ToolError::HostIo(format!("cannot create {}: {e}", target.display())))?,
    }
    let quiet: Progress<'_> = &|_, _| {};
    Ok(download_dir(session, src, target, ModePolicy::DropSpecial, quiet).await?)
}

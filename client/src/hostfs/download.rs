//! `tether cp ID:/path LOCAL`: a file or a directory tree from a sandbox written here,
//! through [`Dest`], [`Landing`] and [`unpack`], so that nothing the agent sends can write
//! outside `LOCAL`. A file moves as a `read` stream, a directory as a `tar_read` stream,
//! unpacked as it flows, never whole in memory; either is written on one blocking thread
//! straight from the frames ([`Session::download_blocking`]). `LOCAL` follows `cp -r`: an existing
//! directory receives the source inside it under its own name.

use std::path::Path;

use tether_proto::op::{FileKind, Op};
use tether_proto::ErrorCode;

use super::dir::Dest;
use super::error::HostFsError;
use super::landing::Landing;
use super::path::SandboxPath;
use super::unpack::{unpack, Unpacked};
use super::ModePolicy;
use crate::escape::escape_os;
use crate::Session;

/// Told how a download is going: the total when known (a file's announced size), and the
/// bytes moved so far.
pub type Progress<'a> = &'a (dyn Fn(Option<u64>, u64) + Send + Sync);

/// Copies `src` in the sandbox to `dst` here; returns what landed.
pub async fn download(
    session: &Session,
    src: &str,
    dst: &Path,
    modes: ModePolicy,
    progress: Progress<'_>,
) -> Result<Unpacked, HostFsError> {
    let stat = session.stat(src).await?;
    let target = match (std::fs::metadata(dst), remote_name(src)) {
        (Ok(m), Some(name)) if m.is_dir() => dst.join(name),
        _ => dst.to_path_buf(),
    };
    match stat.kind {
        FileKind::Dir => download_dir(session, src, &target, modes, progress).await,
        FileKind::File => {
            download_file(session, src, stat.size, stat.mode, &target, modes, progress).await
        }
        FileKind::Symlink => {
            // A link named on the command line is followed, as `cp` does.
            match download_file(session, src, stat.size, 0o644, &target, modes, progress).await {
                Err(HostFsError::Remote(e)) if e.code() == Some(ErrorCode::IsDirectory) => {
                    download_dir(session, src, &target, modes, progress).await
                }
                other => other,
            }
        }
        FileKind::Other => Err(HostFsError::Unsupported {
            path: crate::escape::escape_str(src).into_owned(),
            kind: "special file".into(),
        }),
    }
}

/// Writes the file `src` (of `size` bytes, for `progress`) to `target`: under a temporary
/// name in `target`'s directory, renamed into place with `mode` as `modes` allows, so a
/// symlink standing at `target` is replaced, not followed.
pub async fn download_file(
    session: &Session,
    src: &str,
    size: u64,
    mode: u32,
    target: &Path,
    modes: ModePolicy,
    progress: Progress<'_>,
) -> Result<Unpacked, HostFsError> {
    let (dir, name) = match (target.parent(), target.file_name()) {
        (Some(p), Some(name)) if !p.as_os_str().is_empty() => (p, name),
        (_, Some(name)) => (Path::new("."), name),
        _ => {
            return Err(HostFsError::Io {
                action: "write",
                path: escape_os(target.as_os_str()).into_owned(),
                source: std::io::Error::other("it names no file: give a file or directory name"),
            })
        }
    };
    let dest = Dest::open(dir, false)?;
    let fd = dest
        .root()
        .try_clone_to_owned()
        .map_err(HostFsError::io("open", escape_os(dir.as_os_str())))?;
    let mut landing = Landing::create(fd, escape_os(target.as_os_str()).into_owned())?;
    let mut file = landing
        .file()
        .try_clone()
        .map_err(HostFsError::io("write", landing.shown().to_string()))?;
    let shown = landing.shown().to_string();
    let op = Op::Read {
        path: src.into(),
        offset: 0,
        len: None,
    };
    session
        .download_blocking(
            op,
            move |received| {
                received
                    .write_all_to(&mut file)
                    .map_err(HostFsError::io("write", shown))
            },
            |n| progress(Some(size), n),
        )
        .await?;
    landing.land(name, modes.apply(mode), None)?;
    Ok(Unpacked {
        files: 1,
        ..Unpacked::default()
    })
}

/// Unpacks the tree at `src` into the directory `target` (created, with its parents, if
/// missing) as it streams: nothing in the archive lands outside `target`.
pub async fn download_dir(
    session: &Session,
    src: &str,
    target: &Path,
    modes: ModePolicy,
    progress: Progress<'_>,
) -> Result<Unpacked, HostFsError> {
    let dest = Dest::open(target, true)?;
    let op = Op::TarRead {
        path: src.into(),
        exclude: Vec::new(),
    };
    session
        .download_blocking(
            op,
            move |received| unpack(received, &dest, modes),
            |n| progress(None, n),
        )
        .await
}

/// The last component of a remote path, if it names something (not `/`, `.` or `..`), and
/// only if it is a name that stays in the destination.
fn remote_name(path: &str) -> Option<&str> {
    let name = path.trim_end_matches('/').rsplit('/').next()?;
    SandboxPath::parse_str(name).ok().map(|_| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_names() {
        assert_eq!(remote_name("/a/b/"), Some("b"));
        assert_eq!(remote_name("b"), Some("b"));
        assert_eq!(remote_name("/"), None);
        assert_eq!(remote_name("/a/.."), None);
        assert_eq!(remote_name("/a/."), None);
    }
}

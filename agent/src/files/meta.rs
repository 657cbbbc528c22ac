//! Metadata and namespace operations: stat, list, mkdir, remove, rename and chmod.
//!
//! Each is one request and one reply. None follows a symlink it finds inside a tree: `stat`
//! reports the link itself, `list` does not descend into linked directories, and a
//! recursive `remove` deletes links, never what they point to.

use std::fs::{self, Metadata, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tether_proto::op::{FileId, FileKind, FileStat, Reply};
use tether_proto::{ErrorCode, WirePath};
use walkdir::WalkDir;

use super::atomic::rename_no_replace;
use super::{
    encoded_len, fail, refuse, relative, respond, DEFAULT_DIR_MODE, MAX_LIST_ENTRIES, REPLY_BUDGET,
};
use crate::stream::{OpError, OpResult, StreamCtx};

/// The wire form of a file's metadata; `path` is as asked, or relative to a listed directory.
pub(super) fn file_stat(path: WirePath, meta: &Metadata, target: Option<WirePath>) -> FileStat {
    let kind = match meta.file_type() {
        t if t.is_symlink() => FileKind::Symlink,
        t if t.is_dir() => FileKind::Dir,
        t if t.is_file() => FileKind::File,
        _ => FileKind::Other,
    };
    FileStat {
        path,
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        mtime_ms: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
        target,
        file_id: (kind == FileKind::File).then(|| FileId {
            device: meta.dev(),
            inode: meta.ino(),
            links: meta.nlink(),
        }),
        allocated: (kind == FileKind::File).then(|| meta.blocks().saturating_mul(512)),
    }
}

/// A symlink's target, as its bytes; `None` for anything else.
fn link_target(path: &Path, meta: &Metadata) -> Option<WirePath> {
    if !meta.file_type().is_symlink() {
        return None;
    }
    fs::read_link(path).ok().map(WirePath::from)
}

/// `stat`: the path's own metadata (a symlink is reported, not followed).
pub(super) async fn stat(ctx: StreamCtx, asked: WirePath, path: PathBuf) -> OpResult {
    respond(ctx, move || {
        let meta = fs::symlink_metadata(&path).map_err(fail(&path))?;
        let stat = file_stat(asked, &meta, link_target(&path, &meta));
        Ok(Reply::Stat(stat))
    })
    .await
}

/// `list`: the directory's entries to `depth` levels, sorted by relative path.
pub(super) async fn list(ctx: StreamCtx, path: PathBuf, depth: u32) -> OpResult {
    respond(ctx, move || {
        let entries = list_dir(&path, depth)?;
        Ok(Reply::Entries { entries })
    })
    .await
}

fn list_dir(root: &Path, depth: u32) -> Result<Vec<FileStat>, OpError> {
    // The listed directory itself may be a symlink to one; what is inside is not followed.
    let meta = fs::metadata(root).map_err(fail(root))?;
    if !meta.is_dir() {
        return Err(refuse(ErrorCode::NotADirectory, root, "Not a directory"));
    }
    fs::read_dir(root).map_err(fail(root))?;
    let too_large = |why: String| {
        OpError::new(
            ErrorCode::TooLarge,
            format!(
                "{}: {why}; list a subdirectory or a smaller depth",
                root.display()
            ),
        )
    };
    let mut entries = Vec::new();
    let mut bytes = 0;
    // Unreadable subdirectories and entries that vanish mid-walk are left out.
    for entry in WalkDir::new(root)
        .min_depth(1)
        .max_depth(depth as usize)
        .into_iter()
        .flatten()
    {
        if entries.len() == MAX_LIST_ENTRIES {
            return Err(too_large(format!(
                "more than {MAX_LIST_ENTRIES} entries within depth {depth}"
            )));
        }
        let Ok(meta) = entry.metadata() else { continue };
        let stat = file_stat(
            relative(root, entry.path()),
            &meta,
            link_target(entry.path(), &meta),
        );
        bytes += encoded_len(&stat) + 1;
        if bytes > REPLY_BUDGET {
            return Err(too_large(format!(
                "the listing exceeds one reply ({} entries fit)",
                entries.len()
            )));
        }
        entries.push(stat);
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

/// `mkdir`: creates the directory and its parents; an existing directory is fine.
pub(super) async fn mkdir(ctx: StreamCtx, path: PathBuf, mode: Option<u32>) -> OpResult {
    respond(ctx, move || make_dir(&path, mode).map(|()| Reply::Ok)).await
}

fn make_dir(path: &Path, mode: Option<u32>) -> Result<(), OpError> {
    // The nearest existing ancestor (or the path itself) must be a directory.
    for (i, existing) in path.ancestors().enumerate() {
        match fs::metadata(existing) {
            Ok(meta) if meta.is_dir() && i == 0 => return Ok(()),
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => {
                return Err(refuse(
                    ErrorCode::AlreadyExists,
                    existing,
                    "File exists and is not a directory",
                ))
            }
            Err(_) => {}
        }
    }
    let mode = mode.unwrap_or(DEFAULT_DIR_MODE) & 0o7777;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(fail(path))?;
    // Exactly the asked mode, whatever the umask (as `mkdir -m` does for the last one).
    fs::set_permissions(path, Permissions::from_mode(mode)).map_err(fail(path))
}

/// `remove`: a file or symlink, an empty directory, or with `recursive` a whole tree.
pub(super) async fn remove(ctx: StreamCtx, path: PathBuf, recursive: bool) -> OpResult {
    respond(ctx, move || {
        remove_path(&path, recursive).map(|()| Reply::Ok)
    })
    .await
}

fn remove_path(path: &Path, recursive: bool) -> Result<(), OpError> {
    if path.parent().is_none() {
        return Err(refuse(
            ErrorCode::InvalidArgument,
            path,
            "refusing to remove the root directory",
        ));
    }
    let meta = fs::symlink_metadata(path).map_err(fail(path))?;
    if !meta.is_dir() {
        return fs::remove_file(path).map_err(fail(path));
    }
    if recursive {
        // std's remove_dir_all unlinks symlinks rather than following them, and opens each
        // directory relative to its parent, so a link swapped in cannot redirect it.
        return fs::remove_dir_all(path).map_err(fail(path));
    }
    let not_empty = rustix::io::Errno::NOTEMPTY.raw_os_error();
    fs::remove_dir(path).map_err(|e| match e.raw_os_error() {
        Some(n) if n == not_empty => refuse(
            ErrorCode::from_io(&e),
            path,
            "Directory not empty (pass recursive to remove it and everything in it)",
        ),
        _ => fail(path)(e),
    })
}

/// `rename`: moves `from` to `to`; without `overwrite`, fails if `to` exists.
pub(super) async fn rename(
    ctx: StreamCtx,
    from: PathBuf,
    to: PathBuf,
    overwrite: bool,
) -> OpResult {
    respond(ctx, move || {
        rename_path(&from, &to, overwrite).map(|()| Reply::Ok)
    })
    .await
}

fn rename_path(from: &Path, to: &Path, overwrite: bool) -> Result<(), OpError> {
    // Name the culprit when the source is missing; the OS error cannot tell which it was.
    fs::symlink_metadata(from).map_err(fail(from))?;
    let renamed = if overwrite {
        fs::rename(from, to)
    } else {
        rename_no_replace(from, to)
    };
    renamed.map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists if !overwrite => refuse(
            ErrorCode::AlreadyExists,
            to,
            "File exists (pass overwrite to replace it)",
        ),
        _ => OpError::io(
            &format!("rename {} to {}", from.display(), to.display()),
            &e,
        ),
    })
}

/// `chmod`: sets the permission bits (of the file a symlink points to, as chmod(1) does).
pub(super) async fn chmod(ctx: StreamCtx, path: PathBuf, mode: u32) -> OpResult {
    if mode > 0o7777 {
        return Err(OpError::new(
            ErrorCode::InvalidArgument,
            format!("mode {mode:#o} has bits beyond 0o7777"),
        ));
    }
    respond(ctx, move || {
        fs::set_permissions(&path, Permissions::from_mode(mode))
            .map(|()| Reply::Ok)
            .map_err(fail(&path))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_sorted_to_depth_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        fs::write(root.join("a-z"), "x").unwrap();
        fs::write(root.join("a/f"), "hello").unwrap();
        std::os::unix::fs::symlink("a", root.join("link")).unwrap();

        let names = |depth| -> Vec<WirePath> {
            list_dir(root, depth)
                .unwrap()
                .into_iter()
                .map(|e| e.path)
                .collect()
        };
        assert_eq!(names(1), ["a", "a-z", "link"]);
        assert_eq!(names(2), ["a", "a-z", "a/b", "a/f", "link"]);
        let all = list_dir(root, 9).unwrap();
        let link = all.iter().find(|e| e.path == "link").unwrap();
        assert_eq!(link.kind, FileKind::Symlink);
        assert_eq!(link.target, Some(WirePath::from("a")));
        assert_eq!(all.iter().find(|e| e.path == "a/f").unwrap().size, 5);
        assert!(!all.iter().any(|e| e.path.as_bytes().starts_with(b"link/")));

        let err = list_dir(&root.join("a/f"), 1).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotADirectory);
        let err = list_dir(&root.join("nope"), 1).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert!(err
            .message
            .ends_with("nope: No such file or directory (os error 2)"));
    }
}

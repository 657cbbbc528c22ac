//! Applying image layers, bottom first, to a root filesystem directory, as a container
//! runtime would: whiteouts (`.wh.NAME`) delete what lower layers put there, opaque markers
//! (`.wh..wh..opq`) hide a directory's lower contents, and entries replace what they land
//! on. Every path is resolved inside the root, following symbolic links as the image itself
//! would see them, so a hostile layer cannot write outside it. Ownership is kept when
//! running as root; without root, device nodes are skipped (a sandbox gets its own `/dev`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::{self, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;

use super::constants::MAX_SYMLINK_HOPS;
use super::error::{ImageError, IoContext};

/// The prefix of a whiteout file's name.
const WHITEOUT: &str = ".wh.";
/// An opaque directory marker.
const OPAQUE: &str = ".wh..wh..opq";
/// The prefix of AUFS metadata entries, which carry nothing for us.
const AUFS_META: &str = ".wh..wh.";

/// Applies layers, in order, to one root directory.
pub struct Applier {
    root: PathBuf,
    /// What the errors name (the image).
    image: PathBuf,
    privileged: bool,
    /// Directories' final modes and mtimes, set once every layer is in, deepest first:
    /// a read-only directory must stay writable while later entries land in it.
    dirs: HashMap<PathBuf, (u32, u64)>,
    /// Paths the current layer created, which its own opaque markers must keep.
    this_layer: HashSet<PathBuf>,
    /// Device nodes left out for lack of privilege.
    pub skipped_devices: usize,
}

impl Applier {
    /// Prepares to fill `root` (an empty directory) with the layers of `image`.
    pub fn new(root: &Path, image: &Path) -> Applier {
        Applier {
            root: root.to_path_buf(),
            image: image.to_path_buf(),
            privileged: nix::unistd::geteuid().is_root(),
            dirs: HashMap::new(),
            this_layer: HashSet::new(),
            skipped_devices: 0,
        }
    }

    fn bad(&self, reason: String) -> ImageError {
        ImageError::BadImage {
            path: self.image.clone(),
            reason,
        }
    }

    /// Applies one uncompressed layer tar; `label` names it in errors.
    pub fn apply(&mut self, tar: impl Read, label: &str) -> Result<(), ImageError> {
        self.this_layer.clear();
        let mut archive = tar::Archive::new(tar);
        let entries = archive
            .entries()
            .map_err(|e| self.bad(format!("layer {label} is not a tar archive: {e}")))?;
        for entry in entries {
            let mut entry =
                entry.map_err(|e| self.bad(format!("layer {label} is corrupt: {e}")))?;
            let raw = entry.path_bytes().into_owned();
            let Some(parts) = split(&raw) else {
                let shown = String::from_utf8_lossy(&raw);
                return Err(self.bad(format!(
                    "layer {label} has an entry {shown:?} that leaves the root"
                )));
            };
            let Some((name, parents)) = parts.split_last() else {
                continue; // the root itself
            };
            self.entry(&mut entry, name, parents).map_err(|e| match e {
                ImageError::BadImage { reason, .. } => self.bad(format!("layer {label}: {reason}")),
                other => other,
            })?;
        }
        Ok(())
    }

    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<R>,
        name: &OsStr,
        parents: &[OsString],
    ) -> Result<(), ImageError> {
        let name_bytes = name.as_bytes();
        if name_bytes == OPAQUE.as_bytes() {
            let dir = self.resolve(parents, true)?;
            return self.hide_lower_contents(&dir);
        }
        if name_bytes.starts_with(AUFS_META.as_bytes()) {
            return Ok(());
        }
        if let Some(hidden) = name_bytes.strip_prefix(WHITEOUT.as_bytes()) {
            // `.wh..` would name the directory's parent: the root's is the host's.
            if matches!(hidden, b"" | b"." | b"..") {
                let shown = String::from_utf8_lossy(name_bytes);
                return Err(self.bad(format!("whiteout {shown:?} names no file")));
            }
            let dir = self.resolve(parents, true)?;
            let target = dir.join(OsStr::from_bytes(hidden));
            if !self.this_layer.contains(&target) {
                self.remove_all(&target)?;
            }
            return Ok(());
        }

        let dir = self.resolve(parents, true)?;
        let path = dir.join(name);
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header
            .mode()
            .map_err(|e| self.bad(format!("{}: bad mode: {e}", path.display())))?
            & 0o7777;
        let uid = header.uid().unwrap_or(0);
        let gid = header.gid().unwrap_or(0);
        let mtime = header.mtime().unwrap_or(0);

        let existing = fs::symlink_metadata(&path).ok();
        let keep_dir = kind.is_dir() && existing.as_ref().is_some_and(|m| m.is_dir());
        if existing.is_some() && !keep_dir {
            self.remove_all(&path)?;
        }
        match kind {
            tar::EntryType::Directory => {
                if !keep_dir {
                    fs::DirBuilder::new()
                        .mode(0o755)
                        .create(&path)
                        .io(|| format!("creating {}", path.display()))?;
                }
                self.own(&path, uid, gid)?;
                self.dirs.insert(path.clone(), (mode, mtime));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let mut out = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .io(|| format!("creating {}", path.display()))?;
                io::copy(entry, &mut out).io(|| format!("writing {}", path.display()))?;
                drop(out);
                self.own(&path, uid, gid)?;
                fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                    .io(|| format!("setting the mode of {}", path.display()))?;
                set_mtime(&path, mtime);
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().ok_or_else(|| {
                    self.bad(format!("symbolic link {} has no target", path.display()))
                })?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
                    .io(|| format!("creating the link {}", path.display()))?;
                self.own(&path, uid, gid)?;
                set_mtime(&path, mtime);
            }
            tar::EntryType::Link => {
                let target = entry.link_name_bytes().ok_or_else(|| {
                    self.bad(format!("hard link {} has no target", path.display()))
                })?;
                let parts = split(&target).filter(|p| !p.is_empty()).ok_or_else(|| {
                    self.bad(format!(
                        "hard link {} points outside the root",
                        path.display()
                    ))
                })?;
                let (last, dirs) = parts.split_last().expect("not empty");
                let source = self.resolve(dirs, false)?.join(last);
                fs::hard_link(&source, &path).map_err(|e| {
                    self.bad(format!(
                        "hard link {} to {}: {e}",
                        path.display(),
                        String::from_utf8_lossy(&target)
                    ))
                })?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                let flag = match kind {
                    tar::EntryType::Char => SFlag::S_IFCHR,
                    tar::EntryType::Block => SFlag::S_IFBLK,
                    _ => SFlag::S_IFIFO,
                };
                if !self.privileged && flag != SFlag::S_IFIFO {
                    self.skipped_devices += 1;
                    return Ok(());
                }
                let major = u64::from(header.device_major().ok().flatten().unwrap_or(0));
                let minor = u64::from(header.device_minor().ok().flatten().unwrap_or(0));
                let dev = nix::sys::stat::makedev(major, minor);
                stat::mknod(&path, flag, Mode::from_bits_truncate(mode), dev)
                    .map_err(io::Error::from)
                    .io(|| format!("creating the device {}", path.display()))?;
                self.own(&path, uid, gid)?;
            }
            // Extended headers are consumed by the tar reader; anything else carries nothing
            // a root filesystem can hold.
            _ => return Ok(()),
        }
        self.this_layer.insert(path);
        Ok(())
    }

    /// Sets the directories' recorded modes and times, deepest first.
    pub fn finish(self) -> Result<(), ImageError> {
        let mut dirs: Vec<_> = self.dirs.iter().collect();
        dirs.sort_by_key(|(path, _)| std::cmp::Reverse(path.components().count()));
        for (path, &(mode, mtime)) in dirs {
            // chmod follows links: a path that a later layer turned into (or under) a link
            // could lead out of the root. Removals forget their directories; this checks again.
            if !self.is_real_dir(path) {
                continue;
            }
            match fs::set_permissions(path, fs::Permissions::from_mode(mode)) {
                Ok(()) => set_mtime(path, mtime),
                // Whited out by a later layer.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).io(|| format!("setting the mode of {}", path.display())),
            }
        }
        Ok(())
    }

    /// Whether `path` (under the root) is a directory reached without following a link.
    fn is_real_dir(&self, path: &Path) -> bool {
        let Ok(rel) = path.strip_prefix(&self.root) else {
            return false;
        };
        let mut at = self.root.clone();
        rel.components().all(|c| {
            at.push(c);
            fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir())
        })
    }

    /// Removes `path` whatever it is (a directory with its contents), and forgets the modes
    /// recorded for directories under it; absent is fine.
    fn remove_all(&mut self, path: &Path) -> Result<(), ImageError> {
        self.dirs.retain(|dir, _| !dir.starts_with(path));
        let result = match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(path),
            Ok(_) => fs::remove_file(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        };
        result.io(|| format!("removing {}", path.display()))
    }

    /// Removes what lower layers put in `dir`, keeping what this layer added.
    fn hide_lower_contents(&mut self, dir: &Path) -> Result<(), ImageError> {
        let children = match fs::read_dir(dir) {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).io(|| format!("listing {}", dir.display())),
        };
        for child in children {
            let child = child.io(|| format!("listing {}", dir.display()))?.path();
            if !self.this_layer.contains(&child) {
                self.remove_all(&child)?;
            }
        }
        Ok(())
    }

    /// The host path of the directory `parts` inside the root, following symbolic links
    /// within the root (an absolute target starts again at the root, `..` stops at it).
    /// Missing directories are created when `create` is set.
    fn resolve(&self, parts: &[OsString], create: bool) -> Result<PathBuf, ImageError> {
        let mut pending: VecDeque<OsString> = parts.iter().cloned().collect();
        let mut resolved = self.root.clone();
        let mut depth = 0usize;
        let mut hops = 0;
        while let Some(part) = pending.pop_front() {
            if part == ".." {
                if depth > 0 {
                    resolved.pop();
                    depth -= 1;
                }
                continue;
            }
            let next = resolved.join(&part);
            match fs::symlink_metadata(&next) {
                Ok(m) if m.is_dir() => {
                    resolved = next;
                    depth += 1;
                }
                Ok(m) if m.file_type().is_symlink() => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(self.bad(format!(
                            "too many levels of symbolic links at {}",
                            next.display()
                        )));
                    }
                    let target =
                        fs::read_link(&next).io(|| format!("reading {}", next.display()))?;
                    if target.is_absolute() {
                        resolved = self.root.clone();
                        depth = 0;
                    }
                    for c in target.components().rev() {
                        match c {
                            Component::Normal(s) => pending.push_front(s.to_os_string()),
                            Component::ParentDir => pending.push_front("..".into()),
                            _ => {}
                        }
                    }
                }
                Ok(_) => {
                    return Err(self.bad(format!(
                        "{} is a file where a directory is needed",
                        next.display()
                    )))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                    fs::DirBuilder::new()
                        .mode(0o755)
                        .create(&next)
                        .io(|| format!("creating {}", next.display()))?;
                    resolved = next;
                    depth += 1;
                }
                Err(e) => return Err(e).io(|| format!("reading {}", next.display())),
            }
        }
        Ok(resolved)
    }

    fn own(&self, path: &Path, uid: u64, gid: u64) -> Result<(), ImageError> {
        if !self.privileged {
            return Ok(());
        }
        let id = |v: u64| u32::try_from(v).ok();
        std::os::unix::fs::lchown(path, id(uid), id(gid))
            .io(|| format!("setting the owner of {}", path.display()))
    }
}

/// A tar path's components, without `.`, `/` or empty ones; `None` when one is `..`.
fn split(raw: &[u8]) -> Option<Vec<OsString>> {
    let mut parts = Vec::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            p => parts.push(OsStr::from_bytes(p).to_os_string()),
        }
    }
    Some(parts)
}

/// Sets a path's modification time (and access time) without following links. Best
/// effort: times matter to few programs (Python's bytecode cache among them).
fn set_mtime(path: &Path, mtime: u64) {
    let t = TimeSpec::new(i64::try_from(mtime).unwrap_or(0), 0);
    let _ = stat::utimensat(None, path, &t, &t, UtimensatFlags::NoFollowSymlink);
}

/// Reads `file` as a layer: gzip-compressed or plain tar, by its media type.
pub fn layer_reader(file: File, media_type: &str) -> Result<Box<dyn Read>, String> {
    let reader = io::BufReader::new(file);
    if media_type.ends_with("+gzip") || media_type.ends_with(".tar.gzip") {
        Ok(Box::new(flate2::read::GzDecoder::new(reader)))
    } else if media_type.ends_with("+zstd") || media_type.ends_with(".tar.zstd") {
        Err(format!("its layers are zstd-compressed ({media_type}), which Tether cannot read yet; convert the image to gzip layers (e.g. `skopeo copy --dest-compress-format gzip`)"))
    } else if media_type.ends_with(".tar")
        || media_type.ends_with(".tar.diff")
        || media_type.ends_with("rootfs.diff.tar")
    {
        Ok(Box::new(reader))
    } else {
        Err(format!(
            "it has a layer of type {media_type}, which is not a filesystem layer"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of `(path, content)` files; a content of `None` makes a directory, and
    /// `Some("->x")` a symbolic link to `x`.
    fn tar_of(entries: &[(&str, Option<&str>)]) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, content) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o755);
            match content {
                None => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    tar.append_data(&mut h, path, io::empty()).unwrap();
                }
                Some(link) if link.starts_with("->") => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    tar.append_link(&mut h, path, &link[2..]).unwrap();
                }
                Some(data) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(data.len() as u64);
                    tar.append_data(&mut h, path, data.as_bytes()).unwrap();
                }
            }
        }
        tar.into_inner().unwrap()
    }

    fn listing(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                if fs::symlink_metadata(&p).unwrap().is_dir() {
                    stack.push(p);
                    out.push(format!("{rel}/"));
                } else {
                    out.push(rel);
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn whiteouts_delete_and_opaque_markers_hide_lower_contents() {
        let root = tempfile::tempdir().unwrap();
        let mut a = Applier::new(root.path(), Path::new("test"));
        let lower = tar_of(&[
            ("etc", None),
            ("etc/keep", Some("k")),
            ("etc/gone", Some("g")),
            ("opt", None),
            ("opt/old", Some("o")),
            ("opt/sub", None),
            ("opt/sub/deep", Some("d")),
        ]);
        a.apply(&lower[..], "lower").unwrap();
        let upper = tar_of(&[
            ("etc/.wh.gone", Some("")),
            ("opt/new", Some("n")),
            ("opt/.wh..wh..opq", Some("")),
            ("etc/keep", Some("replaced")),
        ]);
        a.apply(&upper[..], "upper").unwrap();
        a.finish().unwrap();
        assert_eq!(
            listing(root.path()),
            ["etc/", "etc/keep", "opt/", "opt/new"]
        );
        assert_eq!(
            fs::read_to_string(root.path().join("etc/keep")).unwrap(),
            "replaced"
        );
    }

    #[test]
    fn entries_cannot_leave_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let mut a = Applier::new(root.path(), Path::new("test"));
        // A link to an absolute host path is followed inside the root instead.
        let escape = outside.path().to_string_lossy().into_owned();
        let layer = tar_of(&[
            ("evil", Some(&format!("->{escape}"))),
            ("evil/file", Some("x")),
        ]);
        a.apply(&layer[..], "l").unwrap();
        assert!(fs::read_dir(outside.path()).unwrap().next().is_none());
        let inside = root
            .path()
            .join(escape.trim_start_matches('/'))
            .join("file");
        assert_eq!(fs::read_to_string(inside).unwrap(), "x");

        let dotdot = tar_of(&[("up", Some("->../../..")), ("up/file", Some("x"))]);
        a.apply(&dotdot[..], "l").unwrap();
        assert_eq!(fs::read_to_string(root.path().join("file")).unwrap(), "x");

        let mut raw = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_entry_type(tar::EntryType::Regular);
        h.as_old_mut().name[..9].copy_from_slice(b"../escape");
        h.set_cksum();
        raw.append(&h, &b"x"[..]).unwrap();
        let raw = raw.into_inner().unwrap();
        let err = a.apply(&raw[..], "l").unwrap_err().to_string();
        assert!(err.contains("leaves the root"), "{err}");
    }

    #[test]
    fn a_directory_replaced_by_a_link_keeps_its_mode_to_itself() {
        let outside = tempfile::tempdir().unwrap();
        fs::set_permissions(outside.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root = tempfile::tempdir().unwrap();
        let mut a = Applier::new(root.path(), Path::new("test"));
        let mut lower = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o700);
        h.set_size(0);
        lower.append_data(&mut h, "d", io::empty()).unwrap();
        a.apply(&lower.into_inner().unwrap()[..], "lower").unwrap();
        let link = format!("->{}", outside.path().display());
        let upper = tar_of(&[("d", Some(&link))]);
        a.apply(&upper[..], "upper").unwrap();
        let hostile = tar_of(&[(".wh..", Some(""))]);
        let err = a.apply(&hostile[..], "hostile").unwrap_err().to_string();
        assert!(err.contains("names no file"), "{err}");
        a.finish().unwrap();
        let mode = fs::metadata(outside.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "the host directory's mode is untouched");
    }

    #[test]
    fn media_types_pick_the_decompressor() {
        let f = || File::open("/dev/null").unwrap();
        assert!(layer_reader(f(), "application/vnd.oci.image.layer.v1.tar+gzip").is_ok());
        assert!(layer_reader(f(), "application/vnd.docker.image.rootfs.diff.tar.gzip").is_ok());
        assert!(layer_reader(f(), "application/vnd.oci.image.layer.v1.tar").is_ok());
        let zstd = layer_reader(f(), "application/vnd.oci.image.layer.v1.tar+zstd");
        assert!(zstd.is_err_and(|e| e.contains("zstd")));
    }
}

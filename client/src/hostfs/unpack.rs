//! A tar stream from a sandbox (`tar_read`) unpacked into a [`Dest`]: every entry's path
//! checked, files through [`Landing`], symlinks held in [`Links`] until every file has
//! landed, directory modes set last (deepest first, so a read-only directory does not block
//! its contents). A sparse entry lands with its holes; a hard link is made only to a file
//! this same archive landed; FIFOs and devices are not made, only named in
//! [`Unpacked::special`] for the summary.

use std::io::{self, Read};
use std::time::{Duration, SystemTime};

use std::collections::HashSet;

use tar::EntryType;

use super::dir::Dest;
use super::error::HostFsError;
use super::landing::{Landing, Links};
use super::pack::copy_sparse;
use super::path::SandboxPath;
use super::ModePolicy;
use crate::escape::escape;
use tether_proto::sparse::copy_dense;

/// What an unpack wrote.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Unpacked {
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Symlinks.
    pub links: u64,
    /// Hard links (second and later names of a file).
    pub hard_links: u64,
    /// FIFOs and devices the archive listed, not made here (paths, escaped).
    pub special: Vec<String>,
}

/// Bytes copied from the archive to a file per write.
const COPY_BUFFER: usize = 256 << 10; // 256 KiB

/// Unpacks the archive `input` into `dest`. Stops at the first entry it refuses; what
/// landed before it stays (all of it inside `dest`).
pub fn unpack<R: Read>(input: R, dest: &Dest, modes: ModePolicy) -> Result<Unpacked, HostFsError> {
    let mut archive = tar::Archive::new(input);
    let mut done = Unpacked::default();
    let mut links = Links::default();
    let mut dirs: Vec<(SandboxPath, u32)> = Vec::new();
    // The files this archive landed: the only ones a hard link in it may name.
    let mut landed: HashSet<SandboxPath> = HashSet::new();
    let mut buffer = vec![0; COPY_BUFFER];
    let malformed = |e: io::Error| HostFsError::Malformed(e.to_string());
    for entry in archive.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        let kind = entry.header().entry_type();
        let raw = entry.path_bytes().into_owned();
        let mode = entry.header().mode().map_err(malformed)?;
        match kind {
            EntryType::Directory => {
                // Tar names directories with a trailing slash.
                let raw = raw.strip_suffix(b"/").unwrap_or(&raw);
                let path = SandboxPath::parse(raw)?;
                dest.mkdir_all(&path)?;
                dirs.push((path, modes.apply(mode)));
                done.dirs += 1;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let path = SandboxPath::parse(&raw)?;
                let mtime = entry.header().mtime().map_err(malformed)?;
                let (dir, name) = dest.parent(&path, true)?;
                let mut landing = Landing::create(dir, dest.shown(&path))?;
                // Bytes are copied as they come: the announced size is never used to
                // allocate, only to tell a whole file from one cut short.
                let announced = entry.size();
                let copied = if kind == EntryType::GNUSparse {
                    copy_sparse(&mut entry, landing.file(), &mut buffer)
                } else {
                    copy_dense(&mut entry, landing.file(), &mut buffer)
                }
                .map_err(HostFsError::io("write", dest.shown(&path)))?;
                if copied != announced {
                    return Err(HostFsError::Truncated { path: path.shown() });
                }
                // The sandbox's number: one beyond what a time can hold is left out.
                let mtime = SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(mtime));
                landing.land(name, modes.apply(mode), mtime)?;
                landed.insert(path);
                done.files += 1;
            }
            EntryType::Link => {
                let path = SandboxPath::parse(&raw)?;
                let source = entry.link_name_bytes().unwrap_or_default().into_owned();
                let source = SandboxPath::parse(&source)?;
                if !landed.contains(&source) {
                    return Err(HostFsError::Unsupported {
                        path: escape(&raw).into_owned(),
                        kind: format!(
                            "hard link to {}, a file this archive did not send",
                            source.shown()
                        ),
                    });
                }
                dest.hard_link(&source, &path)?;
                done.hard_links += 1;
            }
            EntryType::Fifo | EntryType::Char | EntryType::Block => {
                SandboxPath::parse(&raw)?;
                done.special
                    .push(format!("{} ({})", escape(&raw), kind_name(kind)));
            }
            EntryType::Symlink => {
                let path = SandboxPath::parse(&raw)?;
                let target = entry.link_name_bytes().unwrap_or_default().into_owned();
                links.add(path, &target)?;
            }
            EntryType::XGlobalHeader => {}
            other => {
                return Err(HostFsError::Unsupported {
                    path: escape(&raw).into_owned(),
                    kind: kind_name(other),
                })
            }
        }
    }
    done.links = links.create(dest)? as u64;
    dirs.sort_by(|a, b| b.0.cmp(&a.0));
    for (path, mode) in dirs {
        dest.chmod_dir(&path, mode)?;
    }
    Ok(done)
}

fn kind_name(kind: EntryType) -> String {
    match kind {
        EntryType::Link => "hard link".into(),
        EntryType::Char => "character device".into(),
        EntryType::Block => "block device".into(),
        EntryType::Fifo => "fifo".into(),
        EntryType::GNUSparse => "sparse file".into(),
        other => format!("tar entry of type {:?}", other.as_byte() as char),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn header(kind: EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(1_000_000);
        h
    }

    #[test]
    fn a_tree_lands_with_modes_but_no_setuid() {
        let tar = archive(|b| {
            b.append_data(
                &mut header(EntryType::Directory, 0o750, 0),
                "d",
                io::empty(),
            )
            .unwrap();
            b.append_data(
                &mut header(EntryType::Regular, 0o4755, 2),
                "d/suid",
                &b"hi"[..],
            )
            .unwrap();
            b.append_link(
                &mut header(EntryType::Symlink, 0o777, 0),
                "d/l",
                "/etc/passwd",
            )
            .unwrap();
        });
        let dir = tempfile::tempdir().unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        let done = unpack(&tar[..], &dest, ModePolicy::DropSpecial).unwrap();
        assert_eq!((done.files, done.dirs, done.links), (1, 1, 1));
        let meta = std::fs::metadata(dir.path().join("d/suid")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
        let d = std::fs::metadata(dir.path().join("d")).unwrap();
        assert_eq!(d.permissions().mode() & 0o7777, 0o750);
        assert!(dir.path().join("d/l").is_symlink());

        let dir = tempfile::tempdir().unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        unpack(&tar[..], &dest, ModePolicy::Preserve).unwrap();
        let meta = std::fs::metadata(dir.path().join("d/suid")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o4755);
    }

    #[test]
    fn a_symlink_then_a_file_through_it_stays_inside() {
        let outside = tempfile::tempdir().unwrap();
        let tar = archive(|b| {
            b.append_link(
                &mut header(EntryType::Symlink, 0o777, 0),
                "esc",
                outside.path(),
            )
            .unwrap();
            b.append_data(
                &mut header(EntryType::Regular, 0o644, 2),
                "esc/pwned",
                &b"hi"[..],
            )
            .unwrap();
        });
        let dir = tempfile::tempdir().unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        // The file lands in a real directory `esc`; the link then cannot replace it.
        assert!(unpack(&tar[..], &dest, ModePolicy::DropSpecial).is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        assert!(dir.path().join("esc/pwned").is_file());
    }

    /// The attacks of issue 32 on the SDKs, against this lander: links an earlier transfer
    /// left (a `sync` pull keeps links of any target) at a file's name, at the old fixed
    /// temporary name, and in a directory's place, then the `sub/y -> ..` chain.
    #[test]
    fn links_planted_before_the_transfer_are_replaced_or_refused() {
        use std::os::unix::fs::symlink;
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        symlink(&victim, dir.path().join("f")).unwrap();
        symlink(&victim, dir.path().join("f.tether-part")).unwrap();
        symlink(outside.path(), dir.path().join("d")).unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        let files = archive(|b| {
            b.append_data(&mut header(EntryType::Regular, 0o644, 4), "f", &b"EVIL"[..])
                .unwrap();
        });
        unpack(&files[..], &dest, ModePolicy::DropSpecial).unwrap();
        assert!(!dir.path().join("f").is_symlink(), "the link is replaced");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("f")).unwrap(),
            "EVIL"
        );
        for path in ["d", "d/g"] {
            let kind = if path == "d" {
                EntryType::Directory
            } else {
                EntryType::Regular
            };
            let through = archive(|b| {
                b.append_data(&mut header(kind, 0o777, 0), path, io::empty())
                    .unwrap();
            });
            assert!(matches!(
                unpack(&through[..], &dest, ModePolicy::DropSpecial),
                Err(HostFsError::NotADirectory { .. })
            ));
        }
        // The chain lands as links (a link is never followed here), and nothing goes
        // through it: a later file at its name replaces it.
        let chain = archive(|b| {
            for (name, target) in [("sub/y", ".."), ("esc", "sub/y/../../victim")] {
                b.append_link(&mut header(EntryType::Symlink, 0o777, 0), name, target)
                    .unwrap();
            }
        });
        unpack(&chain[..], &dest, ModePolicy::DropSpecial).unwrap();
        let again = archive(|b| {
            b.append_data(
                &mut header(EntryType::Regular, 0o644, 4),
                "esc",
                &b"EVIL"[..],
            )
            .unwrap();
        });
        unpack(&again[..], &dest, ModePolicy::DropSpecial).unwrap();
        assert!(!dir.path().join("esc").is_symlink());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        let mode = std::fs::metadata(outside.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "nothing was chmodded through `d`");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    }

    #[test]
    fn absurd_times_do_not_panic_and_lying_sizes_land_nothing() {
        let mut far = header(EntryType::Regular, 0o644, 1);
        far.set_mtime(u64::MAX);
        far.set_path("far").unwrap();
        far.set_cksum();
        let tar = archive(|b| b.append(&far, &b"x"[..]).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        let done = unpack(&tar[..], &dest, ModePolicy::DropSpecial).unwrap();
        assert_eq!(done.files, 1);

        // A header announcing a terabyte, then nothing.
        let mut big = header(EntryType::Regular, 0o644, 1 << 40);
        big.set_path("big").unwrap();
        big.set_cksum();
        let mut tar = Vec::from(&big.as_bytes()[..]);
        tar.extend_from_slice(&[0; 1024]);
        let dir = tempfile::tempdir().unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        assert!(unpack(&tar[..], &dest, ModePolicy::DropSpecial).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn hard_links_reach_only_files_of_the_same_archive() {
        for (target, why) in [("/etc/shadow", "absolute"), ("x", "did not send")] {
            let tar = archive(|b| {
                b.append_link(&mut header(EntryType::Link, 0o644, 0), "h", target)
                    .unwrap();
            });
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("x"), "here before").unwrap();
            let dest = Dest::open(dir.path(), false).unwrap();
            let err = unpack(&tar[..], &dest, ModePolicy::DropSpecial).unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
            assert!(!dir.path().join("h").exists());
        }
        let tar = archive(|b| {
            b.append_data(&mut header(EntryType::Regular, 0o644, 2), "a", &b"hi"[..])
                .unwrap();
            b.append_link(&mut header(EntryType::Link, 0o644, 0), "sub/b", "a")
                .unwrap();
            b.append_data(&mut header(EntryType::Fifo, 0o644, 0), "pipe", &b""[..])
                .unwrap();
        });
        let dir = tempfile::tempdir().unwrap();
        let dest = Dest::open(dir.path(), false).unwrap();
        let done = unpack(&tar[..], &dest, ModePolicy::DropSpecial).unwrap();
        assert_eq!((done.files, done.hard_links), (1, 1));
        assert_eq!(done.special, ["pipe (fifo)"]);
        assert!(!dir.path().join("pipe").exists());
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (
            std::fs::metadata(dir.path().join("a")).unwrap(),
            std::fs::metadata(dir.path().join("sub/b")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino());
    }
}

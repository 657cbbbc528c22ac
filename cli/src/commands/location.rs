//! One side of a transfer as `tether cp` and `tether sync` write it: a local path, or
//! `ID:PATH` in a sandbox, as in scp.

use std::path::{Path, PathBuf};

/// One side of a copy or a sync.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Location {
    Local(PathBuf),
    Remote { id: String, path: String },
}

impl Location {
    /// `ID:PATH` is remote when `ID` is non-empty and has no slash (as in scp), and an empty
    /// `PATH` is the sandbox's working directory; write a local path containing a colon as
    /// `./a:b`.
    pub(super) fn parse(s: &str) -> Location {
        match s.split_once(':') {
            Some((id, path)) if !id.is_empty() && !id.contains('/') => Location::Remote {
                id: id.to_string(),
                path: if path.is_empty() {
                    ".".into()
                } else {
                    path.to_string()
                },
            },
            _ => Location::Local(PathBuf::from(s)),
        }
    }

    /// When `written` parsed as `ID:PATH` but also names something on this machine (a local
    /// file whose name has a colon), the sentence that says how it was read and how to write
    /// the local one; `None` otherwise.
    pub(super) fn colon_hint(written: &str) -> Option<String> {
        Location::colon_hint_in(Path::new(""), written)
    }

    /// [`Location::colon_hint`] with relative local names taken under `cwd`.
    fn colon_hint_in(cwd: &Path, written: &str) -> Option<String> {
        let Location::Remote { id, path } = Location::parse(written) else {
            return None;
        };
        cwd.join(written).symlink_metadata().ok()?;
        Some(format!(
            "`{written}` was read as path `{path}` in sandbox `{id}` (a side with a colon is \
             `ID:PATH`), but `{written}` is also a local file here; to copy the local file, \
             write it as `./{written}`"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_sides_look_like_scp() {
        let remote = |id: &str, path: &str| Location::Remote {
            id: id.into(),
            path: path.into(),
        };
        assert_eq!(
            Location::parse("sb-1:/etc/hosts"),
            remote("sb-1", "/etc/hosts")
        );
        assert_eq!(Location::parse("sb-1:"), remote("sb-1", "."));
        assert_eq!(Location::parse("./a:b"), Location::Local("./a:b".into()));
        assert_eq!(Location::parse("/x/y"), Location::Local("/x/y".into()));
        assert_eq!(Location::parse(":x"), Location::Local(":x".into()));
        assert_eq!(Location::parse("dir"), Location::Local("dir".into()));
    }

    #[test]
    fn a_local_name_with_a_colon_gets_the_hint_to_write_it_with_a_dot() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a:b"), b"x").unwrap();
        // Relative, as a user types it: parsed as sandbox `a`, yet a local file.
        let hint = Location::colon_hint_in(dir.path(), "a:b").expect("a hint");
        assert!(
            hint.contains("sandbox `a`") && hint.contains("`./a:b`"),
            "{hint}"
        );
        assert_eq!(Location::colon_hint_in(dir.path(), "x:y"), None);
        assert_eq!(Location::colon_hint_in(dir.path(), "./a:b"), None);
    }
}

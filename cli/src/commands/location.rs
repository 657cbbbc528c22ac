//! One side of a transfer as `tether cp` and `tether sync` write it: a local path, or
//! `ID:PATH` in a sandbox, as in scp.

use std::path::PathBuf;

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
}

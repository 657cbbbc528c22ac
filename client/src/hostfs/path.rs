//! [`SandboxPath`]: a relative path a sandbox sent, checked component by component before
//! anything on this machine is named by it.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::error::HostFsError;
use crate::escape::escape;

/// Longest file name a Linux filesystem takes (`NAME_MAX`), in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// Longest relative path accepted (`PATH_MAX` less its NUL), in bytes.
pub const MAX_PATH_BYTES: usize = 4095;

/// A relative path from a sandbox: one or more `/`-separated components, each a real name
/// (not empty, not `.` or `..`, no NUL, at most [`MAX_NAME_BYTES`]), at most
/// [`MAX_PATH_BYTES`] in all. It can only name something below the directory it is
/// resolved in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SandboxPath(Vec<u8>);

impl SandboxPath {
    /// Checks `raw`; the error says which rule it breaks.
    pub fn parse(raw: &[u8]) -> Result<SandboxPath, HostFsError> {
        let refuse = |reason| HostFsError::BadPath {
            path: escape(raw).into_owned(),
            reason,
        };
        if raw.is_empty() {
            return Err(refuse("is empty"));
        }
        if raw.len() > MAX_PATH_BYTES {
            return Err(refuse("is longer than 4,095 bytes"));
        }
        if raw.contains(&0) {
            return Err(refuse("contains a NUL byte"));
        }
        if raw[0] == b'/' {
            return Err(refuse("is absolute"));
        }
        for name in raw.split(|&b| b == b'/') {
            match name {
                b"" => return Err(refuse("has an empty component (`//` or a trailing `/`)")),
                b"." => return Err(refuse("has a `.` component")),
                b".." => return Err(refuse("climbs out with `..`")),
                n if n.len() > MAX_NAME_BYTES => {
                    return Err(refuse("has a component longer than 255 bytes"))
                }
                _ => {}
            }
        }
        Ok(SandboxPath(raw.to_vec()))
    }

    /// [`SandboxPath::parse`] for a `str` (the agent's JSON listings).
    pub fn parse_str(raw: &str) -> Result<SandboxPath, HostFsError> {
        SandboxPath::parse(raw.as_bytes())
    }

    /// The components, first to last; never empty.
    pub fn components(&self) -> impl DoubleEndedIterator<Item = &OsStr> {
        self.0.split(|&b| b == b'/').map(OsStr::from_bytes)
    }

    /// The directories above the last component, and the last component.
    pub fn split_last(&self) -> (Vec<&OsStr>, &OsStr) {
        let mut parts: Vec<&OsStr> = self.components().collect();
        let name = parts.pop().expect("a checked path has a component");
        (parts, name)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The path escaped for printing.
    pub fn shown(&self) -> String {
        escape(&self.0).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(raw: &[u8]) -> &'static str {
        match SandboxPath::parse(raw) {
            Err(HostFsError::BadPath { reason, .. }) => reason,
            other => panic!("{raw:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn only_names_below_the_destination_pass() {
        for ok in [
            &b"a"[..],
            b"a/b/c",
            b"..a",
            b"a..",
            b".hidden/x",
            b"sp ace/\xff",
        ] {
            assert!(SandboxPath::parse(ok).is_ok(), "{ok:?}");
        }
        assert_eq!(reason(b""), "is empty");
        assert_eq!(reason(b"/etc/passwd"), "is absolute");
        assert_eq!(reason(b"../x"), "climbs out with `..`");
        assert_eq!(reason(b"a/../../x"), "climbs out with `..`");
        assert_eq!(reason(b"a/.."), "climbs out with `..`");
        assert_eq!(reason(b"./a"), "has a `.` component");
        assert_eq!(reason(b"a//b").len(), reason(b"a/").len());
        assert_eq!(reason(b"a\0b"), "contains a NUL byte");
        assert_eq!(
            reason(&[b'x'; 256]),
            "has a component longer than 255 bytes"
        );
        assert!(SandboxPath::parse(&[b'x'; 255]).is_ok());
        let deep: Vec<u8> = b"ab/".repeat(1400);
        assert_eq!(
            reason(&deep[..deep.len() - 1]),
            "is longer than 4,095 bytes"
        );
    }

    #[test]
    fn components_split_on_slashes() {
        let p = SandboxPath::parse(b"a/b/c").unwrap();
        let (dirs, name) = p.split_last();
        assert_eq!(dirs, [OsStr::new("a"), OsStr::new("b")]);
        assert_eq!(name, "c");
        assert_eq!(SandboxPath::parse(b"\x1b[2J").unwrap().shown(), "\\x1b[2J");
    }
}

//! Names the protocol reserves in a file tree (`PROTOCOL.md`, `write`): every temporary file
//! Tether writes, in a sandbox (the agent's new versions of files, before their rename) and
//! on a host (a client's downloads before they land), is named with [`TEMP_PREFIX`]. Such a
//! name is never a user's file: tools that compare or copy trees (`tether sync`) leave them
//! alone, neither copying, deleting nor keeping them as conflicts; only the writer that made
//! one removes it.

/// The prefix of every temporary file name: `.tether-`.
pub const TEMP_PREFIX: &str = ".tether-";

/// Whether a file's name (its last component) is one of Tether's temporaries.
pub fn is_temporary(name: &[u8]) -> bool {
    name.starts_with(TEMP_PREFIX.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporaries_are_told_by_their_prefix_alone() {
        assert!(is_temporary(b".tether-1a2b3c"));
        assert!(!is_temporary(b"a.tether-conflict-20260101T000000Z"));
        assert!(!is_temporary(b".tether"));
        assert!(!is_temporary(b"x.tether-1"));
    }
}

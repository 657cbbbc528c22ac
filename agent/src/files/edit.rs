//! `edit`: replace a string in a file, the way a coding agent patches source.
//!
//! The text to replace must occur exactly once unless `replace_all`, so an ambiguous edit
//! fails instead of changing the wrong place. The file is rewritten atomically and keeps its
//! mode and owner. The file must be UTF-8; text is compared exactly (no Unicode or
//! line-ending normalisation).
//! A concurrent writer's change between the read and the rename is lost, as with any editor.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use memchr::memmem;
use tether_proto::op::Reply;
use tether_proto::ErrorCode;

use super::atomic::{AtomicFile, Options};
use super::{fail, refuse, respond, MAX_EDIT_BYTES};
use crate::stream::{OpError, OpResult, StreamCtx};

/// `edit`: replies `edited` with the number of replacements.
pub(super) async fn edit(
    ctx: StreamCtx,
    path: PathBuf,
    old: String,
    new: String,
    replace_all: bool,
) -> OpResult {
    if old.is_empty() {
        return Err(OpError::new(
            ErrorCode::InvalidArgument,
            "`old` is empty; give the text to replace",
        ));
    }
    respond(ctx, move || {
        let replacements = rewrite(&path, old.as_bytes(), new.as_bytes(), replace_all)?;
        Ok(Reply::Edited { replacements })
    })
    .await
}

fn rewrite(path: &Path, old: &[u8], new: &[u8], replace_all: bool) -> Result<u64, OpError> {
    let meta = fs::metadata(path).map_err(fail(path))?;
    if meta.is_dir() {
        return Err(refuse(ErrorCode::IsDirectory, path, "Is a directory"));
    }
    if meta.len() > MAX_EDIT_BYTES {
        return Err(refuse(
            ErrorCode::TooLarge,
            path,
            &format!(
                "{} bytes is larger than edit handles ({MAX_EDIT_BYTES} bytes); \
                 write the file instead",
                meta.len()
            ),
        ));
    }
    let text = fs::read(path).map_err(fail(path))?;
    if std::str::from_utf8(&text).is_err() {
        return Err(refuse(
            ErrorCode::InvalidArgument,
            path,
            "not UTF-8 text; edit changes text files only",
        ));
    }
    let (replaced, count) = replace(&text, old, new, replace_all);
    match count {
        0 => Err(OpError::new(
            ErrorCode::NotFound,
            format!("the text to replace was not found in {}", path.display()),
        )),
        n if n > 1 && !replace_all => Err(OpError::new(
            ErrorCode::InvalidArgument,
            format!(
                "the text to replace occurs {n} times in {}; include more context to make it \
                 unique, or pass replace_all",
                path.display()
            ),
        )),
        n => {
            let mut file = AtomicFile::create(path, Options::default())?;
            file.file().write_all(&replaced).map_err(fail(path))?;
            file.commit()?;
            Ok(n)
        }
    }
}

/// `text` with non-overlapping occurrences of `old` replaced (all, or only a sole one), and
/// how many occurrences there are.
fn replace(text: &[u8], old: &[u8], new: &[u8], replace_all: bool) -> (Vec<u8>, u64) {
    let hits: Vec<usize> = memmem::find_iter(text, old).collect();
    if hits.is_empty() || (hits.len() > 1 && !replace_all) {
        return (Vec::new(), hits.len() as u64);
    }
    let mut out = Vec::with_capacity(text.len() + hits.len() * new.len());
    let mut last = 0;
    for &at in &hits {
        out.extend_from_slice(&text[last..at]);
        out.extend_from_slice(new);
        last = at + old.len();
    }
    out.extend_from_slice(&text[last..]);
    (out, hits.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn replaces_counts_and_refuses_ambiguity() {
        assert_eq!(replace(b"aaaa", b"aa", b"b", true), (b"bb".to_vec(), 2));
        assert_eq!(replace(b"xay", b"a", b"bc", false), (b"xbcy".to_vec(), 1));
        assert_eq!(replace(b"abab", b"ab", b"", false).1, 2);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.rs");
        fs::write(&path, "let a = 1;\nlet b = 1;\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o751)).unwrap();
        let err = rewrite(&path, b"= 1", b"= 2", false).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(err.message.contains("occurs 2 times"));
        let err = rewrite(&path, b"nope", b"", false).unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound);
        assert_eq!(rewrite(&path, b"b = 1", b"b = 3", false).unwrap(), 1);
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "let a = 1;\nlet b = 3;\n"
        );
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o751);
    }
}

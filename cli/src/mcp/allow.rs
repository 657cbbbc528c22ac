//! The host directories `upload` and `download` may touch (`--allow-dir`), and the checks
//! that keep every host path inside one of them: no `..`, symlinks resolved before the
//! check (a link inside an allowed directory that points out of it is refused), and
//! component-wise containment (`/data2` is not inside `/data`).

use std::path::{Component, Path, PathBuf};

use super::error::ToolError;

/// The canonical directories this server may read from and write to on the host.
#[derive(Clone, Debug, Default)]
pub(super) struct AllowedDirs {
    dirs: Vec<PathBuf>,
}

impl AllowedDirs {
    /// Resolves each of `dirs` (symlinks included) once, at start.
    pub(super) fn new(dirs: &[PathBuf]) -> anyhow::Result<AllowedDirs> {
        let mut out = Vec::new();
        for dir in dirs {
            let canonical = std::fs::canonicalize(dir).map_err(|e| {
                anyhow::anyhow!(
                    "--allow-dir {}: {e}; give an existing directory",
                    dir.display()
                )
            })?;
            if !canonical.is_dir() {
                anyhow::bail!("--allow-dir {} is not a directory", dir.display());
            }
            if canonical == Path::new("/") {
                anyhow::bail!(
                    "--allow-dir / would open the whole machine to the MCP client; give the \
                     directories it may use"
                );
            }
            out.push(canonical);
        }
        Ok(AllowedDirs { dirs: out })
    }

    /// An existing host file or directory to read, resolved and checked.
    pub(super) fn existing(&self, raw: &str) -> Result<PathBuf, ToolError> {
        let path = self.lexical(raw)?;
        let canonical = std::fs::canonicalize(&path)
            .map_err(|e| ToolError::HostIo(format!("cannot open {}: {e}", path.display())))?;
        self.check(raw, &canonical)?;
        Ok(canonical)
    }

    /// A host path to write: an existing one resolved and checked, or a new name in an
    /// existing directory that is itself checked. A symlink at the path that leads to a
    /// file stays the path itself (its directory resolved): the lander renames over the link
    /// and never writes through it, even to a file inside the allowed directories. One that
    /// leads out of them, or nowhere, is refused: it was likely planted.
    pub(super) fn target(&self, raw: &str) -> Result<PathBuf, ToolError> {
        let path = self.lexical(raw)?;
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            let canonical = std::fs::canonicalize(&path).map_err(|e| {
                ToolError::PathNotAllowed(format!(
                    "{} is a symlink that cannot be resolved ({e}); refusing to write through it",
                    path.display()
                ))
            })?;
            self.check(raw, &canonical)?;
            if !meta.file_type().is_symlink() || canonical.is_dir() {
                return Ok(canonical);
            }
        }
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(ToolError::InvalidArgument(format!(
                "host path {raw} names no file"
            )));
        };
        let parent = std::fs::canonicalize(parent).map_err(|e| {
            ToolError::HostIo(format!(
                "the directory {} of host path {raw} cannot be opened ({e}); create it first",
                parent.display()
            ))
        })?;
        let canonical = parent.join(name);
        self.check(raw, &canonical)?;
        Ok(canonical)
    }

    /// The path as given, absolute (a relative one is taken from the first allowed
    /// directory), refused if it has a `..` component or a NUL byte.
    fn lexical(&self, raw: &str) -> Result<PathBuf, ToolError> {
        let Some(first) = self.dirs.first() else {
            return Err(ToolError::PathNotAllowed(
                "this server was started without --allow-dir, so upload and download are off; \
                 restart `tether mcp` with --allow-dir DIR"
                    .into(),
            ));
        };
        if raw.is_empty() || raw.contains('\0') {
            return Err(ToolError::InvalidArgument(
                "host paths must be non-empty and contain no NUL byte".into(),
            ));
        }
        let path = Path::new(raw);
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(ToolError::PathNotAllowed(format!(
                "host path {raw} contains `..`; give a path inside {} without `..`",
                self.shown()
            )));
        }
        Ok(if path.is_absolute() {
            path.to_path_buf()
        } else {
            first.join(path)
        })
    }

    fn check(&self, raw: &str, canonical: &Path) -> Result<(), ToolError> {
        if self.dirs.iter().any(|d| canonical.starts_with(d)) {
            Ok(())
        } else {
            Err(ToolError::PathNotAllowed(format!(
                "host path {raw} resolves to {}, outside the allowed directories ({}); \
                 use a path inside them (symlinks are followed before this check)",
                canonical.display(),
                self.shown()
            )))
        }
    }

    fn shown(&self) -> String {
        let dirs: Vec<_> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        dirs.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, AllowedDirs) {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("allowed")).unwrap();
        std::fs::create_dir(root.path().join("allowed2")).unwrap();
        std::fs::write(root.path().join("allowed/f"), "x").unwrap();
        std::fs::write(root.path().join("allowed2/secret"), "s").unwrap();
        symlink(
            root.path().join("allowed2"),
            root.path().join("allowed/out"),
        )
        .unwrap();
        symlink("f", root.path().join("allowed/in")).unwrap();
        let allowed = AllowedDirs::new(&[root.path().join("allowed")]).unwrap();
        (root, allowed)
    }

    #[test]
    fn paths_inside_pass_and_relative_ones_start_at_the_first_dir() {
        let (root, allowed) = setup();
        let base = std::fs::canonicalize(root.path().join("allowed")).unwrap();
        assert_eq!(allowed.existing("f").unwrap(), base.join("f"));
        assert_eq!(allowed.existing("in").unwrap(), base.join("f"));
        let f = base.join("f");
        assert_eq!(allowed.existing(f.to_str().unwrap()).unwrap(), f);
        assert_eq!(allowed.target("new").unwrap(), base.join("new"));
        // A link to a file is the path to replace, not the file to write through.
        assert_eq!(allowed.target("in").unwrap(), base.join("in"));
    }

    #[test]
    fn escapes_are_refused() {
        let (root, allowed) = setup();
        let code = |r: Result<PathBuf, ToolError>| r.unwrap_err().code();
        assert_eq!(
            code(allowed.existing("../allowed2/secret")),
            "path_not_allowed"
        );
        assert_eq!(code(allowed.existing("out/secret")), "path_not_allowed");
        assert_eq!(code(allowed.target("out/new")), "path_not_allowed");
        assert_eq!(code(allowed.target("out")), "path_not_allowed");
        assert_eq!(code(allowed.existing("/etc/passwd")), "path_not_allowed");
        // A sibling sharing the prefix is not inside.
        let sibling = root.path().join("allowed2/secret");
        assert_eq!(
            code(allowed.existing(sibling.to_str().unwrap())),
            "path_not_allowed"
        );
        assert_eq!(code(allowed.existing("a\0b")), "invalid_argument");
        assert_eq!(
            code(AllowedDirs::default().existing("f")),
            "path_not_allowed"
        );
    }

    #[test]
    fn the_root_is_never_allowed() {
        assert!(AllowedDirs::new(&[PathBuf::from("/")]).is_err());
    }
}

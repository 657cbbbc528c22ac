//! Finding things: `glob` (paths matching a pattern) and `grep` (lines matching a literal
//! or regular expression), plus [`NameOrPath`], the glob filter `grep` and `tar_read` share.
//!
//! Both walk the tree without following symlinks, in sorted order so results are stable,
//! and stop at their limit, at [`MAX_VISITED`] entries or at the reply budget, saying
//! `truncated`. Both run on the blocking pool.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use globset::{Glob, GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};
use regex::bytes::{Regex, RegexBuilder};
use tether_proto::op::{GrepMatch, GrepSpec, Reply};
use tether_proto::{ErrorCode, WirePath};
use walkdir::WalkDir;

use super::{
    encoded_len, fail, refuse, relative, respond, BINARY_PROBE, DEFAULT_GLOB_LIMIT,
    DEFAULT_GREP_LIMIT, GREP_WHOLE_FILE, MAX_MATCH_TEXT, MAX_VISITED, REPLY_BUDGET,
};
use crate::stream::{OpError, OpResult, StreamCtx};

/// Parses a glob where `*` and `?` stay within one path component and `**` crosses them.
fn parse_glob(pattern: &str) -> Result<Glob, OpError> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| OpError::new(ErrorCode::InvalidArgument, e.to_string()))
}

/// Globs matched as `.gitignore` and `tar --exclude` do: a pattern with a `/` against the
/// whole relative path, one without against the entry's name at any depth (`*.log`,
/// `node_modules`).
pub(super) struct NameOrPath {
    names: GlobSet,
    paths: GlobSet,
}

impl NameOrPath {
    /// Compiles the patterns; an invalid one is an `invalid_argument` naming it.
    pub(super) fn new<'a>(
        patterns: impl IntoIterator<Item = &'a str>,
    ) -> Result<NameOrPath, OpError> {
        let (mut names, mut paths) = (GlobSetBuilder::new(), GlobSetBuilder::new());
        for pattern in patterns {
            let glob = parse_glob(pattern.trim_start_matches('/'))?;
            if pattern.contains('/') {
                paths.add(glob);
            } else {
                names.add(glob);
            }
        }
        let build = |set: GlobSetBuilder| {
            set.build()
                .map_err(|e| OpError::new(ErrorCode::InvalidArgument, e.to_string()))
        };
        Ok(NameOrPath {
            names: build(names)?,
            paths: build(paths)?,
        })
    }

    /// True when `rel` (a `/`-separated relative path) matches one of the patterns.
    pub(super) fn is_match(&self, rel: &WirePath) -> bool {
        let rel = rel.as_path();
        let name = rel.file_name().unwrap_or(rel.as_os_str());
        self.names.is_match(name) || self.paths.is_match(rel)
    }
}

/// `glob`: paths under `root` matching `pattern`, relative to it, sorted.
pub(super) async fn glob(
    ctx: StreamCtx,
    root: PathBuf,
    pattern: String,
    limit: Option<u32>,
) -> OpResult {
    let limit = limit.unwrap_or(DEFAULT_GLOB_LIMIT) as usize;
    respond(ctx, move || {
        let (paths, truncated) = find(&root, &pattern, limit)?;
        Ok(Reply::Paths { paths, truncated })
    })
    .await
}

fn find(root: &Path, pattern: &str, limit: usize) -> Result<(Vec<WirePath>, bool), OpError> {
    let matcher: GlobMatcher = parse_glob(pattern)?.compile_matcher();
    if !fs::metadata(root).map_err(fail(root))?.is_dir() {
        return Err(refuse(ErrorCode::NotADirectory, root, "Not a directory"));
    }
    // Walk only below the pattern's literal leading components (`src/app` of
    // `src/app/**/*.rs`), and no deeper than it can match when it has no `**`.
    let parts: Vec<&str> = pattern.split('/').filter(|p| !p.is_empty()).collect();
    let literal = parts[..parts.len().saturating_sub(1)]
        .iter()
        .take_while(|p| !p.contains(['*', '?', '[', '{', '\\']))
        .count();
    let base = parts[..literal]
        .iter()
        .fold(root.to_path_buf(), |dir, p| dir.join(p));
    let mut walk = WalkDir::new(&base).min_depth(1).sort_by_file_name();
    if !pattern.contains("**") {
        walk = walk.max_depth(parts.len() - literal);
    }
    let (mut paths, mut truncated, mut bytes) = (Vec::new(), false, 0);
    for (visited, entry) in walk.into_iter().flatten().enumerate() {
        if visited >= MAX_VISITED {
            truncated = true;
            break;
        }
        let rel = relative(root, entry.path());
        if !matcher.is_match(rel.as_path()) {
            continue;
        }
        bytes += encoded_len(&rel) + 1;
        if paths.len() == limit || bytes > REPLY_BUDGET {
            truncated = true;
            break;
        }
        paths.push(rel);
    }
    paths.sort();
    Ok((paths, truncated))
}

/// `grep`: matching lines of the file, or of every file under the directory.
pub(super) async fn grep(ctx: StreamCtx, root: PathBuf, spec: GrepSpec) -> OpResult {
    respond(ctx, move || {
        let (matches, truncated) = search(&root, &spec)?;
        Ok(Reply::Matches { matches, truncated })
    })
    .await
}

/// A pattern compiled for single lines, and for a quick pass over a whole file.
struct Lines {
    line: Regex,
    file: Regex,
}

/// Collects matches up to the limit and the reply budget.
struct Found {
    matches: Vec<GrepMatch>,
    limit: usize,
    bytes: usize,
    truncated: bool,
}

impl Found {
    /// Records a match; false once the search must stop.
    fn add(&mut self, path: &WirePath, line: u64, text: &[u8]) -> bool {
        let text = strip_eol(text);
        let text = &text[..text.len().min(MAX_MATCH_TEXT)];
        let m = GrepMatch {
            path: path.clone(),
            line,
            text: String::from_utf8_lossy(text).into_owned(),
        };
        self.bytes += encoded_len(&m) + 1;
        if self.matches.len() == self.limit || self.bytes > REPLY_BUDGET {
            self.truncated = true;
            return false;
        }
        self.matches.push(m);
        true
    }
}

fn search(root: &Path, spec: &GrepSpec) -> Result<(Vec<GrepMatch>, bool), OpError> {
    let pattern = if spec.regex {
        spec.pattern.clone()
    } else {
        regex::escape(&spec.pattern)
    };
    let build = |multi_line| {
        RegexBuilder::new(&pattern)
            .case_insensitive(spec.ignore_case)
            .multi_line(multi_line)
            .crlf(multi_line)
            .build()
            .map_err(|e| OpError::new(ErrorCode::InvalidArgument, e.to_string()))
    };
    // Lines are matched one at a time; the whole-file pass needs `^` and `$` to match at
    // every line's ends to find the same lines (it may find more: `\s` can cross a line).
    let re = Lines {
        line: build(false)?,
        file: build(true)?,
    };
    let filter = spec
        .glob
        .as_deref()
        .map(|g| NameOrPath::new([g]))
        .transpose()?;
    let mut found = Found {
        matches: Vec::new(),
        limit: spec.limit.unwrap_or(DEFAULT_GREP_LIMIT) as usize,
        bytes: 0,
        truncated: false,
    };
    let meta = fs::metadata(root).map_err(fail(root))?;
    if !meta.is_dir() {
        let name = root
            .file_name()
            .map(|n| WirePath::from(Path::new(n)))
            .unwrap_or_default();
        if filter.as_ref().is_none_or(|f| f.is_match(&name)) {
            search_file(root, &name, &re, &mut found);
        }
        return Ok((found.matches, found.truncated));
    }
    let walk = WalkDir::new(root).min_depth(1).sort_by_file_name();
    for (visited, entry) in walk.into_iter().flatten().enumerate() {
        if visited >= MAX_VISITED {
            found.truncated = true;
            break;
        }
        if !entry.file_type().is_file() {
            continue;
        }
        let rel = relative(root, entry.path());
        if filter.as_ref().is_some_and(|f| !f.is_match(&rel)) {
            continue;
        }
        if !search_file(entry.path(), &rel, &re, &mut found) {
            break;
        }
    }
    Ok((found.matches, found.truncated))
}

/// Searches one file line by line; false once the search must stop. Unreadable and binary
/// files are skipped, as `grep -s` and `grep -I` do.
fn search_file(path: &Path, rel: &WirePath, re: &Lines, found: &mut Found) -> bool {
    let Ok(mut file) = File::open(path) else {
        return true;
    };
    let size = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
    if size <= GREP_WHOLE_FILE {
        let mut data = Vec::with_capacity(size as usize);
        if file.read_to_end(&mut data).is_err() || is_binary(&data) {
            return true;
        }
        // Most files do not match at all: one pass over the whole file settles that.
        if !re.file.is_match(&data) {
            return true;
        }
        let data = data.strip_suffix(b"\n").unwrap_or(&data);
        for (i, line) in data.split(|&b| b == b'\n').enumerate() {
            if re.line.is_match(strip_eol(line)) && !found.add(rel, i as u64 + 1, line) {
                return false;
            }
        }
        return true;
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    match reader.fill_buf() {
        Ok(head) if !is_binary(head) => {}
        _ => return true,
    }
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if re.line.is_match(strip_eol(&line)) && !found.add(rel, number, &line) {
            return false;
        }
    }
    true
}

fn is_binary(head: &[u8]) -> bool {
    memchr::memchr(0, &head[..head.len().min(BINARY_PROBE)]).is_some()
}

/// A line without its `\n` or `\r\n`.
fn strip_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("src/app")).unwrap();
        fs::write(root.join("src/main.rs"), "fn main() {\n    Hello();\n}\n").unwrap();
        fs::write(root.join("src/app/lib.rs"), "// hello\r\nlet x = 1;\n").unwrap();
        fs::write(root.join("README.md"), "hello world").unwrap();
        fs::write(root.join("blob.bin"), b"hello\0binary").unwrap();
        dir
    }

    #[test]
    fn globs_with_double_star_and_limits() {
        let dir = tree();
        let (paths, truncated) = find(dir.path(), "src/**/*.rs", 10).unwrap();
        assert_eq!(paths, ["src/app/lib.rs", "src/main.rs"]);
        assert!(!truncated);
        let (paths, _) = find(dir.path(), "*.rs", 10).unwrap();
        assert!(paths.is_empty());
        let (paths, truncated) = find(dir.path(), "**", 2).unwrap();
        assert_eq!(paths.len(), 2);
        assert!(truncated);
        let (paths, _) = find(dir.path(), "src/*", 10).unwrap();
        assert_eq!(paths, ["src/app", "src/main.rs"]);
        let err = find(dir.path(), "a[", 10).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
    }

    fn spec(pattern: &str) -> GrepSpec {
        GrepSpec {
            path: WirePath::default(),
            pattern: pattern.into(),
            regex: false,
            ignore_case: false,
            glob: None,
            limit: None,
        }
    }

    #[test]
    fn greps_literals_and_regexes() {
        let dir = tree();
        let (m, _) = search(dir.path(), &spec("hello")).unwrap();
        let got: Vec<_> = m.iter().map(|m| format!("{}:{}", m.path, m.line)).collect();
        assert_eq!(got, ["README.md:1", "src/app/lib.rs:1"]);
        assert_eq!(m[1].text, "// hello");

        let ci = GrepSpec {
            ignore_case: true,
            glob: Some("*.rs".into()),
            ..spec("hello")
        };
        let (m, _) = search(dir.path(), &ci).unwrap();
        let got: Vec<_> = m.iter().map(|m| format!("{}:{}", m.path, m.line)).collect();
        assert_eq!(got, ["src/app/lib.rs:1", "src/main.rs:2"]);

        let re = GrepSpec {
            regex: true,
            limit: Some(1),
            ..spec(r"^\w+ ")
        };
        let (m, truncated) = search(dir.path(), &re).unwrap();
        assert_eq!(m.len(), 1);
        assert!(truncated);
        let anchored = GrepSpec {
            regex: true,
            ..spec(r"^// hello$")
        };
        let (m, _) = search(dir.path(), &anchored).unwrap();
        assert_eq!(m.len(), 1, "{m:?}");

        let (m, _) = search(&dir.path().join("src/main.rs"), &spec("main")).unwrap();
        assert_eq!(m[0].path, "main.rs");
        let bad = GrepSpec {
            regex: true,
            ..spec("(")
        };
        assert_eq!(
            search(dir.path(), &bad).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn name_or_path_filters() {
        let f = NameOrPath::new(["*.log", "build/out", "/top"]).unwrap();
        assert!(f.is_match(&"a/b/x.log".into()));
        assert!(f.is_match(&"build/out".into()));
        assert!(!f.is_match(&"src/build/out".into()));
        assert!(f.is_match(&"top".into()));
        assert!(!f.is_match(&"x.rs".into()));
    }
}

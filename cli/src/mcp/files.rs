//! The file tools on a sandbox: `read_file` (line ranges), `write_file`, `edit_file`, `ls`,
//! `glob`, `grep`. Everything the sandbox answers is bounded before it goes into an answer:
//! bytes read, entries listed, matches, and each line's length.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use tether_proto::op::{FileKind, GrepSpec, Op};

use super::constants::{
    ANSWER_BUDGET, GLOB_MAX_PATHS, GREP_DEFAULT_MATCHES, GREP_MAX_MATCHES, LS_MAX_DEPTH,
    LS_MAX_ENTRIES, MAX_LINE_CHARS, READ_DEFAULT_LINES, READ_MAX_BYTES,
};
use super::error::{invalid, ToolError};
use super::text::{boundary, cut_line, line_range};
use super::Server;

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The file: absolute, or relative to the sandbox's working directory.
    pub path: String,
    /// The first line to return, counting from 1; default 1.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub start_line: Option<usize>,
    /// How many lines to return; default 2000.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub line_count: Option<usize>,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct WriteArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The file; missing parent directories are created, an existing file is replaced
    /// atomically.
    pub path: String,
    /// The whole new content, as text.
    pub content: String,
}

/// Arguments of `edit_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EditArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The text file to edit.
    pub path: String,
    /// The exact text to replace (whitespace and newlines included). It must occur exactly
    /// once unless replace_all is set: include enough surrounding lines to make it unique.
    pub old_string: String,
    /// The text to put in its place.
    pub new_string: String,
    /// Replace every occurrence instead of exactly one.
    #[serde(default)]
    pub replace_all: bool,
}

/// Arguments of `ls`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LsArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The directory; the sandbox's working directory when absent.
    #[serde(default)]
    pub path: Option<String>,
    /// Levels to descend: 1 lists the directory itself; at most 8.
    #[serde(default)]
    #[schemars(range(min = 1, max = 8))]
    pub depth: Option<u32>,
}

/// Arguments of `glob`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct GlobArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// A glob relative to root: `*` within a name, `**` across directories, `?`, `[abc]`,
    /// e.g. `src/**/*.py`.
    pub pattern: String,
    /// The directory the pattern starts from; the sandbox's working directory when absent.
    #[serde(default)]
    pub root: Option<String>,
}

/// Arguments of `grep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct GrepArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// What to find: a literal string, or a regular expression with `regex`.
    pub pattern: String,
    /// The file or directory to search (recursively); the working directory when absent.
    #[serde(default)]
    pub path: Option<String>,
    /// The pattern is a regular expression (Rust regex syntax) rather than a literal.
    #[serde(default)]
    pub regex: bool,
    /// Ignore case.
    #[serde(default)]
    pub ignore_case: bool,
    /// Only files whose path relative to `path` matches this glob, e.g. `**/*.rs`.
    #[serde(default)]
    pub glob: Option<String>,
    /// The most matching lines to return; default 500, at most 5000.
    #[serde(default)]
    #[schemars(range(min = 1, max = 5000))]
    pub limit: Option<u32>,
}

/// How many of the items, of these sizes, fit in one answer (at least one).
fn within_budget(sizes: impl Iterator<Item = usize>) -> usize {
    let mut used = 0;
    let mut n = 0;
    for size in sizes {
        used += size;
        if n > 0 && used > ANSWER_BUDGET {
            break;
        }
        n += 1;
    }
    n
}

fn check_path(path: &str) -> Result<(), ToolError> {
    if path.is_empty() || path.contains('\0') {
        return Err(invalid(
            "a sandbox path must be non-empty and contain no NUL byte",
        ));
    }
    Ok(())
}

pub(super) async fn read(server: &Server, args: ReadArgs) -> Result<Value, ToolError> {
    check_path(&args.path)?;
    let first = args.start_line.unwrap_or(1);
    if first == 0 {
        return Err(invalid("start_line counts from 1"));
    }
    let count = args.line_count.unwrap_or(READ_DEFAULT_LINES);
    if count == 0 {
        return Err(invalid("line_count must be at least 1"));
    }
    let session = server.connections.get(&args.sandbox_id).await?;
    let op = Op::Read {
        path: args.path.as_str().into(),
        offset: 0,
        len: Some(READ_MAX_BYTES + 1),
    };
    let mut sink = Capped::new(READ_MAX_BYTES as usize + 1);
    session.download(op, &mut sink, |_| {}).await?;
    let mut bytes = sink.buf;
    let whole = bytes.len() as u64 <= READ_MAX_BYTES;
    bytes.truncate(READ_MAX_BYTES as usize);
    if bytes.iter().take(8192).any(|&b| b == 0) {
        return Err(ToolError::BinaryFile(format!(
            "{} holds binary data; use download to copy it, or exec with a tool such as xxd",
            tether_client::escape::escape_str(&args.path)
        )));
    }
    let cut = if whole {
        bytes.len()
    } else {
        boundary(&bytes, bytes.len())
    };
    let text = String::from_utf8_lossy(&bytes[..cut]);
    let range = line_range(&text, first, count, MAX_LINE_CHARS, ANSWER_BUDGET);
    let mut answer = json!({
        "path": args.path,
        "content": range.text,
        "start_line": first,
        "end_line": range.last,
        "total_lines": range.total,
        "more_lines": range.last < range.total,
        "lines_cut": range.cut,
    });
    if !whole {
        answer["file_cut"] = json!(format!(
            "the file is larger than {} bytes; only its start was read and counted: use exec \
             (sed -n, tail) for the rest",
            READ_MAX_BYTES
        ));
    }
    Ok(answer)
}

pub(super) async fn write(server: &Server, args: WriteArgs) -> Result<Value, ToolError> {
    check_path(&args.path)?;
    let session = server.connections.get(&args.sandbox_id).await?;
    let bytes = session
        .write_file(&args.path, args.content.as_bytes())
        .await?;
    Ok(json!({ "path": args.path, "written_bytes": bytes }))
}

pub(super) async fn edit(server: &Server, args: EditArgs) -> Result<Value, ToolError> {
    check_path(&args.path)?;
    if args.old_string.is_empty() {
        return Err(invalid(
            "old_string is empty: give the exact text to replace",
        ));
    }
    if args.old_string == args.new_string {
        return Err(invalid(
            "old_string and new_string are the same: nothing would change",
        ));
    }
    let session = server.connections.get(&args.sandbox_id).await?;
    let replacements = session
        .edit(
            &args.path,
            &args.old_string,
            &args.new_string,
            args.replace_all,
        )
        .await?;
    Ok(json!({ "path": args.path, "replacements": replacements }))
}

pub(super) async fn ls(server: &Server, args: LsArgs) -> Result<Value, ToolError> {
    let path = args.path.unwrap_or_else(|| ".".into());
    check_path(&path)?;
    let depth = args.depth.unwrap_or(1);
    if !(1..=LS_MAX_DEPTH).contains(&depth) {
        return Err(invalid(format!("depth must be 1 to {LS_MAX_DEPTH}")));
    }
    let session = server.connections.get(&args.sandbox_id).await?;
    let mut entries = session.list(&path, depth).await?;
    let total = entries.len();
    entries.truncate(LS_MAX_ENTRIES);
    let kept = within_budget(entries.iter().map(|e| e.path.len() + 96));
    entries.truncate(kept);
    let entries: Vec<Value> = entries
        .into_iter()
        .map(|e| {
            let kind = match e.kind {
                FileKind::File => "file",
                FileKind::Dir => "dir",
                FileKind::Symlink => "symlink",
                FileKind::Other => "other",
            };
            let mut v = json!({
                "path": e.path,
                "kind": kind,
                "size": e.size,
                "mode": format!("{:o}", e.mode & 0o7777),
                "mtime_ms": e.mtime_ms,
            });
            if let Some(target) = e.target {
                v["target"] = json!(target);
            }
            v
        })
        .collect();
    Ok(json!({
        "path": path,
        "entries": entries,
        "truncated": total > kept,
    }))
}

pub(super) async fn glob(server: &Server, args: GlobArgs) -> Result<Value, ToolError> {
    let root = args.root.unwrap_or_else(|| ".".into());
    check_path(&root)?;
    if args.pattern.is_empty() {
        return Err(invalid("pattern is empty: give a glob such as **/*.py"));
    }
    let session = server.connections.get(&args.sandbox_id).await?;
    let op = Op::Glob {
        root: root.as_str().into(),
        pattern: args.pattern,
        limit: Some(GLOB_MAX_PATHS),
    };
    let (mut paths, truncated) = match session.request(op).await? {
        tether_proto::op::Reply::Paths { paths, truncated } => (paths, truncated),
        other => {
            return Err(ToolError::Client(tether_client::ClientError::Protocol(
                format!("the agent answered a glob with {other:?}"),
            )))
        }
    };
    let total = paths.len();
    paths.truncate(GLOB_MAX_PATHS as usize);
    paths.truncate(within_budget(paths.iter().map(|p| p.len() + 4)));
    let over = total > paths.len();
    Ok(json!({ "root": root, "paths": paths, "truncated": truncated || over }))
}

pub(super) async fn grep(server: &Server, args: GrepArgs) -> Result<Value, ToolError> {
    let path = args.path.unwrap_or_else(|| ".".into());
    check_path(&path)?;
    if args.pattern.is_empty() {
        return Err(invalid("pattern is empty: give the text or regex to find"));
    }
    let limit = args.limit.unwrap_or(GREP_DEFAULT_MATCHES);
    if !(1..=GREP_MAX_MATCHES).contains(&limit) {
        return Err(invalid(format!("limit must be 1 to {GREP_MAX_MATCHES}")));
    }
    let session = server.connections.get(&args.sandbox_id).await?;
    let spec = GrepSpec {
        path: path.as_str().into(),
        pattern: args.pattern,
        regex: args.regex,
        ignore_case: args.ignore_case,
        glob: args.glob,
        limit: Some(limit),
    };
    let (mut matches, truncated) = session.grep(spec).await?;
    let total = matches.len();
    matches.truncate(limit as usize);
    let matches: Vec<(String, u64, String)> = matches
        .into_iter()
        .map(|m| {
            (
                m.path.to_string(),
                m.line,
                cut_line(&m.text, MAX_LINE_CHARS),
            )
        })
        .collect();
    let kept = within_budget(matches.iter().map(|(p, _, t)| p.len() + t.len() + 48));
    let over = total > kept;
    let matches: Vec<Value> = matches
        .into_iter()
        .take(kept)
        .map(|(path, line, text)| json!({ "path": path, "line": line, "text": text }))
        .collect();
    Ok(json!({ "path": path, "matches": matches, "truncated": truncated || over }))
}

/// A memory sink that refuses bytes past its capacity: an agent that sends more than it
/// was asked for fails the read instead of filling this process's memory.
struct Capped {
    buf: Vec<u8>,
    cap: usize,
}

impl Capped {
    fn new(cap: usize) -> Capped {
        Capped {
            buf: Vec::new(),
            cap,
        }
    }
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.buf.len() + data.len() > self.cap {
            return std::task::Poll::Ready(Err(std::io::Error::other(
                "the sandbox sent more of the file than was asked for",
            )));
        }
        self.buf.extend_from_slice(data);
        std::task::Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

//! The MCP tool surface: every tool's name, description and argument schema (derived from
//! the argument types with schemars), routed to the module that implements it. Failures
//! become tool results with `isError: true` and `{"error": {"code", "message"}}`.

use std::sync::{Arc, OnceLock};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};
use serde_json::Value;

use super::args::Parameters;
use super::error::ToolError;
use super::exec::ExecArgs;
use super::files::{EditArgs, GlobArgs, GrepArgs, LsArgs, ReadArgs, WriteArgs};
use super::sandboxes::{CreateArgs, ListArgs, SandboxArgs};
use super::sessions::{PollArgs, SignalArgs, StartArgs, WriteStdinArgs};
use super::transfer::{DownloadArgs, UploadArgs};
use super::{exec, files, sandboxes, transfer, Server};
use tether_client::api::Power;

/// What the server tells an MCP host about itself.
const INSTRUCTIONS: &str = "Tether runs commands and edits files in isolated sandboxes \
(local Linux namespaces or cloud providers, as the relay is configured). Create a sandbox \
with sandbox_create (or find one with sandbox_list) and pass its sandbox_id to every other \
tool. Use exec for commands that finish; exec_start + exec_poll for long-running or \
interactive ones (servers, REPLs, watchers). Files: read_file, write_file, edit_file, ls, \
glob, grep. upload/download move files between the host and a sandbox, only under the \
host directories this server allows. Delete sandboxes you no longer need.";

/// One MCP connection's view of the shared [`Server`]: every connection (stdio, or each
/// HTTP session) gets its own, all sharing sandboxes' sessions and exec sessions.
#[derive(Clone)]
pub(crate) struct Tools {
    server: Arc<Server>,
    tool_router: ToolRouter<Tools>,
}

impl Tools {
    /// The tools over `server`.
    pub(crate) fn new(server: Arc<Server>) -> Tools {
        // Built once: over HTTP a connection, or on the 2026-07-28 revision every request,
        // gets its own `Tools`.
        static ROUTER: OnceLock<ToolRouter<Tools>> = OnceLock::new();
        let tool_router = ROUTER
            .get_or_init(|| {
                let mut router = Self::tool_router();
                for route in router.map.values_mut() {
                    let mut schema = (*route.attr.input_schema).clone();
                    unwrap_descriptions(&mut schema);
                    route.attr.input_schema = Arc::new(schema);
                }
                router
            })
            .clone();
        Tools {
            server,
            tool_router,
        }
    }
}

/// Joins the lines of every `description` in a schema: schemars keeps the line breaks of
/// the doc comments it takes them from, which were wrapped for the source, not for a model.
fn unwrap_descriptions(object: &mut serde_json::Map<String, Value>) {
    for (key, value) in object.iter_mut() {
        match value {
            Value::String(text) if key == "description" => *text = text.replace('\n', " "),
            Value::Object(inner) => unwrap_descriptions(inner),
            Value::Array(items) => items.iter_mut().for_each(|item| {
                if let Value::Object(inner) = item {
                    unwrap_descriptions(inner);
                }
            }),
            _ => {}
        }
    }
}

/// Arguments of a tool that takes none.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoArgs {}

fn answer(result: Result<Value, ToolError>) -> Result<CallToolResult, ErrorData> {
    Ok(match result {
        Ok(value) => CallToolResult::structured(value),
        Err(e) => {
            tracing::debug!(code = %e.code(), "tool failed: {e}");
            e.into_result()
        }
    })
}

#[tool_router]
impl Tools {
    #[tool(
        description = "Create a sandbox and return it (its `id` is the sandbox_id of every \
        other tool). Optional: labels to find it again, ttl_seconds (one hour when absent), \
        idle_timeout_seconds, \
        image, provider (local, e2b, daytona, modal: whatever the relay serves), env, and \
        get_or_create to reuse the sandbox that already has exactly these labels."
    )]
    async fn sandbox_create(
        &self,
        Parameters(args): Parameters<CreateArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { sandboxes::create(&self.server, args?).await }.await)
    }

    #[tool(
        description = "List your sandboxes (id, provider, state, labels, image, creation \
        and expiry times), optionally only those carrying all of the given labels.",
        annotations(read_only_hint = true)
    )]
    async fn sandbox_list(
        &self,
        Parameters(args): Parameters<ListArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { sandboxes::list(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Delete a sandbox and everything in it (files, processes, exec \
        sessions). Cannot be undone.",
        annotations(destructive_hint = true)
    )]
    async fn sandbox_delete(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { sandboxes::delete(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Pause a sandbox: its processes freeze with their memory kept and use \
        no CPU; its files stay. The next tool call that reaches it resumes it (unless it was \
        created without auto-resume), or call sandbox_resume."
    )]
    async fn sandbox_pause(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { sandboxes::power(&self.server, args?, Power::Pause).await }.await)
    }

    #[tool(description = "Resume a paused sandbox: its processes continue where they were.")]
    async fn sandbox_resume(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { sandboxes::power(&self.server, args?, Power::Resume).await }.await)
    }

    #[tool(
        description = "Stop a sandbox: every process ends, its files stay. The next tool call \
        that reaches it starts it again (unless it was created without auto-resume), or call \
        sandbox_start."
    )]
    async fn sandbox_stop(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { sandboxes::power(&self.server, args?, Power::Stop).await }.await)
    }

    #[tool(description = "Start a stopped sandbox again, its files as they were.")]
    async fn sandbox_start(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { sandboxes::power(&self.server, args?, Power::Start).await }.await)
    }

    #[tool(
        description = "Show a sandbox: its record, its agent (version, OS, CPUs, memory, \
        user, working directory), the TCP ports listening in it with a preview URL for \
        each (open it in a browser), and the preview token.",
        annotations(read_only_hint = true)
    )]
    async fn sandbox_info(
        &self,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { sandboxes::info(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Run a shell command (/bin/sh -c) in a sandbox to completion and \
        return its output (stdout and stderr merged in the order written), exit_code (128+N \
        when killed by signal N, 124 on timeout) and timed_out. Output over 32 KiB is shown \
        as its head and tail with truncated: true, and kept whole in a file in the sandbox \
        named by output_file. Default timeout 120 s; for longer or interactive work use \
        exec_start."
    )]
    async fn exec(
        &self,
        Parameters(args): Parameters<ExecArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { exec::run(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Start a shell command in the background in a sandbox and return a \
        session_id at once. The process keeps running between calls and across client \
        reconnections; read its output with exec_poll, send it input with \
        exec_write_stdin, signal it with exec_signal. Set pty for programs that want a \
        terminal."
    )]
    async fn exec_start(
        &self,
        Parameters(args): Parameters<StartArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { self.server.sessions.start(args?).await }.await)
    }

    #[tool(
        description = "Read an exec session's output from a cursor (a byte offset): \
        returns output, the next cursor, running, and once the process ended and all output \
        was read, exit_code and timed_out. Waits up to wait_ms for output when none is \
        there yet. Nothing is lost between polls: while output waits unread, the process is \
        held back rather than its output dropped. Pass the returned cursor to the next \
        poll; pending_bytes > 0 means more output is already waiting."
    )]
    async fn exec_poll(
        &self,
        Parameters(args): Parameters<PollArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { self.server.sessions.poll(args?).await }.await)
    }

    #[tool(
        description = "List this server's exec sessions (session_id, sandbox_id, command, \
        running), e.g. to find a session again after reconnecting.",
        annotations(read_only_hint = true)
    )]
    async fn exec_list(
        &self,
        Parameters(args): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(
            args.map(|NoArgs {}| serde_json::json!({ "sessions": self.server.sessions.summary() })),
        )
    }

    #[tool(
        description = "Write text to an exec session's standard input (add \\n to end a \
        line); close_stdin sends end-of-file afterwards."
    )]
    async fn exec_write_stdin(
        &self,
        Parameters(args): Parameters<WriteStdinArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { self.server.sessions.write_stdin(args?).await }.await)
    }

    #[tool(
        description = "Send a signal (INT, TERM, KILL, HUP, USR1, ...) to an exec session's \
        process group, e.g. INT to interrupt a server or KILL to end it. Poll afterwards to \
        see it exit."
    )]
    async fn exec_signal(
        &self,
        Parameters(args): Parameters<SignalArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { self.server.sessions.signal(args?).await }.await)
    }

    #[tool(
        description = "Read a text file in a sandbox, by line range: start_line (from 1, \
        default 1) and line_count (default 2000). Returns content, end_line, total_lines \
        and more_lines. Very long lines are cut; binary files are refused (use download).",
        annotations(read_only_hint = true)
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { files::read(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Write a text file in a sandbox, replacing it atomically if it \
        exists and creating missing parent directories."
    )]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { files::write(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Edit a text file in a sandbox by exact string replacement: \
        old_string must occur exactly once (or set replace_all). Returns the number of \
        replacements; fails with not_found when old_string does not occur and \
        invalid_argument when it occurs more than once without replace_all."
    )]
    async fn edit_file(
        &self,
        Parameters(args): Parameters<EditArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { files::edit(&self.server, args?).await }.await)
    }

    #[tool(
        description = "List a directory in a sandbox: each entry's path, kind (file, dir, \
        symlink, other), size, mode and modification time; depth > 1 descends.",
        annotations(read_only_hint = true)
    )]
    async fn ls(&self, Parameters(args): Parameters<LsArgs>) -> Result<CallToolResult, ErrorData> {
        answer(async { files::ls(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Find paths in a sandbox matching a glob such as `src/**/*.py`, \
        relative to root.",
        annotations(read_only_hint = true)
    )]
    async fn glob(
        &self,
        Parameters(args): Parameters<GlobArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { files::glob(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Search file contents in a sandbox for a literal string (or a regular \
        expression with regex: true), recursively under path, optionally only in files \
        matching glob. Returns each match's path, line number and text.",
        annotations(read_only_hint = true)
    )]
    async fn grep(
        &self,
        Parameters(args): Parameters<GrepArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { files::grep(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Copy a file or directory from this machine into a sandbox. \
        host_path must lie inside a directory the server was started with (--allow-dir); \
        symlinks inside a copied directory are copied as links, never followed."
    )]
    async fn upload(
        &self,
        Parameters(args): Parameters<UploadArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { transfer::upload(&self.server, args?).await }.await)
    }

    #[tool(
        description = "Copy a file or directory from a sandbox to this machine. host_path \
        must lie inside a directory the server was started with (--allow-dir); nothing the \
        sandbox sends is written outside it (its symlinks land as symlinks, setuid bits are \
        dropped)."
    )]
    async fn download(
        &self,
        Parameters(args): Parameters<DownloadArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        answer(async { transfer::download(&self.server, args?).await }.await)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("tether", env!("CARGO_PKG_VERSION"))
                    .with_title("Tether sandboxes"),
            )
            .with_instructions(INSTRUCTIONS)
    }
}

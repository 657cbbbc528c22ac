//! Exec sessions: `exec_start`, `exec_poll`, `exec_write_stdin`, `exec_signal`,
//! `exec_list`. A session is an agent background process plus a task in this server that
//! reads its output into a [`Buffer`](super::buffer::Buffer) (see [`super::exec_session`]).
//! Sessions live in the server process, keyed by an id any client connection may use, so a
//! client that disconnects and comes back polls on from its cursor.
//!
//! Nothing is lost: the reading task holds at most
//! [`SESSION_BUFFER_BYTES`](super::constants::SESSION_BUFFER_BYTES) that no poll
//! acknowledged, then stops reading, and the agent's flow control blocks the process's
//! writes until a poll makes room. When the connection to the sandbox drops, the task
//! re-attaches from the last offset it holds (the agent's replay ring covers the gap; a gap
//! the ring could not cover is reported to the poll that reaches it).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;

use tether_proto::op::{ExecSpec, Op, PtySpec};

use tether_client::ClientError;

use super::connections::Connections;
use super::constants::{
    MAX_SESSIONS, POLL_DEFAULT_BYTES, POLL_DEFAULT_WAIT, POLL_MAX_BYTES, POLL_MAX_WAIT,
    SESSION_RETENTION, STDIN_TIMEOUT,
};
use super::error::{invalid, ToolError};
use super::exec::{check_command, exit_fields, timeout};
use super::exec_session::{read, Ended, ExecSession, State, Stdin};
use super::text::boundary;

/// Arguments of `exec_start`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StartArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// A shell command line, run with `/bin/sh -c` in the background.
    pub command: String,
    /// Working directory; the sandbox's default when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Environment variables added for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Kill the command after this many seconds (exit code 124); no limit when absent.
    #[serde(default)]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: Option<u64>,
    /// Run under a pseudo-terminal (120x40): for programs that want a terminal (REPLs,
    /// prompts, colour). Without one, stdout and stderr are merged in the order written.
    #[serde(default)]
    pub pty: bool,
}

/// Arguments of `exec_poll`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PollArgs {
    /// The session's id, from exec_start.
    pub session_id: String,
    /// The byte offset to read from: the `cursor` the previous poll returned (0 for the
    /// start). Presenting a cursor acknowledges everything before it, which the server then
    /// forgets. When absent, the poll continues where the previous poll's answer ended.
    #[serde(default)]
    pub cursor: Option<u64>,
    /// Wait up to this many milliseconds for output when there is none yet; default 1000,
    /// at most 60000. Returns as soon as any output or the exit is there.
    #[serde(default)]
    #[schemars(range(max = 60000))]
    pub wait_ms: Option<u64>,
    /// The most bytes of output to return; default 32768, at most 65536.
    #[serde(default)]
    #[schemars(range(min = 16, max = 65536))]
    pub max_bytes: Option<u64>,
}

/// Arguments of `exec_write_stdin`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct WriteStdinArgs {
    /// The session's id, from exec_start.
    pub session_id: String,
    /// Text to write to the process's standard input, as is (add "\n" to end a line).
    #[serde(default)]
    pub input: String,
    /// Close the input after writing: the process reads end-of-file (under a terminal,
    /// Ctrl-D is sent).
    #[serde(default)]
    pub close_stdin: bool,
}

/// Arguments of `exec_signal`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SignalArgs {
    /// The session's id, from exec_start.
    pub session_id: String,
    /// The signal's name or number: INT, TERM, KILL, HUP, QUIT, USR1, USR2, ...
    pub signal: String,
    /// Signal only the process itself rather than its whole process group (the group is
    /// the default: it reaches the shell's children too).
    #[serde(default)]
    pub process_only: bool,
}

/// Every exec session of this server.
#[derive(Debug)]
pub(super) struct ExecSessions {
    connections: Arc<Connections>,
    all: Mutex<HashMap<String, Arc<ExecSession>>>,
}

impl ExecSessions {
    /// No sessions yet.
    pub(super) fn new(connections: Arc<Connections>) -> ExecSessions {
        ExecSessions {
            connections,
            all: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<ExecSession>>> {
        self.all.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn find(&self, id: &str) -> Result<Arc<ExecSession>, ToolError> {
        self.lock().get(id).cloned().ok_or_else(|| {
            ToolError::SessionNotFound(tether_client::escape::escape_str(id).into_owned())
        })
    }

    /// Forgets the sessions whose process ended longer than [`SESSION_RETENTION`] ago.
    fn sweep(&self) {
        self.lock().retain(|_, s| {
            s.state()
                .ended_at
                .is_none_or(|at| at.elapsed() < SESSION_RETENTION)
        });
    }

    /// Makes room for one more session, forgetting the finished session that started
    /// first; fails when every session is still running.
    fn make_room(&self) -> Result<(), ToolError> {
        self.sweep();
        let mut all = self.lock();
        if all.len() < MAX_SESSIONS {
            return Ok(());
        }
        let oldest = all
            .values()
            .filter(|s| !s.is_running())
            .min_by_key(|s| s.started_ms)
            .map(|s| s.id.clone());
        match oldest {
            Some(id) => {
                all.remove(&id);
                Ok(())
            }
            None => Err(ToolError::TooManySessions(all.len())),
        }
    }

    /// `exec_start`.
    pub(super) async fn start(&self, args: StartArgs) -> Result<Value, ToolError> {
        check_command(&args.command)?;
        let limit = timeout(args.timeout_seconds, None)?;
        self.make_room()?;
        let session = self.connections.get(&args.sandbox_id).await?;
        let id = format!("es-{:016x}", rand::random::<u64>());
        let spec = ExecSpec {
            cwd: args.cwd.map(Into::into),
            env: args.env,
            stdin: true,
            merge_stderr: true,
            background: true,
            pty: args.pty.then_some(PtySpec {
                cols: 120,
                rows: 40,
                term: None,
            }),
            timeout_ms: limit.map(|d| d.as_millis() as u64),
            tag: Some(format!("tether-mcp {id}")),
            ..ExecSpec::shell(args.command.clone())
        };
        let mut process = session.exec(spec).await?;
        let exec = Arc::new(ExecSession {
            id: id.clone(),
            sandbox_id: args.sandbox_id,
            process: process.process,
            pid: process.pid,
            command: args.command,
            started_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or_default(),
            state: Mutex::new(State {
                stdin: Some(Stdin {
                    connection: session.clone(),
                    sender: process.stream().sender(),
                }),
                ..State::default()
            }),
            changed: Notify::new(),
            room: Notify::new(),
            reader: Mutex::new(None),
        });
        let task = tokio::spawn(read(exec.clone(), self.connections.clone(), process));
        *exec.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(AbortOnDropHandle::new(task));
        self.lock().insert(id.clone(), exec.clone());
        Ok(json!({
            "session_id": id,
            "sandbox_id": exec.sandbox_id,
            "pid": exec.pid,
            "cursor": 0,
            "next": "read its output with exec_poll (session_id, cursor); send input with \
                     exec_write_stdin; stop it with exec_signal",
        }))
    }

    /// `exec_poll`.
    pub(super) async fn poll(&self, args: PollArgs) -> Result<Value, ToolError> {
        let exec = self.find(&args.session_id)?;
        let wait = match args.wait_ms {
            None => POLL_DEFAULT_WAIT,
            Some(ms) => Duration::from_millis(ms).min(POLL_MAX_WAIT),
        };
        let max = match args.max_bytes {
            None => POLL_DEFAULT_BYTES,
            Some(n) => (n as usize).clamp(16, POLL_MAX_BYTES),
        };
        let cursor = {
            let mut state = exec.state();
            let cursor = args.cursor.unwrap_or(state.delivered);
            if cursor > state.buffer.end() {
                return Err(invalid(format!(
                    "cursor {cursor} is beyond the {} bytes of output so far; pass the cursor \
                     the previous exec_poll returned",
                    state.buffer.end()
                )));
            }
            state.buffer.ack(cursor);
            cursor
        };
        exec.room.notify_waiters();

        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let changed = exec.changed.notified();
            {
                let state = exec.state();
                if state.buffer.end() > cursor || state.ended.is_some() {
                    break;
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                break;
            }
        }

        let mut state = exec.state();
        let read = state.buffer.read(cursor, max);
        let end = state.buffer.end();
        let ended = state.ended.clone();
        // A character still being written waits for its last bytes, unless none will come.
        let complete = read.from.saturating_add(read.bytes.len() as u64) == end && ended.is_some();
        let n = if complete {
            read.bytes.len()
        } else {
            match boundary(&read.bytes, read.bytes.len()) {
                0 if read.bytes.len() >= 4 => read.bytes.len(),
                n => n,
            }
        };
        let next = read.from.saturating_add(n as u64);
        state.delivered = next;
        drop(state);

        let mut answer = json!({
            "session_id": exec.id,
            "output": String::from_utf8_lossy(&read.bytes[..n]),
            "cursor": next,
            "pending_bytes": end - next,
            "running": ended.is_none(),
        });
        if read.from > cursor {
            answer["lost"] = json!({
                "from": cursor,
                "to": read.from,
                "why": "this output is no longer held (an earlier poll acknowledged it, or the \
                        sandbox's replay ring overwrote it while the server was disconnected)",
            });
        }
        match ended {
            Some(Ended::Exited(status)) if next == end => {
                let exit = exit_fields(&status);
                for (k, v) in exit.as_object().expect("an object") {
                    answer[k] = v.clone();
                }
            }
            Some(Ended::Failed(why)) if next == end => {
                answer["error"] = json!(why);
            }
            _ => {}
        }
        Ok(answer)
    }

    /// `exec_write_stdin`.
    pub(super) async fn write_stdin(&self, args: WriteStdinArgs) -> Result<Value, ToolError> {
        let exec = self.find(&args.session_id)?;
        let stdin = {
            let state = exec.state();
            if state.stdin_closed {
                return Err(ToolError::SessionEnded(format!(
                    "the input of exec session {} was closed already",
                    exec.id
                )));
            }
            match (&state.ended, &state.stdin) {
                (None, Some(stdin)) => stdin.clone(),
                (None, None) => {
                    return Err(ToolError::SessionEnded(format!(
                        "exec session {} lost its process's input when it re-attached after a \
                         lost connection (the sandbox still gave it to the old stream); its \
                         output can still be polled",
                        exec.id
                    )))
                }
                (Some(_), _) => {
                    return Err(ToolError::SessionEnded(format!(
                        "the process of exec session {} has ended; it takes no more input",
                        exec.id
                    )))
                }
            }
        };
        let write = async {
            if !args.input.is_empty() {
                stdin.sender.send(args.input.as_bytes()).await?;
            }
            if args.close_stdin {
                stdin.sender.eof().await?;
            }
            // Frames go out in order on one connection: an answer to a request sent after
            // them proves the agent received them. Without it, bytes queued on a connection
            // that was dying would be reported written and silently lost.
            match stdin
                .connection
                .request(Op::Stat { path: "/".into() })
                .await
            {
                // Any answer, even an error, came after the input.
                Ok(_) | Err(ClientError::Remote { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        };
        tokio::time::timeout(STDIN_TIMEOUT, write)
            .await
            .map_err(|_| {
                ToolError::Timeout(format!(
                    "the process did not take its input within {} s (it is not reading stdin); \
                     poll it, or end it with exec_signal",
                    STDIN_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| match e {
                ClientError::Disconnected | ClientError::PeerSilent { .. } => {
                    ToolError::Disconnected(
                        "the connection to the sandbox was lost before the agent confirmed the \
                     input, which may not have reached the process; the server re-attaches by \
                     itself: poll the session, and write the input again if it is missing"
                            .into(),
                    )
                }
                e => ToolError::Client(e),
            })?;
        if args.close_stdin {
            exec.state().stdin_closed = true;
        }
        Ok(json!({
            "session_id": exec.id,
            "written_bytes": args.input.len(),
            "stdin_closed": args.close_stdin,
        }))
    }

    /// `exec_signal`.
    pub(super) async fn signal(&self, args: SignalArgs) -> Result<Value, ToolError> {
        let exec = self.find(&args.session_id)?;
        let name = args.signal.trim();
        let valid = !name.is_empty()
            && name.len() <= 16
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-');
        if !valid {
            return Err(invalid(format!(
                "`{}` is not a signal: give a name such as INT, TERM or KILL, or a number",
                tether_client::escape::escape_str(name)
            )));
        }
        if !exec.is_running() {
            return Err(ToolError::SessionEnded(format!(
                "the process of exec session {} has already ended; poll it for its exit",
                exec.id
            )));
        }
        let session = self.connections.get(&exec.sandbox_id).await?;
        session
            .kill(exec.process, Some(name), !args.process_only)
            .await?;
        Ok(json!({
            "session_id": exec.id,
            "signal": name,
            "next": "poll the session to see the process end",
        }))
    }

    /// What is known of every session (`exec_list`).
    pub(super) fn summary(&self) -> Vec<Value> {
        self.sweep();
        let all = self.lock();
        let mut out: Vec<_> = all
            .values()
            .map(|s| {
                json!({
                    "session_id": s.id,
                    "sandbox_id": s.sandbox_id,
                    "command": s.command,
                    "running": s.is_running(),
                })
            })
            .collect();
        out.sort_by(|a, b| a["session_id"].as_str().cmp(&b["session_id"].as_str()));
        out
    }

    /// Forgets the sessions of a deleted sandbox; returns how many there were.
    pub(super) fn forget_sandbox(&self, sandbox_id: &str) -> usize {
        let mut all = self.lock();
        let gone: Vec<String> = all
            .values()
            .filter(|s| s.sandbox_id == sandbox_id)
            .map(|s| s.id.clone())
            .collect();
        for id in &gone {
            if let Some(s) = all.remove(id) {
                s.stop();
            }
        }
        gone.len()
    }

    /// Kills the processes of sessions still running: called when the server stops, after
    /// which nobody could follow them. Bounded by `limit`.
    pub(super) async fn shutdown(&self, limit: Duration) {
        let running: Vec<_> = self
            .lock()
            .drain()
            .map(|(_, s)| s)
            .filter(|s| s.is_running())
            .collect();
        let kills = running.iter().map(|s| async {
            if let Ok(session) = self.connections.get(&s.sandbox_id).await {
                let _ = session.kill(s.process, Some("KILL"), true).await;
            }
        });
        let _ = tokio::time::timeout(limit, futures_util::future::join_all(kills)).await;
    }
}

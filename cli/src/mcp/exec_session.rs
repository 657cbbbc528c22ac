//! One exec session: an agent background process, the [`Buffer`] its output fills, and the
//! task that fills it, which re-attaches from the last offset it holds when the connection
//! to the sandbox drops. [`super::sessions`] keeps the sessions and serves the tools.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;

use tether_proto::control::ExitStatus;
use tether_proto::{ErrorCode, ProcessId};

use tether_client::{ClientError, Process, ProcessEvent, Session, StreamSender};

use super::buffer::Buffer;
use super::connections::Connections;
use super::constants::{REATTACH_ATTEMPTS, REATTACH_BACKOFF, SESSION_BUFFER_BYTES};

/// How a session's process ended, or why it can no longer be followed.
#[derive(Clone, Debug)]
pub(super) enum Ended {
    Exited(ExitStatus),
    Failed(String),
}

/// What the reading task and the polls share.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) buffer: Buffer,
    pub(super) ended: Option<Ended>,
    /// When `ended` was set.
    pub(super) ended_at: Option<tokio::time::Instant>,
    /// The cursor the last answer ended at: where a poll with no cursor starts.
    pub(super) delivered: u64,
    pub(super) stdin: Option<Stdin>,
    pub(super) stdin_closed: bool,
}

/// Where a session's input goes: the stream that forwards it, and its connection, on which
/// a round trip after a write confirms the agent has the bytes.
#[derive(Clone, Debug)]
pub(super) struct Stdin {
    pub(super) connection: Session,
    pub(super) sender: StreamSender,
}

/// One exec session.
#[derive(Debug)]
pub(super) struct ExecSession {
    pub(super) id: String,
    pub(super) sandbox_id: String,
    pub(super) process: ProcessId,
    pub(super) pid: u32,
    pub(super) command: String,
    pub(super) started_ms: u128,
    pub(super) state: Mutex<State>,
    /// Output arrived or the process ended.
    pub(super) changed: Notify,
    /// A poll acknowledged output: the reader may go on.
    pub(super) room: Notify,
    pub(super) reader: Mutex<Option<AbortOnDropHandle<()>>>,
}

impl ExecSession {
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn is_running(&self) -> bool {
        self.state().ended.is_none()
    }

    /// Stops reading: the process, if it runs, is left to the sandbox.
    pub(super) fn stop(&self) {
        self.reader.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    pub(super) fn end(&self, ended: Ended) {
        let mut state = self.state();
        if state.ended.is_none() {
            state.ended = Some(ended);
            state.ended_at = Some(tokio::time::Instant::now());
        }
        state.stdin = None;
        drop(state);
        self.changed.notify_waiters();
    }
}

/// The session's reader: output into the buffer while it has room, the exit, and
/// re-attaching after a lost connection.
pub(super) async fn read(
    exec: Arc<ExecSession>,
    connections: Arc<Connections>,
    mut process: Process,
) {
    loop {
        loop {
            let room = exec.room.notified();
            if exec.state().buffer.held() < SESSION_BUFFER_BYTES {
                break;
            }
            room.await;
        }
        match process.next().await {
            Some(Ok(ProcessEvent::Stdout(bytes) | ProcessEvent::Stderr(bytes))) => {
                exec.state().buffer.push(bytes);
                exec.changed.notify_waiters();
            }
            Some(Ok(ProcessEvent::Dropped { to, .. })) => exec.state().buffer.skip_to(to),
            Some(Ok(ProcessEvent::Exit(status))) => return exec.end(Ended::Exited(status)),
            Some(Err(ClientError::Disconnected)) | None => {
                match reattach(&exec, &connections).await {
                    Ok(p) => process = p,
                    Err(why) => return exec.end(Ended::Failed(why)),
                }
            }
            Some(Err(e)) => return exec.end(Ended::Failed(e.to_string())),
        }
    }
}

/// Opens a new connection and attaches to the process from the last offset held.
async fn reattach(exec: &ExecSession, connections: &Connections) -> Result<Process, String> {
    let mut pause = REATTACH_BACKOFF;
    let mut last = String::new();
    for attempt in 1..=REATTACH_ATTEMPTS {
        let (offset, mut stdin) = {
            let state = exec.state();
            (state.buffer.end(), !state.stdin_closed)
        };
        match connections.fresh(&exec.sandbox_id).await {
            Ok(session) => {
                let mut attached = session.attach(exec.process, [offset, 0], stdin).await;
                // The agent has not noticed yet that the old stream, which held the input, is
                // gone: try again later, and on the last attempt follow the output without it.
                if stdin
                    && matches!(&attached, Err(e) if e.code() == Some(ErrorCode::InvalidArgument))
                    && attempt == REATTACH_ATTEMPTS
                {
                    stdin = false;
                    attached = session.attach(exec.process, [offset, 0], false).await;
                }
                match attached {
                    Ok(mut process) => {
                        let mut state = exec.state();
                        state.stdin = stdin.then(|| Stdin {
                            connection: session.clone(),
                            sender: process.stream().sender(),
                        });
                        if let Some(to) = Some(process.offsets()[0]).filter(|&o| o > offset) {
                            state.buffer.skip_to(to);
                        }
                        return Ok(process);
                    }
                    Err(e) if e.code() == Some(ErrorCode::NotFound) => {
                        return Err(format!(
                            "the sandbox no longer knows the process ({e}); its exit was lost \
                             with the connection"
                        ))
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
    Err(format!(
        "lost the connection to sandbox {} and could not re-attach: {last}",
        exec.sandbox_id
    ))
}

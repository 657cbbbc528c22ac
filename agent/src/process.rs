//! The agent's processes: the registry every connection shares, and each process's life from
//! spawn to collected exit.
//!
//! A supervisor task per process runs its output pumps (see `output`), enforces its timeout,
//! and publishes the exit status once the status is known and every output channel has
//! ended. Streams attach to a process through its replay rings (see `exec`); the process does
//! not know who is attached, which is what lets a background process outlive its connection.
//!
//! A finished process stays listed until its exit is collected (delivered by an exec, attach
//! or wait stream) or for [`EXIT_RETENTION_SECS`], whichever comes first.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tether_proto::limits::EXIT_RETENTION_SECS;
use tether_proto::op::{Command, ExecSpec, ProcessInfo};
use tether_proto::{ByteOffset, Channel, ErrorCode, ExitStatus, ProcessId};
use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, watch};
use tracing::debug;

use crate::reaper::{Ended, Reaper};
use crate::replay::{Reader, Ring};
use crate::spawn::{self, ChildIo, Inheritance};
use crate::stream::OpError;
use crate::{output, pty, sys};

/// Bounds of a spec's replay ring capacity, per channel: 4 KiB to 64 MiB.
const RING_BYTES: (u64, u64) = (4 << 10, 64 << 20);

/// Every process started through this agent.
#[derive(Debug)]
pub(crate) struct Processes {
    registry: Arc<Registry>,
}

#[derive(Debug)]
struct Registry {
    table: Mutex<HashMap<ProcessId, Arc<Process>>>,
    next_id: AtomicU64,
    reaper: Arc<Reaper>,
    /// What children undo: the agent's OOM shield, the signals it was started ignoring.
    inheritance: Inheritance,
}

/// One process and its output history.
#[derive(Debug)]
pub(crate) struct Process {
    /// The agent's id for it.
    pub id: ProcessId,
    /// Its pid, also its process group id.
    pub pid: i32,
    /// It runs under a PTY.
    pub pty: bool,
    command: String,
    tag: Option<String>,
    started_ms: i64,
    /// Replay rings for `out` and `err`.
    rings: [Arc<Ring>; 2],
    /// Where input goes: its stdin pipe or PTY master; `None` for /dev/null or once closed.
    input: Mutex<Option<Input>>,
    /// Output bytes still allowed under the spec's limit.
    output_left: Option<AtomicU64>,
    timed_out: AtomicBool,
    truncated: AtomicBool,
    leader_alive: AtomicBool,
    collected: AtomicBool,
    exit: watch::Receiver<Option<ExitStatus>>,
    reaper: Arc<Reaper>,
}

/// The writing end of a process's input (a pipe, or a PTY master). Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Input(Arc<AsyncFd<OwnedFd>>);

impl Input {
    /// Writes some of `buf` once the descriptor is writable; returns how much. Dropping the
    /// future before it finishes writes nothing.
    pub(crate) async fn write(&self, buf: &[u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.0.writable().await?;
            if let Ok(result) =
                ready.try_io(|fd| nix::unistd::write(fd.get_ref(), buf).map_err(io::Error::from))
            {
                return result;
            }
        }
    }
}

impl Processes {
    /// Starts the registry and the reaper. Must be called inside the tokio runtime.
    pub(crate) fn start() -> Processes {
        // The agent lowered its own OOM score, so children must raise theirs back.
        let reset_oom = std::fs::read_to_string("/proc/self/oom_score_adj")
            .is_ok_and(|score| score.trim() != "0");
        // Read before the reaper and the signal tasks install their handlers.
        let inheritance = Inheritance {
            reset_oom,
            default_signals: sys::children_inherit_ignored_signals(),
        };
        Processes {
            registry: Arc::new(Registry {
                table: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                reaper: Reaper::start(),
                inheritance,
            }),
        }
    }

    /// Starts the process `spec` describes. `workdir` is the default working directory and
    /// `ring_bytes` the default replay ring capacity.
    pub(crate) fn spawn(
        &self,
        spec: &ExecSpec,
        workdir: &std::path::Path,
        ring_bytes: usize,
    ) -> Result<Arc<Process>, OpError> {
        let registry = &self.registry;
        let child = spawn::spawn(spec, workdir, registry.inheritance, &registry.reaper)?;
        let capacity = spec
            .ring_bytes
            .map_or(ring_bytes, |b| b.clamp(RING_BYTES.0, RING_BYTES.1) as usize);
        let register = |fd: OwnedFd| {
            sys::watch_fd(fd)
                .map(Arc::new)
                .map_err(|e| OpError::io("cannot watch a process's output", &e))
        };
        let registered = match child.io {
            ChildIo::Pipes {
                stdin,
                stdout,
                stderr,
            } => (|| {
                let outputs = [Some(register(stdout)?), stderr.map(register).transpose()?];
                Ok((stdin.map(register).transpose()?, outputs))
            })(),
            ChildIo::Pty { master } => register(master).map(|m| (Some(m.clone()), [Some(m), None])),
        };
        let (input, outputs) = match registered {
            Ok(io) => io,
            Err(e) => {
                // Nobody would read its output: do not leave it running.
                let _ = killpg(Pid::from_raw(child.pid), Signal::SIGKILL);
                return Err(e);
            }
        };
        let (exit_tx, exit_rx) = watch::channel(None);
        let process = Arc::new(Process {
            id: ProcessId(registry.next_id.fetch_add(1, SeqCst)),
            pid: child.pid,
            pty: spec.pty.is_some(),
            command: display(&spec.command),
            tag: spec.tag.clone(),
            started_ms: now_ms(),
            rings: [Arc::new(Ring::new(capacity)), Arc::new(Ring::new(capacity))],
            input: Mutex::new(input.map(Input)),
            output_left: spec.output_limit.map(AtomicU64::new),
            timed_out: AtomicBool::new(false),
            truncated: AtomicBool::new(false),
            leader_alive: AtomicBool::new(true),
            collected: AtomicBool::new(false),
            exit: exit_rx,
            reaper: registry.reaper.clone(),
        });
        registry.lock().insert(process.id, process.clone());
        let timeout = spec.timeout_ms.map(Duration::from_millis);
        tokio::spawn(supervise(
            process.clone(),
            outputs,
            child.ended,
            timeout,
            exit_tx,
            Arc::downgrade(registry),
        ));
        Ok(process)
    }

    /// The process with this id.
    pub(crate) fn get(&self, id: ProcessId) -> Result<Arc<Process>, OpError> {
        self.registry.lock().get(&id).cloned().ok_or_else(|| {
            OpError::new(
                ErrorCode::NotFound,
                format!(
                    "{id} not found: it never existed, or it ended and its exit was already \
                     collected or expired"
                ),
            )
        })
    }

    /// Running and uncollected processes, oldest first.
    pub(crate) fn list(&self) -> Vec<ProcessInfo> {
        let mut all: Vec<_> = self.registry.lock().values().cloned().collect();
        all.sort_by_key(|p| p.id);
        all.iter().map(|p| p.info()).collect()
    }

    /// Records that a client received the process's exit: it is forgotten once it ended.
    pub(crate) fn collect(&self, process: &Process) {
        process.collected.store(true, SeqCst);
        if process.exit.borrow().is_some() {
            self.registry.lock().remove(&process.id);
        }
    }

    /// Sends `sig` to the process group of every process that has not finished.
    pub(crate) fn signal_all(&self, sig: Signal) {
        for p in self.registry.lock().values() {
            if p.exit.borrow().is_none() {
                let _ = killpg(Pid::from_raw(p.pid), sig);
            }
        }
    }

    /// True while any process we started is still running.
    pub(crate) fn any_running(&self) -> bool {
        self.registry
            .lock()
            .values()
            .any(|p| p.leader_alive.load(SeqCst))
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ProcessId, Arc<Process>>> {
        self.table.lock().expect("process table lock")
    }

    /// The process's exit was published: forget it now if collected, else after retention.
    fn finished(self: &Arc<Self>, process: &Process) {
        if process.collected.load(SeqCst) {
            self.lock().remove(&process.id);
            return;
        }
        let registry = Arc::downgrade(self);
        let id = process.id;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(EXIT_RETENTION_SECS)).await;
            if let Some(registry) = registry.upgrade() {
                registry.lock().remove(&id);
            }
        });
    }
}

impl Process {
    /// The replay ring of `out` (index 0) or `err` (index 1).
    pub(crate) fn ring(&self, channel: Channel) -> &Arc<Ring> {
        match channel {
            Channel::Err => &self.rings[1],
            _ => &self.rings[0],
        }
    }

    /// Attaches readers to both channels from the given offsets.
    pub(crate) fn attach(&self, from: [ByteOffset; 2]) -> Result<[Reader; 2], OpError> {
        let reader = |channel: Channel, from: ByteOffset| {
            let ring = self.ring(channel);
            ring.attach(from).ok_or_else(|| {
                OpError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "offset {from} is past the end of the {channel:?} output of {} \
                         ({} bytes so far)",
                        self.id,
                        ring.end()
                    ),
                )
            })
        };
        Ok([
            reader(Channel::Out, from[0])?,
            reader(Channel::Err, from[1])?,
        ])
    }

    /// Where input goes, unless stdin is /dev/null or was closed.
    pub(crate) fn input(&self) -> Option<Input> {
        self.input.lock().expect("process input lock").clone()
    }

    /// Closes the stdin pipe (the process reads end-of-file once pending writes are done).
    /// A PTY is left open: its end-of-file is a byte, [`pty::EOF_BYTE`].
    pub(crate) fn close_stdin(&self) {
        if !self.pty {
            self.input.lock().expect("process input lock").take();
        }
    }

    /// Resizes the PTY, if the process has one and it is still open.
    pub(crate) fn resize(&self, cols: u16, rows: u16) {
        if let (true, Some(master)) = (self.pty, self.input()) {
            if let Err(e) = pty::resize(master.0.get_ref(), cols, rows) {
                debug!("cannot resize the terminal of {}: {e}", self.id);
            }
        }
    }

    /// Sends `sig` to the process, or to its process group: for a PTY, the terminal's
    /// foreground group, which is where a typed Ctrl-C would go. Nothing is sent once the
    /// process finished, since its ids may then belong to others.
    pub(crate) fn signal(&self, sig: Signal, group: bool) {
        if self.exit.borrow().is_some() {
            return;
        }
        if !group {
            self.reaper.signal(self.pid, sig);
            return;
        }
        let foreground = match (self.pty, self.input()) {
            (true, Some(master)) => nix::unistd::tcgetpgrp(master.0.get_ref().as_fd()).ok(),
            _ => None,
        };
        let _ = killpg(foreground.unwrap_or(Pid::from_raw(self.pid)), sig);
    }

    /// SIGKILLs the process group (and, under a PTY, every process of its session, since job
    /// control moves jobs into groups of their own).
    pub(crate) fn kill_all(&self) {
        let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
        if self.pty {
            pty::kill_session(self.pid);
        }
    }

    /// Waits until the process has ended and all its output is in the rings.
    pub(crate) async fn wait(&self) -> ExitStatus {
        let mut exit = self.exit.clone();
        let status = exit.wait_for(Option::is_some).await.ok().and_then(|s| *s);
        status.unwrap_or_default()
    }

    fn info(&self) -> ProcessInfo {
        ProcessInfo {
            process: self.id,
            pid: self.pid as u32,
            tag: self.tag.clone(),
            command: self.command.clone(),
            pty: self.pty,
            exit: *self.exit.borrow(),
            offsets: [self.rings[0].end(), self.rings[1].end()],
            started_ms: self.started_ms,
        }
    }

    /// Cuts `chunk` to what the output limit still allows.
    pub(crate) fn within_limit(&self, mut chunk: Bytes) -> Bytes {
        let Some(left) = &self.output_left else {
            return chunk;
        };
        let len = chunk.len() as u64;
        let before = left
            .fetch_update(SeqCst, SeqCst, |l| Some(l.saturating_sub(len)))
            .unwrap_or_default();
        if before < len {
            self.truncated.store(true, SeqCst);
            chunk.truncate(before as usize);
        }
        chunk
    }

    pub(crate) fn output_exhausted(&self) -> bool {
        self.output_left
            .as_ref()
            .is_some_and(|left| left.load(SeqCst) == 0)
    }
}

/// Runs a process to its end: pumps, timeout, exit status, retention.
async fn supervise(
    process: Arc<Process>,
    outputs: [Option<Arc<AsyncFd<OwnedFd>>>; 2],
    ended: oneshot::Receiver<Ended>,
    timeout: Option<Duration>,
    exit_tx: watch::Sender<Option<ExitStatus>>,
    registry: Weak<Registry>,
) {
    let (gone_tx, gone_rx) = watch::channel(false);
    let leader = async {
        // The reaper never drops a registered sender: a status always comes.
        let ended = ended.await.unwrap_or(Ended::Code(255));
        process.leader_alive.store(false, SeqCst);
        let _ = gone_tx.send(true);
        ended
    };
    let [out, err] = outputs;
    let run = async {
        tokio::join!(
            leader,
            output::pump(&process, Channel::Out, out, gone_rx.clone()),
            output::pump(&process, Channel::Err, err, gone_rx),
        )
    };
    // The timeout covers the process and its output: a descendant still writing after the
    // leader exited is cut off too.
    let (ended, (), ()) = match timeout {
        None => run.await,
        Some(limit) => {
            tokio::pin!(run);
            tokio::select! {
                done = &mut run => done,
                () = tokio::time::sleep(limit) => {
                    process.timed_out.store(true, SeqCst);
                    process.kill_all();
                    run.await
                }
            }
        }
    };
    // Nothing reads the process's input any more; a PTY is released here.
    process.input.lock().expect("process input lock").take();
    let (code, signal) = match ended {
        Ended::Code(code) => (Some(code), None),
        Ended::Signal(sig) => (None, Some(sig)),
    };
    let _ = exit_tx.send(Some(ExitStatus {
        code,
        signal,
        timed_out: process.timed_out.load(SeqCst),
        truncated: process.truncated.load(SeqCst),
    }));
    if let Some(registry) = registry.upgrade() {
        registry.finished(&process);
    }
}

/// The command line for `processes`, shell-quoted where needed; bytes that are not UTF-8 are
/// written as `$'\xNN'`, so the line still names exactly what runs.
fn display(command: &Command) -> String {
    match command {
        Command::Shell(script) => quote_bytes(script.as_bytes(), false),
        Command::Argv(argv) => argv
            .iter()
            .map(|arg| quote_bytes(arg.as_bytes(), true))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// `bytes` as text: as they are when `plain` text (or not `quote`d), in single quotes when
/// UTF-8, else in ANSI-C quotes with every byte outside printable ASCII escaped.
fn quote_bytes(bytes: &[u8], quote: bool) -> String {
    let plain = !bytes.is_empty()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(b));
    match std::str::from_utf8(bytes) {
        Ok(text) if plain || !quote => text.to_string(),
        Ok(text) => format!("'{}'", text.replace('\'', r"'\''")),
        Err(_) => {
            let mut out = String::from("$'");
            for &b in bytes {
                match b {
                    b'\'' | b'\\' => {
                        out.push('\\');
                        out.push(b as char);
                    }
                    0x20..=0x7e => out.push(b as char),
                    _ => out.push_str(&format!("\\x{b:02x}")),
                }
            }
            out.push('\'');
            out
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_commands_quoted() {
        let argv = Command::Argv(vec![
            "echo".into(),
            "a b".into(),
            "it's".into(),
            "x=1".into(),
        ]);
        assert_eq!(display(&argv), r"echo 'a b' 'it'\''s' x=1");
        assert_eq!(display(&Command::Shell("ls | wc".into())), "ls | wc");
        let odd = Command::Argv(vec!["printf".into(), b"it's \xff\\".to_vec().into()]);
        assert_eq!(display(&odd), r"printf $'it\'s \xff\\'");
    }
}

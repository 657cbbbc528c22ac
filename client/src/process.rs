//! A running process seen from the client: its output, stdin, signals and exit.

use bytes::Bytes;

use tether_proto::control::ExitStatus;
use tether_proto::op::{ExecSpec, Op, ProcessInfo, Reply};
use tether_proto::{ByteOffset, Channel, ProcessId};

use super::session::{Event, RawStream, Session};
use super::ClientError;

/// What a process stream delivers.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    /// Bytes of stdout (or merged or PTY output).
    Stdout(Bytes),
    /// Bytes of stderr.
    Stderr(Bytes),
    /// Output `from..to` on `channel` was lost from the replay ring before it was read.
    Dropped {
        /// `out` or `err`.
        channel: Channel,
        /// First lost offset.
        from: ByteOffset,
        /// Where output resumes.
        to: ByteOffset,
    },
    /// The process ended; no events follow.
    Exit(ExitStatus),
}

/// Everything a finished process printed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub status: ExitStatus,
}

/// A process started with [`Session::exec`] or re-attached with [`Session::attach`].
/// Dropping it kills a foreground process and detaches from a background one.
#[derive(Debug)]
pub struct Process {
    stream: RawStream,
    /// The agent's id for the process.
    pub process: ProcessId,
    /// Its pid inside the sandbox.
    pub pid: u32,
    offsets: [ByteOffset; 2],
    exited: bool,
}

impl Process {
    async fn started(mut stream: RawStream) -> Result<Process, ClientError> {
        loop {
            match stream.next().await {
                Some(Event::Started {
                    process,
                    pid,
                    offsets,
                }) => {
                    return Ok(Process {
                        stream,
                        process,
                        pid,
                        offsets,
                        exited: false,
                    })
                }
                Some(Event::Error(e)) => return Err(e),
                Some(Event::Closed) | None => return Err(ClientError::Disconnected),
                Some(_) => {}
            }
        }
    }

    /// Offsets of the next byte this handle will deliver, per channel (`out`, `err`):
    /// what to pass to [`Session::attach`] after a reconnect.
    pub fn offsets(&self) -> [ByteOffset; 2] {
        self.offsets
    }

    /// The next output chunk or the exit; `None` after the exit.
    pub async fn next(&mut self) -> Option<Result<ProcessEvent, ClientError>> {
        if self.exited {
            return None;
        }
        loop {
            match self.stream.next().await? {
                Event::Data(Channel::Err, b) => {
                    self.offsets[1] += b.len() as u64;
                    return Some(Ok(ProcessEvent::Stderr(b)));
                }
                Event::Data(_, b) => {
                    self.offsets[0] += b.len() as u64;
                    return Some(Ok(ProcessEvent::Stdout(b)));
                }
                Event::Dropped { channel, from, to } => {
                    let i = usize::from(channel == Channel::Err);
                    self.offsets[i] = to;
                    return Some(Ok(ProcessEvent::Dropped { channel, from, to }));
                }
                Event::Exit(status) => {
                    self.exited = true;
                    return Some(Ok(ProcessEvent::Exit(status)));
                }
                Event::Error(e) => {
                    self.exited = true;
                    return Some(Err(e));
                }
                Event::Closed => {
                    self.exited = true;
                    return Some(Err(ClientError::Disconnected));
                }
                _ => {}
            }
        }
    }

    /// Collects all output until the process exits.
    pub async fn output(mut self) -> Result<Output, ClientError> {
        let mut out = Output::default();
        while let Some(ev) = self.next().await {
            match ev? {
                ProcessEvent::Stdout(b) => out.stdout.extend_from_slice(&b),
                ProcessEvent::Stderr(b) => out.stderr.extend_from_slice(&b),
                ProcessEvent::Dropped { .. } => {}
                ProcessEvent::Exit(status) => {
                    out.status = status;
                    return Ok(out);
                }
            }
        }
        Err(ClientError::Disconnected)
    }

    /// Writes to the process's stdin (the exec must have asked for stdin).
    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), ClientError> {
        self.stream.send(data).await
    }

    /// Closes the process's stdin: it reads end-of-file.
    pub async fn close_stdin(&self) -> Result<(), ClientError> {
        self.stream.eof().await
    }

    /// Resizes the process's terminal.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), ClientError> {
        self.stream.resize(cols, rows).await
    }

    /// Sends `signal` (a name such as `INT` or a number) to the process, or its whole group.
    pub async fn signal(&self, signal: &str, group: bool) -> Result<(), ClientError> {
        self.stream.signal(signal, group).await
    }

    /// The underlying stream, for callers that need raw events.
    pub fn stream(&mut self) -> &mut RawStream {
        &mut self.stream
    }
}

impl Session {
    /// Starts a process.
    pub async fn exec(&self, spec: ExecSpec) -> Result<Process, ClientError> {
        Process::started(self.open(Op::Exec(Box::new(spec))).await?).await
    }

    /// Re-attaches to a process from byte offsets (`[out, err]`).
    pub async fn attach(
        &self,
        process: ProcessId,
        offsets: [ByteOffset; 2],
        stdin: bool,
    ) -> Result<Process, ClientError> {
        let op = Op::Attach {
            process,
            out_offset: offsets[0],
            err_offset: offsets[1],
            stdin,
        };
        Process::started(self.open(op).await?).await
    }

    /// Waits for a process to end.
    pub async fn wait(&self, process: ProcessId) -> Result<ExitStatus, ClientError> {
        let mut stream = self.open(Op::Wait { process }).await?;
        loop {
            match stream.next().await {
                Some(Event::Exit(status)) => return Ok(status),
                Some(Event::Error(e)) => return Err(e),
                Some(Event::Closed) | None => return Err(ClientError::Disconnected),
                Some(_) => {}
            }
        }
    }

    /// Sends a signal (default KILL) to a process or its group.
    pub async fn kill(
        &self,
        process: ProcessId,
        signal: Option<&str>,
        group: bool,
    ) -> Result<(), ClientError> {
        let op = Op::Kill {
            process,
            signal: signal.map(str::to_string),
            group,
        };
        self.request(op).await.map(|_| ())
    }

    /// The agent's processes.
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>, ClientError> {
        match self.request(Op::Processes).await? {
            Reply::Processes { processes } => Ok(processes),
            other => Err(unexpected(&other)),
        }
    }
}

pub(crate) fn unexpected(reply: &Reply) -> ClientError {
    ClientError::Protocol(format!("unexpected reply {reply:?}"))
}

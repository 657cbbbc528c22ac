//! Process operations on a stream: `exec` starts a process and attaches its stream to it,
//! `attach` re-attaches to one from byte offsets, `wait`, `kill` and `processes`.
//!
//! An attached stream runs one sender per output channel, each reading the process's replay
//! ring from its own offset and sending within the stream's credit, next to an input loop
//! that takes stdin, resizes and signals from the client. The stream sends `started`, the
//! data, an `eof` per channel and then `exit`. A foreground process dies with its exec
//! stream (cancel or lost connection) unless that stream already delivered its exit; a
//! background process is only detached.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use nix::sys::signal::Signal;
use tether_proto::limits::BULK_CHUNK;
use tether_proto::op::{Op, Reply};
use tether_proto::{ByteOffset, Channel, Control, ErrorCode, ProcessId};
use tracing::warn;

use crate::agent::Agent;
use crate::process::{Process, Processes};
use crate::pty::EOF_BYTE;
use crate::replay::{Read, Reader};
use crate::signal;
use crate::stream::{Inbound, OpError, OpResult, StreamCtx, StreamIn, StreamOut};

/// Most bytes a sender takes from a ring at once: one frame's worth, as large as a bulk
/// frame when that much is waiting (a frame carries what the ring holds, so output as it
/// comes still goes out at once, in small frames). The ring frees them for the writer as
/// soon as that frame is queued.
const SEND_BYTES: usize = BULK_CHUNK;

/// Runs a process operation.
pub(crate) async fn run(ctx: StreamCtx, op: Op, agent: Arc<Agent>) -> OpResult {
    match op {
        Op::Exec(mut spec) => {
            // An image's USER: commands that name no user run as it (the agent stays root).
            if spec.user.is_none() {
                spec.user.clone_from(&agent.default_user);
            }
            let process = agent
                .processes
                .spawn(&spec, &agent.workdir, agent.ring_bytes)?;
            // A terminal's input is always the client's: there is no /dev/null to give it.
            let stdin = spec.stdin || spec.pty.is_some();
            attach(
                ctx,
                &agent.processes,
                process,
                [0, 0],
                stdin,
                !spec.background,
            )
            .await
        }
        Op::Attach {
            process,
            out_offset,
            err_offset,
            stdin,
        } => {
            let process = agent.processes.get(process)?;
            let from = [out_offset, err_offset];
            attach(ctx, &agent.processes, process, from, stdin, false).await
        }
        Op::Wait { process } => wait(ctx, &agent.processes, process).await,
        Op::Kill {
            process,
            signal,
            group,
        } => {
            let sig = match signal {
                Some(name) => signal::parse(&name)?,
                None => Signal::SIGKILL,
            };
            agent.processes.get(process)?.signal(sig, group);
            ctx.out.reply(Reply::Ok).await
        }
        Op::Processes => {
            let processes = agent.processes.list();
            ctx.out.reply(Reply::Processes { processes }).await
        }
        other => Err(OpError::new(
            ErrorCode::Internal,
            format!("the exec module was handed a {other:?} operation"),
        )),
    }
}

/// Kills a foreground process whose exec stream ends before delivering its exit, however it
/// ends (cancel, lost connection, a failed send, a panic).
struct Foreground<'a> {
    process: Option<&'a Process>,
    processes: &'a Processes,
}

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill_all();
            // Nobody is left to collect its exit.
            self.processes.collect(process);
        }
    }
}

/// Streams a process's output from `from` and its exit, forwarding input and commands.
/// `owner` is true for the exec stream of a foreground process.
async fn attach(
    ctx: StreamCtx,
    processes: &Processes,
    process: Arc<Process>,
    from: [ByteOffset; 2],
    stdin: bool,
    owner: bool,
) -> OpResult {
    let mut guard = Foreground {
        process: owner.then_some(&*process),
        processes,
    };
    let [out_reader, err_reader] = process.attach(from)?;
    let (out, mut input) = ctx.split();
    out.control(Control::Started {
        stream: out.id(),
        process: process.id,
        pid: process.pid as u32,
        offsets: [out_reader.offset(), err_reader.offset()],
    })
    .await?;

    let output = async {
        let (sent_out, sent_err) = tokio::join!(
            send_channel(&out, Channel::Out, out_reader),
            send_channel(&out, Channel::Err, err_reader),
        );
        sent_out?;
        sent_err?;
        let status = process.wait().await;
        out.control(Control::Exit {
            stream: out.id(),
            status,
        })
        .await
    };
    tokio::select! {
        sent = output => {
            sent?;
            guard.process = None;
            processes.collect(&process);
            Ok(())
        }
        () = forward_input(&mut input, &process, stdin) => Ok(()),
    }
}

/// Sends one channel from `reader` until the channel ends, then its `eof`. Each frame holds
/// what the ring has at that moment, however many reads of the pump it took (a terminal
/// gives at most 4 KiB per read), as the ring's own pieces: the writer gathers them into the
/// socket, so the agent never copies output on its way out.
async fn send_channel(out: &StreamOut, channel: Channel, mut reader: Reader) -> OpResult {
    loop {
        match reader.read_into(SEND_BYTES, |_| Vec::new()).await {
            Read::Data(pieces) => {
                let n = pieces.iter().map(Bytes::len).sum();
                out.data_parts(channel, pieces).await?;
                reader.advance(n);
            }
            Read::Dropped { from, to } => {
                out.control(Control::Dropped {
                    stream: out.id(),
                    channel,
                    from,
                    to,
                })
                .await?
            }
            Read::End => return out.eof(channel).await,
        }
    }
}

/// Bytes on their way to the process's input. `credit` is false for bytes the agent made
/// up (a PTY's end-of-file byte), which return no credit to the client.
struct Pending {
    bytes: Bytes,
    credit: bool,
}

/// Handles the client's side of an attached stream until it cancels or goes away: input to
/// the process (written as the process takes it, returning credit only then), half-close,
/// resizes and signals. Input keeps being accepted while a write waits, so a signal or a
/// cancel is never stuck behind a process that stopped reading.
async fn forward_input(input: &mut StreamIn, process: &Process, stdin: bool) {
    let mut sink = if stdin { process.input() } else { None };
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut eof = false;
    loop {
        let writing = sink.as_ref().zip(pending.front());
        tokio::select! {
            msg = input.recv() => match msg {
                None | Some(Inbound::Cancel) => return,
                Some(Inbound::Data(bytes)) => {
                    if sink.is_some() && !eof {
                        pending.push_back(Pending { bytes, credit: true });
                    } else {
                        input.consumed(bytes.len()).await;
                    }
                }
                Some(Inbound::Eof) if !eof => {
                    eof = true;
                    if process.pty && sink.is_some() {
                        pending.push_back(Pending {
                            bytes: Bytes::from_static(&[EOF_BYTE]),
                            credit: false,
                        });
                    }
                }
                Some(Inbound::Eof) => {}
                Some(Inbound::Resize { cols, rows }) => process.resize(cols, rows),
                Some(Inbound::Signal { signal, group }) => match signal::parse(&signal) {
                    Ok(sig) => process.signal(sig, group),
                    Err(e) => warn!("{} ignored a signal: {}", process.id, e.message),
                },
            },
            written = async {
                let (sink, front) = writing.expect("guarded by the branch condition");
                sink.write(&front.bytes).await
            }, if writing.is_some() => match written {
                Ok(n) => {
                    let front = pending.front_mut().expect("a write was pending");
                    front.bytes.advance(n);
                    if front.credit {
                        input.consumed(n).await;
                    }
                    if front.bytes.is_empty() {
                        pending.pop_front();
                    }
                }
                Err(_) => {
                    // The process closed its input (EPIPE) or it is gone: discard the rest.
                    let owed: usize = pending
                        .drain(..)
                        .filter(|p| p.credit)
                        .map(|p| p.bytes.len())
                        .sum();
                    input.consumed(owed).await;
                    sink = None;
                }
            },
        }
        if eof && pending.is_empty() && sink.take().is_some() {
            process.close_stdin();
        }
    }
}

/// `wait`: sends `exit` when the process ends.
async fn wait(ctx: StreamCtx, processes: &Processes, id: ProcessId) -> OpResult {
    let process = processes.get(id)?;
    let (out, mut input) = ctx.split();
    let until_cancelled = async {
        loop {
            match input.recv().await {
                None | Some(Inbound::Cancel) => return,
                Some(Inbound::Data(bytes)) => input.consumed(bytes.len()).await,
                Some(_) => {}
            }
        }
    };
    tokio::select! {
        status = process.wait() => {
            out.control(Control::Exit { stream: out.id(), status }).await?;
            processes.collect(&process);
            Ok(())
        }
        () = until_cancelled => Ok(()),
    }
}

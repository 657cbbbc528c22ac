//! A running remote process wired to this one, until it exits: its output to our stdout and
//! stderr (binary-safe, written as it arrives), our stdin to its stdin when asked (local
//! end-of-file closes it), the signals we receive (INT, TERM, HUP, QUIT, USR1, USR2)
//! forwarded to its process group, and, when it runs under a terminal, the window size
//! followed. We exit as it exits: its code, or 128 + the signal that ended it.

use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, Signal as SignalStream, SignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use tether_proto::control::ExitStatus;

use super::terminal;
use tether_client::{ClientError, Process, ProcessEvent, StreamSender};

/// Bytes read from stdin at a time.
const STDIN_CHUNK: usize = 64 * 1024; // 64 KiB
/// Chunks read ahead of the remote side's credit before the reader waits: 1 MiB in all.
const STDIN_QUEUE: usize = 16;
/// Interrupts (Ctrl-C without a terminal) after which `tether` stops waiting for a remote
/// command that ignores them, and kills it.
const INTERRUPTS_TO_ABANDON: u32 = 3;
/// How long a process under a terminal has to exit after a hangup we forwarded before the
/// session ends anyway (and kills it): the local terminal is likely gone.
const HANGUP_GRACE: Duration = Duration::from_secs(5);

/// What to connect besides stdout and stderr.
#[derive(Clone, Copy, Debug)]
pub(super) struct Wiring {
    /// Forward our stdin; the exec must have asked for stdin.
    pub stdin: bool,
    /// The process runs under a PTY: follow our terminal's size (SIGWINCH).
    pub pty: bool,
}

/// Carries the process's I/O until it exits, and returns how it ended. Dropping the
/// process on an early return kills it (it runs in the foreground).
pub(super) async fn wire(mut process: Process, wiring: Wiring) -> anyhow::Result<ExitStatus> {
    let sender = process.stream().sender();
    let _stdin = wiring
        .stdin
        .then(|| AbortOnDropHandle::new(tokio::spawn(forward_stdin(sender.clone(), read_stdin()))));
    let mut signals = Signals::new(wiring.pty)?;
    let mut interrupts = 0;
    let mut hung_up: Option<Instant> = None;
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    // Output goes straight to the descriptors from here on: whatever std still buffers goes
    // first.
    let _ = std::io::Write::flush(&mut stdout.lock());
    loop {
        tokio::select! {
            event = process.next() => {
                let written = match event {
                    Some(Ok(ProcessEvent::Stdout(bytes))) => write(stdout.as_fd(), &bytes),
                    Some(Ok(ProcessEvent::Stderr(bytes))) => write(stderr.as_fd(), &bytes),
                    Some(Ok(ProcessEvent::Dropped { .. })) => Ok(()),
                    Some(Ok(ProcessEvent::Exit(status))) => return Ok(status),
                    Some(Err(e)) => return Err(e.into()),
                    None => return Err(ClientError::Disconnected.into()),
                };
                match written {
                    Ok(()) => {}
                    // The reader went away (`tether exec ... | head`): end as a local
                    // command would, by SIGPIPE, and let the drop kill the remote one.
                    Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                        return Ok(signalled(Signal::SIGPIPE));
                    }
                    Err(e) => return Err(e).context("cannot write the command's output"),
                }
            }
            _ = sleep_until(hung_up) => return Ok(signalled(Signal::SIGHUP)),
            Some(sig) = signals.next() => match sig {
                Signal::SIGWINCH => {
                    let (cols, rows) = terminal::size_or_default();
                    sender.resize(cols, rows).await?;
                }
                // Under a PTY the keys carry INT and QUIT; a TERM sent to `tether` itself
                // ends the session, as it ends ssh: an interactive remote shell would ignore
                // it. The drop kills what runs.
                Signal::SIGTERM if wiring.pty => return Ok(signalled(Signal::SIGTERM)),
                // A hangup (most likely our terminal closed) reaches the remote side as its
                // own terminal's hangup would, so a shell or an editor ends as it should; one
                // that ignores it is killed after a grace period.
                Signal::SIGHUP if wiring.pty => {
                    hung_up.get_or_insert_with(|| Instant::now() + HANGUP_GRACE);
                    sender.signal(signal_name(Signal::SIGHUP), true).await?;
                }
                sig => {
                    if sig == Signal::SIGINT {
                        interrupts += 1;
                        if interrupts >= INTERRUPTS_TO_ABANDON {
                            eprintln!("tether: the command ignores interrupts; killing it");
                            return Ok(signalled(Signal::SIGINT));
                        }
                    }
                    sender.signal(signal_name(sig), true).await?;
                }
            },
        }
    }
}

/// Waits until `deadline`, forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Writes all of `bytes` to `fd` straight from the frame that carried them: no buffer in
/// between (std's stdout is line-buffered, which costs a scan and a second write for output
/// that does not end a line) and nothing held back. Waits when `fd` is non-blocking and full
/// (a descriptor shared with a parent that set O_NONBLOCK).
fn write(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match nix::unistd::write(fd, bytes) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn signalled(sig: Signal) -> ExitStatus {
    ExitStatus {
        signal: Some(sig as i32),
        ..ExitStatus::default()
    }
}

fn signal_name(sig: Signal) -> &'static str {
    sig.as_str().trim_start_matches("SIG")
}

/// Reads stdin on its own thread (a terminal or pipe cannot be read asynchronously without
/// making it non-blocking for every process sharing it), into a bounded queue.
fn read_stdin() -> mpsc::Receiver<std::io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel(STDIN_QUEUE);
    let reader = move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; STDIN_CHUNK];
        loop {
            let chunk = match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => Ok(Bytes::copy_from_slice(&buf[..n])),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let failed = chunk.is_err();
            if tx.blocking_send(chunk).is_err() || failed {
                return;
            }
        }
    };
    // The thread is never joined: it may sit in `read` until the process exits.
    if let Err(e) = std::thread::Builder::new()
        .name("stdin".into())
        .spawn(reader)
    {
        tracing::warn!("cannot start the stdin reader: {e}");
    }
    rx
}

/// Sends what stdin yields to the process, then end-of-file.
async fn forward_stdin(sender: StreamSender, mut chunks: mpsc::Receiver<std::io::Result<Bytes>>) {
    while let Some(chunk) = chunks.recv().await {
        match chunk {
            Ok(bytes) => {
                if sender.send(&bytes).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!("reading stdin failed: {e}; closing the command's stdin");
                break;
            }
        }
    }
    let _ = sender.eof().await;
}

/// The signals forwarded to the remote process, and SIGWINCH for a PTY.
struct Signals {
    interrupt: SignalStream,
    terminate: SignalStream,
    hangup: SignalStream,
    quit: SignalStream,
    user1: SignalStream,
    user2: SignalStream,
    window: Option<SignalStream>,
}

impl Signals {
    fn new(pty: bool) -> anyhow::Result<Signals> {
        let watch = |kind: SignalKind| signal(kind).context("cannot install a signal handler");
        Ok(Signals {
            interrupt: watch(SignalKind::interrupt())?,
            terminate: watch(SignalKind::terminate())?,
            hangup: watch(SignalKind::hangup())?,
            quit: watch(SignalKind::quit())?,
            user1: watch(SignalKind::user_defined1())?,
            user2: watch(SignalKind::user_defined2())?,
            window: pty
                .then(|| watch(SignalKind::window_change()))
                .transpose()?,
        })
    }

    /// The next signal received.
    async fn next(&mut self) -> Option<Signal> {
        let window = async {
            match &mut self.window {
                Some(w) => w.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(()) = self.interrupt.recv() => Some(Signal::SIGINT),
            Some(()) = self.terminate.recv() => Some(Signal::SIGTERM),
            Some(()) = self.hangup.recv() => Some(Signal::SIGHUP),
            Some(()) = self.quit.recv() => Some(Signal::SIGQUIT),
            Some(()) = self.user1.recv() => Some(Signal::SIGUSR1),
            Some(()) = self.user2.recv() => Some(Signal::SIGUSR2),
            Some(()) = window => Some(Signal::SIGWINCH),
            else => None,
        }
    }
}

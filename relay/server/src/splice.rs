//! The spliced data path: once the client's and the agent's upgrades are done, the two
//! connections carry one WebSocket session end to end, and the relay copies bytes between
//! them without reading a frame. The client's frames are masked, as the agent expects of a
//! client; the agent's are not, as the client expects of a server.
//!
//! Between two plain sockets (a client's TCP connection, a local agent's Unix socket or a
//! container's TCP connection) the bytes move by `splice(2)` through a pipe, never entering
//! the relay's memory; otherwise (TLS on either side, a provider edge's stream) they are
//! copied through a buffer. Pipes and buffers are held only while bytes flow and go back to
//! a small shared pool when a direction goes quiet, so an idle tunnel holds neither: two
//! sockets and one task.
//!
//! Liveness is judged by bytes: a side from which nothing arrives for the peer timeout while
//! the relay waits for it is taken for dead. The endpoints keep a live session audible: the
//! agent pings every 15 s and the client answers; a client that announced it pings when asked
//! (`x-tether-ping-interval`) pings as often as the relay's `101` asks, and the agent answers.
//! A direction whose sink is slow is not silent: the clock runs only while the relay waits to
//! read.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use nix::sys::socket::{shutdown, Shutdown};
use tokio::io::{AsyncRead, AsyncWriteExt, Interest, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::constants::{CLOSE_GRACE, COPY_BUFFER, IDLE_BUFFERS, IDLE_PIPES, PIPE_BYTES};
use tether_relay_core::provider::upgrade::AgentConn;
use tether_relay_core::provider::AgentIo;

/// One side of a spliced tunnel.
pub(super) enum Conn {
    /// A plain socket, which `splice(2)` can move bytes to and from.
    Raw(Raw),
    /// Anything else.
    Stream(Pin<Box<dyn AgentIo>>),
}

impl From<AgentConn> for Conn {
    fn from(conn: AgentConn) -> Conn {
        match conn {
            AgentConn::Unix(unix) => Conn::Raw(Raw::Unix(unix)),
            AgentConn::Tcp(tcp) => Conn::Raw(Raw::Tcp(tcp)),
            AgentConn::Other(io) => Conn::Stream(io),
        }
    }
}

impl Conn {
    fn boxed(self) -> Pin<Box<dyn AgentIo>> {
        match self {
            Conn::Raw(Raw::Tcp(tcp)) => Box::pin(tcp),
            Conn::Raw(Raw::Unix(unix)) => Box::pin(unix),
            Conn::Stream(io) => io,
        }
    }
}

/// A plain socket.
pub(super) enum Raw {
    /// TCP.
    Tcp(TcpStream),
    /// A Unix stream socket.
    Unix(UnixStream),
}

impl Raw {
    async fn ready(&self, interest: Interest) -> io::Result<()> {
        match self {
            Raw::Tcp(s) => s.ready(interest).await.map(drop),
            Raw::Unix(s) => s.ready(interest).await.map(drop),
        }
    }

    /// Runs `f` if the socket is ready for `interest`, clearing the readiness when it would
    /// block.
    fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        match self {
            Raw::Tcp(s) => s.try_io(interest, f),
            Raw::Unix(s) => s.try_io(interest, f),
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Raw::Tcp(s) => s.as_fd(),
            Raw::Unix(s) => s.as_fd(),
        }
    }

    /// Passes on the end of what the other side sends (a TCP FIN).
    fn shutdown_write(&self) {
        let _ = shutdown(self.fd().as_raw_fd(), Shutdown::Write);
    }

    /// Writes all of `bytes`, waiting as long as the socket takes.
    async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            self.ready(Interest::WRITABLE).await?;
            match self.try_io(Interest::WRITABLE, || write_fd(self.fd(), bytes)) {
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn write_fd(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<usize> {
    nix::unistd::write(fd, bytes).map_err(io::Error::from)
}

fn read_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    nix::unistd::read(fd.as_raw_fd(), buf).map_err(io::Error::from)
}

/// How a tunnel ended, and what it carried.
#[derive(Debug, Default)]
pub(super) struct Spliced {
    /// Bytes from the client to the agent.
    pub up: u64,
    /// Bytes from the agent to the client.
    pub down: u64,
    /// How it ended.
    pub end: End,
}

/// Why a tunnel ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// Both sides finished (or one did and the other followed within the grace).
    #[default]
    Finished,
    /// The client sent nothing for the peer timeout.
    ClientSilent,
    /// The agent sent nothing for the peer timeout.
    AgentSilent,
    /// A connection failed (reset, or an error).
    Broken,
    /// The relay shuts down.
    Shutdown,
}

/// How one direction ended.
enum Flow {
    /// Its source ended; the end was passed on.
    Eof,
    /// Its source was silent for the peer timeout.
    Silent,
    /// A socket failed.
    Failed,
}

/// Copies between `client` and `agent` (after each side's bytes already read, `client_early`
/// and `agent_early`) until both have ended, either is silent for `peer_timeout`, a
/// connection fails, or `shutdown` fires. Dropping both connections then closes them.
pub(super) async fn run(
    client: Conn,
    client_early: Bytes,
    agent: Conn,
    agent_early: Bytes,
    peer_timeout: Duration,
    shutdown: &CancellationToken,
) -> Spliced {
    let mut up = 0u64;
    let mut down = 0u64;
    let end = match (client, agent) {
        (Conn::Raw(client), Conn::Raw(agent)) => {
            let upward = pump_raw(&client, &agent, client_early, peer_timeout, &mut up);
            let downward = pump_raw(&agent, &client, agent_early, peer_timeout, &mut down);
            both(upward, downward, shutdown).await
        }
        (client, agent) => {
            let (mut client_rx, mut client_tx) = tokio::io::split(client.boxed());
            let (mut agent_rx, mut agent_tx) = tokio::io::split(agent.boxed());
            let upward = pump_stream(
                &mut client_rx,
                &mut agent_tx,
                client_early,
                peer_timeout,
                &mut up,
            );
            let downward = pump_stream(
                &mut agent_rx,
                &mut client_tx,
                agent_early,
                peer_timeout,
                &mut down,
            );
            both(upward, downward, shutdown).await
        }
    };
    Spliced { up, down, end }
}

/// Runs both directions: when one ends by its source's end, the other gets [`CLOSE_GRACE`] to
/// end too; any other end ends both.
async fn both(
    upward: impl Future<Output = Flow> + Send,
    downward: impl Future<Output = Flow> + Send,
    shutdown: &CancellationToken,
) -> End {
    tokio::pin!(upward, downward);
    // Which direction is left once the other has ended, and what its silence means.
    let (rest, silent): (Pin<&mut (dyn Future<Output = Flow> + Send)>, End) = tokio::select! {
        flow = &mut upward => match flow {
            Flow::Eof => (downward, End::AgentSilent),
            Flow::Silent => return End::ClientSilent,
            Flow::Failed => return End::Broken,
        },
        flow = &mut downward => match flow {
            Flow::Eof => (upward, End::ClientSilent),
            Flow::Silent => return End::AgentSilent,
            Flow::Failed => return End::Broken,
        },
        () = shutdown.cancelled() => return End::Shutdown,
    };
    tokio::select! {
        flow = tokio::time::timeout(CLOSE_GRACE, rest) => match flow {
            Ok(Flow::Eof) | Err(_) => End::Finished,
            Ok(Flow::Silent) => silent,
            Ok(Flow::Failed) => End::Broken,
        },
        () = shutdown.cancelled() => End::Shutdown,
    }
}

/// Moves bytes from `from` to `to` (after `early`), through a pipe when one can be had and a
/// buffer otherwise, counting them into `moved`.
async fn pump_raw(
    from: &Raw,
    to: &Raw,
    early: Bytes,
    peer_timeout: Duration,
    moved: &mut u64,
) -> Flow {
    // Written, then let go: it may pin the whole read buffer of the upgrade it came with.
    if to.write_all(&early).await.is_err() {
        return Flow::Failed;
    }
    drop(early);
    let mut heard = Instant::now();
    loop {
        // The only wait on the source, and so the only one the silence clock runs in.
        match tokio::time::timeout_at(heard + peer_timeout, from.ready(Interest::READABLE)).await {
            Err(_) => return Flow::Silent,
            Ok(Err(_)) => return Flow::Failed,
            Ok(Ok(())) => {}
        }
        let burst = match Pipe::take() {
            Some(mut pipe) => {
                let burst = splice_burst(from, to, &mut pipe, moved).await;
                pipe.give_back();
                burst
            }
            // No descriptor for a pipe: the same through a buffer.
            None => {
                let mut buf = Buffer::take();
                let burst = copy_burst(from, to, &mut buf, moved).await;
                buf.give_back();
                burst
            }
        };
        match burst {
            Burst::Drained { heard: true } => heard = Instant::now(),
            Burst::Drained { heard: false } => {}
            Burst::Eof => {
                to.shutdown_write();
                return Flow::Eof;
            }
            Burst::Failed => return Flow::Failed,
        }
    }
}

/// What one burst of a raw pump did.
enum Burst {
    /// The source has nothing more for now; `heard` if it gave anything.
    Drained { heard: bool },
    /// The source ended.
    Eof,
    /// A socket failed.
    Failed,
}

/// Splices what `from` has into `pipe` and on to `to`, until `from` would block. A pipe left
/// holding bytes (the sink failed) says so, and is never used again.
async fn splice_burst(from: &Raw, to: &Raw, pipe: &mut Pipe, moved: &mut u64) -> Burst {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    let mut heard = false;
    loop {
        let filled = from.try_io(Interest::READABLE, || {
            splice(from.fd(), None, &pipe.write, None, pipe.size, flags).map_err(io::Error::from)
        });
        match filled {
            Ok(0) => return Burst::Eof,
            Ok(n) => pipe.held = n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Burst::Drained { heard },
            Err(_) => return Burst::Failed,
        };
        heard = true;
        *moved += pipe.held as u64;
        while pipe.held > 0 {
            if to.ready(Interest::WRITABLE).await.is_err() {
                return Burst::Failed;
            }
            let drained = to.try_io(Interest::WRITABLE, || {
                splice(&pipe.read, None, to.fd(), None, pipe.held, flags).map_err(io::Error::from)
            });
            match drained {
                Ok(n) => pipe.held -= n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Burst::Failed,
            }
        }
    }
}

/// Reads what `from` has into `buf` and writes it to `to`, until `from` would block.
async fn copy_burst(from: &Raw, to: &Raw, buf: &mut Buffer, moved: &mut u64) -> Burst {
    let mut heard = false;
    loop {
        let n = match from.try_io(Interest::READABLE, || read_fd(from.fd(), buf.bytes())) {
            Ok(0) => return Burst::Eof,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Burst::Drained { heard },
            Err(_) => return Burst::Failed,
        };
        heard = true;
        *moved += n as u64;
        if to.write_all(&buf.bytes()[..n]).await.is_err() {
            return Burst::Failed;
        }
    }
}

/// Moves bytes from `from` to `to` (after `early`) through a buffer held only while a read
/// has something, counting them into `moved`.
async fn pump_stream(
    from: &mut ReadHalf<Pin<Box<dyn AgentIo>>>,
    to: &mut WriteHalf<Pin<Box<dyn AgentIo>>>,
    early: Bytes,
    peer_timeout: Duration,
    moved: &mut u64,
) -> Flow {
    if to.write_all(&early).await.is_err() {
        return Flow::Failed;
    }
    drop(early);
    let mut heard = Instant::now();
    loop {
        let read = match tokio::time::timeout_at(heard + peer_timeout, read_pooled(from)).await {
            Err(_) => return Flow::Silent,
            Ok(Err(_)) => return Flow::Failed,
            Ok(Ok(read)) => read,
        };
        let (buf, n) = read;
        if n == 0 {
            buf.give_back();
            let _ = to.shutdown().await;
            return Flow::Eof;
        }
        heard = Instant::now();
        *moved += n as u64;
        let written = to.write_all(buf.filled(n)).await;
        buf.give_back();
        if written.is_err() {
            return Flow::Failed;
        }
    }
}

/// Reads into a pooled buffer, taken for each poll and given back when the read must wait,
/// so a stream with nothing to read holds none.
async fn read_pooled<R: AsyncRead + Unpin>(from: &mut R) -> io::Result<(Buffer, usize)> {
    std::future::poll_fn(|cx| {
        let mut buf = Buffer::take();
        let mut read = ReadBuf::new(buf.bytes());
        match Pin::new(&mut *from).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) => {
                let n = read.filled().len();
                Poll::Ready(Ok((buf, n)))
            }
            Poll::Ready(Err(e)) => {
                buf.give_back();
                Poll::Ready(Err(e))
            }
            Poll::Pending => {
                buf.give_back();
                Poll::Pending
            }
        }
    })
    .await
}

/// Idle pipes, for the next direction that has bytes to move.
static PIPES: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());
/// Idle copy buffers, likewise.
static BUFFERS: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());

/// A pipe, empty whenever it is idle.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Its capacity, in bytes.
    size: usize,
    /// Bytes in it, on their way to a sink. A pipe is pooled only when this is 0: a pipe
    /// still holding one tunnel's bytes must never pass them to the next tunnel.
    held: usize,
}

impl Pipe {
    /// An idle pipe, or a new one; `None` when no descriptor is left for one.
    fn take() -> Option<Pipe> {
        if let Some(pipe) = lock(&PIPES).pop() {
            return Some(pipe);
        }
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).ok()?;
        // A larger pipe moves more per pair of calls; refused (past the unprivileged limit of
        // pipe memory, `/proc/sys/fs/pipe-user-pages-soft`), it keeps the default 64 KiB.
        let size = fcntl(write.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(PIPE_BYTES as i32))
            .or_else(|_| fcntl(write.as_raw_fd(), FcntlArg::F_GETPIPE_SZ))
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(64 << 10);
        Some(Pipe {
            read,
            write,
            size,
            held: 0,
        })
    }

    /// Keeps an empty pipe for the next burst, unless enough are idle already; one that still
    /// holds bytes is closed.
    fn give_back(self) {
        if self.held > 0 {
            return;
        }
        let mut idle = lock(&PIPES);
        if idle.len() < IDLE_PIPES {
            idle.push(self);
        }
    }
}

/// A copy buffer, zeroed once when first made.
struct Buffer(Box<[u8]>);

impl Buffer {
    fn take() -> Buffer {
        Buffer(
            lock(&BUFFERS)
                .pop()
                .unwrap_or_else(|| vec![0u8; COPY_BUFFER].into_boxed_slice()),
        )
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.0
    }

    fn filled(&self, n: usize) -> &[u8] {
        &self.0[..n]
    }

    fn give_back(self) {
        let mut idle = lock(&BUFFERS);
        if idle.len() < IDLE_BUFFERS {
            idle.push(self.0);
        }
    }
}

fn lock<T>(pool: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A pool is consistent after every push and pop, so a poisoned lock is safe to use.
    pool.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_that_still_holds_bytes_is_never_pooled() {
        let mut dirty = Pipe::take().unwrap();
        let n = nix::unistd::write(&dirty.write, b"another tunnel's bytes").unwrap();
        dirty.held = n;
        dirty.give_back();
        // Every pooled pipe (other tests may pool theirs meanwhile) is empty.
        let mut taken = Vec::new();
        while let Some(pipe) = lock(&PIPES).pop() {
            let mut buf = [0u8; 64];
            let read = nix::unistd::read(pipe.read.as_raw_fd(), &mut buf);
            assert_eq!(
                read,
                Err(nix::errno::Errno::EAGAIN),
                "a pooled pipe held bytes"
            );
            taken.push(pipe);
        }
        for pipe in taken {
            pipe.give_back();
        }
    }
}

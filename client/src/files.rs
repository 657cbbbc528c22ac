//! File operations, transfers, watches and port connections on a [`Session`].

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use tether_proto::frame;
use tether_proto::limits::{BULK_CHUNK, DATA_CHUNK};
use tether_proto::op::{
    AgentInfo, FileStat, GrepMatch, GrepSpec, ListeningPort, Op, Reply, WatchEvent, WriteSpec,
};
use tether_proto::{Channel, WirePath};

use super::process::unexpected;
use super::session::{Event, RawStream, Session, StreamSender};
use super::ClientError;

impl Session {
    /// A path's metadata (symlinks not followed).
    pub async fn stat(&self, path: impl Into<WirePath>) -> Result<FileStat, ClientError> {
        match self.request(Op::Stat { path: path.into() }).await? {
            Reply::Stat(s) => Ok(s),
            other => Err(unexpected(&other)),
        }
    }

    /// A directory's entries, `depth` levels deep.
    pub async fn list(
        &self,
        path: impl Into<WirePath>,
        depth: u32,
    ) -> Result<Vec<FileStat>, ClientError> {
        match self
            .request(Op::List {
                path: path.into(),
                depth,
            })
            .await?
        {
            Reply::Entries { entries } => Ok(entries),
            other => Err(unexpected(&other)),
        }
    }

    /// `mkdir -p`.
    pub async fn mkdir(&self, path: impl Into<WirePath>) -> Result<(), ClientError> {
        self.request(Op::Mkdir {
            path: path.into(),
            mode: None,
        })
        .await
        .map(drop)
    }

    /// Removes a file or (with `recursive`) a directory tree.
    pub async fn remove(
        &self,
        path: impl Into<WirePath>,
        recursive: bool,
    ) -> Result<(), ClientError> {
        self.request(Op::Remove {
            path: path.into(),
            recursive,
        })
        .await
        .map(drop)
    }

    /// Renames `from` to `to`.
    pub async fn rename(
        &self,
        from: impl Into<WirePath>,
        to: impl Into<WirePath>,
        overwrite: bool,
    ) -> Result<(), ClientError> {
        let op = Op::Rename {
            from: from.into(),
            to: to.into(),
            overwrite,
        };
        self.request(op).await.map(drop)
    }

    /// Changes permission bits.
    pub async fn chmod(&self, path: impl Into<WirePath>, mode: u32) -> Result<(), ClientError> {
        self.request(Op::Chmod {
            path: path.into(),
            mode,
        })
        .await
        .map(drop)
    }

    /// Paths under `root` matching `pattern`, and whether the limit cut the list.
    pub async fn glob(
        &self,
        root: impl Into<WirePath>,
        pattern: &str,
    ) -> Result<(Vec<WirePath>, bool), ClientError> {
        let op = Op::Glob {
            root: root.into(),
            pattern: pattern.into(),
            limit: None,
        };
        match self.request(op).await? {
            Reply::Paths { paths, truncated } => Ok((paths, truncated)),
            other => Err(unexpected(&other)),
        }
    }

    /// Matching lines, and whether the limit cut the list.
    pub async fn grep(&self, spec: GrepSpec) -> Result<(Vec<GrepMatch>, bool), ClientError> {
        match self.request(Op::Grep(spec)).await? {
            Reply::Matches { matches, truncated } => Ok((matches, truncated)),
            other => Err(unexpected(&other)),
        }
    }

    /// Replaces `old` by `new` in a file; returns the number of replacements.
    pub async fn edit(
        &self,
        path: impl Into<WirePath>,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<u64, ClientError> {
        let op = Op::Edit {
            path: path.into(),
            old: old.into(),
            new: new.into(),
            replace_all,
        };
        match self.request(op).await? {
            Reply::Edited { replacements } => Ok(replacements),
            other => Err(unexpected(&other)),
        }
    }

    /// Facts about the agent.
    pub async fn info(&self) -> Result<AgentInfo, ClientError> {
        match self.request(Op::Info).await? {
            Reply::Info(i) => Ok(i),
            other => Err(unexpected(&other)),
        }
    }

    /// TCP ports listening inside the sandbox.
    pub async fn ports(&self) -> Result<Vec<ListeningPort>, ClientError> {
        match self.request(Op::Ports).await? {
            Reply::Ports { ports } => Ok(ports),
            other => Err(unexpected(&other)),
        }
    }

    /// Reads a whole file into memory.
    pub async fn read_file(&self, path: impl Into<WirePath>) -> Result<Vec<u8>, ClientError> {
        let mut buf = Vec::new();
        let op = Op::Read {
            path: path.into(),
            offset: 0,
            len: None,
        };
        self.download(op, &mut buf, |_| {}).await?;
        Ok(buf)
    }

    /// Writes a whole file atomically (replacing it), creating parent directories.
    pub async fn write_file(
        &self,
        path: impl Into<WirePath>,
        data: &[u8],
    ) -> Result<u64, ClientError> {
        let spec = WriteSpec {
            path: path.into(),
            mode: None,
            create_parents: true,
            if_exists: Default::default(),
        };
        match self.upload(Op::Write(spec), data, |_| {}).await? {
            Reply::Written { bytes } => Ok(bytes),
            other => Err(unexpected(&other)),
        }
    }

    /// Runs a download operation (`read`, `tar_read`, `read_batch`), copying its `out`
    /// bytes into `sink`; `progress` gets the running byte count. Returns the bytes copied.
    pub async fn download<W: AsyncWrite + Unpin>(
        &self,
        op: Op,
        mut sink: W,
        mut progress: impl FnMut(u64),
    ) -> Result<u64, ClientError> {
        let mut stream = self.open(op).await?;
        let mut total = 0u64;
        while let Some(ev) = stream.next().await {
            match ev {
                Event::Data(Channel::Out, bytes) => {
                    sink.write_all(&bytes).await.map_err(local)?;
                    total += bytes.len() as u64;
                    progress(total);
                }
                Event::Error(e) => return Err(e),
                Event::Closed => {
                    sink.flush().await.map_err(local)?;
                    return Ok(total);
                }
                _ => {}
            }
        }
        Err(ClientError::Disconnected)
    }

    /// Runs an upload operation (`write`, `tar_write`, `write_batch`), streaming `source`
    /// on `in`; `progress` gets the running byte count. Returns the agent's reply.
    pub async fn upload<R: AsyncRead + Unpin>(
        &self,
        op: Op,
        source: R,
        progress: impl FnMut(u64),
    ) -> Result<Reply, ClientError> {
        let mut stream = self.open(op).await?;
        let pump = pump_in(stream.sender(), source, progress);
        // Watch for an early error (e.g. already_exists) while sending.
        let mut reply = None;
        tokio::pin!(pump);
        let mut sent = false;
        loop {
            tokio::select! {
                r = &mut pump, if !sent => {
                    r?;
                    sent = true;
                }
                ev = stream.next() => match ev {
                    Some(Event::Reply(r)) => reply = Some(r),
                    Some(Event::Error(e)) => return Err(e),
                    Some(Event::Closed) | None => break,
                    Some(_) => {}
                },
            }
        }
        reply.ok_or(ClientError::Disconnected)
    }

    /// Starts watching a directory; read events with [`Watch::next`].
    pub async fn watch(
        &self,
        path: impl Into<WirePath>,
        recursive: bool,
    ) -> Result<Watch, ClientError> {
        let op = Op::Watch {
            path: path.into(),
            recursive,
        };
        let mut stream = self.open(op).await?;
        // The agent replies `ok` once its watches are armed; return only then, so no change
        // made after this call can be missed.
        loop {
            match stream.next().await {
                Some(Event::Reply(_)) => return Ok(Watch { stream }),
                Some(Event::Error(e)) => return Err(e),
                Some(Event::Closed) | None => return Err(ClientError::Disconnected),
                Some(_) => {}
            }
        }
    }

    /// Opens a TCP connection to `port` inside the sandbox.
    pub async fn connect_port(&self, port: u16) -> Result<RawStream, ClientError> {
        self.open(Op::Connect { port, host: None }).await
    }
}

/// Sends everything `source` yields on the stream's `in` channel, then eof. Each read goes
/// straight into the data frame that carries it ([`frame::data_buffer`]), so the bytes are
/// not copied again on their way to the socket.
async fn pump_in<R: AsyncRead + Unpin>(
    stream: StreamSender,
    mut source: R,
    mut progress: impl FnMut(u64),
) -> Result<(), ClientError> {
    let mut total = 0u64;
    loop {
        let mut buf = frame::data_buffer(BULK_CHUNK);
        // What one read gives goes out at once: a source that trickles (a pipe, a tar
        // being packed) is not held back to fill the frame.
        let n = source.read_buf(&mut buf).await.map_err(local)?;
        if n == 0 {
            return stream.eof().await;
        }
        stream.send_in_place(buf).await?;
        total += n as u64;
        progress(total);
    }
}

/// Carries bytes between a local socket and a `connect` stream until both sides are done.
pub async fn splice<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: RawStream,
    socket: S,
) -> Result<(), ClientError> {
    let (mut rd, mut wr) = tokio::io::split(socket);
    let mut buf = vec![0u8; DATA_CHUNK];
    let mut local_open = true;
    loop {
        tokio::select! {
            n = rd.read(&mut buf), if local_open => {
                match n {
                    Ok(0) | Err(_) => {
                        local_open = false;
                        stream.eof().await?;
                    }
                    Ok(n) => stream.send(&buf[..n]).await?,
                }
            }
            ev = stream.next() => match ev {
                Some(Event::Data(_, bytes)) => wr.write_all(&bytes).await.map_err(local)?,
                Some(Event::Eof(_)) => { let _ = wr.shutdown().await; }
                Some(Event::Error(e)) => return Err(e),
                Some(Event::Closed) | None => return Ok(()),
                Some(_) => {}
            },
        }
    }
}

/// A directory watch.
#[derive(Debug)]
pub struct Watch {
    stream: RawStream,
}

impl Watch {
    /// The next change; `None` when the watch ended.
    pub async fn next(&mut self) -> Option<Result<WatchEvent, ClientError>> {
        loop {
            match self.stream.next().await? {
                Event::Watch(ev) => return Some(Ok(ev)),
                Event::Error(e) => return Some(Err(e)),
                Event::Closed => return None,
                _ => {}
            }
        }
    }
}

fn local(e: std::io::Error) -> ClientError {
    ClientError::Local(e.to_string())
}

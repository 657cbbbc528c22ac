//! The floors: what this machine does with nothing of Tether in the way, measured in the
//! same run as the figures so each figure can be read as a ratio to its floor. Spawning a
//! process, a loopback WebSocket round trip between two threads, echo through a local PTY,
//! the throughput of a local PTY and a local pipe fed by the same writer the figures use,
//! and writing a new file into a memory file system, as both ends of a transfer do.
//!
//! Everything here blocks (it measures the kernel, not a runtime), so each floor runs on a
//! blocking thread.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use super::pty::{KEYSTROKES, KEYSTROKE_WARMUP};
use super::sizes::writer;
use super::stats::{time, Latency, Throughput};

/// The size of a keystroke's data frame (header and one byte), sent in the WebSocket floor.
const KEYSTROKE_FRAME: usize = 7;

/// Kernel buffer of the floor's pipe: 1 MiB, as the agent sizes its output pipes.
const PIPE_BYTES: i32 = 1 << 20;

/// Bytes read from a pipe or PTY at once: 1 MiB.
const READ_BYTES: usize = 1 << 20;

/// Bytes per write of the memory file floor: 64 KiB, a data frame's payload, which is what
/// the agent writes an upload in.
const WRITE_BYTES: usize = 64 << 10;

/// How a hangup of the local PTY is confirmed, as the agent confirms one (its
/// `output::pump`): read again once, and when the last read was full (a terminal's line
/// discipline gives at most 4 KiB less one byte per read while its writer streams), this
/// many more times, this far apart.
const TERMINAL_READ_BYTES: usize = (4 << 10) - 1;
const HANGUP_RETRIES: u32 = 5;
const HANGUP_RETRY_EVERY: Duration = Duration::from_millis(1);

/// Spawning and reaping `true`, `n` times.
pub(super) async fn spawn(n: usize) -> anyhow::Result<Latency> {
    blocking(move || {
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let (status, took) = time(|| Command::new("true").status());
            anyhow::ensure!(
                status.context("cannot run `true`")?.success(),
                "`true` failed"
            );
            samples.push(took);
        }
        Ok(samples)
    })
    .await
    .and_then(summary)
}

/// A small binary message to a WebSocket echo server on another thread and back, `n` times.
pub(super) async fn ws_round_trip(n: usize) -> anyhow::Result<Latency> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot listen on loopback")?;
    let addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let server = std::thread::spawn(move || -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let (tcp, _) = listener.accept().await?;
            tcp.set_nodelay(true)?;
            let mut ws = tokio_tungstenite::accept_async(tcp).await?;
            while let Some(Ok(msg)) = ws.next().await {
                if msg.is_binary() {
                    ws.send(msg).await?;
                }
            }
            Ok(())
        })
    });
    let url = format!("ws://{addr}/");
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true)
        .await
        .context("cannot connect to the loopback WebSocket")?;
    let payload = Bytes::from(vec![b'a'; KEYSTROKE_FRAME]);
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + KEYSTROKE_WARMUP {
        let start = Instant::now();
        ws.send(Message::Binary(payload.clone())).await?;
        loop {
            match ws.next().await {
                Some(Ok(Message::Binary(_))) => break,
                Some(Ok(_)) => continue,
                _ => anyhow::bail!("the loopback WebSocket closed"),
            }
        }
        if i >= KEYSTROKE_WARMUP {
            samples.push(start.elapsed());
        }
    }
    let _ = ws.close(None).await;
    let served = tokio::task::spawn_blocking(move || server.join()).await?;
    served.map_err(|_| anyhow::anyhow!("the WebSocket echo thread panicked"))??;
    summary(samples)
}

/// Typing into a local PTY running `cat` with echo on and reading the echo back, `n` times.
pub(super) async fn pty_echo(n: usize) -> anyhow::Result<Latency> {
    blocking(move || {
        let (master, mut child) = under_pty(&["cat".into()])?;
        let mut master = File::from(master);
        let mut buf = [0u8; 64];
        let mut samples = Vec::with_capacity(n);
        for (i, (key, echo_len)) in KEYSTROKES
            .iter()
            .cycle()
            .take(n + KEYSTROKE_WARMUP)
            .enumerate()
        {
            let start = Instant::now();
            master.write_all(&[*key])?;
            let mut got = 0;
            while got < *echo_len {
                got += master.read(&mut buf)?;
            }
            if i >= KEYSTROKE_WARMUP {
                samples.push(start.elapsed());
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        Ok(samples)
    })
    .await
    .and_then(summary)
}

/// Reading the output of [`writer`] from a local PTY, `runs` times.
pub(super) async fn pty_throughput(bytes: u64, runs: usize) -> anyhow::Result<Throughput> {
    let times = blocking(move || {
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = Instant::now();
            let (master, mut child) = under_pty(&writer(bytes))?;
            let got = drain(File::from(master))?;
            child.wait()?;
            times.push(start.elapsed());
            anyhow::ensure!(got == bytes, "read {got} of {bytes} bytes from the PTY");
        }
        Ok(times)
    })
    .await?;
    Throughput::of(bytes, &times).context("no runs")
}

/// Reading the output of [`writer`] from a local pipe, `runs` times.
pub(super) async fn pipe_throughput(bytes: u64, runs: usize) -> anyhow::Result<Throughput> {
    let times = blocking(move || {
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = Instant::now();
            let argv = writer(bytes);
            let mut child = Command::new(&argv[0])
                .args(&argv[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .context("cannot run dd")?;
            let stdout = child.stdout.take().context("no stdout")?;
            let _ = nix::fcntl::fcntl(
                stdout.as_raw_fd(),
                nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES),
            );
            let got = drain(stdout)?;
            child.wait()?;
            times.push(start.elapsed());
            anyhow::ensure!(got == bytes, "read {got} of {bytes} bytes from the pipe");
        }
        Ok(times)
    })
    .await?;
    Throughput::of(bytes, &times).context("no runs")
}

/// Writing a new `bytes`-byte file into a memory file system in [`WRITE_BYTES`] writes, `runs`
/// times. The kernel's copy into fresh pages, which it must also zero, bounds an upload
/// (written into the sandbox's `/tmp`) and a download (written into `/dev/shm` here) however
/// fast the network is.
pub(super) async fn tmpfs_write(bytes: u64, runs: usize) -> anyhow::Result<Throughput> {
    let times = blocking(move || {
        let base = super::transfer::tmpfs_dir();
        let dir = tempfile::Builder::new()
            .prefix("tether-bench-")
            .tempdir_in(&base)
            .with_context(|| format!("cannot create a directory in {}", base.display()))?;
        let path = dir.path().join("floor.bin");
        let block = vec![0x5au8; WRITE_BYTES];
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = Instant::now();
            let mut file = File::create(&path)?;
            let mut left = bytes;
            while left > 0 {
                let n = left.min(WRITE_BYTES as u64) as usize;
                file.write_all(&block[..n])?;
                left -= n as u64;
            }
            drop(file);
            times.push(start.elapsed());
            std::fs::remove_file(&path)?;
        }
        Ok(times)
    })
    .await?;
    Throughput::of(bytes, &times).context("no runs")
}

/// Starts `argv` with a new PTY as its standard streams; returns the master.
fn under_pty(argv: &[String]) -> anyhow::Result<(OwnedFd, Child)> {
    let pty = nix::pty::openpty(None, None).context("cannot open a PTY")?;
    let child = {
        // The command owns the slave's copies; it is dropped right after the spawn, so the
        // child holds the only ones and its exit ends the master's output.
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(pty.slave.try_clone()?)
            .stdout(pty.slave.try_clone()?)
            .stderr(pty.slave);
        cmd.spawn()
            .with_context(|| format!("cannot run {}", argv[0]))?
    };
    Ok((pty.master, child))
}

/// Reads `source` to its end (EIO, for a PTY whose writers are gone); returns the bytes read.
fn drain(mut source: impl Read) -> anyhow::Result<u64> {
    let mut buf = vec![0u8; READ_BYTES];
    let mut total = 0u64;
    let mut full_read = false;
    let mut hangups = 0;
    loop {
        match source.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => {
                total += n as u64;
                full_read = n >= TERMINAL_READ_BYTES;
                hangups = 0;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // A PTY master reports that every slave is closed as EIO, possibly before the
            // last bytes are readable: confirmed as the agent confirms it (its
            // `output::pump`), so the floor and the figure end a terminal alike.
            Err(e) if e.raw_os_error() == Some(nix::libc::EIO) => {
                let reads = if full_read { 1 + HANGUP_RETRIES } else { 1 };
                if hangups >= reads {
                    return Ok(total);
                }
                if hangups > 0 {
                    std::thread::sleep(HANGUP_RETRY_EVERY);
                }
                hangups += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("a measuring thread panicked")?
}

fn summary(samples: Vec<Duration>) -> anyhow::Result<Latency> {
    Latency::of(samples).context("no samples")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_floor_measures_something() {
        assert_eq!(spawn(3).await.unwrap().samples, 3);
        assert_eq!(ws_round_trip(5).await.unwrap().samples, 5);
        assert_eq!(pty_echo(4).await.unwrap().samples, 4);
        let pty = pty_throughput(1 << 20, 1).await.unwrap();
        assert!(pty.median > 0.0 && pty.bytes == 1 << 20);
        let pipe = pipe_throughput(4 << 20, 2).await.unwrap();
        assert_eq!(pipe.runs, 2);
        let tmpfs = tmpfs_write(4 << 20, 2).await.unwrap();
        assert!(tmpfs.median > 0.0 && tmpfs.runs == 2);
    }
}

//! Terminal and output figures through a sandbox: keystroke echo through a PTY, and how fast
//! a process's stdout arrives, piped and through a PTY.
//!
//! A keystroke is what a user feels: one byte typed into a PTY whose line discipline echoes
//! it (a PTY running `cat` with echo on, as a shell's line editor would), timed until the
//! echo is back. Keys alternate between a letter and an erase, so the line never grows.

use std::time::Instant;

use anyhow::Context;
use tether_proto::op::{ExecSpec, PtySpec};

use super::sizes::writer;
use super::stats::{Latency, Throughput};
use tether_client::{Process, ProcessEvent, Session};

/// The keys typed, each with the length of its echo: a letter echoes as itself, an erase
/// (DEL, the default VERASE) as backspace-space-backspace.
pub(super) const KEYSTROKES: [(u8, usize); 2] = [(b'a', 1), (0x7f, 3)];

/// Keystrokes typed before timing starts: the first ones fault in pages and warm caches.
pub(super) const KEYSTROKE_WARMUP: usize = 10;

/// Size of the benchmark's terminals.
const COLS: u16 = 80;
const ROWS: u16 = 24;

/// An exec of `cat` under a PTY, taking input: a terminal that echoes what is typed.
pub(super) fn echo_terminal() -> ExecSpec {
    let mut spec = ExecSpec::argv(["cat"]);
    spec.stdin = true;
    spec.pty = Some(PtySpec {
        cols: COLS,
        rows: ROWS,
        term: None,
    });
    spec
}

/// Types `n` keystrokes into a fresh echo terminal on `session`.
pub(super) async fn keystrokes(session: &Session, n: usize) -> anyhow::Result<Latency> {
    let mut terminal = session
        .exec(echo_terminal())
        .await
        .context("cannot start `cat` under a PTY")?;
    let mut samples = Vec::with_capacity(n);
    for (i, key) in KEYSTROKES
        .iter()
        .cycle()
        .take(n + KEYSTROKE_WARMUP)
        .enumerate()
    {
        let took = keystroke(&mut terminal, *key).await?;
        if i >= KEYSTROKE_WARMUP {
            samples.push(took);
        }
    }
    Latency::of(samples).context("no samples")
}

/// Types one key into `terminal` and waits for its whole echo; returns how long that took.
pub(super) async fn keystroke(
    terminal: &mut Process,
    (key, echo_len): (u8, usize),
) -> anyhow::Result<std::time::Duration> {
    let start = Instant::now();
    terminal.write_stdin(&[key]).await?;
    let mut got = 0;
    while got < echo_len {
        match terminal.next().await {
            Some(Ok(ProcessEvent::Stdout(bytes))) => got += bytes.len(),
            Some(Ok(ProcessEvent::Exit(status))) => {
                anyhow::bail!("the terminal's `cat` exited ({status:?})")
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.into()),
            None => anyhow::bail!("the terminal's stream ended"),
        }
    }
    Ok(start.elapsed())
}

/// Runs [`writer`] in the sandbox `runs` times, piped or under a PTY, reading all its output.
pub(super) async fn stdout(
    session: &Session,
    bytes: u64,
    runs: usize,
    pty: bool,
) -> anyhow::Result<Throughput> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let mut spec = ExecSpec::argv(writer(bytes));
        if pty {
            spec.pty = Some(PtySpec {
                cols: COLS,
                rows: ROWS,
                term: None,
            });
        }
        let start = Instant::now();
        let mut process = session.exec(spec).await.context("cannot start dd")?;
        let mut got = 0u64;
        loop {
            match process.next().await {
                Some(Ok(ProcessEvent::Stdout(b))) => got += b.len() as u64,
                Some(Ok(ProcessEvent::Exit(_))) | None => break,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
            }
        }
        times.push(start.elapsed());
        anyhow::ensure!(got == bytes, "received {got} of {bytes} bytes of output");
    }
    Throughput::of(bytes, &times).context("no runs")
}

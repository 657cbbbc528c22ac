//! `tether bench`: latency and throughput against a sandbox, next to this machine's floors,
//! measured in the same run.
//!
//! # Layout
//! - this file: the order of the run, and its cleanup;
//! - [`figures`](self::figures): what is reported, each figure's floor and target;
//! - `target`: the relay (a named one, or a private `tether serve`) and the sandbox;
//! - `floors`: spawn, loopback WebSocket, local PTY and pipe, a tmpfs write, with nothing of
//!   Tether;
//! - `exec`, `pty`, `transfer`, `create`, `sessions`, `pause`: one family of figures each;
//! - `direct`: the same sandbox without the relay, for `--direct`;
//! - `memory`: resident memory of the relay and the agent; `machine`: where it ran;
//! - `stats`: medians and percentiles; `sizes`: how much a full and a `--quick` run do;
//! - `report`: verdicts, tables and JSON; `units`: how numbers are written.

mod create;
mod direct;
mod exec;
mod figures;
mod floors;
mod machine;
mod memory;
mod pause;
mod pty;
mod report;
mod sessions;
mod sizes;
mod stats;
mod target;
mod transfer;
mod units;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::SystemTime;

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tether_client::Session;

pub(crate) use report::Report;
pub(crate) use target::{Endpoint, RelayChoice};

use self::direct::Direct;
use self::figures::{Spec, FIGURES, FLOORS};
use self::machine::Machine;
use self::report::{Figure, Value};
use self::sizes::Sizes;
use self::target::{Relay, Sandbox};

/// What to measure, and against what.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// The relay.
    pub relay: RelayChoice,
    /// The sandbox; a fresh one (deleted afterwards) when absent.
    pub sandbox: Option<String>,
    /// Small sizes and few iterations: a smoke check.
    pub quick: bool,
    /// The `tether` binary: run as `tether exec` and as a private relay.
    pub tether: PathBuf,
    /// The agent binary a private relay runs, for its size.
    pub agent_binary: Option<PathBuf>,
    /// Idle sessions for the figures marked 7, instead of the run's default.
    pub sessions: Option<usize>,
    /// Measure the data path a second time straight to an agent in the same sandbox.
    pub direct: bool,
}

/// What each measurement gave, by figure key.
type Results = HashMap<&'static str, Result<Value, String>>;

/// Runs the bench; `progress` hears what is being measured. Figures that cannot be measured
/// are reported as such; only a failure to start is an error.
pub(crate) async fn run(options: Options, progress: &dyn Fn(&str)) -> anyhow::Result<Report> {
    let mut sizes = if options.quick {
        sizes::QUICK
    } else {
        sizes::FULL
    };
    if let Some(n) = options.sessions {
        sizes.sessions = n.max(1);
    }
    raise_open_files(sizes.sessions);
    // The default crowd shrinks to what this machine can open (a session the relay cannot
    // open would fail the figure); one the user asked for is tried as asked, and fails saying
    // what to raise.
    let mut sessions_fitted = None;
    if options.sessions.is_none() {
        if let Some((fit, why)) = sessions::fitting(sizes.sessions, open_files_limit()) {
            progress(&format!(
                "{} idle sessions instead of {}: {why}",
                fit, sizes.sessions
            ));
            sessions_fitted = Some(format!("{} do not fit: {why}", sizes.sessions));
            sizes.sessions = fit;
        }
    }
    let mut results = Results::new();
    let mut direct = Results::new();
    measure_floors(&sizes, &mut results, progress).await;

    progress("starting the relay");
    let relay = Relay::start(options.relay.clone(), &options.tether).await?;
    let measured = tokio::select! {
        sandbox = against(&relay, &options, &sizes, &mut results, &mut direct, progress) => Some(sandbox),
        _ = tokio::signal::ctrl_c() => None,
    };
    if relay.is_private() {
        sweep(&relay).await;
    }
    let endpoint = relay.endpoint.url.clone();
    let kind = if relay.is_private() {
        "private"
    } else {
        "configured"
    };
    relay.stop().await;
    let Some(sandbox) = measured else {
        anyhow::bail!("interrupted");
    };

    if let Some(path) = &options.agent_binary {
        let size = std::fs::metadata(path)
            .map(|m| m.len())
            .map_err(|e| format!("{}: {e}", path.display()));
        results.insert("agent_binary", size.map(Value::from));
    }
    let mut report = Report {
        date: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        machine: Machine::detect(),
        relay: endpoint,
        relay_kind: kind,
        sandbox,
        quick: options.quick,
        sessions: sizes.sessions,
        sessions_fitted,
        transfer_bytes: sizes.transfer_bytes,
        agent_binary: options.agent_binary.map(|p| p.display().to_string()),
        floors: collect(FLOORS, &mut results),
        figures: collect(FIGURES, &mut results),
    };
    for figure in &mut report.figures {
        if let Some(measured) = direct.remove(figure.key) {
            figure.direct = Some(measured.unwrap_or_else(|error| Value::Failed { error }));
        }
    }
    report.judge();
    Ok(report)
}

async fn measure_floors(sizes: &Sizes, results: &mut Results, progress: &dyn Fn(&str)) {
    progress("floors: process spawn");
    put(results, "spawn", floors::spawn(sizes.spawns).await);
    progress("floors: loopback WebSocket");
    put(
        results,
        "ws",
        floors::ws_round_trip(sizes.ws_round_trips).await,
    );
    progress("floors: local PTY echo");
    put(
        results,
        "pty_echo",
        floors::pty_echo(sizes.keystrokes).await,
    );
    progress("floors: local PTY throughput");
    let pty = floors::pty_throughput(sizes.pty_bytes, sizes.throughput_runs).await;
    put(results, "pty", pty);
    progress("floors: local pipe throughput");
    let pipe = floors::pipe_throughput(sizes.pipe_bytes, sizes.throughput_runs).await;
    put(results, "pipe", pipe);
    progress("floors: local tmpfs write");
    let tmpfs = floors::tmpfs_write(sizes.transfer_bytes, sizes.throughput_runs).await;
    put(results, "tmpfs", tmpfs);
}

/// Everything measured through the relay (and, with `--direct`, the data path again straight
/// to an agent in the same sandbox, into `direct`); returns the measured sandbox's id. Setup
/// failures are recorded against the figures they prevent.
async fn against(
    relay: &Relay,
    options: &Options,
    sizes: &Sizes,
    results: &mut Results,
    direct: &mut Results,
    progress: &dyn Fn(&str),
) -> Option<String> {
    let rest = &relay.rest;
    progress("creating the sandbox");
    let sandbox = match Sandbox::get_or_create(rest, options.sandbox.clone()).await {
        Ok(sandbox) => sandbox,
        Err(e) => {
            fail_all(results, &format!("{e:#}"));
            return None;
        }
    };
    let session = match rest.connect(&sandbox.id).await {
        Ok(session) => session,
        Err(e) => {
            fail_all(results, &format!("cannot connect to the sandbox: {e}"));
            let _ = sandbox.release(rest).await;
            return None;
        }
    };
    progress("agent idle memory");
    put(results, "agent_idle_rss", memory::agent_rss(&session).await);
    // Each figure of the data path is measured through the relay and then, with `--direct`,
    // straight away without it, so the two see the same machine.
    let without = if options.direct {
        progress("starting a second agent in the sandbox, for --direct");
        let opened = match relay.data_dir() {
            Some(dir) => Direct::open(&session, &dir, &sandbox.id)
                .await
                .map_err(|e| format!("{e:#}")),
            None => Err(
                "--direct measures a local sandbox of the bench's own relay: add --embedded"
                    .to_string(),
            ),
        };
        Some(opened)
    } else {
        None
    };
    let mut both = Both {
        relayed: &session,
        direct: without.as_ref(),
        results,
        direct_results: direct,
    };
    progress("1 exec, warm connection");
    both.measure("exec_warm", |s| exec::warm(s, sizes.execs))
        .await;
    progress("3 keystroke echo");
    both.measure("keystroke", |s| pty::keystrokes(s, sizes.keystrokes))
        .await;
    progress("4 stdout, piped");
    both.measure("stdout_piped", |s| {
        pty::stdout(s, sizes.pipe_bytes, sizes.throughput_runs, false)
    })
    .await;
    progress("4 stdout, PTY");
    both.measure("stdout_pty", |s| {
        pty::stdout(s, sizes.pty_bytes, sizes.throughput_runs, true)
    })
    .await;
    progress("5 upload and download");
    match transfer::Files::create(sizes.transfer_bytes).await {
        Ok(files) => {
            both.measure("upload", |s| {
                transfer::upload(s, &files, sizes.transfer_runs)
            })
            .await;
            both.measure("download", |s| {
                transfer::download(s, &files, sizes.transfer_runs)
            })
            .await;
            transfer::clean(&session).await;
        }
        Err(e) => {
            let e = format!("{e:#}");
            for key in ["upload", "download"] {
                both.results.insert(key, Err(e.clone()));
                if both.direct.is_some() {
                    both.direct_results.insert(key, Err(e.clone()));
                }
            }
        }
    }
    if let Some(Ok(second)) = without {
        second.close(&session).await;
    }
    progress("8 pause and resume");
    match pause::pause_resume(rest, &session, &sandbox.id, sizes.pauses).await {
        Ok(measured) => {
            results.insert("pause", Ok(measured.pause.into()));
            results.insert("resume", Ok(measured.resume.into()));
        }
        Err(e) => {
            let e = format!("{e:#}");
            results.insert("pause", Err(e.clone()));
            results.insert("resume", Err(e));
        }
    }
    drop(session);
    progress("2 `tether exec` as a new process");
    let cli = exec::cli(
        &options.tether,
        &relay.endpoint,
        &sandbox.id,
        sizes.cli_execs,
    )
    .await;
    put(results, "exec_cli", cli);
    progress("6 sandbox create to first output");
    put(
        results,
        "create",
        create::to_first_output(rest, sizes.creates).await,
    );
    progress("7 idle sessions");
    let crowd = sessions::crowd(
        rest,
        relay.pid,
        &sandbox.id,
        sizes.sessions,
        sizes.session_keystrokes,
    )
    .await;
    match crowd {
        Ok(crowd) => {
            results.insert("sessions_keystroke", Ok(crowd.keystroke.into()));
            let elsewhere = || "the relay does not run on this machine".to_string();
            let relay_rss = crowd.relay_rss.ok_or_else(elsewhere);
            results.insert("sessions_relay_rss", relay_rss.map(Value::from));
            let relay_each = crowd.relay_per_session.ok_or_else(elsewhere);
            results.insert("sessions_relay_each", relay_each.map(Value::from));
            results.insert("sessions_agent_rss", Ok(crowd.agent_rss.into()));
            results.insert("sessions_agent_each", Ok(crowd.agent_per_session.into()));
        }
        Err(e) => {
            let e = format!("{e:#}");
            for key in SESSION_FIGURES {
                results.insert(key, Err(e.clone()));
            }
        }
    }
    let id = sandbox.id.clone();
    if let Err(e) = sandbox.release(rest).await {
        tracing::warn!("{e:#}");
    }
    Some(id)
}

/// The figures the crowd of idle sessions gives.
const SESSION_FIGURES: [&str; 5] = [
    "sessions_keystroke",
    "sessions_relay_rss",
    "sessions_relay_each",
    "sessions_agent_rss",
    "sessions_agent_each",
];

/// Deletes every sandbox the bench created on a private relay, including any an interrupted
/// run left behind: the relay's data directory goes with it, its sandboxes must not outlive it.
async fn sweep(relay: &Relay) {
    let labels = [(target::LABEL.0.to_string(), target::LABEL.1.to_string())].into();
    if let Ok(left) = relay.rest.list(&labels).await {
        for sandbox in left {
            let _ = relay.rest.delete(&sandbox.id).await;
        }
    }
}

/// The relayed session and, with `--direct`, the direct one, and where their figures go.
struct Both<'a> {
    relayed: &'a Session,
    direct: Option<&'a Result<Direct, String>>,
    results: &'a mut Results,
    direct_results: &'a mut Results,
}

impl<'a> Both<'a> {
    /// Measures figure `key` with `measure` through the relay, then directly when asked.
    async fn measure<T, F, Fut>(&mut self, key: &'static str, measure: F)
    where
        T: Into<Value>,
        F: Fn(&'a Session) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        put(self.results, key, measure(self.relayed).await);
        match self.direct {
            Some(Ok(direct)) => put(self.direct_results, key, measure(&direct.session).await),
            Some(Err(e)) => {
                self.direct_results.insert(key, Err(e.clone()));
            }
            None => {}
        }
    }
}

fn put<T: Into<Value>>(results: &mut Results, key: &'static str, measured: anyhow::Result<T>) {
    results.insert(key, measured.map(Into::into).map_err(|e| format!("{e:#}")));
}

/// Records `error` for every figure measured through the relay.
fn fail_all(results: &mut Results, error: &str) {
    for spec in FIGURES.iter().filter(|s| s.key != "agent_binary") {
        results.insert(spec.key, Err(error.to_string()));
    }
}

fn collect(specs: &[Spec], results: &mut Results) -> Vec<Figure> {
    specs
        .iter()
        .map(|spec| {
            let measured = results
                .remove(spec.key)
                .unwrap_or_else(|| Err("not measured".into()));
            Figure::from_spec(spec, measured)
        })
        .collect()
}

/// Idle sessions need descriptors here (one each), in a private relay (two each) and in its
/// sandboxes' agents, which inherit the limit: the soft limit is raised to the hard one, and
/// as root the hard one to what `sessions` need, as far as the kernel allows
/// (`/proc/sys/fs/nr_open`).
fn raise_open_files(sessions: usize) {
    let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let wanted = (sessions as u64 * DESCRIPTORS_PER_SESSION + SPARE_DESCRIPTORS).max(hard);
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(hard);
    let raised = wanted.min(ceiling.max(hard));
    if raised > hard && setrlimit(Resource::RLIMIT_NOFILE, raised, raised).is_ok() {
        return;
    }
    let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
}

/// The soft limit on open files after [`raise_open_files`], if it can be read.
fn open_files_limit() -> Option<u64> {
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// Descriptors an idle session costs the process that needs the most of them: the relay,
/// two sockets each, with room to spare.
const DESCRIPTORS_PER_SESSION: u64 = 3;
/// Descriptors beyond the sessions': the relay's reserve, its database, the bench's own.
const SPARE_DESCRIPTORS: u64 = 4096;

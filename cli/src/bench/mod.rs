//! `tether bench`: latency and throughput against a sandbox, next to this machine's floors,
//! measured in the same run.
//!
//! # Layout
//! - this file: the order of the run, and its cleanup;
//! - [`figures`](self::figures): what is reported, each figure's floor and target;
//! - `target`: the relay (a named one, or a private `tether serve`) and the sandbox;
//! - `floors`: spawn, loopback WebSocket, local PTY and pipe, a tmpfs write, with nothing of
//!   Tether;
//! - `exec`, `pty`, `transfer`, `create`, `sessions`: one family of figures each;
//! - `memory`: resident memory of the relay and the agent; `machine`: where it ran;
//! - `stats`: medians and percentiles; `sizes`: how much a full and a `--quick` run do;
//! - `report`: verdicts, tables and JSON; `units`: how numbers are written.

mod create;
mod exec;
mod figures;
mod floors;
mod machine;
mod memory;
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

pub(crate) use report::Report;
pub(crate) use target::{Endpoint, RelayChoice};

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
}

/// What each measurement gave, by figure key.
type Results = HashMap<&'static str, Result<Value, String>>;

/// Runs the bench; `progress` hears what is being measured. Figures that cannot be measured
/// are reported as such; only a failure to start is an error.
pub(crate) async fn run(options: Options, progress: &dyn Fn(&str)) -> anyhow::Result<Report> {
    let sizes = if options.quick {
        sizes::QUICK
    } else {
        sizes::FULL
    };
    raise_open_files();
    let mut results = Results::new();
    measure_floors(&sizes, &mut results, progress).await;

    progress("starting the relay");
    let relay = Relay::start(options.relay.clone(), &options.tether).await?;
    let measured = tokio::select! {
        sandbox = against(&relay, &options, &sizes, &mut results, progress) => Some(sandbox),
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
        transfer_bytes: sizes.transfer_bytes,
        agent_binary: options.agent_binary.map(|p| p.display().to_string()),
        floors: collect(FLOORS, &mut results),
        figures: collect(FIGURES, &mut results),
    };
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

/// Everything measured through the relay; returns the measured sandbox's id. Setup failures
/// are recorded against the figures they prevent.
async fn against(
    relay: &Relay,
    options: &Options,
    sizes: &Sizes,
    results: &mut Results,
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
    progress("1 exec, warm connection");
    put(
        results,
        "exec_warm",
        exec::warm(&session, sizes.execs).await,
    );
    progress("3 keystroke echo");
    put(
        results,
        "keystroke",
        pty::keystrokes(&session, sizes.keystrokes).await,
    );
    progress("4 stdout, piped");
    let piped = pty::stdout(&session, sizes.pipe_bytes, sizes.throughput_runs, false).await;
    put(results, "stdout_piped", piped);
    progress("4 stdout, PTY");
    let tty = pty::stdout(&session, sizes.pty_bytes, sizes.throughput_runs, true).await;
    put(results, "stdout_pty", tty);
    progress("5 upload and download");
    match transfer::Files::create(sizes.transfer_bytes).await {
        Ok(files) => {
            let up = transfer::upload(&session, &files, sizes.transfer_runs).await;
            put(results, "upload", up);
            let down = transfer::download(&session, &files, sizes.transfer_runs).await;
            put(results, "download", down);
        }
        Err(e) => {
            let e = format!("{e:#}");
            results.insert("upload", Err(e.clone()));
            results.insert("download", Err(e));
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
            let relay_rss = crowd
                .relay_rss
                .ok_or_else(|| "the relay does not run on this machine".to_string());
            results.insert("sessions_relay_rss", relay_rss.map(Value::from));
            results.insert("sessions_agent_rss", Ok(crowd.agent_rss.into()));
        }
        Err(e) => {
            let e = format!("{e:#}");
            for key in [
                "sessions_keystroke",
                "sessions_relay_rss",
                "sessions_agent_rss",
            ] {
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

/// A thousand sessions need a few thousand descriptors here, in a private relay and in its
/// sandboxes' agents (which inherit the limit): raise the soft limit to the hard one.
fn raise_open_files() {
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

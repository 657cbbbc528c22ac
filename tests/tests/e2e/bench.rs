//! `tether bench --quick --json` as CI runs it: a private relay and a fresh local sandbox,
//! and every figure of the performance issue present and positive. Timings are never
//! asserted: they depend on the machine.

use std::process::Command;

use serde_json::Value;
use tether_e2e::bin;

/// Every floor the bench measures on this machine.
const FLOORS: &[&str] = &["spawn", "ws", "pty_echo", "pty", "pipe", "tmpfs"];

/// Every figure the bench reports.
const FIGURES: &[&str] = &[
    "exec_warm",
    "exec_cli",
    "keystroke",
    "stdout_piped",
    "stdout_pty",
    "upload",
    "download",
    "create",
    "pause",
    "resume",
    "sessions_keystroke",
    "sessions_relay_rss",
    "sessions_relay_each",
    "sessions_agent_rss",
    "sessions_agent_each",
    "agent_idle_rss",
    "agent_binary",
];

/// The figure `key` of `section` in the report.
fn find<'a>(report: &'a Value, section: &str, key: &str) -> &'a Value {
    report[section]
        .as_array()
        .unwrap_or_else(|| panic!("no `{section}` list in {report:#}"))
        .iter()
        .find(|f| f["key"] == key)
        .unwrap_or_else(|| panic!("`{key}` missing from `{section}`"))
}

/// Asserts that figure `f` was measured and that its numbers are positive.
fn assert_measured(f: &Value) {
    let key = &f["key"];
    let positive = |field: &str| {
        let v = f[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: no `{field}` in {f}"));
        assert!(v > 0.0, "{key}: `{field}` is {v}");
    };
    match f["kind"].as_str() {
        Some("latency") => {
            positive("median_us");
            positive("p99_us");
            assert!(f["p99_us"].as_f64() >= f["median_us"].as_f64(), "{f}");
        }
        Some("throughput") => {
            positive("median_bytes_per_s");
            positive("worst_bytes_per_s");
        }
        // What each idle session added may round to nothing.
        Some("bytes") if key.as_str().is_some_and(|k| k.ends_with("_each")) => {
            assert!(f["bytes"].as_u64().is_some(), "{key}: no `bytes` in {f}");
        }
        Some("bytes") => positive("bytes"),
        _ => panic!("{key} was not measured: {f}"),
    }
}

#[test]
fn quick_bench_measures_every_figure() {
    let out = Command::new(bin("tether"))
        .args(["bench", "--quick", "--json", "--embedded"])
        .env("TETHER_AGENT_BIN", bin("tether-agent"))
        .env_remove("TETHER_RELAY")
        .env_remove("TETHER_TOKEN")
        .output()
        .expect("run tether bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tether bench failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: not JSON:\n{stdout}"));
    assert_eq!(report["quick"], true);
    assert_eq!(report["relay_kind"], "private");
    assert!(report["sandbox"].as_str().is_some_and(|s| !s.is_empty()));

    for key in FLOORS {
        assert_measured(find(&report, "floors", key));
    }
    for key in FIGURES {
        let figure = find(&report, "figures", key);
        assert_measured(figure);
        if let Some(floor) = figure["floor"].as_str() {
            assert!(FLOORS.contains(&floor), "{key}: unknown floor {floor}");
            let ratio = figure["ratio"].as_f64().unwrap_or_default();
            assert!(ratio > 0.0, "{key}: no ratio to its floor: {figure}");
        }
        if figure.get("target").is_some() {
            assert!(
                figure["met"].is_boolean(),
                "{key}: target without a verdict"
            );
        }
    }
    // A new figure must be added to FIGURES, so this test checks it too.
    assert_eq!(
        report["figures"].as_array().map(Vec::len),
        Some(FIGURES.len())
    );
}

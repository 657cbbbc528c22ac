//! A bench run's report: every figure with its floor ratio and target, printed as tables or
//! as one JSON document.
//!
//! A figure that could not be measured is kept, with the reason, so a run always shows every
//! figure; ratios compare medians; a target is checked against the figure's own numbers
//! (and its floor's, for the targets relative to a floor). Missing a target is reported,
//! never an error: timings depend on the machine.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use super::figures::Spec;
use super::machine::Machine;
use super::stats::{Latency, Throughput};
use super::units::{duration, rate, size};

/// One bench run.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// When it ran (RFC 3339, UTC).
    pub date: String,
    /// Where.
    pub machine: Machine,
    /// The relay's URL, and whether the bench started it.
    pub relay: String,
    /// `private` (started for the run) or `configured`.
    pub relay_kind: &'static str,
    /// The measured sandbox, when there was one.
    pub sandbox: Option<String>,
    /// A `--quick` run: small sizes, few iterations.
    pub quick: bool,
    /// Idle sessions opened for the figures marked 7.
    pub sessions: usize,
    /// Why fewer idle sessions than the run's default were opened, when they were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions_fitted: Option<String>,
    /// Bytes of each upload and download.
    pub transfer_bytes: u64,
    /// The agent binary whose size is reported.
    pub agent_binary: Option<String>,
    /// This machine's floors.
    pub floors: Vec<Figure>,
    /// What Tether does.
    pub figures: Vec<Figure>,
}

/// One measured number (or set of numbers).
#[derive(Debug, Serialize)]
pub(crate) struct Figure {
    /// A stable name for scripts, e.g. `exec_warm`.
    pub key: &'static str,
    /// What a reader sees.
    pub name: &'static str,
    /// What was measured.
    #[serde(flatten)]
    pub value: Value,
    /// The key of the floor this figure is compared with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<&'static str>,
    /// The figure's median over its floor's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// The target, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Whether the target holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub met: Option<bool>,
    /// The same figure straight to an agent in the same sandbox, without the relay
    /// (`--direct`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<Value>,
    /// What the relay costs against [`Figure::direct`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay_cost: Option<RelayCost>,
    #[serde(skip)]
    goal: Option<Goal>,
}

/// What the relay costs a figure, against the same figure without it.
#[derive(Debug, Serialize)]
pub(crate) struct RelayCost {
    /// A throughput's median as a share of the direct one's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
    /// What a latency's median adds to the direct one's, in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_us: Option<f64>,
    /// The target, in words.
    pub target: String,
    /// Whether it holds.
    pub met: bool,
}

/// Through the relay, a throughput keeps at least this share of direct's (issue 14).
const RELAYED_SHARE: f64 = 0.9;
/// Through the relay, a latency's median adds at most this to direct's (issue 14).
const RELAYED_ADDED: Duration = Duration::from_micros(50);

/// A measurement's outcome.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Value {
    /// A latency distribution.
    Latency(Latency),
    /// A throughput over runs.
    Throughput(Throughput),
    /// A size in bytes (resident memory, a binary).
    Bytes {
        /// How many.
        bytes: u64,
    },
    /// It could not be measured.
    Failed {
        /// Why.
        error: String,
    },
}

/// A target from the performance issue.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Goal {
    /// Median at most the floor's median plus this.
    MedianOverFloor(Duration),
    /// Median at most this.
    Median(Duration),
    /// 99th percentile at most this.
    P99(Duration),
    /// Median throughput at least this many bytes per second.
    Rate(f64),
    /// Median throughput at least this share of the floor's median.
    ShareOfFloor(f64),
    /// At most this many bytes.
    Size(u64),
}

impl Figure {
    /// A figure from a measurement's result (the report's tests build figures this way; a run
    /// builds them from their [`Spec`]).
    #[cfg(test)]
    pub(crate) fn new<T: Into<Value>>(
        key: &'static str,
        name: &'static str,
        measured: anyhow::Result<T>,
    ) -> Figure {
        let value = match measured {
            Ok(v) => v.into(),
            Err(e) => Value::Failed {
                error: format!("{e:#}"),
            },
        };
        Figure {
            key,
            name,
            value,
            floor: None,
            ratio: None,
            target: None,
            met: None,
            direct: None,
            relay_cost: None,
            goal: None,
        }
    }

    /// The figure `spec` describes, from its measurement.
    pub(crate) fn from_spec(spec: &Spec, measured: Result<Value, String>) -> Figure {
        Figure {
            key: spec.key,
            name: spec.name,
            value: measured.unwrap_or_else(|error| Value::Failed { error }),
            floor: spec.floor,
            ratio: None,
            target: None,
            met: None,
            direct: None,
            relay_cost: None,
            goal: spec.goal,
        }
    }

    /// Compares the figure with floor `key`.
    #[cfg(test)]
    pub(crate) fn floor(mut self, key: &'static str) -> Figure {
        self.floor = Some(key);
        self
    }

    /// Checks the figure against `goal`.
    #[cfg(test)]
    pub(crate) fn goal(mut self, goal: Goal) -> Figure {
        self.goal = Some(goal);
        self
    }

    fn median(&self) -> Option<f64> {
        match &self.value {
            Value::Latency(l) => Some(l.median.as_secs_f64()),
            Value::Throughput(t) => Some(t.median),
            Value::Bytes { bytes } => Some(*bytes as f64),
            Value::Failed { .. } => None,
        }
    }

    /// What the relay costs this figure, when it was also measured without the relay.
    fn relay_cost(&self) -> Option<RelayCost> {
        match (&self.value, self.direct.as_ref()?) {
            (Value::Throughput(relayed), Value::Throughput(direct)) => {
                let share = relayed.median / direct.median;
                Some(RelayCost {
                    share: Some(share),
                    added_us: None,
                    target: format!("≥ {:.0}% of direct", RELAYED_SHARE * 100.0),
                    met: share >= RELAYED_SHARE,
                })
            }
            (Value::Latency(relayed), Value::Latency(direct)) => {
                let added = relayed.median.as_secs_f64() - direct.median.as_secs_f64();
                Some(RelayCost {
                    share: None,
                    added_us: Some(added * 1e6),
                    target: format!("≤ direct + {}", duration(RELAYED_ADDED)),
                    met: added <= RELAYED_ADDED.as_secs_f64(),
                })
            }
            _ => None,
        }
    }

    /// Fills in the ratio to the floor and the target's verdict.
    fn judge(&mut self, floors: &[Figure]) {
        self.relay_cost = self.relay_cost();
        let floor = self
            .floor
            .and_then(|key| floors.iter().find(|f| f.key == key));
        let floor_median = floor.and_then(Figure::median);
        if let (Some(m), Some(f)) = (self.median(), floor_median) {
            self.ratio = Some(m / f);
        }
        let Some(goal) = self.goal else { return };
        let floor_name = self.floor.unwrap_or("floor");
        self.target = Some(match goal {
            Goal::MedianOverFloor(d) => format!("median ≤ {floor_name} + {}", duration(d)),
            Goal::Median(d) => format!("median ≤ {}", duration(d)),
            Goal::P99(d) => format!("p99 ≤ {}", duration(d)),
            Goal::Rate(r) => format!("≥ {}", rate(r)),
            Goal::ShareOfFloor(s) => format!("≥ {:.0}% of {floor_name}", s * 100.0),
            Goal::Size(b) => format!("≤ {}", size(b)),
        });
        self.met = match (&self.value, goal) {
            (Value::Latency(l), Goal::MedianOverFloor(d)) => {
                floor_median.map(|f| l.median.as_secs_f64() <= f + d.as_secs_f64())
            }
            (Value::Latency(l), Goal::Median(d)) => Some(l.median <= d),
            (Value::Latency(l), Goal::P99(d)) => Some(l.p99 <= d),
            (Value::Throughput(t), Goal::Rate(r)) => Some(t.median >= r),
            (Value::Throughput(t), Goal::ShareOfFloor(s)) => {
                floor_median.map(|f| t.median >= s * f)
            }
            (Value::Bytes { bytes }, Goal::Size(max)) => Some(*bytes <= max),
            _ => None,
        };
    }
}

impl From<Latency> for Value {
    fn from(l: Latency) -> Value {
        Value::Latency(l)
    }
}

impl From<Throughput> for Value {
    fn from(t: Throughput) -> Value {
        Value::Throughput(t)
    }
}

impl From<u64> for Value {
    fn from(bytes: u64) -> Value {
        Value::Bytes { bytes }
    }
}

impl Report {
    /// Computes every figure's ratio and verdict.
    pub(crate) fn judge(&mut self) {
        for figure in &mut self.figures {
            figure.judge(&self.floors);
        }
    }

    /// The figures that could not be measured.
    pub(crate) fn failures(&self) -> impl Iterator<Item = &Figure> {
        self.floors
            .iter()
            .chain(&self.figures)
            .filter(|f| matches!(f.value, Value::Failed { .. }))
    }

    /// The report as tables.
    pub(crate) fn text(&self) -> String {
        let m = &self.machine;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "tether bench{} · {} · {} · Linux {} · {} · {} CPUs · {}",
            if self.quick { " --quick" } else { "" },
            self.date,
            m.os,
            m.kernel,
            m.cpu,
            m.cpus,
            size(m.memory_bytes)
        );
        let _ = writeln!(
            out,
            "relay {} ({}) · sandbox {} · {} transfers · {} idle sessions",
            self.relay,
            self.relay_kind,
            self.sandbox.as_deref().unwrap_or("none"),
            size(self.transfer_bytes),
            self.sessions
        );
        if let Some(agent) = &self.agent_binary {
            let _ = writeln!(out, "agent binary {agent}");
        }
        if let Some(why) = &self.sessions_fitted {
            let _ = writeln!(
                out,
                "idle sessions: {why}; the figures marked 7 are for fewer"
            );
        }
        if self.quick {
            let full = super::sizes::FULL;
            let _ = writeln!(
                out,
                "--quick: a smoke check with fewer samples, {} idle sessions instead of {} and \
                 a {} file instead of {}; its timings mean little",
                self.sessions,
                full.sessions,
                size(self.transfer_bytes),
                size(full.transfer_bytes)
            );
        }
        let _ = writeln!(
            out,
            "\n{:<44}{:>12}{:>12}",
            "floors (this machine, this run)", "median", "p99 | worst"
        );
        for f in &self.floors {
            let _ = writeln!(out, "  {:<42}{}", f.name, numbers(&f.value));
        }
        let _ = writeln!(
            out,
            "\n{:<44}{:>12}{:>12}  {:<20}{:<8}target",
            "figures", "median", "p99 | worst", "× floor", ""
        );
        for f in &self.figures {
            let ratio = match (f.ratio, f.floor) {
                (Some(r), Some(key)) => format!("{r:.2}× {key}"),
                _ => String::new(),
            };
            let verdict = match f.met {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "",
            };
            let target = f.target.as_deref().unwrap_or("");
            let _ = writeln!(
                out,
                "  {:<42}{}  {:<20}{verdict:<8}{target}",
                f.name,
                numbers(&f.value),
                ratio
            );
        }
        let direct: Vec<&Figure> = self.figures.iter().filter(|f| f.direct.is_some()).collect();
        if !direct.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<44}{:>12}{:>12}  {:<20}{:<8}target",
                "the relay's cost: the same, direct to an agent",
                "median",
                "p99 | worst",
                "relayed vs direct",
                ""
            );
            for f in direct {
                let (cost, verdict, target) = match &f.relay_cost {
                    Some(c) => (
                        match (c.share, c.added_us) {
                            (Some(share), _) => format!("{:.0}% of direct", share * 100.0),
                            (_, Some(us)) => format!("{us:+.0} µs"),
                            _ => String::new(),
                        },
                        if c.met { "met" } else { "MISSED" },
                        c.target.as_str(),
                    ),
                    None => (String::new(), "", ""),
                };
                let numbers = f.direct.as_ref().map(numbers).unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  {:<42}{numbers}  {cost:<20}{verdict:<8}{target}",
                    f.name
                );
            }
        }
        out
    }
}

/// A value's two number columns (or its error).
fn numbers(value: &Value) -> String {
    match value {
        Value::Latency(l) => format!("{:>12}{:>12}", duration(l.median), duration(l.p99)),
        Value::Throughput(t) => format!("{:>12}{:>12}", rate(t.median), rate(t.worst)),
        Value::Bytes { bytes } => format!("{:>12}{:>12}", size(*bytes), ""),
        Value::Failed { error } => format!("  FAILED: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latency(median_us: u64) -> Latency {
        Latency::of(vec![Duration::from_micros(median_us)]).unwrap()
    }

    fn report(figures: Vec<Figure>) -> Report {
        let mut r = Report {
            date: "2026-01-01T00:00:00Z".into(),
            machine: Machine::detect(),
            relay: "http://127.0.0.1:1".into(),
            relay_kind: "private",
            sandbox: Some("sb-1".into()),
            quick: true,
            sessions: 50,
            sessions_fitted: None,
            transfer_bytes: 1 << 20,
            agent_binary: None,
            floors: vec![
                Figure::new("spawn", "process spawn", Ok(latency(700))),
                Figure::new(
                    "pipe",
                    "pipe",
                    Ok(Throughput::of(4_000_000_000, &[Duration::from_secs(1)]).unwrap()),
                ),
            ],
            figures,
        };
        r.judge();
        r
    }

    #[test]
    fn targets_relative_to_floors_use_the_floor_median() {
        let r = report(vec![
            Figure::new("a", "a", Ok(latency(1100)))
                .floor("spawn")
                .goal(Goal::MedianOverFloor(Duration::from_micros(500))),
            Figure::new("b", "b", Ok(latency(1300)))
                .floor("spawn")
                .goal(Goal::MedianOverFloor(Duration::from_micros(500))),
            Figure::new(
                "c",
                "c",
                Ok(Throughput::of(1_000_000_000, &[Duration::from_secs(1)]).unwrap()),
            )
            .floor("pipe")
            .goal(Goal::ShareOfFloor(0.9)),
        ]);
        assert_eq!(r.figures[0].met, Some(true));
        assert_eq!(r.figures[1].met, Some(false));
        assert_eq!(r.figures[2].met, Some(false));
        assert!((r.figures[2].ratio.unwrap() - 0.25).abs() < 1e-9);
    }

    #[test]
    fn failures_are_kept_and_printed() {
        let failed: anyhow::Result<Latency> = Err(anyhow::anyhow!("no sandbox"));
        let r = report(vec![
            Figure::new("x", "exec", failed).goal(Goal::Median(Duration::from_millis(1))),
            Figure::new("rss", "relay RSS", Ok(300u64 << 20)).goal(Goal::Size(256 << 20)),
        ]);
        assert_eq!(r.failures().count(), 1);
        assert_eq!(r.figures[0].met, None);
        assert_eq!(r.figures[1].met, Some(false));
        let text = r.text();
        assert!(text.contains("FAILED: no sandbox"), "{text}");
        assert!(text.contains("MISSED"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["figures"][0]["kind"], "failed");
        assert_eq!(json["figures"][1]["bytes"], 300u64 << 20);
        assert_eq!(json["floors"][0]["median_us"], 700.0);
    }
}

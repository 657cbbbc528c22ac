//! Summaries of repeated measurements: latencies as median, p99 and worst; throughputs as
//! median and worst (the slowest run).

use std::time::{Duration, Instant};

use serde::Serialize;

/// The distribution of a latency.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct Latency {
    /// The median sample.
    #[serde(rename = "median_us", serialize_with = "micros")]
    pub median: Duration,
    /// The 99th percentile (nearest rank): with fewer than 100 samples, the worst.
    #[serde(rename = "p99_us", serialize_with = "micros")]
    pub p99: Duration,
    /// The slowest sample.
    #[serde(rename = "worst_us", serialize_with = "micros")]
    pub worst: Duration,
    /// How many samples.
    pub samples: usize,
}

impl Latency {
    /// Summarises `samples`; `None` when there are none.
    pub(crate) fn of(mut samples: Vec<Duration>) -> Option<Latency> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let n = samples.len();
        Some(Latency {
            median: samples[(n - 1) / 2],
            p99: samples[nearest_rank(n, 99)],
            worst: samples[n - 1],
            samples: n,
        })
    }
}

/// The distribution of a throughput over several runs, in bytes per second.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct Throughput {
    /// The median run.
    #[serde(rename = "median_bytes_per_s")]
    pub median: f64,
    /// The slowest run.
    #[serde(rename = "worst_bytes_per_s")]
    pub worst: f64,
    /// Bytes moved per run.
    pub bytes: u64,
    /// How many runs.
    pub runs: usize,
}

impl Throughput {
    /// Summarises runs that each moved `bytes` in the given times; `None` when there are none.
    pub(crate) fn of(bytes: u64, times: &[Duration]) -> Option<Throughput> {
        let mut rates: Vec<f64> = times
            .iter()
            .map(|t| bytes as f64 / t.as_secs_f64().max(1e-9))
            .collect();
        if rates.is_empty() {
            return None;
        }
        rates.sort_unstable_by(f64::total_cmp);
        Some(Throughput {
            median: rates[rates.len() / 2],
            worst: rates[0],
            bytes,
            runs: rates.len(),
        })
    }
}

/// The index of the `pct`th percentile of `n` sorted samples, by the nearest-rank method.
fn nearest_rank(n: usize, pct: usize) -> usize {
    (n * pct).div_ceil(100).clamp(1, n) - 1
}

/// Times `f`.
pub(super) fn time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn latency_percentiles_use_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=200).rev().map(ms).collect();
        let l = Latency::of(samples).unwrap();
        assert_eq!(l.median, ms(100));
        assert_eq!(l.p99, ms(198));
        assert_eq!(l.worst, ms(200));
        assert_eq!(l.samples, 200);
    }

    #[test]
    fn few_samples_make_p99_the_worst() {
        let l = Latency::of(vec![ms(3), ms(1), ms(2)]).unwrap();
        assert_eq!((l.median, l.p99, l.worst), (ms(2), ms(3), ms(3)));
        assert_eq!(Latency::of(vec![ms(7)]).unwrap().p99, ms(7));
        assert!(Latency::of(Vec::new()).is_none());
    }

    #[test]
    fn throughput_worst_is_the_slowest_run() {
        let t = Throughput::of(1_000_000, &[ms(1), ms(4), ms(2)]).unwrap();
        assert_eq!(t.median, 5e8);
        assert_eq!(t.worst, 2.5e8);
        assert_eq!(t.runs, 3);
        assert!(Throughput::of(1, &[]).is_none());
    }

    #[test]
    fn latencies_serialise_in_microseconds() {
        let l = Latency::of(vec![Duration::from_micros(1500)]).unwrap();
        let v = serde_json::to_value(l).unwrap();
        assert_eq!(v["median_us"], 1500.0);
    }
}

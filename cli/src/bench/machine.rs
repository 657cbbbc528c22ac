//! The machine a report was measured on, as BENCHMARKS.md quotes it: OS, kernel, CPU, memory.

use serde::Serialize;

/// This machine.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Machine {
    /// The distribution, e.g. `Debian GNU/Linux 12 (bookworm)`.
    pub os: String,
    /// The kernel release.
    pub kernel: String,
    /// The CPU model.
    pub cpu: String,
    /// CPUs this process may use.
    pub cpus: usize,
    /// Total memory in bytes.
    pub memory_bytes: u64,
}

impl Machine {
    /// Reads what `/etc/os-release` and `/proc` say; unknown parts are left empty.
    pub(crate) fn detect() -> Machine {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let os = field(&read("/etc/os-release"), "PRETTY_NAME", '=')
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default();
        let cpu = field(&read("/proc/cpuinfo"), "model name", ':').unwrap_or_default();
        let memory_kib: u64 = field(&read("/proc/meminfo"), "MemTotal", ':')
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        Machine {
            os,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            cpu,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_bytes: memory_kib * 1024,
        }
    }
}

/// The value of the first `key SEP value` line of `text`, trimmed.
fn field(text: &str, key: &str, sep: char) -> Option<String> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(sep)?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_key_value_lines() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\n";
        assert_eq!(
            field(cpuinfo, "model name", ':').as_deref(),
            Some("Some CPU @ 2.0GHz")
        );
        assert_eq!(
            field("A=1\nB=\"x y\"\n", "B", '=').as_deref(),
            Some("\"x y\"")
        );
        assert_eq!(field("", "B", '='), None);
    }

    #[test]
    fn describes_this_machine() {
        let m = Machine::detect();
        assert!(m.cpus > 0 && m.memory_bytes > 0 && !m.kernel.is_empty());
    }
}

//! The range every number of a create request must be in, whatever the policy: a value out of
//! range is a mistake (a typo, a unit slip) and gets a 400 naming the range, before the policy
//! (403) or a provider (which might answer 502) sees it.

use std::time::Duration;

use crate::constants::MAX_LIFETIME;

/// Memory and disk sizes: at least 1 MiB (nothing runs in less) and at most 1 PiB (no
/// machine has more; anything above is a unit slip).
const MIN_BYTES: u64 = 1 << 20; // 1 MiB
const MAX_BYTES: u64 = 1 << 50; // 1 PiB
/// CPU cores: a hundredth of a core (the finest share worth scheduling) up to 4096, the
/// largest CPU count a Linux kernel is built for.
const MIN_CPUS: f64 = 0.01;
const MAX_CPUS: f64 = 4096.0;
/// Processes: at least the agent itself, at most the kernel's `PID_MAX_LIMIT` on 64-bit
/// (4 Mi): `pids.max` refuses anything above.
const MIN_PIDS: u64 = 1;
const MAX_PIDS: u64 = 4 << 20; // 4194304

/// `field` is a memory size in range.
pub(super) fn memory(field: &str, bytes: u64) -> Result<(), String> {
    sized(field, bytes)
}

/// `field` is a disk size in range.
pub(super) fn disk(field: &str, bytes: u64) -> Result<(), String> {
    sized(field, bytes)
}

fn sized(field: &str, bytes: u64) -> Result<(), String> {
    if (MIN_BYTES..=MAX_BYTES).contains(&bytes) {
        return Ok(());
    }
    Err(format!(
        "`{field}` must be between {MIN_BYTES} and {MAX_BYTES} bytes (1 MiB to 1 PiB); got {bytes}"
    ))
}

/// `field` is a CPU count in range.
pub(super) fn cpus(field: &str, cores: f64) -> Result<(), String> {
    if cores.is_finite() && (MIN_CPUS..=MAX_CPUS).contains(&cores) {
        return Ok(());
    }
    Err(format!(
        "`{field}` must be between {MIN_CPUS} and {MAX_CPUS} cores; got {cores}"
    ))
}

/// `field` is a process count in range.
pub(super) fn pids(field: &str, count: u64) -> Result<(), String> {
    if (MIN_PIDS..=MAX_PIDS).contains(&count) {
        return Ok(());
    }
    Err(format!(
        "`{field}` must be between {MIN_PIDS} and {MAX_PIDS} (the kernel's maximum); got {count}"
    ))
}

/// `field` is a TTL or idle timeout in range.
pub(crate) fn lifetime(field: &str, d: Duration) -> Result<(), String> {
    if !d.is_zero() && d <= MAX_LIFETIME {
        return Ok(());
    }
    Err(format!(
        "`{field}` must be a positive number of seconds, at most {}",
        MAX_LIFETIME.as_secs()
    ))
}

/// Checks every number of a request's spec.
pub(super) fn check_spec(spec: &tether_relay_core::provider::SandboxSpec) -> Result<(), String> {
    if let Some(m) = spec.memory_bytes {
        memory("memory_bytes", m)?;
    }
    if let Some(c) = spec.cpus {
        cpus("cpus", c)?;
    }
    if let Some(p) = spec.pids {
        pids("pids", p)?;
    }
    if let Some(d) = spec.disk_bytes {
        disk("disk_bytes", d)?;
    }
    if let Some(t) = spec.ttl {
        lifetime("ttl", t)?;
    }
    if let Some(t) = spec.idle_timeout {
        lifetime("idle_timeout", t)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_name_their_bounds() {
        assert!(memory("m", 1 << 30).is_ok());
        let err = memory("memory_bytes", 1).unwrap_err();
        assert!(
            err.contains("memory_bytes") && err.contains("1 MiB to 1 PiB"),
            "{err}"
        );
        assert!(cpus("cpus", 0.5).is_ok());
        assert!(cpus("cpus", f64::NAN).is_err() && cpus("cpus", 0.0).is_err());
        assert!(pids("pids", MAX_PIDS).is_ok());
        let err = pids("pids", MAX_PIDS + 1).unwrap_err();
        assert!(err.contains("4194304"), "{err}");
        assert!(pids("pids", 0).is_err());
        assert!(lifetime("ttl", Duration::ZERO).is_err());
        assert!(lifetime("ttl", MAX_LIFETIME + Duration::from_secs(1)).is_err());
    }
}

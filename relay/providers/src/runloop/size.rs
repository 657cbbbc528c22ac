//! A devbox's size in Runloop's terms: `--cpus`, `--memory` and `--disk` become
//! `resource_size_request: CUSTOM_SIZE` with `custom_cpu_cores`, `custom_gb_memory` and
//! `custom_disk_size` in the create's `launch_parameters`, checked against Runloop's rules
//! before anything is sent (its `LaunchParameters`): CPU 0.5, 1 or a multiple of 2, at most
//! 16; memory 1 GiB or a multiple of 2 GiB, at most 64; disk a multiple of 2 GiB from 2 to
//! 64; memory between 2 and 8 GiB per core. A custom size needs CPU and memory together.
//! Without any of them Runloop's default size applies (`SMALL`: 1 CPU, 2 GiB, 4 GiB disk).

use serde::Serialize;

use tether_relay_core::provider::{ProviderError, SandboxSpec};

/// Bytes in a GiB, Runloop's unit of memory and disk.
const GIB: u64 = 1 << 30;
/// Most cores, GiB of memory and GiB of disk a custom size takes.
const MAX_CPUS: f64 = 16.0;
const MAX_MEMORY_GIB: u64 = 64;
const MIN_DISK_GIB: u64 = 2;
const MAX_DISK_GIB: u64 = 64;
/// GiB of memory per core: at least, at most.
const MIN_GIB_PER_CORE: f64 = 2.0;
const MAX_GIB_PER_CORE: f64 = 8.0;

/// The size fields of `launch_parameters`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(super) struct Size {
    /// `CUSTOM_SIZE` when any of the others is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_size_request: Option<&'static str>,
    /// Cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_cpu_cores: Option<f64>,
    /// GiB of memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_gb_memory: Option<u64>,
    /// GiB of disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_disk_size: Option<u64>,
}

/// The size `spec` asks for, or why Runloop cannot give it.
pub(super) fn size(spec: &SandboxSpec) -> Result<Size, ProviderError> {
    if spec.pids.is_some() {
        return Err(refused(
            "Runloop has no process limit: drop --pids".to_string(),
        ));
    }
    let (cpus, memory) = match (spec.cpus, spec.memory_bytes) {
        (None, None) if spec.disk_bytes.is_none() => return Ok(Size::default()),
        (Some(cpus), Some(memory)) => (cpus, memory),
        _ => {
            return Err(refused(
                "Runloop's custom size takes --cpus and --memory together (and --disk if you \
                 like): give both, or neither for Runloop's default size (1 CPU, 2 GiB, 4 GiB \
                 of disk)"
                    .to_string(),
            ))
        }
    };
    let cpu_ok =
        cpus == 0.5 || cpus == 1.0 || (cpus.fract() == 0.0 && (cpus as u64).is_multiple_of(2));
    if !(cpu_ok && cpus > 0.0 && cpus <= MAX_CPUS) {
        return Err(refused(format!(
            "Runloop takes 0.5, 1 or an even number of CPUs up to 16, not {cpus}"
        )));
    }
    let gib = whole_gib(memory, "--memory")?;
    if !(gib == 1 || gib.is_multiple_of(2)) || gib == 0 || gib > MAX_MEMORY_GIB {
        return Err(refused(format!(
            "Runloop takes 1 GiB or an even number of GiB of memory up to {MAX_MEMORY_GIB}, not \
             {gib} GiB"
        )));
    }
    let per_core = gib as f64 / cpus;
    if !(MIN_GIB_PER_CORE..=MAX_GIB_PER_CORE).contains(&per_core) {
        return Err(refused(format!(
            "Runloop takes 2 to 8 GiB of memory per CPU; {gib} GiB for {cpus} CPUs is {per_core} \
             per CPU"
        )));
    }
    let disk = match spec.disk_bytes {
        None => None,
        Some(bytes) => {
            let gib = whole_gib(bytes, "--disk")?;
            if !gib.is_multiple_of(2) || !(MIN_DISK_GIB..=MAX_DISK_GIB).contains(&gib) {
                return Err(refused(format!(
                    "Runloop takes an even number of GiB of disk from {MIN_DISK_GIB} to \
                     {MAX_DISK_GIB}, not {gib} GiB"
                )));
            }
            Some(gib)
        }
    };
    Ok(Size {
        resource_size_request: Some("CUSTOM_SIZE"),
        custom_cpu_cores: Some(cpus),
        custom_gb_memory: Some(gib),
        custom_disk_size: disk,
    })
}

fn whole_gib(bytes: u64, flag: &str) -> Result<u64, ProviderError> {
    if !bytes.is_multiple_of(GIB) {
        return Err(refused(format!(
            "Runloop sizes in whole GiB: give {flag} as a number of GiB (e.g. 4G)"
        )));
    }
    Ok(bytes / GIB)
}

fn refused(message: String) -> ProviderError {
    ProviderError::InvalidSpec(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cpus: Option<f64>, memory_gib: Option<u64>, disk_gib: Option<u64>) -> SandboxSpec {
        SandboxSpec {
            cpus,
            memory_bytes: memory_gib.map(|g| g * GIB),
            disk_bytes: disk_gib.map(|g| g * GIB),
            ..SandboxSpec::default()
        }
    }

    #[test]
    fn a_custom_size_carries_runloop_field_names() {
        let json =
            serde_json::to_value(size(&spec(Some(2.0), Some(8), Some(16))).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "resource_size_request": "CUSTOM_SIZE",
                "custom_cpu_cores": 2.0,
                "custom_gb_memory": 8,
                "custom_disk_size": 16,
            })
        );
        assert_eq!(size(&spec(None, None, None)).unwrap(), Size::default());
        assert!(size(&spec(Some(0.5), Some(1), None)).is_ok());
    }

    #[test]
    fn what_runloop_refuses_is_refused_here_first() {
        for (cpus, mem, disk, says) in [
            (Some(3.0), Some(8), None, "even number of CPUs"),
            (Some(32.0), Some(64), None, "up to 16"),
            (Some(2.0), Some(3), None, "even number of GiB of memory"),
            (Some(2.0), Some(2), None, "2 to 8 GiB"),
            (Some(2.0), Some(32), None, "2 to 8 GiB"),
            (Some(2.0), Some(8), Some(3), "disk"),
            (Some(2.0), Some(8), Some(128), "disk"),
            (Some(2.0), None, None, "together"),
            (None, None, Some(8), "together"),
        ] {
            let err = size(&spec(cpus, mem, disk)).unwrap_err().to_string();
            assert!(err.contains(says), "{cpus:?} {mem:?} {disk:?}: {err}");
        }
        let odd = SandboxSpec {
            cpus: Some(1.0),
            memory_bytes: Some(GIB + 1),
            ..SandboxSpec::default()
        };
        assert!(size(&odd).unwrap_err().to_string().contains("whole GiB"));
        let pids = SandboxSpec {
            pids: Some(10),
            ..SandboxSpec::default()
        };
        assert!(size(&pids).unwrap_err().to_string().contains("--pids"));
    }
}

//! The container a sandbox becomes: its image, the agent's token, Tether's labels, and the
//! security defaults and limits, from a [`SandboxSpec`]. Pure: no engine call here.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};

use super::constants::{
    AGENT_TOKEN_ENV, CAPABILITIES, DEFAULT_PIDS, LABEL_RELAY, LABEL_SANDBOX, MAX_NOFILE, MAX_NPROC,
};
use nix::sys::resource::Resource;
use tether_relay_core::provider::{NetworkPolicy, ProviderError, SandboxSpec};

/// The engine's network a sandbox is put on: none at all by default; the engine's default
/// bridge (outbound through its NAT) for `--network host`. Allowlists are refused.
pub(super) fn network_mode(spec: &SandboxSpec) -> Result<&'static str, ProviderError> {
    match spec.network {
        NetworkPolicy::None => Ok("none"),
        NetworkPolicy::Host => Ok("bridge"),
        NetworkPolicy::Allowlist => Err(ProviderError::InvalidSpec(
            "the docker provider has no egress allowlist (an engine's networks are all or \
             nothing); use --network none or --network host, or --provider local for an \
             allowlist enforced by the relay"
                .into(),
        )),
    }
}

/// The body of `POST /containers/create` for sandbox `id` of relay `relay`.
pub(super) fn container(
    id: &str,
    relay: &str,
    agent_token: &str,
    spec: &SandboxSpec,
) -> Result<ContainerCreateBody, ProviderError> {
    let Some(image) = spec.image.as_deref().filter(|i| !i.is_empty()) else {
        return Err(ProviderError::InvalidSpec(
            "the docker provider needs an image with tether-agent as its entrypoint: build and \
             load one with `tether image build --target docker --name NAME`, then pass \
             --image NAME"
                .into(),
        ));
    };
    let mut env = Vec::with_capacity(spec.env.len() + 1);
    for (key, value) in &spec.env {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return Err(ProviderError::InvalidSpec(format!(
                "the environment variable {key:?} cannot be passed to a container: names may \
                 not be empty or hold '=' or NUL, values may not hold NUL"
            )));
        }
        if key == AGENT_TOKEN_ENV {
            return Err(ProviderError::InvalidSpec(format!(
                "{AGENT_TOKEN_ENV} is the relay's to set; leave it out of --env"
            )));
        }
        env.push(format!("{key}={value}"));
    }
    env.push(format!("{AGENT_TOKEN_ENV}={agent_token}"));
    let labels = HashMap::from([
        (LABEL_SANDBOX.to_string(), id.to_string()),
        (LABEL_RELAY.to_string(), relay.to_string()),
    ]);
    Ok(ContainerCreateBody {
        image: Some(image.to_string()),
        env: Some(env),
        labels: Some(labels),
        hostname: Some(id.chars().take(63).collect()),
        host_config: Some(host_config(spec)?),
        ..Default::default()
    })
}

fn host_config(spec: &SandboxSpec) -> Result<HostConfig, ProviderError> {
    let mut security_opt = vec!["no-new-privileges".to_string()];
    if spec.seccomp_unconfined {
        // Admin tokens only; the relay's policy checked it before the provider sees it.
        security_opt.push("seccomp=unconfined".into());
    }
    let nano_cpus = match spec.cpus {
        None => None,
        Some(c) if c.is_finite() && c > 0.0 && c <= 1024.0 => Some((c * 1e9).round() as i64),
        Some(c) => {
            return Err(ProviderError::InvalidSpec(format!(
                "--cpus {c} is not a number of cores the engine takes: give a positive number \
                 such as 0.5 or 2"
            )))
        }
    };
    let memory = spec
        .memory_bytes
        .map(|m| positive("--memory", m))
        .transpose()?;
    let pids = spec
        .pids
        .map(|p| positive("--pids", p))
        .transpose()?
        .unwrap_or(DEFAULT_PIDS);
    let storage_opt = spec
        .disk_bytes
        .map(|d| HashMap::from([("size".to_string(), d.to_string())]));
    Ok(HostConfig {
        network_mode: Some(network_mode(spec)?.to_string()),
        privileged: Some(false),
        security_opt: Some(security_opt),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(CAPABILITIES.iter().map(|c| c.to_string()).collect()),
        pids_limit: Some(pids),
        nano_cpus,
        memory,
        // No swap beyond the memory limit.
        memory_swap: memory,
        storage_opt,
        ulimits: Some(vec![
            ulimit("nofile", Resource::RLIMIT_NOFILE, MAX_NOFILE),
            ulimit("nproc", Resource::RLIMIT_NPROC, MAX_NPROC),
        ]),
        // The agent is PID 1 and reaps; no engine init in front of it.
        init: Some(false),
        publish_all_ports: Some(false),
        ..Default::default()
    })
}

fn positive(flag: &str, value: u64) -> Result<i64, ProviderError> {
    i64::try_from(value)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| ProviderError::InvalidSpec(format!("{flag} {value} is out of range")))
}

/// The rlimit `name` at `max`, or at the relay's own hard limit if lower: the engine on this
/// host has no more than that to give, and refuses the container when asked for more.
fn ulimit(name: &str, resource: Resource, max: u64) -> ResourcesUlimits {
    let hard = nix::sys::resource::getrlimit(resource)
        .map(|(_, hard)| hard)
        .unwrap_or(max);
    let value = i64::try_from(hard.min(max)).unwrap_or(1024);
    ResourcesUlimits {
        name: Some(name.into()),
        soft: Some(value),
        hard: Some(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            image: Some("sandbox:1".into()),
            ..SandboxSpec::default()
        }
    }

    #[test]
    fn containers_are_unprivileged_unnetworked_and_labelled() {
        let body = container("sb-1", "/var/lib/tether", "tok", &spec()).unwrap();
        let host = body.host_config.unwrap();
        assert_eq!(host.privileged, Some(false));
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        assert!(!host.cap_add.unwrap().iter().any(|c| c.contains("SYS_")));
        assert!(host
            .security_opt
            .unwrap()
            .contains(&"no-new-privileges".into()));
        assert_eq!(host.pids_limit, Some(DEFAULT_PIDS));
        assert!(host.port_bindings.is_none());
        let labels = body.labels.unwrap();
        assert_eq!(labels[LABEL_SANDBOX], "sb-1");
        assert_eq!(labels[LABEL_RELAY], "/var/lib/tether");
        assert!(body.env.unwrap().contains(&"TETHER_AGENT_TOKEN=tok".into()));
    }

    #[test]
    fn sizes_become_engine_limits() {
        let spec = SandboxSpec {
            cpus: Some(1.5),
            memory_bytes: Some(512 << 20),
            pids: Some(64),
            disk_bytes: Some(1 << 30),
            ..spec()
        };
        let host = container("sb-1", "r", "t", &spec)
            .unwrap()
            .host_config
            .unwrap();
        assert_eq!(host.nano_cpus, Some(1_500_000_000));
        assert_eq!(host.memory, Some(512 << 20));
        assert_eq!(host.memory_swap, Some(512 << 20));
        assert_eq!(host.pids_limit, Some(64));
        assert_eq!(host.storage_opt.unwrap()["size"], (1u64 << 30).to_string());
    }

    #[test]
    fn what_a_container_cannot_hold_is_refused() {
        for bad in [
            SandboxSpec {
                image: None,
                ..SandboxSpec::default()
            },
            SandboxSpec {
                network: NetworkPolicy::Allowlist,
                ..spec()
            },
            SandboxSpec {
                cpus: Some(f64::NAN),
                ..spec()
            },
            SandboxSpec {
                pids: Some(u64::MAX),
                ..spec()
            },
            SandboxSpec {
                env: [("A=B".to_string(), "x".to_string())].into(),
                ..spec()
            },
            SandboxSpec {
                env: [(AGENT_TOKEN_ENV.to_string(), "mine".to_string())].into(),
                ..spec()
            },
        ] {
            let err = container("sb-1", "r", "t", &bad).unwrap_err();
            assert!(matches!(err, ProviderError::InvalidSpec(_)), "{err}");
        }
    }
}

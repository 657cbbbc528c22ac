//! What a sandbox's network mode guarantees, as `tether info` states it: the mode and allowlist
//! asked for, the secrets bound (names only), who enforces it, and what holds and what does not.
//! Each provider says this of itself ([`super::Provider::network_info`]); the relay's own
//! enforcement (local sandboxes) is the default, here.

use tether_client::api::{NetworkInfo, SecretBinding};

use super::{NetworkPolicy, SandboxSpec};

/// Who enforces a local sandbox's network: the relay itself.
pub const RELAY: &str = "relay";

/// What a provider states about one mode on its sandboxes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Guarantees {
    /// One sentence per guarantee that holds.
    pub holds: Vec<String>,
    /// One sentence per thing that does not hold or is not enforced.
    pub not: Vec<String>,
}

impl Guarantees {
    /// Guarantees from sentences.
    pub fn new(holds: &[&str], not: &[&str]) -> Self {
        let own = |s: &[&str]| s.iter().map(|s| s.to_string()).collect();
        Guarantees {
            holds: own(holds),
            not: own(not),
        }
    }
}

/// The [`NetworkInfo`] of `spec` enforced by `enforced_by` with `guarantees`. Secret values
/// never appear: only names and hosts.
pub fn info(spec: &SandboxSpec, enforced_by: &str, guarantees: Guarantees) -> NetworkInfo {
    NetworkInfo {
        mode: spec.network,
        egress: spec.egress.clone(),
        secrets: spec
            .secrets
            .iter()
            .map(|s| SecretBinding {
                name: s.name.clone(),
                hosts: s.hosts.clone(),
            })
            .collect(),
        enforced_by: enforced_by.to_string(),
        guarantees: guarantees.holds,
        not_guaranteed: guarantees.not,
    }
}

/// What the relay guarantees where it enforces the network itself (local sandboxes: their own
/// network namespace, and for an allowlist the relay's DNS and egress proxy).
pub fn relay_enforced(spec: &SandboxSpec) -> NetworkInfo {
    let guarantees = match spec.network {
        NetworkPolicy::None => {
            Guarantees::new(&["no network: the sandbox has its own loopback only"], &[])
        }
        NetworkPolicy::Host => Guarantees::new(
            &[],
            &["nothing is restricted: the sandbox shares the host's network"],
        ),
        NetworkPolicy::Allowlist => Guarantees::new(
            &[
                "DNS is answered by the relay: allowed names only, nothing is forwarded, so no \
                 data leaves in DNS queries",
                "connections go only to allowed names (TLS SNI and HTTP Host checked against \
                 the name) and allowed networks, through the relay's egress proxy; UDP only to \
                 allowed networks (never port 53, which is the relay's DNS), relayed by the \
                 relay; every other packet is refused",
                "secrets never enter the sandbox: it holds placeholders, replaced with the \
                 values on the way out to the secrets' own hosts only",
            ],
            &[],
        ),
    };
    info(spec, RELAY, guarantees)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_client::api::{EgressSpec, SecretSpec, SecretValue};

    #[test]
    fn secret_values_never_reach_the_info() {
        let spec = SandboxSpec {
            network: NetworkPolicy::Allowlist,
            egress: EgressSpec {
                allow_hosts: vec!["*.pypi.org".into()],
                allow_cidrs: vec![],
            },
            secrets: vec![SecretSpec {
                name: "OPENAI_API_KEY".into(),
                hosts: vec!["api.openai.com".into()],
                value: Some(SecretValue::new("sk-live-never-shown")),
            }],
            ..SandboxSpec::default()
        };
        let info = relay_enforced(&spec);
        let json = serde_json::to_string(&info).unwrap();
        assert!(!json.contains("sk-live-never-shown"), "{json}");
        assert!(json.contains("OPENAI_API_KEY") && json.contains("api.openai.com"));
        assert_eq!(info.enforced_by, "relay");
        assert!(info.guarantees.iter().any(|g| g.contains("DNS")));
        assert!(info.not_guaranteed.is_empty(), "{:?}", info.not_guaranteed);
    }

    #[test]
    fn allowed_networks_say_udp_reaches_them_and_nothing_else() {
        let spec = SandboxSpec {
            network: NetworkPolicy::Allowlist,
            egress: EgressSpec {
                allow_hosts: vec![],
                allow_cidrs: vec!["10.1.0.0/16".into()],
            },
            ..SandboxSpec::default()
        };
        let info = relay_enforced(&spec);
        assert!(info.not_guaranteed.is_empty(), "{:?}", info.not_guaranteed);
        assert!(
            info.guarantees
                .iter()
                .any(|g| g.contains("UDP only to allowed networks")),
            "{:?}",
            info.guarantees
        );
    }
}

//! A Runloop devbox's outbound network, in Runloop's own controls: a network policy
//! (`POST /v1/network-policies`) named in the devbox's `launch_parameters.network_policy_id`.
//!
//! Runloop's rules (its API reference and official SDK, `NetworkPolicyCreateParams`): a policy
//! with `allow_all: false` allows `allowed_hostnames` (DNS names, `*.` wildcards) and
//! `allowed_cidrs` (IPv4 blocks in canonical form, host bits zero, optionally limited to
//! ports); with both empty it allows nothing (Runloop's DENY_ALL). Runloop's package mirrors,
//! agent gateway, MCP hub and devbox-to-devbox tunnels stay off unless asked for. A devbox
//! without a policy has Runloop's default, open egress.
//!
//! So `--network none` is a policy of its own that allows nothing, `--network host` is no
//! policy, and an allowlist is a policy of its names and networks. Each sandbox gets its own
//! policy, named `tether-<sandbox id>`, deleted with the sandbox.

use ipnet::IpNet;
use serde::Serialize;

use crate::cloud::egress::{self, refuse};
use tether_relay_core::provider::network::{self, Guarantees};
use tether_relay_core::provider::{NetworkInfo, NetworkPolicy, ProviderError, SandboxSpec};

/// Runloop's display name in messages.
const RUNLOOP: &str = "Runloop";
/// The prefix of the policies the relay makes: `tether-<sandbox id>`.
pub(super) const POLICY_PREFIX: &str = "tether-";

/// `POST /v1/network-policies`: the egress a sandbox may have.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(super) struct NewPolicy {
    /// `tether-<sandbox id>`: policies are found again by it.
    pub name: String,
    /// Says what the policy is for, in Runloop's dashboard.
    pub description: String,
    /// Always false: what is not listed is refused.
    pub allow_all: bool,
    /// Host names, `*.` for the names below a domain.
    pub allowed_hostnames: Vec<String>,
    /// IPv4 networks, every port.
    pub allowed_cidrs: Vec<AllowedCidr>,
}

/// One entry of `allowed_cidrs` (no `ports`: every port and protocol).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(super) struct AllowedCidr {
    /// In canonical form, e.g. `10.1.0.0/16`.
    pub cidr: String,
}

/// The policy `spec`'s network mode becomes for sandbox `id`: `None` for Runloop's open
/// default (`--network host`), or why Runloop cannot express it.
pub(super) fn policy(id: &str, spec: &SandboxSpec) -> Result<Option<NewPolicy>, ProviderError> {
    let mut policy = NewPolicy {
        name: format!("{POLICY_PREFIX}{id}"),
        description: format!("egress of Tether sandbox {id}"),
        ..NewPolicy::default()
    };
    let Some(list) = egress::allowlist(RUNLOOP, spec)? else {
        return Ok(match spec.network {
            NetworkPolicy::Host => None,
            // Nothing listed, nothing allowed: Runloop's DENY_ALL.
            _ => Some(policy),
        });
    };
    policy.allowed_hostnames = list.hosts.iter().map(ToString::to_string).collect();
    for net in &list.networks {
        match net {
            IpNet::V4(_) => policy.allowed_cidrs.push(AllowedCidr {
                cidr: net.to_string(),
            }),
            IpNet::V6(_) => {
                return Err(refuse(
                    RUNLOOP,
                    &format!("the IPv6 network {net} (its network policies take IPv4 only)"),
                    "allow IPv4 networks only, or use --provider local",
                ))
            }
        }
    }
    Ok(Some(policy))
}

/// What holds for a Runloop devbox created from `spec`.
pub(super) fn info(spec: &SandboxSpec) -> NetworkInfo {
    let mut guarantees = match spec.network {
        NetworkPolicy::None => Guarantees::new(
            &[
                "no outbound network: the devbox's Runloop network policy allows nothing \
               (allow_all off, no names, no networks, no Runloop mirrors)",
            ],
            &[],
        ),
        NetworkPolicy::Host => Guarantees::new(
            &[],
            &[
                "outbound traffic is unrestricted: the devbox has no network policy (Runloop's \
               default)",
            ],
        ),
        NetworkPolicy::Allowlist => Guarantees::new(
            &[
                "Runloop's network policy allows outbound traffic only to its \
                 allowed_hostnames and allowed_cidrs (IPv4, every port); Runloop's mirrors, \
                 gateways and other devboxes are not allowed",
            ],
            &[
                "names are matched by Runloop, not checked by the relay: how (DNS answers, TLS \
                 SNI, HTTP Host) is not documented",
                "DNS: whether the devbox can still send DNS queries for other names (and data \
                 in them) is Runloop's and not documented",
            ],
        ),
    };
    egress::secrets_guarantees(RUNLOOP, spec, &mut guarantees);
    network::info(spec, "runloop", guarantees)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_client::api::{EgressSpec, SecretSpec};

    fn allowlist(hosts: &[&str], cidrs: &[&str]) -> SandboxSpec {
        SandboxSpec {
            network: NetworkPolicy::Allowlist,
            egress: EgressSpec {
                allow_hosts: hosts.iter().map(|s| s.to_string()).collect(),
                allow_cidrs: cidrs.iter().map(|s| s.to_string()).collect(),
            },
            ..SandboxSpec::default()
        }
    }

    #[test]
    fn modes_become_a_policy_of_their_own_or_none() {
        let none = policy("sb-1", &SandboxSpec::default()).unwrap().unwrap();
        assert_eq!(none.name, "tether-sb-1");
        assert!(!none.allow_all && none.allowed_hostnames.is_empty());
        assert!(none.allowed_cidrs.is_empty());
        let host = SandboxSpec {
            network: NetworkPolicy::Host,
            ..SandboxSpec::default()
        };
        assert_eq!(policy("sb-1", &host).unwrap(), None);
        let empty = policy("sb-1", &allowlist(&[], &[])).unwrap().unwrap();
        assert!(empty.allowed_hostnames.is_empty() && empty.allowed_cidrs.is_empty());
    }

    #[test]
    fn an_allowlist_carries_runloop_field_names() {
        let list = policy(
            "sb-2",
            &allowlist(
                &["api.openai.com", "*.PyPI.org"],
                &["10.1.0.0/16", "192.0.2.7"],
            ),
        )
        .unwrap()
        .unwrap();
        let json = serde_json::to_value(&list).unwrap();
        assert_eq!(json["allow_all"], false);
        assert_eq!(
            json["allowed_hostnames"],
            serde_json::json!(["api.openai.com", "*.pypi.org"])
        );
        assert_eq!(
            json["allowed_cidrs"],
            serde_json::json!([{"cidr": "10.1.0.0/16"}, {"cidr": "192.0.2.7/32"}])
        );
    }

    #[test]
    fn what_runloop_cannot_express_is_refused_naming_it() {
        let v6 = policy("sb-3", &allowlist(&[], &["2001:db8::/32"])).unwrap_err();
        assert!(v6.to_string().contains("Runloop") && v6.to_string().contains("IPv6"));
        let mut secret = allowlist(&["api.openai.com"], &[]);
        secret.secrets.push(SecretSpec {
            name: "KEY".into(),
            hosts: vec!["api.openai.com".into()],
            value: None,
        });
        let err = policy("sb-3", &secret).unwrap_err().to_string();
        assert!(err.contains("Runloop cannot carry secrets"), "{err}");
    }

    #[test]
    fn info_says_runloop_enforces_it_and_what_is_not_known() {
        let info = info(&allowlist(&["api.openai.com"], &[]));
        assert_eq!(info.enforced_by, "runloop");
        assert!(info.not_guaranteed.iter().any(|n| n.contains("DNS")));
    }
}

//! A Modal sandbox's outbound network, in Modal's own control: the sandbox definition's
//! `network_access` (`NetworkAccess{network_access_type, allowed_cidrs, allowed_domains}`, the
//! successor of the deprecated `block_network`), as the Python SDK's `block_network`,
//! `outbound_cidr_allowlist` and `outbound_domain_allowlist` build it. `BLOCKED` would forbid
//! the open port the agent is reached on, so no network is an `ALLOWLIST` with nothing in it.

use super::pb::network_access::NetworkAccessType;
use super::pb::NetworkAccess;
use crate::cloud::egress;
use tether_relay_core::provider::network::{self, Guarantees};
use tether_relay_core::provider::{NetworkInfo, NetworkPolicy, ProviderError, SandboxSpec};

/// What `spec`'s network mode becomes on Modal, or why Modal cannot take it.
pub(super) fn network_access(spec: &SandboxSpec) -> Result<NetworkAccess, ProviderError> {
    let list = egress::allowlist("Modal", spec)?;
    Ok(match (spec.network, list) {
        (NetworkPolicy::Host, _) => NetworkAccess {
            network_access_type: NetworkAccessType::Open as i32,
            ..NetworkAccess::default()
        },
        (_, list) => {
            let list = list.unwrap_or_default();
            NetworkAccess {
                network_access_type: NetworkAccessType::Allowlist as i32,
                allowed_cidrs: list.networks.iter().map(ToString::to_string).collect(),
                allowed_domains: list.hosts.iter().map(ToString::to_string).collect(),
            }
        }
    })
}

/// What holds for a Modal sandbox created from `spec`.
pub(super) fn info(spec: &SandboxSpec) -> NetworkInfo {
    let mut guarantees = match spec.network {
        NetworkPolicy::None => Guarantees::new(
            &["no outbound network: Modal's network_access is an empty allowlist"],
            &[],
        ),
        NetworkPolicy::Host => Guarantees::new(
            &[],
            &["outbound traffic is unrestricted (Modal's OPEN network access)"],
        ),
        NetworkPolicy::Allowlist => Guarantees::new(
            &[
                "Modal allows outbound connections to the allowed networks (allowed_cidrs) \
                 and names (allowed_domains) only",
            ],
            &[
                "how Modal matches names (DNS, TLS SNI) is Modal's and not documented: \
                 assume the sandbox can still send DNS queries, and data in them",
            ],
        ),
    };
    egress::secrets_guarantees("Modal", spec, &mut guarantees);
    network::info(spec, "modal", guarantees)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_client::api::EgressSpec;

    #[test]
    fn an_allowlist_becomes_modal_cidrs_and_domains() {
        let spec = SandboxSpec {
            network: NetworkPolicy::Allowlist,
            egress: EgressSpec {
                allow_hosts: vec!["api.openai.com".into(), "*.pypi.org".into()],
                allow_cidrs: vec!["10.1.0.0/16".into(), "2001:db8::/32".into()],
            },
            ..SandboxSpec::default()
        };
        let got = network_access(&spec).unwrap();
        assert_eq!(got.network_access_type, NetworkAccessType::Allowlist as i32);
        assert_eq!(got.allowed_cidrs, ["10.1.0.0/16", "2001:db8::/32"]);
        assert_eq!(got.allowed_domains, ["api.openai.com", "*.pypi.org"]);

        // No network is an allowlist of nothing, never OPEN.
        let none = network_access(&SandboxSpec::default()).unwrap();
        assert_eq!(
            none.network_access_type,
            NetworkAccessType::Allowlist as i32
        );
        assert!(none.allowed_cidrs.is_empty() && none.allowed_domains.is_empty());
        let host = SandboxSpec {
            network: NetworkPolicy::Host,
            ..SandboxSpec::default()
        };
        let open = network_access(&host).unwrap();
        assert_eq!(open.network_access_type, NetworkAccessType::Open as i32);
    }

    #[test]
    fn info_says_dns_is_not_guaranteed() {
        let info = info(&SandboxSpec {
            network: NetworkPolicy::Allowlist,
            ..SandboxSpec::default()
        });
        assert_eq!(info.enforced_by, "modal");
        assert!(info.not_guaranteed.iter().any(|n| n.contains("DNS")));
    }
}

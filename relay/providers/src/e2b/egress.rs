//! An E2B sandbox's outbound network, in E2B's own controls: `allow_internet_access` and
//! `network.allowOut` / `network.denyOut` of the create request (E2B's `SandboxNetworkConfig`).
//!
//! E2B's rules (infra `packages/api/internal/handlers/sandbox_create.go`,
//! `packages/shared/pkg/sandbox-network/firewall.go`; e2b.dev/docs/network/internet-access):
//! `allowOut` takes IPv4 addresses, CIDRs and host names (`*.` for the names below a domain)
//! and wins over `denyOut`, which takes addresses and CIDRs only; host names need
//! `0.0.0.0/0` in `denyOut`; names are matched on ports 80 (HTTP `Host`) and 443 (TLS SNI)
//! only, and once a name is listed the sandbox may query the nameserver 8.8.8.8.

use ipnet::IpNet;

use crate::cloud::egress::{self, refuse};
use tether_relay_core::egress::route::{EgressUrl, RelayEntry, RouteHost};
use tether_relay_core::provider::network::{self, Guarantees};
use tether_relay_core::provider::{NetworkInfo, NetworkPolicy, ProviderError, SandboxSpec};

/// `denyOut` that blocks every IPv4 destination (E2B's `ALL_TRAFFIC`).
pub(super) const ALL_TRAFFIC: &str = "0.0.0.0/0";
/// E2B's display name in messages.
const E2B: &str = "E2B";

/// The outbound fields of a create request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Outbound {
    /// `allow_internet_access`.
    pub allow_internet_access: bool,
    /// `network.allowOut`.
    pub allow_out: Vec<String>,
    /// `network.denyOut`.
    pub deny_out: Vec<String>,
}

/// What `spec`'s network mode becomes on E2B, or why E2B cannot express it.
pub(super) fn outbound(spec: &SandboxSpec) -> Result<Outbound, ProviderError> {
    let Some(list) = egress::allowlist(E2B, spec)? else {
        return Ok(Outbound {
            allow_internet_access: spec.network == NetworkPolicy::Host,
            ..Outbound::default()
        });
    };
    if list.hosts.is_empty() && list.networks.is_empty() {
        // Nothing allowed: the same as no network.
        return Ok(Outbound::default());
    }
    let mut allow_out: Vec<String> = list.hosts.iter().map(ToString::to_string).collect();
    for net in &list.networks {
        allow_out.push(network_entry(net)?);
    }
    // As E2B documents it: internet access on, everything denied but what allowOut lists.
    Ok(Outbound {
        allow_internet_access: true,
        allow_out,
        deny_out: vec![ALL_TRAFFIC.to_string()],
    })
}

/// One allowed network as E2B takes it: IPv4 only (its firewall filters IPv4), and not an
/// unspecified address (E2B refuses `0.0.0.0/8` and the like as "invalid allowed address").
fn network_entry(net: &IpNet) -> Result<String, ProviderError> {
    match net {
        IpNet::V6(_) => Err(refuse(
            E2B,
            &format!("the IPv6 network {net} (its firewall filters IPv4)"),
            "allow IPv4 networks only, or use --provider local",
        )),
        IpNet::V4(v4) if v4.addr().is_unspecified() && v4.prefix_len() != 0 => Err(refuse(
            E2B,
            &format!("{net}, whose address is unspecified"),
            "name a network with a real address, or 0.0.0.0/0 for every IPv4 address",
        )),
        IpNet::V4(_) => Ok(net.to_string()),
    }
}

/// What `allowOut` must also hold for an E2B sandbox to reach the relay's egress listener at
/// `url`: its IPv4 address (any port), or its name when the URL is `https` on port 443 (E2B
/// matches names by TLS SNI on 443 and HTTP Host on 80 only, and a proxy's CONNECT carries
/// the target's name, not the proxy's).
pub(super) fn relay_entry(url: &EgressUrl) -> Result<RelayEntry, ProviderError> {
    match &url.host {
        RouteHost::Addr(addr) if addr.is_ipv6() => Err(refuse(
            E2B,
            &format!("the relay's IPv6 egress address {addr} (its firewall filters IPv4)"),
            "give --egress-url the relay's IPv4 address or an https URL on port 443",
        )),
        RouteHost::Name(name) if !(url.tls && url.port == 443) => Err(refuse(
            E2B,
            &format!(
                "the relay's egress URL {url} by name (it matches names by TLS SNI on port 443 \
                 and HTTP Host on port 80 only, so {name} on another port is never allowed)"
            ),
            "give --egress-url an https URL on port 443, or the relay's IPv4 address \
             (http://ADDRESS:PORT)",
        )),
        _ => Ok(RelayEntry::of(url)),
    }
}

/// What holds for an E2B sandbox created from `spec`.
pub(super) fn info(spec: &SandboxSpec) -> NetworkInfo {
    let mut guarantees = match spec.network {
        NetworkPolicy::None => Guarantees::new(
            &["no outbound network: E2B's allow_internet_access is off"],
            &[],
        ),
        NetworkPolicy::Host => Guarantees::new(
            &[],
            &["outbound traffic is unrestricted (E2B's internet access)"],
        ),
        NetworkPolicy::Allowlist => Guarantees::new(
            &[
                "E2B's firewall denies all outbound IPv4 (denyOut 0.0.0.0/0) except allowOut: \
               the allowed networks on every port, the allowed names on ports 80 and 443 only",
            ],
            &[
                "DNS exfiltration: once a name is allowed, E2B lets the sandbox query 8.8.8.8 \
                 for any name, so data can leave in DNS queries",
                "names are matched on what the sandbox sends (TLS SNI on 443, HTTP Host on \
                 80), not checked by the relay",
                "a refused TCP connection may appear to open inside before E2B drops it",
            ],
        ),
    };
    egress::secrets_guarantees(E2B, spec, &mut guarantees);
    network::info(spec, "e2b", guarantees)
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
    fn an_allowlist_becomes_allow_out_with_everything_else_denied() {
        let got = outbound(&allowlist(
            &["api.openai.com", "*.PyPI.org"],
            &["10.1.0.0/16", "192.0.2.7"],
        ))
        .unwrap();
        assert_eq!(
            got,
            Outbound {
                allow_internet_access: true,
                allow_out: vec![
                    "api.openai.com".into(),
                    "*.pypi.org".into(),
                    "10.1.0.0/16".into(),
                    "192.0.2.7/32".into()
                ],
                deny_out: vec!["0.0.0.0/0".into()],
            }
        );
        // Nothing allowed is no network, never E2B's open default.
        assert_eq!(outbound(&allowlist(&[], &[])).unwrap(), Outbound::default());
        assert!(
            !outbound(&SandboxSpec::default())
                .unwrap()
                .allow_internet_access
        );
        let host = SandboxSpec {
            network: NetworkPolicy::Host,
            ..SandboxSpec::default()
        };
        assert!(outbound(&host).unwrap().allow_internet_access);
    }

    #[test]
    fn the_create_request_carries_e2b_field_names() {
        let out = outbound(&allowlist(&["api.openai.com"], &["10.1.0.0/16"])).unwrap();
        let empty = std::collections::BTreeMap::new();
        let body = super::super::api::NewSandbox {
            template_id: "t",
            timeout: 60,
            metadata: &empty,
            env_vars: &empty,
            allow_internet_access: out.allow_internet_access,
            network: super::super::api::Network {
                allow_public_traffic: false,
                allow_out: out.allow_out,
                deny_out: out.deny_out,
            },
        };
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["allow_internet_access"], true);
        assert_eq!(
            json["network"],
            serde_json::json!({
                "allowPublicTraffic": false,
                "allowOut": ["api.openai.com", "10.1.0.0/16"],
                "denyOut": ["0.0.0.0/0"],
            })
        );
    }

    #[test]
    fn what_e2b_cannot_express_is_refused_naming_it() {
        let v6 = outbound(&allowlist(&[], &["2001:db8::/32"])).unwrap_err();
        assert!(
            v6.to_string().contains("E2B") && v6.to_string().contains("IPv6"),
            "{v6}"
        );
        let unspecified = outbound(&allowlist(&[], &["0.0.0.0/8"])).unwrap_err();
        assert!(
            unspecified.to_string().contains("0.0.0.0/8"),
            "{unspecified}"
        );
        let mut secret = allowlist(&["api.openai.com"], &[]);
        secret.secrets.push(SecretSpec {
            name: "KEY".into(),
            hosts: vec!["api.openai.com".into()],
            value: None,
        });
        let err = outbound(&secret).unwrap_err().to_string();
        assert!(err.contains("E2B cannot carry secrets"), "{err}");
    }

    #[test]
    fn the_relay_is_allowed_by_address_or_by_name_on_443_only() {
        let by_addr = relay_entry(&EgressUrl::parse("http://203.0.113.9:3129").unwrap());
        assert_eq!(
            by_addr.unwrap(),
            RelayEntry::Network("203.0.113.9/32".parse().unwrap())
        );
        let tls = relay_entry(&EgressUrl::parse("https://relay.example.com").unwrap());
        assert_eq!(tls.unwrap(), RelayEntry::Host("relay.example.com".into()));
        for bad in [
            "http://relay.example.com:3129",
            "https://relay.example.com:8443",
            "http://[2001:db8::1]:3129",
        ] {
            let err = relay_entry(&EgressUrl::parse(bad).unwrap()).unwrap_err();
            assert!(err.to_string().contains("--egress-url"), "{bad}: {err}");
        }
    }

    #[test]
    fn info_states_what_e2b_does_not_enforce() {
        let info = info(&allowlist(&["api.openai.com"], &[]));
        assert_eq!(info.enforced_by, "e2b");
        assert!(info.not_guaranteed.iter().any(|n| n.contains("DNS")));
        assert!(info.not_guaranteed.iter().any(|n| n.contains("SNI")));
        assert_eq!(info.egress.allow_hosts, ["api.openai.com"]);
    }
}

//! A Daytona sandbox's outbound network, in Daytona's own controls: `networkBlockAll`,
//! `networkAllowList` and `domainAllowList` of `POST /sandbox`.
//!
//! Daytona's rules (`apps/api/src/sandbox/utils/network-validation.util.ts`; daytona.io/docs
//! network-limits): `networkAllowList` is a comma-separated list of at most 10 IPv4 CIDRs
//! (a prefix length is required), `domainAllowList` of at most 20 names (`*.` allowed, the
//! last label alphabetic), one of the two per sandbox, neither with `networkBlockAll`. On
//! organizations of tiers 1 and 2 Daytona's own restrictions apply on top.

use ipnet::IpNet;

use crate::cloud::egress::{self, refuse};
use tether_relay_core::egress::route::{EgressUrl, RelayEntry, RouteHost};
use tether_relay_core::provider::network::{self, Guarantees};
use tether_relay_core::provider::{NetworkInfo, NetworkPolicy, ProviderError, SandboxSpec};

/// Most networks `networkAllowList` holds.
pub(super) const MAX_NETWORKS: usize = 10;
/// Most names `domainAllowList` holds.
pub(super) const MAX_DOMAINS: usize = 20;
/// Daytona's display name in messages.
const DAYTONA: &str = "Daytona";

/// The outbound fields of a create request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Outbound {
    /// `networkBlockAll`.
    pub block_all: bool,
    /// `networkAllowList`, comma-separated.
    pub network_allow_list: Option<String>,
    /// `domainAllowList`, comma-separated.
    pub domain_allow_list: Option<String>,
}

/// What `spec`'s network mode becomes on Daytona, or why Daytona cannot express it.
pub(super) fn outbound(spec: &SandboxSpec) -> Result<Outbound, ProviderError> {
    let blocked = Outbound {
        block_all: true,
        ..Outbound::default()
    };
    let Some(list) = egress::allowlist(DAYTONA, spec)? else {
        return Ok(match spec.network {
            NetworkPolicy::Host => Outbound::default(),
            _ => blocked,
        });
    };
    match (list.hosts.is_empty(), list.networks.is_empty()) {
        (true, true) => Ok(blocked),
        (false, false) => Err(refuse(
            DAYTONA,
            "host names and networks for one sandbox (its domainAllowList and \
             networkAllowList exclude each other)",
            "allow either host names or networks, or use --provider local",
        )),
        (true, false) => {
            if list.networks.len() > MAX_NETWORKS {
                return Err(refuse(
                    DAYTONA,
                    &format!("{} networks (it takes {MAX_NETWORKS})", list.networks.len()),
                    "merge them into wider networks, or use --provider local",
                ));
            }
            let nets: Vec<String> = list
                .networks
                .iter()
                .map(|net| match net {
                    IpNet::V4(_) => Ok(net.to_string()),
                    IpNet::V6(_) => Err(refuse(
                        DAYTONA,
                        &format!("the IPv6 network {net} (it takes IPv4 only)"),
                        "allow IPv4 networks only, or use --provider local",
                    )),
                })
                .collect::<Result<_, _>>()?;
            Ok(Outbound {
                network_allow_list: Some(nets.join(",")),
                ..Outbound::default()
            })
        }
        (false, true) => {
            if list.hosts.len() > MAX_DOMAINS {
                return Err(refuse(
                    DAYTONA,
                    &format!("{} host names (it takes {MAX_DOMAINS})", list.hosts.len()),
                    "use wildcards such as *.example.com, or use --provider local",
                ));
            }
            let names: Vec<String> = list.hosts.iter().map(ToString::to_string).collect();
            if let Some(bad) = names.iter().find(|n| !is_daytona_domain(n)) {
                return Err(refuse(
                    DAYTONA,
                    &format!("the host name {bad}"),
                    "it takes names of letters, digits and `-` with an alphabetic top-level \
                     domain (optionally *. before them); use --provider local for others",
                ));
            }
            Ok(Outbound {
                domain_allow_list: Some(names.join(",")),
                ..Outbound::default()
            })
        }
    }
}

/// Daytona's domain syntax: `(\*\.)?([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)+[a-zA-Z]{2,}`.
pub(super) fn is_daytona_domain(name: &str) -> bool {
    let name = name.strip_prefix("*.").unwrap_or(name);
    let mut labels: Vec<&str> = name.split('.').collect();
    let Some(tld) = labels.pop() else {
        return false;
    };
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        (1..=63).contains(&b.len())
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
    };
    !labels.is_empty()
        && labels.iter().all(|l| label_ok(l))
        && tld.len() >= 2
        && tld.bytes().all(|c| c.is_ascii_alphabetic())
}

/// What Daytona's lists must also hold for a sandbox created from `spec` to reach the relay's
/// egress listener at `url`. Its secrets are bound to names, which go in `domainAllowList`,
/// and Daytona takes names or networks for a sandbox, not both: so the relay must be named.
pub(super) fn relay_entry(
    spec: &SandboxSpec,
    url: &EgressUrl,
) -> Result<RelayEntry, ProviderError> {
    match &url.host {
        RouteHost::Addr(addr)
            if !spec.secrets.is_empty() || !spec.egress.allow_hosts.is_empty() =>
        {
            Err(refuse(
                DAYTONA,
                &format!(
                    "the relay's egress address {addr} beside the host names this sandbox \
                     allows and binds secrets to (its networkAllowList and domainAllowList \
                     exclude each other)"
                ),
                "give --egress-url the relay's host name (http://relay.example.com:PORT)",
            ))
        }
        _ => Ok(RelayEntry::of(url)),
    }
}

/// What holds for a Daytona sandbox created from `spec`.
pub(super) fn info(spec: &SandboxSpec) -> NetworkInfo {
    let tiers = "on Daytona organizations of tiers 1 and 2 Daytona's own egress restrictions \
                 apply on top, and its \"essential services\" (package and container \
                 registries, Git hosts, CDNs) may stay reachable whatever the list says";
    let mut guarantees = match spec.network {
        NetworkPolicy::None => Guarantees::new(
            &["no outbound network: Daytona's networkBlockAll is on"],
            &[tiers],
        ),
        NetworkPolicy::Host => Guarantees::new(
            &[],
            &[
                "outbound traffic is unrestricted, as far as Daytona's organization tier \
               allows",
            ],
        ),
        NetworkPolicy::Allowlist if !spec.egress.allow_hosts.is_empty() => Guarantees::new(
            &[
                "Daytona's firewall allows outbound connections to the names of its \
                 domainAllowList only, and the sandbox resolves only those names",
            ],
            &[
                tiers,
                "names are matched by Daytona, not checked by the relay",
            ],
        ),
        NetworkPolicy::Allowlist => Guarantees::new(
            &[
                "Daytona's firewall allows outbound connections to the networks of its \
                 networkAllowList only (nothing at all when the list is empty)",
            ],
            &[
                tiers,
                "DNS: whether the sandbox can still send DNS queries (and data in them) is \
                 Daytona's and not documented",
            ],
        ),
    };
    egress::secrets_guarantees(DAYTONA, spec, &mut guarantees);
    network::info(spec, "daytona", guarantees)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_client::api::EgressSpec;

    fn allowlist(hosts: &[String], cidrs: &[String]) -> SandboxSpec {
        SandboxSpec {
            network: NetworkPolicy::Allowlist,
            egress: EgressSpec {
                allow_hosts: hosts.to_vec(),
                allow_cidrs: cidrs.to_vec(),
            },
            ..SandboxSpec::default()
        }
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn networks_and_names_map_to_their_own_lists() {
        let nets = outbound(&allowlist(&[], &strings(&["10.1.0.0/16", "192.0.2.7"]))).unwrap();
        assert_eq!(
            nets,
            Outbound {
                block_all: false,
                network_allow_list: Some("10.1.0.0/16,192.0.2.7/32".into()),
                domain_allow_list: None,
            }
        );
        let names = outbound(&allowlist(&strings(&["api.openai.com", "*.pypi.org"]), &[]));
        assert_eq!(
            names.unwrap().domain_allow_list.as_deref(),
            Some("api.openai.com,*.pypi.org")
        );
        assert!(outbound(&allowlist(&[], &[])).unwrap().block_all);
        assert!(outbound(&SandboxSpec::default()).unwrap().block_all);
        let host = SandboxSpec {
            network: NetworkPolicy::Host,
            ..SandboxSpec::default()
        };
        assert_eq!(outbound(&host).unwrap(), Outbound::default());
    }

    #[test]
    fn the_create_request_carries_daytona_field_names() {
        let out = outbound(&allowlist(&strings(&["*.pypi.org"]), &[])).unwrap();
        let empty = std::collections::BTreeMap::new();
        let body = super::super::api::CreateSandbox {
            name: "sb-1",
            snapshot: "s",
            env: &empty,
            labels: &empty,
            public: false,
            network_block_all: out.block_all,
            network_allow_list: out.network_allow_list,
            domain_allow_list: out.domain_allow_list,
            auto_stop_interval: 0,
            auto_delete_interval: -1,
            ttl_minutes: None,
        };
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["networkBlockAll"], false);
        assert_eq!(json["domainAllowList"], "*.pypi.org");
        assert!(json.get("networkAllowList").is_none(), "{json}");
    }

    #[test]
    fn what_daytona_cannot_express_is_refused_naming_it() {
        let both = outbound(&allowlist(
            &strings(&["a.example.com"]),
            &strings(&["10.0.0.0/8"]),
        ));
        assert!(both.unwrap_err().to_string().contains("Daytona"));

        let eleven: Vec<String> = (0..11).map(|i| format!("10.{i}.0.0/16")).collect();
        let err = outbound(&allowlist(&[], &eleven)).unwrap_err().to_string();
        assert!(err.contains("11 networks (it takes 10)"), "{err}");
        let ten = &eleven[..10];
        assert!(outbound(&allowlist(&[], ten)).is_ok());

        let many: Vec<String> = (0..21).map(|i| format!("h{i}.example.com")).collect();
        let err = outbound(&allowlist(&many, &[])).unwrap_err().to_string();
        assert!(err.contains("21 host names (it takes 20)"), "{err}");

        let v6 = outbound(&allowlist(&[], &strings(&["2001:db8::/32"]))).unwrap_err();
        assert!(v6.to_string().contains("IPv6"), "{v6}");
        for name in ["localhost", "under_score.example.com", "host.example.c0m"] {
            let err = outbound(&allowlist(&strings(&[name]), &[])).unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn domain_syntax_follows_daytona() {
        for good in ["a.io", "*.pypi.org", "xn--bcher-kva.de", "a-b.c-d.example"] {
            assert!(is_daytona_domain(good), "{good}");
        }
        for bad in ["io", "*.io", "-a.io", "a-.io", "a.1o", "a..io", "*.*.a.io"] {
            assert!(!is_daytona_domain(bad), "{bad}");
        }
    }

    #[test]
    fn the_relay_must_be_named_beside_names() {
        let named = EgressUrl::parse("http://relay.example.com:3129").unwrap();
        let addr = EgressUrl::parse("http://203.0.113.9:3129").unwrap();
        let names = allowlist(&strings(&["api.openai.com"]), &[]);
        assert_eq!(
            relay_entry(&names, &named).unwrap(),
            RelayEntry::Host("relay.example.com".into())
        );
        let err = relay_entry(&names, &addr).unwrap_err().to_string();
        assert!(
            err.contains("203.0.113.9") && err.contains("host name"),
            "{err}"
        );
        let nets = allowlist(&[], &strings(&["10.1.0.0/16"]));
        assert_eq!(
            relay_entry(&nets, &addr).unwrap(),
            RelayEntry::Network("203.0.113.9/32".parse().unwrap())
        );
    }

    #[test]
    fn info_names_the_tier_caveat() {
        let info = info(&allowlist(&strings(&["api.openai.com"]), &[]));
        assert_eq!(info.enforced_by, "daytona");
        assert!(info
            .not_guaranteed
            .iter()
            .any(|n| n.contains("tiers 1 and 2")));
    }
}

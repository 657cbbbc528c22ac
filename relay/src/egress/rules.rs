//! The nftables rules of a sandbox's network namespace, as one `nft -f` script applied
//! atomically: DNS to the relay's DNS server, TCP to a fake address or an allowed network to
//! the relay's proxy, everything else that would leave loopback refused (a TCP reset, or ICMP
//! administratively prohibited), for IPv4 and IPv6 alike.

use std::fmt::Write;

use ipnet::IpNet;

use super::pool::FAKE_NETWORK;

/// The relay's listening ports inside the namespace (all on 127.0.0.1).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ports {
    /// The DNS server over UDP.
    pub(super) dns_udp: u16,
    /// The DNS server over TCP.
    pub(super) dns_tcp: u16,
    /// The transparent proxy.
    pub(super) proxy: u16,
}

/// The script: it first drops whatever an earlier relay set, so re-attaching replaces it.
pub(super) fn script(ports: Ports, networks: &[IpNet]) -> String {
    let v4: Vec<String> = networks
        .iter()
        .filter(|n| matches!(n, IpNet::V4(_)))
        .map(ToString::to_string)
        .collect();
    let mut nat = String::new();
    let _ = writeln!(nat, "    udp dport 53 redirect to :{}", ports.dns_udp);
    let _ = writeln!(nat, "    tcp dport 53 redirect to :{}", ports.dns_tcp);
    let _ = writeln!(
        nat,
        "    ip daddr {FAKE_NETWORK} meta l4proto tcp redirect to :{}",
        ports.proxy
    );
    if !v4.is_empty() {
        let _ = writeln!(
            nat,
            "    ip daddr {{ {} }} meta l4proto tcp redirect to :{}",
            v4.join(", "),
            ports.proxy
        );
    }
    format!(
        "flush ruleset
table ip tether_egress_nat {{
  chain output {{
    type nat hook output priority -100; policy accept;
{nat}  }}
}}
table inet tether_egress {{
  chain output {{
    type filter hook output priority 0; policy drop;
    oif \"lo\" ip daddr 127.0.0.0/8 accept
    oif \"lo\" ip6 daddr ::1 accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx type admin-prohibited
  }}
}}
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_redirects_dns_and_allowed_tcp_and_refuses_the_rest() {
        let ports = Ports {
            dns_udp: 1053,
            dns_tcp: 1054,
            proxy: 1080,
        };
        let nets = [
            "10.9.0.0/30".parse().unwrap(),
            "2001:db8::/32".parse().unwrap(),
        ];
        let s = script(ports, &nets);
        assert!(s.starts_with("flush ruleset\n"));
        assert!(s.contains("udp dport 53 redirect to :1053"));
        assert!(s.contains("ip daddr 198.18.0.0/15 meta l4proto tcp redirect to :1080"));
        assert!(s.contains("ip daddr { 10.9.0.0/30 } meta l4proto tcp redirect to :1080"));
        // IPv6 networks cannot be redirected to the IPv4 proxy: they stay refused.
        assert!(!s.contains("2001:db8"));
        assert!(s.contains("policy drop;"));
        assert!(!script(ports, &[]).contains("ip daddr {"));
    }
}

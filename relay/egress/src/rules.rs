//! The nftables rules of a sandbox's network namespace, as one `nft -f` script applied
//! atomically: DNS to the relay's DNS server, TCP to a fake address or an allowed network to
//! the relay's proxy, UDP to an allowed network to the relay's UDP socket, everything else
//! that would leave loopback refused (a TCP reset, or ICMP administratively prohibited), for
//! IPv4 and IPv6 alike.
//!
//! UDP cannot be redirected like TCP: a redirected datagram's original destination is lost
//! (`SO_ORIGINAL_DST` is TCP's). It is handed over by TPROXY instead, which keeps it: a
//! `route` chain marks the datagram on its way out, the policy route of [`UDP_MARK`] (set by
//! [`super::netns`]) makes its route local so it loops back through `lo` to the namespace's
//! own stack, where the `prerouting` chain gives it to the relay's transparent socket with
//! its destination untouched.

use std::fmt::Write;

use ipnet::IpNet;

use super::pool::FAKE_NETWORK;

/// The packet mark of UDP bound for the relay's UDP socket, and the routing table its policy
/// route looks up (both private to the sandbox's namespace).
pub(super) const UDP_MARK: u32 = 0x7e7e;
/// The routing table of [`UDP_MARK`]: one route, everything local (over `lo`).
pub(super) const UDP_TABLE: u32 = 0x7e7e;
/// The priority of the policy rule that sends [`UDP_MARK`] to [`UDP_TABLE`]: before `main`.
pub(super) const UDP_RULE_PRIORITY: u32 = 100;

/// The relay's listening ports inside the namespace (all on 127.0.0.1).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ports {
    /// The DNS server over UDP.
    pub(super) dns_udp: u16,
    /// The DNS server over TCP.
    pub(super) dns_tcp: u16,
    /// The transparent proxy.
    pub(super) proxy: u16,
    /// The transparent UDP socket (`None` when the sandbox has no IPv4 network to reach).
    pub(super) udp: Option<u16>,
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
    // UDP to an allowed network, except what stays the relay's: DNS (port 53, redirected
    // above), loopback and the fake addresses (which stand for names, reached over TCP).
    let (udp, udp_accept) = match ports.udp {
        Some(port) if !v4.is_empty() => {
            let to = format!(
                "ip daddr {{ {} }} ip daddr != {{ 127.0.0.0/8, {FAKE_NETWORK} }} udp dport != 53",
                v4.join(", ")
            );
            let table = format!(
                "table ip tether_egress_udp {{
  chain output {{
    type route hook output priority mangle; policy accept;
    {to} meta mark set {UDP_MARK:#x}
  }}
  chain prerouting {{
    type filter hook prerouting priority mangle; policy accept;
    {to} tproxy to 127.0.0.1:{port} meta mark set {UDP_MARK:#x} accept
  }}
}}
"
            );
            (table, format!("    oif \"lo\" {to} accept\n"))
        }
        _ => (String::new(), String::new()),
    };
    format!(
        "flush ruleset
table ip tether_egress_nat {{
  chain output {{
    type nat hook output priority -100; policy accept;
{nat}  }}
}}
{udp}table inet tether_egress {{
  chain output {{
    type filter hook output priority 0; policy drop;
    oif \"lo\" ip daddr 127.0.0.0/8 accept
    oif \"lo\" ip6 daddr ::1 accept
{udp_accept}    meta l4proto tcp reject with tcp reset
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
            udp: Some(1090),
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

    #[test]
    fn udp_to_allowed_networks_goes_to_the_relays_socket_and_nothing_else_does() {
        let ports = Ports {
            dns_udp: 1053,
            dns_tcp: 1054,
            proxy: 1080,
            udp: Some(1090),
        };
        let nets = ["10.9.0.0/30".parse().unwrap()];
        let s = script(ports, &nets);
        let to = "ip daddr { 10.9.0.0/30 } ip daddr != { 127.0.0.0/8, 198.18.0.0/15 } \
                  udp dport != 53";
        assert!(s.contains(&format!("{to} meta mark set 0x7e7e\n")), "{s}");
        assert!(
            s.contains(&format!(
                "{to} tproxy to 127.0.0.1:1090 meta mark set 0x7e7e accept\n"
            )),
            "{s}"
        );
        // The filter lets exactly those datagrams out to `lo`, before its refusals.
        let accept = s.find(&format!("oif \"lo\" {to} accept")).unwrap();
        assert!(accept < s.find("reject with icmpx").unwrap());
        // Without IPv4 networks (or without the socket) there is no UDP table at all.
        assert!(!script(ports, &[]).contains("tproxy"));
        let no_socket = Ports { udp: None, ..ports };
        assert!(!script(no_socket, &nets).contains("tproxy"));
    }
}

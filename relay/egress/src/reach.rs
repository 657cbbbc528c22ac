//! The one address filter every egress target passes, whatever named it: a literal address in
//! a CONNECT or an absolute URL, the original destination of transparent TCP or UDP, and each
//! address a name resolves to (at every connection, so a name that rebinds is caught too).
//!
//! Addresses fall in three kinds:
//! - **never** reachable, whatever a sandbox's allowlist or the relay's policy says: the
//!   unspecified address and the rest of `0.0.0.0/8` (Linux connects `0.0.0.0` to the local
//!   host), loopback (all of `127.0.0.0/8`, `::1`), multicast, broadcast and `240.0.0.0/4`,
//!   and the relay's own data plane (the fake addresses of `198.18.0.0/15` its DNS gives out);
//!   IPv4-mapped and IPv4-compatible IPv6 forms are judged as the IPv4 address they carry;
//! - **the relay host's own addresses** (every interface's, read with `getifaddrs` and
//!   refreshed every [`HOST_ADDRESSES_TTL`]): the relay's API, its database and every port a
//!   tenant forwards listen there. Reachable only where the sandbox's allowlist names that very
//!   address (`--allow-cidr ADDR/32`), which a member token can ask for only when the relay's
//!   policy lists it (`egress_networks`): a wide network such as `0.0.0.0/0` never covers them;
//! - **guarded** ranges (link-local with cloud metadata at `169.254.169.254`, and the private
//!   ranges `10/8`, `172.16/12`, `192.168/16`, `100.64/10`, `fc00::/7`): reachable only inside a
//!   network on the sandbox's allowlist, which the policy bounds at create
//!   (the relay's `egress_networks` policy key). A public name that resolves there is refused.
//!
//! The operator's hosts file (`--egress-hosts`) is trusted for the guarded ranges (the operator
//! says where a name lives, often on a private network) but not for the other two kinds: no
//! file line can lead a sandbox to the relay's host.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::pool::FAKE_NETWORK;

/// How long the list of the host's addresses is reused before it is read again: an address
/// added to an interface is refused at most this long after.
pub(super) const HOST_ADDRESSES_TTL: Duration = Duration::from_secs(5);

/// Networks never reachable besides the relay's fake addresses ([`FAKE_NETWORK`]).
const NEVER: [&str; 7] = [
    "0.0.0.0/8",
    "127.0.0.0/8",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "ff00::/8",
];

/// Networks reachable only inside a network on the sandbox's allowlist.
pub const GUARDED: [(&str, &str); 7] = [
    (
        "169.254.0.0/16",
        "link-local (cloud metadata at 169.254.169.254)",
    ),
    ("fe80::/10", "IPv6 link-local"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT (RFC 6598)"),
    ("fc00::/7", "IPv6 unique local"),
];

/// Why an address may not be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Unspecified, loopback, multicast, broadcast, reserved or the relay's fake addresses.
    #[error("{0} is the relay host itself, multicast, broadcast or reserved, which no sandbox may reach")]
    Never(IpAddr),
    /// An address of one of the relay host's interfaces.
    #[error(
        "{0} is an address of the relay's own host; a sandbox reaches it only where its \
         allowlist names that address itself (--allow-cidr {0}/32), which the relay's policy \
         must allow for member tokens"
    )]
    HostOwn(IpAddr),
    /// Link-local or private, outside the sandbox's allowed networks.
    #[error(
        "{0} is {1}, reachable only inside a network the sandbox's allowlist names \
         (--allow-cidr), which the relay's policy must allow for member tokens"
    )]
    Guarded(IpAddr, &'static str),
}

/// The relay-wide filter: the fixed ranges and a cache of the host's own addresses. The
/// relay has one ([`shared`]), used by the create check and by every sandbox's proxy.
#[derive(Debug)]
pub struct Reach {
    host: Mutex<Option<(Instant, Vec<IpAddr>)>>,
    /// Unit tests' upstreams listen on loopback (tests send traffic nowhere else): a filter
    /// made for them lets `127.0.0.0/8` through. No build but the tests' can set it.
    #[cfg(test)]
    loopback_upstreams: bool,
}

impl Default for Reach {
    fn default() -> Self {
        Self::new()
    }
}

/// The relay's filter.
pub fn shared() -> &'static Reach {
    static SHARED: std::sync::LazyLock<Reach> = std::sync::LazyLock::new(Reach::new);
    &SHARED
}

impl Reach {
    /// A filter that reads the host's addresses on first use.
    pub fn new() -> Self {
        Reach {
            host: Mutex::new(None),
            #[cfg(test)]
            loopback_upstreams: false,
        }
    }

    /// A filter for unit tests whose upstreams listen on loopback.
    #[cfg(test)]
    pub(super) fn for_loopback_upstreams() -> &'static Reach {
        static LOOPBACK: std::sync::LazyLock<Reach> = std::sync::LazyLock::new(|| Reach {
            loopback_upstreams: true,
            ..Reach::new()
        });
        &LOOPBACK
    }

    /// Whether a sandbox whose allowlist holds `allowed` may reach `addr`; `trusted` for an
    /// address from the operator's hosts file (see the module docs).
    pub fn check(&self, addr: IpAddr, allowed: &[IpNet], trusted: bool) -> Result<(), Refused> {
        let addr = canonical(addr);
        #[cfg(test)]
        if self.loopback_upstreams && addr.is_loopback() {
            return Ok(());
        }
        if is_never(addr) {
            return Err(Refused::Never(addr));
        }
        if self.host_addresses().contains(&addr) {
            let named = allowed
                .iter()
                .any(|n| n.prefix_len() == n.max_prefix_len() && canonical(n.addr()) == addr);
            return if named {
                Ok(())
            } else {
                Err(Refused::HostOwn(addr))
            };
        }
        if let Some(what) = guarded(addr) {
            if !trusted && !allowed.iter().any(|n| contains(n, addr)) {
                return Err(Refused::Guarded(addr, what));
            }
        }
        Ok(())
    }

    /// The host's addresses, read again once [`HOST_ADDRESSES_TTL`] has passed.
    pub fn host_addresses(&self) -> Vec<IpAddr> {
        let mut cached = self.host.lock().unwrap_or_else(|p| p.into_inner());
        match &*cached {
            Some((at, addrs)) if at.elapsed() < HOST_ADDRESSES_TTL => addrs.clone(),
            _ => {
                let addrs = read_host_addresses();
                *cached = Some((Instant::now(), addrs.clone()));
                addrs
            }
        }
    }
}

/// Every address of the host's interfaces, canonical. A failure to list them is logged and
/// leaves only the fixed ranges: loopback and unspecified stay refused either way.
fn read_host_addresses() -> Vec<IpAddr> {
    match nix::ifaddrs::getifaddrs() {
        Ok(list) => list
            .filter_map(|ifa| ifa.address)
            .filter_map(|a| {
                if let Some(v4) = a.as_sockaddr_in() {
                    Some(IpAddr::V4(v4.ip()))
                } else {
                    a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                }
            })
            .map(canonical)
            .collect(),
        Err(e) => {
            tracing::warn!("cannot list the host's addresses to keep sandboxes from them: {e}");
            Vec::new()
        }
    }
}

/// `addr` as the IPv4 address it carries, for IPv4-mapped (`::ffff:a.b.c.d`) and
/// IPv4-compatible (`::a.b.c.d`, deprecated but still routed by some stacks) forms.
pub fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6].iter().all(|x| *x == 0)
                && v6 != Ipv6Addr::UNSPECIFIED
                && v6 != Ipv6Addr::LOCALHOST
            {
                return IpAddr::V4(Ipv4Addr::new(
                    (s[6] >> 8) as u8,
                    s[6] as u8,
                    (s[7] >> 8) as u8,
                    s[7] as u8,
                ));
            }
            addr
        }
        v4 => v4,
    }
}

/// The never-reachable networks: [`NEVER`] and the relay's fake addresses, which stand for
/// names inside a sandbox and are never a real destination.
fn never_networks() -> impl Iterator<Item = IpNet> {
    NEVER
        .iter()
        .map(|n| n.parse().expect("the built-in networks parse"))
        .chain(std::iter::once(IpNet::V4(FAKE_NETWORK)))
}

/// Whether `net` contains `addr`, both judged canonically.
fn contains(net: &IpNet, addr: IpAddr) -> bool {
    net.contains(&addr) || canonical_net(net).is_some_and(|n| n.contains(&addr))
}

/// An IPv4-mapped IPv6 network as the IPv4 network it stands for.
fn canonical_net(net: &IpNet) -> Option<IpNet> {
    match (net, canonical(net.addr())) {
        (IpNet::V6(v6), IpAddr::V4(v4)) if v6.prefix_len() >= 96 => {
            IpNet::new(IpAddr::V4(v4), v6.prefix_len() - 96).ok()
        }
        _ => None,
    }
}

fn is_never(addr: IpAddr) -> bool {
    addr == IpAddr::V4(Ipv4Addr::BROADCAST) || never_networks().any(|n| n.contains(&addr))
}

fn guarded(addr: IpAddr) -> Option<&'static str> {
    GUARDED
        .iter()
        .find(|(net, _)| net.parse::<IpNet>().is_ok_and(|n| n.contains(&addr)))
        .map(|(_, what)| *what)
}

/// Why a network asked for at create is not the caller's to allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restricted {
    /// Whether nothing can allow it (it lies inside never-reachable space).
    pub never: bool,
    /// What it includes, as a sentence.
    pub why: String,
}

/// What of `net` (a network asked for at create) only a policy can allow: the first range
/// (never, host's own, guarded) it overlaps that no network in `permitted` covers, with a
/// sentence naming it. `None` when all of it is ordinary public address space or permitted.
/// A network that overlaps a never-reachable range only by being wider (`0.0.0.0/0`) is not
/// refused for that: the connect-time filter keeps those parts out; one that lies inside such
/// a range (`0.0.0.0/32`, `127.0.0.0/8`) is, since it could reach nothing else.
pub fn restricted_part(net: &IpNet, permitted: &[IpNet], host: &[IpAddr]) -> Option<Restricted> {
    let net = canonical_net(net).unwrap_or(*net);
    let covered = |part: &IpNet| {
        permitted
            .iter()
            .map(|p| canonical_net(p).unwrap_or(*p))
            .any(|p| p.contains(part))
    };
    for never in never_networks() {
        if never.contains(&net) {
            return Some(Restricted {
                never: true,
                why: format!(
                    "{net} is inside {never} (unspecified, loopback, multicast, reserved or \
                     the relay's own fake addresses), which no sandbox may reach"
                ),
            });
        }
    }
    for (text, what) in GUARDED {
        let range: IpNet = text.parse().expect("the built-in networks parse");
        let overlap = if range.contains(&net) {
            Some(net)
        } else if net.contains(&range) {
            Some(range)
        } else {
            None
        };
        if let Some(part) = overlap.filter(|p| !covered(p)) {
            return Some(Restricted {
                never: false,
                why: format!("{net} includes {part}, which is {what}"),
            });
        }
    }
    for addr in host {
        if net.contains(addr) && !covered(&IpNet::from(*addr)) {
            return Some(Restricted {
                never: false,
                why: format!("{net} includes {addr}, an address of the relay's own host"),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn the_host_itself_is_never_reachable_whatever_is_allowed() {
        let reach = Reach::new();
        let everything = [net("0.0.0.0/0"), net("::/0")];
        for bad in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.0.0.2",
            "127.255.255.254",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "ff02::1",
            "198.18.0.5",
        ] {
            let got = reach.check(ip(bad), &everything, true);
            assert!(matches!(got, Err(Refused::Never(_))), "{bad}: {got:?}");
        }
    }

    #[test]
    fn the_hosts_own_addresses_need_the_address_itself() {
        let reach = Reach::new();
        let own = reach
            .host_addresses()
            .into_iter()
            .find(|a| !a.is_loopback() && !a.is_unspecified());
        let Some(own) = own else {
            // A host with loopback only: nothing more to check here (e2e tests cover a veth).
            return;
        };
        let wide = [net("0.0.0.0/0")];
        assert_eq!(
            reach.check(own, &wide, true),
            Err(Refused::HostOwn(own)),
            "a wide network or the hosts file does not reach the host's own address"
        );
        assert!(reach.check(own, &[IpNet::from(own)], false).is_ok());
    }

    #[test]
    fn guarded_ranges_need_an_allowed_network_unless_the_operator_named_them() {
        let reach = Reach::new();
        for guarded in [
            "169.254.169.254",
            "10.200.0.9",
            "192.168.77.1",
            "100.64.0.1",
        ] {
            let addr = ip(guarded);
            assert!(
                matches!(reach.check(addr, &[], false), Err(Refused::Guarded(..))),
                "{guarded}"
            );
            assert!(
                reach.check(addr, &[], true).is_ok(),
                "{guarded} (hosts file)"
            );
            assert!(reach.check(addr, &[IpNet::from(addr)], false).is_ok());
        }
        assert!(reach.check(ip("93.184.216.34"), &[], false).is_ok());
        assert!(reach.check(ip("2001:db8::1"), &[], false).is_ok());
    }

    #[test]
    fn networks_asked_for_at_create_are_bounded() {
        let host = [ip("203.0.113.9")];
        let none: [IpNet; 0] = [];
        for bad in [
            "0.0.0.0/32",
            "127.0.0.0/8",
            "::ffff:127.0.0.1/128",
            "169.254.169.254/32",
            "10.0.0.0/8",
            "10.1.0.0/16",
            "0.0.0.0/0",
            "172.16.0.0/12",
            "fd00::/8",
            "203.0.113.0/24",
        ] {
            assert!(
                restricted_part(&net(bad), &none, &host).is_some(),
                "{bad} was accepted"
            );
        }
        assert!(restricted_part(&net("93.184.216.0/24"), &none, &host).is_none());
        let permitted = [net("10.1.0.0/16"), net("203.0.113.9/32")];
        assert!(restricted_part(&net("10.1.2.0/24"), &permitted, &host).is_none());
        assert!(restricted_part(&net("10.2.0.0/16"), &permitted, &host).is_some());
        assert!(restricted_part(&net("203.0.113.9/32"), &permitted, &host).is_none());
        // Inside a never-reachable range: no policy can permit it.
        let all = [net("0.0.0.0/0")];
        assert!(restricted_part(&net("0.0.0.0/32"), &all, &host).is_some_and(|r| r.never));
        assert!(restricted_part(&net("10.0.0.0/8"), &none, &host).is_some_and(|r| !r.never));
    }
}

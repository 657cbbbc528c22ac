//! E2B's checks of a new sandbox's egress rules (`validateEgressRules` in infra's
//! `packages/api/internal/handlers/sandbox_create.go`, with `sandbox-network/firewall.go`):
//! `denyOut` holds addresses and CIDRs only, `allowOut` also host names, which need
//! `0.0.0.0/0` in `denyOut`; an unspecified address (`0.0.0.0`, `::`) is refused except in
//! `0.0.0.0/0` itself. Messages are E2B's.

use std::net::IpAddr;

use ipnet::IpNet;

/// `denyOut` that blocks all IPv4 traffic (E2B's `ALL_TRAFFIC`).
const ALL_TRAFFIC: &str = "0.0.0.0/0";
/// E2B's message for host names without `ALL_TRAFFIC`.
const DOMAINS_REQUIRE_BLOCK_ALL: &str = "When specifying allowed domains in allow out, you must \
     include 'ALL_TRAFFIC' in deny out to block all other traffic.";

/// The address part of an IP or CIDR (Go's `net.ParseIP` / `net.ParseCIDR`, which keep host
/// bits), or `None` for anything else (a host name).
fn address(entry: &str) -> Option<IpAddr> {
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<IpNet>().ok().map(|n| n.addr()))
}

fn specified(entry: &str) -> bool {
    entry == ALL_TRAFFIC || address(entry).is_some_and(|a| !a.is_unspecified())
}

/// E2B's answer to `allowOut` and `denyOut`: `Err` with its 400 message.
pub(super) fn validate(allow_out: &[String], deny_out: &[String]) -> Result<(), String> {
    if let Some(bad) = deny_out.iter().find(|e| !specified(e)) {
        return Err(format!("invalid denied CIDR {bad}"));
    }
    let (addresses, domains): (Vec<&String>, Vec<&String>) =
        allow_out.iter().partition(|e| address(e).is_some());
    if let Some(bad) = addresses.iter().find(|e| !specified(e)) {
        return Err(format!("invalid allowed address {bad}"));
    }
    if !domains.is_empty() && !deny_out.iter().any(|e| e == ALL_TRAFFIC) {
        return Err(DOMAINS_REQUIRE_BLOCK_ALL.to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn follows_e2b() {
        assert!(validate(&v(&["api.openai.com", "10.1.0.0/16"]), &v(&["0.0.0.0/0"])).is_ok());
        assert!(validate(&v(&["1.1.1.1", "8.8.8.0/24"]), &v(&[])).is_ok());
        assert!(validate(&v(&[]), &v(&["8.8.8.8"])).is_ok());
        let err = validate(&v(&["api.openai.com"]), &v(&["8.8.8.8"])).unwrap_err();
        assert!(err.contains("ALL_TRAFFIC"), "{err}");
        assert_eq!(
            validate(&v(&[]), &v(&["example.com"])).unwrap_err(),
            "invalid denied CIDR example.com"
        );
        assert_eq!(
            validate(&v(&["0.0.0.0/8"]), &v(&[])).unwrap_err(),
            "invalid allowed address 0.0.0.0/8"
        );
    }
}

//! Daytona's checks of a sandbox's network settings, with its messages
//! (`apps/api/src/sandbox/utils/network-validation.util.ts`): `networkAllowList` is at most
//! 10 comma-separated IPv4 CIDRs, `domainAllowList` at most 20 names (an optional leading
//! `*.`, an alphabetic top-level domain); not both, and neither with `networkBlockAll`.

use std::net::Ipv4Addr;

/// Most entries of `networkAllowList`.
const MAX_NETWORKS: usize = 10;
/// Most entries of `domainAllowList`.
const MAX_DOMAINS: usize = 20;

/// The non-empty, trimmed entries of a comma-separated list.
fn entries(list: Option<&str>) -> Vec<&str> {
    list.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect()
}

fn check_network(network: &str) -> Result<(), String> {
    let parts: Vec<&str> = network.split('/').collect();
    let [ip, prefix] = parts[..] else {
        return Err(format!(
            "Invalid network format: \"{network}\". Must be CIDR notation (e.g., 192.168.1.0/24)"
        ));
    };
    if ip.parse::<Ipv4Addr>().is_err() {
        return Err(format!(
            "Invalid IP address: \"{ip}\" in network \"{network}\". Must be a valid IPv4 address"
        ));
    }
    if prefix.is_empty() {
        return Err(format!(
            "Invalid network format: \"{network}\". Missing CIDR prefix length (e.g., /24)"
        ));
    }
    if !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "Invalid CIDR prefix length: {network}. Prefix must be an integer between 0 and 32"
        ));
    }
    if prefix.parse::<u32>().map_or(true, |p| p > 32) {
        return Err(format!(
            "Invalid CIDR prefix length: {network}. Prefix must be between 0 and 32"
        ));
    }
    Ok(())
}

/// `^(\*\.)?([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)+[a-zA-Z]{2,}$`
fn domain_ok(domain: &str) -> bool {
    let name = domain.strip_prefix("*.").unwrap_or(domain);
    let mut labels: Vec<&str> = name.split('.').collect();
    let tld = labels.pop().unwrap_or("");
    let label_ok = |l: &&str| {
        let b = l.as_bytes();
        (1..=63).contains(&b.len())
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
    };
    !labels.is_empty()
        && labels.iter().all(label_ok)
        && tld.len() >= 2
        && tld.bytes().all(|c| c.is_ascii_alphabetic())
}

/// Daytona's answer to a create's network settings: `Err` with its 400 message.
pub(super) fn validate(
    block_all: bool,
    network_allow_list: Option<&str>,
    domain_allow_list: Option<&str>,
) -> Result<(), String> {
    let networks = entries(network_allow_list);
    for network in &networks {
        check_network(network)?;
    }
    if networks.len() > MAX_NETWORKS {
        return Err(format!(
            "Network allow list cannot contain more than {MAX_NETWORKS} networks"
        ));
    }
    let domains = entries(domain_allow_list);
    if let Some(bad) = domains.iter().find(|d| !domain_ok(d)) {
        return Err(format!(
            "Invalid domain: \"{bad}\". Must be a valid ASCII domain (optional leading *.) with \
             an alphabetic top-level domain"
        ));
    }
    if domains.len() > MAX_DOMAINS {
        return Err(format!(
            "Domain allow list cannot contain more than {MAX_DOMAINS} domains"
        ));
    }
    if !networks.is_empty() && !domains.is_empty() {
        return Err(
            "networkAllowList and domainAllowList are mutually exclusive and cannot be \
                    set at the same time. Provide only one of them."
                .into(),
        );
    }
    if block_all && !(networks.is_empty() && domains.is_empty()) {
        return Err("networkBlockAll: true cannot be combined with a non-empty \
                    networkAllowList or domainAllowList. Remove the allow-list(s) or set \
                    networkBlockAll to false."
            .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_daytona() {
        assert!(validate(false, Some("10.0.0.0/8, 192.0.2.7/32,"), None).is_ok());
        assert!(validate(false, None, Some("*.pypi.org,api.openai.com")).is_ok());
        assert!(validate(true, Some(""), Some(" ")).is_ok());
        for (bad, says) in [
            ("10.0.0.1", "Must be CIDR notation"),
            ("10.0.0.0/", "Missing"),
            ("10.0.0.0/33", "between 0 and 32"),
            ("2001:db8::/32", "IPv4"),
            ("10.0.0.0/x", "integer"),
        ] {
            let err = validate(false, Some(bad), None).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let eleven: Vec<String> = (0..11).map(|i| format!("10.{i}.0.0/16")).collect();
        assert!(validate(false, Some(&eleven.join(",")), None)
            .unwrap_err()
            .contains("more than 10"));
        assert!(validate(false, None, Some("localhost")).is_err());
        assert!(validate(false, Some("10.0.0.0/8"), Some("a.io"))
            .unwrap_err()
            .contains("mutually exclusive"));
        assert!(validate(true, Some("10.0.0.0/8"), None)
            .unwrap_err()
            .contains("networkBlockAll"));
    }
}

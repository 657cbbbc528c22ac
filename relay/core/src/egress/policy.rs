//! What a sandbox with an allowlist may reach: host name patterns and networks, parsed once
//! from the create spec and matched on every DNS query and connection.

use std::net::IpAddr;

use ipnet::IpNet;
use tether_client::api::{NetworkPolicy, SandboxSpec, SecretValue};

use super::preset::PRESET_SIGIL;

/// What every secret's placeholder starts with, so it is recognizable in a request or a log.
pub const PLACEHOLDER_PREFIX: &str = "tether-secret-";

/// Most patterns and networks one sandbox may list; matching is linear.
pub const MAX_ENTRIES: usize = 256;

/// A host name pattern: `api.openai.com` (that name only) or `*.pypi.org` (every name below
/// `pypi.org`, not `pypi.org` itself). Names are compared lowercase, without a trailing dot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPattern {
    /// This name only.
    Exact(String),
    /// Every name ending in `.` followed by this suffix.
    Below(String),
}

impl HostPattern {
    /// Parses a pattern, refusing what is not a DNS name (or a `*.` wildcard over one).
    pub fn parse(pattern: &str) -> Result<Self, String> {
        if pattern.starts_with(PRESET_SIGIL) {
            // Presets are expanded when a sandbox is created (`super::preset`); one that gets
            // here is where no preset belongs (a secret's hosts, a policy file).
            return Err(format!(
                "`{pattern}` is a preset, which only a sandbox's allowed hosts may name; name \
                 the hosts themselves here"
            ));
        }
        let lower = pattern.trim_end_matches('.').to_ascii_lowercase();
        let (below, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, lower),
        };
        check_name(&name).map_err(|why| {
            format!(
                "`{pattern}` is not a host name pattern ({why}); use a name such as \
                 api.openai.com, or *.pypi.org for every name below pypi.org"
            )
        })?;
        if below && !name.contains('.') {
            return Err(format!(
                "`{pattern}` would allow a whole top-level domain; name a domain below it, \
                 such as *.example.com"
            ));
        }
        Ok(if below {
            Self::Below(name)
        } else {
            Self::Exact(name)
        })
    }

    /// Whether `host` (any case, trailing dot or not) is covered.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        match self {
            Self::Exact(name) => host.eq_ignore_ascii_case(name),
            Self::Below(suffix) => {
                host.len() > suffix.len() + 1
                    && host.is_char_boundary(host.len() - suffix.len() - 1)
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
        }
    }

    /// Whether every name `other` matches, this matches too: `*.example.com` covers
    /// `api.example.com` and `*.eu.example.com`, not `example.com`.
    pub fn covers(&self, other: &HostPattern) -> bool {
        match (self, other) {
            (Self::Exact(mine), Self::Exact(theirs)) => mine == theirs,
            (Self::Exact(_), Self::Below(_)) => false,
            (Self::Below(mine), Self::Below(theirs)) => mine == theirs || self.matches(theirs),
            (Self::Below(_), Self::Exact(name)) => self.matches(name),
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exact(name) => f.write_str(name),
            Self::Below(suffix) => write!(f, "*.{suffix}"),
        }
    }
}

/// A DNS name as RFC 1035 letters, digits and hyphens (and `_`, which real names use), labels of
/// 1 to 63 bytes, 253 at most in all. IP addresses are not names: they go in `allow_cidrs`.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("a name has 1 to 253 characters");
    }
    if name.parse::<IpAddr>().is_ok() {
        return Err("an address is not a name: allow it as a network, e.g. 192.0.2.7/32");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("each dot-separated label has 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(
                "a label holds only letters, digits, `-` and `_` (use punycode for others)",
            );
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label neither starts nor ends with `-`");
        }
    }
    Ok(())
}

/// A parsed allowlist: host patterns (the spec's own and those its secrets are bound to) and
/// networks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    /// Names the sandbox may reach.
    pub hosts: Vec<HostPattern>,
    /// Networks the sandbox may reach by address.
    pub networks: Vec<IpNet>,
}

impl Allowlist {
    /// The allowlist of `spec`, or why it is invalid (a sentence that says what to send
    /// instead). Specs without [`NetworkPolicy::Allowlist`] must not carry one.
    pub fn from_spec(spec: &SandboxSpec) -> Result<Option<Self>, String> {
        if spec.network != NetworkPolicy::Allowlist {
            if !spec.egress.is_empty() || !spec.secrets.is_empty() {
                return Err(
                    "`egress` and `secrets` need `\"network\": \"allowlist\"` (the CLI's \
                     --allow-host, --allow-cidr and --secret set it)"
                        .into(),
                );
            }
            return Ok(None);
        }
        let mut list = Self::default();
        let bound = spec.secrets.iter().flat_map(|s| s.hosts.iter());
        for pattern in spec.egress.allow_hosts.iter().chain(bound) {
            let parsed = HostPattern::parse(pattern)?;
            if !list.hosts.contains(&parsed) {
                list.hosts.push(parsed);
            }
        }
        for cidr in &spec.egress.allow_cidrs {
            let net = parse_network(cidr)?;
            if !list.networks.contains(&net) {
                list.networks.push(net);
            }
        }
        if list.hosts.len() + list.networks.len() > MAX_ENTRIES {
            return Err(format!(
                "an allowlist holds at most {MAX_ENTRIES} hosts and networks together; use \
                 wildcards (*.example.com) or wider networks"
            ));
        }
        Ok(Some(list))
    }

    /// Whether `host` is allowed by name.
    pub fn allows_host(&self, host: &str) -> bool {
        self.hosts.iter().any(|p| p.matches(host))
    }

    /// Whether `addr` is allowed by address.
    pub fn allows_addr(&self, addr: IpAddr) -> bool {
        self.networks.iter().any(|n| n.contains(&addr))
    }
}

/// A secret bound to a sandbox at create: the sandbox's environment holds `placeholder` under
/// `name`; the egress proxy puts `value` in its place in requests to `hosts` only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundSecret {
    /// The environment variable, and the secret's name in the relay's store.
    pub name: String,
    /// What the sandbox sees instead of the value: `tether-secret-` and 32 random hex digits.
    pub placeholder: String,
    /// The real value, which never enters the sandbox.
    pub value: SecretValue,
    /// Hosts the value may be sent to.
    pub hosts: Vec<HostPattern>,
}

/// A CIDR (`10.1.0.0/16`) or a single address (as /32 or /128), with host bits refused so a
/// typo does not silently widen or narrow the network.
fn parse_network(text: &str) -> Result<IpNet, String> {
    let net = match text.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => match text.parse::<IpAddr>() {
            Ok(addr) => IpNet::from(addr),
            Err(_) => {
                return Err(format!(
                    "`{text}` is not a network; write it as a CIDR such as 10.1.0.0/16, or a \
                     single address such as 192.0.2.7"
                ))
            }
        },
    };
    if net.trunc() != net {
        return Err(format!(
            "`{text}` has host bits set; did you mean {}?",
            net.trunc()
        ));
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_client::api::{EgressSpec, SecretSpec};

    #[test]
    fn exact_and_wildcard_patterns_match_what_they_say() {
        let exact = HostPattern::parse("API.OpenAI.com.").unwrap();
        assert!(exact.matches("api.openai.com"));
        assert!(exact.matches("api.openai.com."));
        assert!(!exact.matches("x.api.openai.com"));
        assert!(!exact.matches("openai.com"));

        let below = HostPattern::parse("*.pypi.org").unwrap();
        assert!(below.matches("files.pypi.org"));
        assert!(below.matches("a.b.PYPI.org"));
        assert!(!below.matches("pypi.org"));
        assert!(!below.matches("evilpypi.org"));
        assert!(!below.matches("pypi.org.evil.test"));
        assert!(!below.matches(".pypi.org"));
    }

    #[test]
    fn patterns_that_are_not_names_are_refused() {
        for bad in [
            "", "*", "*.com", "a..b", "-a.test", "a b.test", "10.0.0.1", "a/b", "é.test",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} was accepted");
        }
        let long = format!("{}.test", "a".repeat(64));
        assert!(HostPattern::parse(&long).is_err());
    }

    #[test]
    fn a_wildcard_covers_what_lies_below_it_only() {
        let p = |s: &str| HostPattern::parse(s).unwrap();
        assert!(p("*.example.com").covers(&p("api.example.com")));
        assert!(p("*.example.com").covers(&p("*.eu.example.com")));
        assert!(p("*.example.com").covers(&p("*.example.com")));
        assert!(!p("*.example.com").covers(&p("example.com")));
        assert!(!p("*.example.com").covers(&p("*.com.evil.test")));
        assert!(!p("*.example.com").covers(&p("evilexample.com")));
        assert!(p("pypi.org").covers(&p("PyPI.org")));
        assert!(!p("pypi.org").covers(&p("*.pypi.org")));
        assert!(!p("pypi.org").covers(&p("files.pypi.org")));
    }

    #[test]
    fn a_preset_is_not_a_pattern() {
        let why = HostPattern::parse("@package-registries").unwrap_err();
        assert!(why.contains("preset"), "{why}");
    }

    #[test]
    fn networks_refuse_host_bits_and_accept_single_addresses() {
        assert!(parse_network("10.1.0.0/16").is_ok());
        assert_eq!(
            parse_network("192.0.2.7").unwrap(),
            "192.0.2.7/32".parse().unwrap()
        );
        assert!(parse_network("10.1.2.3/16")
            .unwrap_err()
            .contains("10.1.0.0/16"));
        assert!(parse_network("10.1.0.0/33").is_err());
    }

    #[test]
    fn a_spec_allowlist_includes_its_secrets_hosts() {
        let spec = SandboxSpec {
            network: NetworkPolicy::Allowlist,
            egress: EgressSpec {
                allow_hosts: vec!["*.pypi.org".into()],
                allow_cidrs: vec!["10.1.0.0/16".into()],
            },
            secrets: vec![SecretSpec {
                name: "OPENAI_API_KEY".into(),
                hosts: vec!["api.openai.com".into()],
                value: None,
            }],
            ..SandboxSpec::default()
        };
        let list = Allowlist::from_spec(&spec).unwrap().unwrap();
        assert!(list.allows_host("api.openai.com"));
        assert!(list.allows_host("files.pypi.org"));
        assert!(!list.allows_host("example.com"));
        assert!(list.allows_addr("10.1.200.3".parse().unwrap()));
        assert!(!list.allows_addr("10.2.0.1".parse().unwrap()));
    }

    #[test]
    fn egress_without_the_allowlist_mode_is_refused() {
        let spec = SandboxSpec {
            egress: EgressSpec {
                allow_hosts: vec!["a.test".into()],
                allow_cidrs: vec![],
            },
            ..SandboxSpec::default()
        };
        assert!(Allowlist::from_spec(&spec)
            .unwrap_err()
            .contains("allowlist"));
        assert_eq!(Allowlist::from_spec(&SandboxSpec::default()), Ok(None));
    }
}

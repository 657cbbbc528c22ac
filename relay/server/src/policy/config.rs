//! The relay's policy file (`tether serve --config FILE`): what each tenant may use, read
//! strictly (an unknown key is an error naming it), and resolved into one [`Limits`] per
//! tenant over the built-in defaults.
//!
//! ```toml
//! [defaults]                  # every tenant; each key optional, built-in values shown
//! providers = ["local"]       # allowed providers (absent: every provider of the relay)
//! network_host = false        # members may ask for --network host (admins always may)
//! egress_networks = []        # besides public addresses, networks members may allow with
//!                             # --allow-cidr (see below)
//! # egress_hosts = ["@package-registries", "*.example.com"]  # absent: any host (see below)
//! max_sandboxes = 32
//! memory = "1G"               # what a request that names none gets
//! max_memory = "16G"
//! cpus = 1
//! max_cpus = 8
//! pids = 1024
//! max_pids = 32768
//! disk = "10G"
//! max_disk = "100G"
//! ttl = "24h"
//! max_ttl = "7d"
//!
//! [tenants.team-a]            # overrides for one tenant, key by key
//! max_sandboxes = 100
//! egress_networks = ["10.20.0.0/16", "169.254.169.254/32"]
//! ```
//!
//! `egress_networks` bounds what a member token may put on an allowlist (`--allow-cidr`):
//! public addresses always, and inside these networks only, the private ranges (`10/8`,
//! `172.16/12`, `192.168/16`, `100.64/10`, `fc00::/7`), link-local (`169.254/16` with cloud
//! metadata, `fe80::/10`) and the relay host's own addresses. Admin tokens may allow any of
//! them. Nobody may allow what lies inside unspecified, loopback, multicast or reserved
//! space (`0.0.0.0/32`, `127.0.0.0/8`...), and a host's own address is reached only by a
//! sandbox whose allowlist names that address itself (see `egress::reach`).
//!
//! `egress_hosts`, when present, bounds the hosts a member token may put on an allowlist
//! (`--allow-host`, a preset's hosts, a secret's hosts): each must fall within one of its
//! patterns (`pypi.org`, `*.example.com`) or presets' hosts. Absent, members may allow any
//! host name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};

use tether_relay_core::egress::policy::HostPattern;
use tether_relay_core::egress::preset;
use tether_store::Tenant;

/// Built-in defaults: what a tenant gets when neither the file's `[defaults]` nor its own
/// table says otherwise. Every size is bounded, so a request that names none still has limits.
mod builtin {
    use std::time::Duration;

    pub(super) const NETWORK_HOST: bool = false;
    /// Members may allow public addresses only.
    pub(super) const EGRESS_NETWORKS: Vec<ipnet::IpNet> = Vec::new();
    pub(super) const MAX_SANDBOXES: u64 = 32;
    pub(super) const MEMORY: u64 = 1 << 30; // 1 GiB
    pub(super) const MAX_MEMORY: u64 = 16 << 30; // 16 GiB
    pub(super) const CPUS: f64 = 1.0;
    pub(super) const MAX_CPUS: f64 = 8.0;
    pub(super) const PIDS: u64 = 1024;
    pub(super) const MAX_PIDS: u64 = 32768;
    pub(super) const DISK: u64 = 10 << 30; // 10 GiB
    pub(super) const MAX_DISK: u64 = 100 << 30; // 100 GiB
    pub(super) const TTL: Duration = Duration::from_secs(24 * 3600); // 24 h
    pub(super) const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600); // 7 days
}

/// Why the policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read the policy file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has an unknown key or a bad value.
    #[error("the policy file {path} is invalid: {message}; docs/policy.md lists its keys")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message, naming the key and line.
        message: String,
    },
    /// The values do not fit together.
    #[error("the policy file {path} is invalid: {message}")]
    Inconsistent {
        /// The file.
        path: String,
        /// What is wrong, and where.
        message: String,
    },
}

/// The file as written: every key optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// What every tenant gets.
    #[serde(default)]
    defaults: TenantTable,
    /// Per-tenant overrides, by tenant name.
    #[serde(default)]
    tenants: BTreeMap<String, TenantTable>,
}

/// One table of the file: `[defaults]` or `[tenants.NAME]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantTable {
    providers: Option<Vec<String>>,
    network_host: Option<bool>,
    egress_networks: Option<Networks>,
    egress_hosts: Option<HostPatterns>,
    max_sandboxes: Option<u64>,
    memory: Option<ByteSize>,
    max_memory: Option<ByteSize>,
    cpus: Option<Cores>,
    max_cpus: Option<Cores>,
    pids: Option<u64>,
    max_pids: Option<u64>,
    disk: Option<ByteSize>,
    max_disk: Option<ByteSize>,
    ttl: Option<Lifetime>,
    max_ttl: Option<Lifetime>,
}

/// What one tenant may use, every value resolved.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Limits {
    /// Providers it may use; `None` is every provider of the relay.
    pub providers: Option<BTreeSet<String>>,
    /// Whether its member tokens may ask for the host's network.
    pub network_host: bool,
    /// Networks beyond public address space its member tokens may allow (`--allow-cidr`).
    pub egress_networks: Vec<IpNet>,
    /// Host patterns its member tokens' allowlists must fall within; `None` is any host.
    pub egress_hosts: Option<Vec<HostPattern>>,
    /// Sandboxes it may have at once.
    pub max_sandboxes: u64,
    /// Memory in bytes when a request names none, and the most it may ask for.
    pub memory: u64,
    /// See [`Limits::memory`].
    pub max_memory: u64,
    /// CPU cores when a request names none, and the most it may ask for.
    pub cpus: f64,
    /// See [`Limits::cpus`].
    pub max_cpus: f64,
    /// Processes when a request names none, and the most it may ask for.
    pub pids: u64,
    /// See [`Limits::pids`].
    pub max_pids: u64,
    /// Disk quota in bytes when a request names none, and the most it may ask for.
    pub disk: u64,
    /// See [`Limits::disk`].
    pub max_disk: u64,
    /// TTL when a request names none, and the longest it may ask for (at create or renew).
    pub ttl: Duration,
    /// See [`Limits::ttl`].
    pub max_ttl: Duration,
}

impl PolicyFile {
    /// Reads and checks the file at `path`.
    pub(crate) fn load(path: &Path) -> Result<PolicyFile, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        PolicyFile::parse(&text, &shown)
    }

    /// Parses and checks `text`; `path` is for messages.
    pub(crate) fn parse(text: &str, path: &str) -> Result<PolicyFile, ConfigError> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        let inconsistent = |message: String| ConfigError::Inconsistent {
            path: path.to_string(),
            message,
        };
        for name in file.tenants.keys() {
            Tenant::parse(name).map_err(|e| inconsistent(format!("[tenants.{name}]: {e}")))?;
        }
        let tables = std::iter::once(("[defaults]".to_string(), None)).chain(
            file.tenants
                .keys()
                .map(|n| (format!("[tenants.{n}]"), Some(n))),
        );
        for (table, tenant) in tables {
            let limits = file.resolve(tenant.map(String::as_str));
            limits
                .check()
                .map_err(|e| inconsistent(format!("{table}: {e}")))?;
        }
        Ok(file)
    }

    /// Every provider name the file mentions.
    pub(crate) fn provider_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&self.defaults)
            .chain(self.tenants.values())
            .filter_map(|t| t.providers.as_ref())
            .flatten()
            .map(String::as_str)
    }

    /// What `tenant` may use (`None`: the defaults alone).
    pub(crate) fn resolve(&self, tenant: Option<&str>) -> Limits {
        let own = tenant.and_then(|t| self.tenants.get(t));
        let d = &self.defaults;
        macro_rules! pick {
            ($field:ident, $builtin:expr) => {
                own.and_then(|t| t.$field.clone())
                    .or_else(|| d.$field.clone())
                    .map(Into::into)
                    .unwrap_or($builtin)
            };
        }
        Limits {
            providers: own
                .and_then(|t| t.providers.clone())
                .or_else(|| d.providers.clone())
                .map(|p| p.into_iter().collect()),
            network_host: pick!(network_host, builtin::NETWORK_HOST),
            egress_networks: pick!(egress_networks, builtin::EGRESS_NETWORKS),
            egress_hosts: own
                .and_then(|t| t.egress_hosts.clone())
                .or_else(|| d.egress_hosts.clone())
                .map(Into::into),
            max_sandboxes: pick!(max_sandboxes, builtin::MAX_SANDBOXES),
            memory: pick!(memory, builtin::MEMORY),
            max_memory: pick!(max_memory, builtin::MAX_MEMORY),
            cpus: pick!(cpus, builtin::CPUS),
            max_cpus: pick!(max_cpus, builtin::MAX_CPUS),
            pids: pick!(pids, builtin::PIDS),
            max_pids: pick!(max_pids, builtin::MAX_PIDS),
            disk: pick!(disk, builtin::DISK),
            max_disk: pick!(max_disk, builtin::MAX_DISK),
            ttl: pick!(ttl, builtin::TTL),
            max_ttl: pick!(max_ttl, builtin::MAX_TTL),
        }
    }
}

impl Limits {
    /// Checks that every default is within its maximum and every value is in the range a
    /// request could ask for.
    fn check(&self) -> Result<(), String> {
        use super::ranges;
        ranges::memory("memory", self.memory)?;
        ranges::memory("max_memory", self.max_memory)?;
        ranges::cpus("cpus", self.cpus)?;
        ranges::cpus("max_cpus", self.max_cpus)?;
        ranges::pids("pids", self.pids)?;
        ranges::pids("max_pids", self.max_pids)?;
        ranges::disk("disk", self.disk)?;
        ranges::disk("max_disk", self.max_disk)?;
        ranges::lifetime("ttl", self.ttl)?;
        ranges::lifetime("max_ttl", self.max_ttl)?;
        let over = |what: &str, default: String, max: String| {
            Err(format!(
                "the default `{what}` ({default}) is above `max_{what}` ({max}); lower one or \
                 raise the other"
            ))
        };
        if self.memory > self.max_memory {
            return over(
                "memory",
                self.memory.to_string(),
                self.max_memory.to_string(),
            );
        }
        if self.cpus > self.max_cpus {
            return over("cpus", self.cpus.to_string(), self.max_cpus.to_string());
        }
        if self.pids > self.max_pids {
            return over("pids", self.pids.to_string(), self.max_pids.to_string());
        }
        if self.disk > self.max_disk {
            return over("disk", self.disk.to_string(), self.max_disk.to_string());
        }
        if self.ttl > self.max_ttl {
            let show = |d: Duration| humantime::format_duration(d).to_string();
            return over("ttl", show(self.ttl), show(self.max_ttl));
        }
        Ok(())
    }
}

/// A size: a byte count, or a string such as `"512M"` or `"2GiB"` (binary units).
#[derive(Clone, Copy, Debug, PartialEq)]
struct ByteSize(u64);

impl From<ByteSize> for u64 {
    fn from(s: ByteSize) -> u64 {
        s.0
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a size: a byte count or a string such as \"2G\"")
        })? {
            Raw::Bytes(n) => Ok(ByteSize(n)),
            Raw::Text(s) => tether_client::size::parse_size(&s)
                .map(ByteSize)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Networks, as CIDRs (`"10.20.0.0/16"`) or single addresses, host bits refused.
#[derive(Clone, Debug, PartialEq)]
struct Networks(Vec<IpNet>);

impl From<Networks> for Vec<IpNet> {
    fn from(n: Networks) -> Vec<IpNet> {
        n.0
    }
}

impl<'de> Deserialize<'de> for Networks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Networks, D::Error> {
        let texts = Vec::<String>::deserialize(d)?;
        texts
            .iter()
            .map(|text| {
                let net = text
                    .parse::<IpNet>()
                    .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        serde::de::Error::custom(format!(
                            "`{text}` is not a network: write a CIDR such as \"10.20.0.0/16\" \
                             or an address such as \"169.254.169.254\""
                        ))
                    })?;
                if net.trunc() != net {
                    return Err(serde::de::Error::custom(format!(
                        "`{text}` has host bits set; did you mean \"{}\"?",
                        net.trunc()
                    )));
                }
                Ok(net)
            })
            .collect::<Result<_, _>>()
            .map(Networks)
    }
}

/// Host name patterns (`"pypi.org"`, `"*.example.com"`) and presets
/// (`"@package-registries"`, expanded here), as an allowlist writes them.
#[derive(Clone, Debug, PartialEq)]
struct HostPatterns(Vec<HostPattern>);

impl From<HostPatterns> for Vec<HostPattern> {
    fn from(h: HostPatterns) -> Vec<HostPattern> {
        h.0
    }
}

impl<'de> Deserialize<'de> for HostPatterns {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HostPatterns, D::Error> {
        let texts = Vec::<String>::deserialize(d)?;
        preset::expand(&texts)
            .map_err(serde::de::Error::custom)?
            .iter()
            .map(|text| HostPattern::parse(text).map_err(serde::de::Error::custom))
            .collect::<Result<_, _>>()
            .map(HostPatterns)
    }
}

/// CPU cores: an integer or a float.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Cores(f64);

impl From<Cores> for f64 {
    fn from(c: Cores) -> f64 {
        c.0
    }
}

impl<'de> Deserialize<'de> for Cores {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Cores, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Float(f64),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a number of CPU cores, e.g. 2 or 0.5")
        })? {
            Raw::Int(n) => Ok(Cores(n as f64)),
            Raw::Float(f) => Ok(Cores(f)),
        }
    }
}

/// A duration: a string such as `"30m"`, `"24h"` or `"7d"`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Lifetime(Duration);

impl From<Lifetime> for Duration {
    fn from(l: Lifetime) -> Duration {
        l.0
    }
}

impl<'de> Deserialize<'de> for Lifetime {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Lifetime, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map(Lifetime).map_err(|e| {
            serde::de::Error::custom(format!(
                "`{text}` is not a duration ({e}): write one such as \"30m\", \"24h\" or \"7d\""
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_the_builtin_defaults_and_they_are_bounded() {
        let file = PolicyFile::parse("", "p.toml").unwrap();
        let l = file.resolve(Some("anyone"));
        assert_eq!(l, PolicyFile::default().resolve(None));
        assert_eq!(l.providers, None);
        assert!(!l.network_host);
        assert_eq!((l.memory, l.cpus, l.pids), (1 << 30, 1.0, 1024));
        assert_eq!((l.disk, l.ttl), (10 << 30, Duration::from_secs(86400)));
    }

    #[test]
    fn tenants_override_the_defaults_key_by_key() {
        let text = r#"
            [defaults]
            providers = ["local"]
            max_memory = "4G"
            memory = 536870912
            ttl = "1h"
            [tenants.team-a]
            memory = "2GiB"
            cpus = 0.5
            network_host = true
            egress_networks = ["10.20.0.0/16"]
            egress_hosts = ["*.Example.com.", "@package-registries", "pypi.org"]
            max_ttl = "30d"
        "#;
        let file = PolicyFile::parse(text, "p.toml").unwrap();
        let a = file.resolve(Some("team-a"));
        assert_eq!((a.memory, a.max_memory, a.cpus), (2 << 30, 4 << 30, 0.5));
        assert!(a.network_host);
        assert_eq!(
            a.egress_networks,
            ["10.20.0.0/16".parse::<IpNet>().unwrap()]
        );
        let hosts: Vec<String> = a
            .egress_hosts
            .unwrap()
            .iter()
            .map(|h| h.to_string())
            .collect();
        assert_eq!(
            hosts[..3],
            ["*.example.com", "pypi.org", "files.pythonhosted.org"]
        );
        assert_eq!(hosts.len(), 1 + preset::PRESETS[0].hosts.len());
        assert_eq!(a.ttl, Duration::from_secs(3600));
        assert_eq!(a.max_ttl, Duration::from_secs(30 * 86400));
        assert_eq!(a.providers, Some(BTreeSet::from(["local".to_string()])));
        let b = file.resolve(Some("team-b"));
        assert_eq!((b.memory, b.max_memory), (512 << 20, 4 << 30));
        assert!(!b.network_host);
        assert!(b.egress_networks.is_empty());
        assert_eq!(b.egress_hosts, None, "absent is any host");
        assert_eq!(file.provider_names().collect::<Vec<_>>(), ["local"]);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        for (text, words) in [
            ("[defaults]\nmemroy = \"1G\"", &["memroy", "line 2"][..]),
            ("[tenant.a]\nmemory = 1", &["tenant"][..]),
            ("[tenants.a]\nmax_pid = 1", &["max_pid"][..]),
            ("[defaults]\nttl = 30", &["ttl"][..]),
            ("[defaults]\nmemory = \"12X\"", &["12X"][..]),
            (
                "[defaults]\nmemory = \"2G\"\nmax_memory = \"1G\"",
                &["max_memory", "[defaults]"][..],
            ),
            (
                "[tenants.a]\npids = 100000000",
                &["pids", "[tenants.a]", "4194304"][..],
            ),
            ("[tenants.\"a b\"]\npids = 1", &["a b"][..]),
            ("[defaults]\ncpus = 0", &["cpus"][..]),
            (
                "[defaults]\negress_networks = [\"10.1.2.3/16\"]",
                &["egress_networks", "10.1.0.0/16"][..],
            ),
            ("[defaults]\negress_networks = [\"ten\"]", &["`ten`"][..]),
            ("[defaults]\negress_hosts = [\"*.com\"]", &["`*.com`"][..]),
            (
                "[defaults]\negress_hosts = [\"@registries\"]",
                &["egress_hosts", "@package-registries"][..],
            ),
        ] {
            let err = PolicyFile::parse(text, "p.toml").unwrap_err().to_string();
            for word in words {
                assert!(err.contains(word), "{text:?}: {word:?} not in {err}");
            }
        }
    }
}

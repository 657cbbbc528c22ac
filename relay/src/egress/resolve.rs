//! How the proxy finds the addresses of an allowed name: first the operator's hosts(5) file
//! (`tether serve --egress-hosts`), then the host's resolver. Addresses a public name must
//! never lead a sandbox to (the host's loopback, link-local cloud metadata, unspecified or
//! multicast) are dropped from the resolver's answers; the operator's file is trusted as is.

use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use super::constants::MAX_HOSTS_FILE_BYTES;

/// Resolves allowed names for the proxy.
#[derive(Debug, Default)]
pub(super) struct Resolver {
    hosts: HashMap<String, Vec<IpAddr>>,
}

impl Resolver {
    /// A resolver with the entries of the hosts(5) file `path`, if any.
    pub(super) fn new(path: Option<&Path>) -> Result<Self, String> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_HOSTS_FILE_BYTES).read_to_string(&mut text))
            .map_err(|e| {
                format!(
                    "cannot read the egress hosts file {}: {e}; give a readable file in \
                     hosts(5) format (`ADDRESS NAME...` per line)",
                    path.display()
                )
            })?;
        Self::parse(&text).map_err(|why| format!("{}: {why}", path.display()))
    }

    /// Entries from hosts(5) text: `ADDRESS NAME [NAME...]`, `#` comments.
    fn parse(text: &str) -> Result<Self, String> {
        let mut hosts: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("");
            let mut words = line.split_whitespace();
            let Some(addr) = words.next() else { continue };
            let addr: IpAddr = addr.parse().map_err(|_| {
                format!(
                    "line {}: `{addr}` is not an IP address (each line is `ADDRESS NAME...`)",
                    n + 1
                )
            })?;
            for name in words {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                let entry = hosts.entry(name).or_default();
                if !entry.contains(&addr) {
                    entry.push(addr);
                }
            }
        }
        Ok(Resolver { hosts })
    }

    /// The addresses to try for `name` on `port`: the hosts file's, else the resolver's that a
    /// sandbox may reach. Empty when there is none.
    pub(super) async fn resolve(&self, name: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        if let Some(addrs) = self.hosts.get(name) {
            return Ok(addrs.iter().map(|a| SocketAddr::new(*a, port)).collect());
        }
        let found = tokio::net::lookup_host((name, port)).await?;
        Ok(found.filter(|a| reachable(a.ip())).collect())
    }
}

/// Whether a resolved address may be handed to a sandbox: not the relay host itself (loopback,
/// unspecified), not link-local (cloud metadata at 169.254.169.254), not multicast.
fn reachable(addr: IpAddr) -> bool {
    let addr = addr.to_canonical();
    let link_local = match addr {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    !(addr.is_loopback() || addr.is_unspecified() || addr.is_multicast() || link_local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_files_parse_and_refuse_what_is_not_an_address() {
        let r = Resolver::parse("# upstreams\n10.9.0.2 api.allowed.test Files.Allowed.Test.\n\n")
            .unwrap();
        assert_eq!(
            r.hosts["files.allowed.test"],
            vec!["10.9.0.2".parse::<IpAddr>().unwrap()]
        );
        assert!(Resolver::parse("api.test 10.0.0.1\n")
            .unwrap_err()
            .contains("line 1"));
    }

    #[test]
    fn the_hosts_own_addresses_are_never_reachable_by_name() {
        for bad in [
            "127.0.0.1",
            "::1",
            "0.0.0.0",
            "169.254.169.254",
            "fe80::1",
            "224.0.0.1",
            "::ffff:127.0.0.1",
        ] {
            assert!(!reachable(bad.parse().unwrap()), "{bad}");
        }
        for good in ["10.1.2.3", "93.184.216.34", "2001:db8::1"] {
            assert!(reachable(good.parse().unwrap()), "{good}");
        }
    }

    #[tokio::test]
    async fn the_hosts_file_answers_first() {
        let r = Resolver::parse("10.9.0.2 api.allowed.test\n").unwrap();
        let addrs = r.resolve("api.allowed.test", 443).await.unwrap();
        assert_eq!(addrs, vec!["10.9.0.2:443".parse().unwrap()]);
    }
}

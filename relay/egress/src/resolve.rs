//! How the proxy finds the addresses of an allowed name: first the operator's hosts(5) file
//! (`tether serve --egress-hosts`), then the host's resolver. Every address found still passes
//! [`super::reach`] before the proxy connects to it; the answer says whether it came from the
//! operator's file, which that filter trusts for private and link-local ranges (never for the
//! relay's own host).

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

    /// The addresses of `name` on `port`: the hosts file's, else the resolver's. Empty when
    /// there is none. Not yet filtered: see [`super::reach`].
    pub(super) async fn resolve(&self, name: &str, port: u16) -> std::io::Result<Resolved> {
        if let Some(addrs) = self.hosts.get(name) {
            return Ok(Resolved {
                addrs: addrs.iter().map(|a| SocketAddr::new(*a, port)).collect(),
                from_hosts_file: true,
            });
        }
        let found = tokio::net::lookup_host((name, port)).await?;
        Ok(Resolved {
            addrs: found.collect(),
            from_hosts_file: false,
        })
    }
}

/// What a name resolved to, and where the answer came from.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Resolved {
    /// Its addresses, in the order to try them.
    pub(super) addrs: Vec<SocketAddr>,
    /// Whether the operator's hosts file gave them.
    pub(super) from_hosts_file: bool,
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

    #[tokio::test]
    async fn the_hosts_file_answers_first() {
        let r = Resolver::parse("10.9.0.2 api.allowed.test\n").unwrap();
        let found = r.resolve("api.allowed.test", 443).await.unwrap();
        assert_eq!(found.addrs, vec!["10.9.0.2:443".parse().unwrap()]);
        assert!(found.from_hosts_file);
    }
}

//! How a sandbox that does not run on the relay's host (a cloud sandbox) reaches the relay's
//! egress proxy: the address it dials (`tether serve --egress-url`), its own proxy credential,
//! and the environment that points its HTTP clients at the proxy and its TLS clients at its CA.
//!
//! The credential is HMAC-SHA256 of the sandbox's id under its agent token, with a context of
//! its own: per sandbox, stable across relay restarts, unguessable without the agent token,
//! needing no column in the store, and neither the agent token nor any API token. It is
//! revoked when the sandbox is deleted: the relay then stops accepting it.

use std::fmt;
use std::net::IpAddr;

use hmac::{Hmac, Mac};
use ipnet::IpNet;
use sha2::Sha256;

use super::ca::{BUNDLE_PATH, CA_PATH};

/// What the HMAC signs besides the id, so the agent token serves no other purpose by accident.
const CREDENTIAL_CONTEXT: &[u8] = b"tether-egress-proxy-v1:";
/// Bytes of HMAC kept in a credential (hex-encoded, so twice as many characters): 128 bits.
const CREDENTIAL_BYTES: usize = 16;
/// Hosts every HTTP client inside reaches directly, never through the proxy.
const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// The variables that send a sandbox's HTTP clients to the proxy (upper and lower case: curl
/// reads only `http_proxy` in lower case, Go and Python read both).
pub const PROXY_VARIABLES: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// The host part of an egress URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteHost {
    /// A DNS name, lowercase.
    Name(String),
    /// An address.
    Addr(IpAddr),
}

impl fmt::Display for RouteHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Addr(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
            Self::Addr(addr) => write!(f, "{addr}"),
        }
    }
}

/// Where sandboxes elsewhere reach the relay's egress proxy: `http://HOST:PORT`, or
/// `https://HOST:PORT` for a proxy spoken to over TLS (the relay's own certificate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressUrl {
    /// Whether the proxy is spoken to over TLS.
    pub tls: bool,
    /// The host sandboxes dial.
    pub host: RouteHost,
    /// The port they dial.
    pub port: u16,
}

impl EgressUrl {
    /// Parses `--egress-url`, refusing what a proxy URL cannot be (a path, a query, user
    /// information, another scheme), each with what to write instead.
    pub fn parse(text: &str) -> Result<Self, String> {
        let how = "write it as http://HOST:PORT or https://HOST:PORT, the address at which \
                   sandboxes reach this relay's egress listener";
        let url = reqwest::Url::parse(text)
            .map_err(|e| format!("--egress-url {text:?} is not a URL ({e}); {how}"))?;
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            other => {
                return Err(format!(
                    "--egress-url {text:?} has the scheme {other}; {how}"
                ))
            }
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "--egress-url {text:?} carries user information; leave it out (each sandbox \
                 gets a credential of its own); {how}"
            ));
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "--egress-url {text:?} has a path, a query or a fragment, which a proxy \
                 address cannot have; {how}"
            ));
        }
        let host = match url.host_str() {
            None | Some("") => return Err(format!("--egress-url {text:?} names no host; {how}")),
            Some(host) => {
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                match bare.parse::<IpAddr>() {
                    Ok(addr) => RouteHost::Addr(addr),
                    Err(_) => RouteHost::Name(host.to_ascii_lowercase()),
                }
            }
        };
        let port = url
            .port_or_known_default()
            .ok_or_else(|| format!("--egress-url {text:?} names no port; {how}"))?;
        Ok(Self { tls, host, port })
    }

    /// The proxy URL a sandbox's clients use: this address with its credential.
    pub fn proxy_url(&self, id: &str, credential: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{id}:{credential}@{}:{}", self.host, self.port)
    }
}

impl fmt::Display for EgressUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

/// What a sandbox's native allowlist (its provider's egress controls) must hold for it to
/// reach the egress listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelayEntry {
    /// The listener's host name, as an allowed host.
    Host(String),
    /// The listener's address, as an allowed network of one address.
    Network(IpNet),
}

impl RelayEntry {
    /// The URL's host as it is: by name, or by address.
    pub fn of(url: &EgressUrl) -> Self {
        match &url.host {
            RouteHost::Name(name) => Self::Host(name.clone()),
            RouteHost::Addr(addr) => Self::Network(IpNet::from(*addr)),
        }
    }

    /// Adds the entry to `egress`, unless it is there already.
    pub fn add_to(&self, egress: &mut tether_client::api::EgressSpec) {
        let (list, entry) = match self {
            Self::Host(name) => (&mut egress.allow_hosts, name.clone()),
            Self::Network(net) => (&mut egress.allow_cidrs, net.to_string()),
        };
        if !list.contains(&entry) {
            list.push(entry);
        }
    }
}

impl fmt::Display for RelayEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host(name) => f.write_str(name),
            Self::Network(net) => write!(f, "{net}"),
        }
    }
}

/// The proxy credential of sandbox `id` whose agent token is `agent_token`, as 32 hex digits.
pub fn credential(agent_token: &str, id: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(agent_token.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(CREDENTIAL_CONTEXT);
    mac.update(id.as_bytes());
    hex::encode(&mac.finalize().into_bytes()[..CREDENTIAL_BYTES])
}

/// The environment a routed sandbox gets: every proxy variable pointing at `url` with its
/// credential; loopback and the allowed `networks` exempt (the sandbox reaches those itself,
/// through its provider's controls); Node told to honour them; and TLS clients pointed at the
/// bundle holding its CA (the same paths as a local sandbox's).
pub fn environment(
    url: &EgressUrl,
    id: &str,
    credential: &str,
    networks: &[IpNet],
) -> Vec<(&'static str, String)> {
    let proxy = url.proxy_url(id, credential);
    let mut env: Vec<(&'static str, String)> = PROXY_VARIABLES
        .iter()
        .map(|name| (*name, proxy.clone()))
        .collect();
    let mut no_proxy = NO_PROXY.to_string();
    for net in networks {
        no_proxy.push(',');
        no_proxy.push_str(&net.to_string());
    }
    env.push(("NO_PROXY", no_proxy.clone()));
    env.push(("no_proxy", no_proxy));
    // Node 24 and later read the proxy variables only when told to.
    env.push(("NODE_USE_ENV_PROXY", "1".to_string()));
    for (name, path) in super::ca::environment() {
        env.push((name, path.to_string()));
    }
    debug_assert!(env.iter().any(|(_, v)| v == BUNDLE_PATH || v == CA_PATH));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_urls_parse_and_what_a_proxy_address_cannot_be_is_refused() {
        let plain = EgressUrl::parse("http://Relay.Example.com:3129").unwrap();
        assert_eq!(
            plain,
            EgressUrl {
                tls: false,
                host: RouteHost::Name("relay.example.com".into()),
                port: 3129
            }
        );
        let tls = EgressUrl::parse("https://203.0.113.9").unwrap();
        assert_eq!(tls.port, 443);
        assert_eq!(tls.host, RouteHost::Addr("203.0.113.9".parse().unwrap()));
        let v6 = EgressUrl::parse("http://[2001:db8::1]:8080/").unwrap();
        assert_eq!(v6.to_string(), "http://[2001:db8::1]:8080");
        assert_eq!(
            v6.proxy_url("sb-1", "c0ffee"),
            "http://sb-1:c0ffee@[2001:db8::1]:8080"
        );
        for (bad, words) in [
            ("relay:3129", "scheme"),
            ("socks5://relay:1080", "scheme socks5"),
            ("http://u:p@relay:3129", "user information"),
            ("http://relay:3129/proxy", "path"),
            ("http://relay:3129/?x=1", "query"),
            ("not a url", "not a URL"),
        ] {
            let err = EgressUrl::parse(bad).unwrap_err();
            assert!(err.contains(words), "{bad}: {err}");
            assert!(err.contains("http://HOST:PORT"), "{bad}: {err}");
        }
    }

    #[test]
    fn credentials_are_per_sandbox_and_not_the_agent_token() {
        let a = credential("agent-token-a", "sb-1");
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(a, credential("agent-token-a", "sb-1"), "stable");
        assert_ne!(a, credential("agent-token-a", "sb-2"));
        assert_ne!(a, credential("agent-token-b", "sb-1"));
        assert!(!a.contains("agent-token"));
    }

    #[test]
    fn the_environment_sets_every_proxy_variable_and_the_trust_paths() {
        let url = EgressUrl::parse("https://relay.test:8443").unwrap();
        let env = environment(&url, "sb-1", "abc", &["10.1.0.0/16".parse().unwrap()]);
        let get = |name: &str| {
            env.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        for name in PROXY_VARIABLES {
            assert_eq!(
                get(name),
                Some("https://sb-1:abc@relay.test:8443"),
                "{name}"
            );
        }
        assert_eq!(get("no_proxy"), Some("localhost,127.0.0.1,::1,10.1.0.0/16"));
        assert_eq!(get("NO_PROXY"), get("no_proxy"));
        assert_eq!(get("SSL_CERT_FILE"), Some(BUNDLE_PATH));
        assert_eq!(get("NODE_EXTRA_CA_CERTS"), Some(CA_PATH));
    }
}

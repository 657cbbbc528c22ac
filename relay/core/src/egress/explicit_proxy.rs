//! The explicit proxy inside a local sandbox with an allowlist: where it listens, and the
//! environment that sends the sandbox's HTTP clients to it.
//!
//! The transparent path already fences every connection, so the variables add no protection.
//! They are there for what a refusal says: a client that asks a proxy (pip, npm, curl, git,
//! Python's requests, Go) gets `403 Forbidden by the sandbox's egress policy: ...` as its
//! CONNECT's status line, which it prints, where the transparent path can only answer a
//! name off the allowlist with NXDOMAIN ("Name or service not known").

/// The port of the explicit proxy on the sandbox's loopback.
pub const EXPLICIT_PROXY_PORT: u16 = 3128;

/// Hosts every HTTP client inside reaches directly, never through the proxy: the sandbox's
/// own loopback, where the proxy would refuse them.
const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// The variables, upper and lower case (curl reads `http_proxy` only in lower case; Go and
/// Python read both). Not `ALL_PROXY`: it would send protocols other than HTTP to an HTTP
/// proxy too.
pub fn environment() -> [(&'static str, String); 6] {
    let url = format!("http://127.0.0.1:{EXPLICIT_PROXY_PORT}");
    [
        ("HTTPS_PROXY", url.clone()),
        ("https_proxy", url.clone()),
        ("HTTP_PROXY", url.clone()),
        ("http_proxy", url),
        ("NO_PROXY", NO_PROXY.to_string()),
        ("no_proxy", NO_PROXY.to_string()),
    ]
}

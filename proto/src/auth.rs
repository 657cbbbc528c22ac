//! Token comparison that takes the same time whatever the tokens hold.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// True when `given` equals `expected`. Both are hashed first, so neither the position of the
/// first difference nor the expected token's length leaks through timing.
pub fn token_matches(given: &str, expected: &str) -> bool {
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.ct_eq(&b).into()
}

/// The upgrade header that may carry the agent token instead of `Authorization` (lowercase,
/// as HTTP/2 and the `http` crate spell it): for edges that read `Authorization` themselves,
/// such as Daytona's preview proxy, which tries any bearer as a Daytona credential first.
pub const TOKEN_HEADER: &str = "x-tether-agent-token";

/// Extracts the token from an `Authorization: Bearer <token>` header value.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares() {
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abd", "abc"));
        assert!(!token_matches("", "abc"));
    }

    #[test]
    fn parses_bearer() {
        assert_eq!(bearer("Bearer xyz"), Some("xyz"));
        assert_eq!(bearer("bearer  xyz "), Some("xyz"));
        assert_eq!(bearer("Basic xyz"), None);
    }
}

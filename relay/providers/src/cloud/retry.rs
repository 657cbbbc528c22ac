//! Which provider failures are passing, and how long to wait before trying again: exponential
//! backoff with jitter, overridden by the server's `Retry-After` when it sends one.
//!
//! Passing: HTTP 429 (rate limited), 502, 503 and 504 (a gateway or the service is busy), and
//! failing to connect at all. Everything else is reported at once.

use std::time::{Duration, SystemTime};

use rand::Rng;
use reqwest::header::{HeaderMap, RETRY_AFTER};

use super::constants::{BACKOFF_MAX, BACKOFF_START, MAX_RETRY_AFTER, RETRY_ATTEMPTS};

/// Whether an HTTP status is worth retrying.
pub(crate) fn is_retryable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// Whether a 429 comes from Daytona's failed-auth limiter (`Retry-After-failed-auth`): the
/// caller's IP is blocked after repeated refused credentials, which waiting out one backoff
/// does not fix and more tries only prolong.
pub(crate) fn is_failed_auth_block(headers: &HeaderMap) -> bool {
    headers.contains_key("retry-after-failed-auth")
}

/// The wait a response asks for, if any: `Retry-After` (delta-seconds or an HTTP date), or
/// the longest of Daytona's per-throttler `Retry-After-{name}` headers.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            name == RETRY_AFTER.as_str() || name.starts_with("retry-after-")
        })
        .filter_map(|(_, value)| parse_retry_after(value.to_str().ok()?.trim()))
        .max()
}

fn parse_retry_after(value: &str) -> Option<Duration> {
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(SystemTime::now()).unwrap_or_default())
}

/// The tries of one call: how many are left and how long to wait before the next.
#[derive(Debug)]
pub(crate) struct Backoff {
    tries: u32,
}

impl Backoff {
    /// A call about to make its first try.
    pub(crate) fn new() -> Backoff {
        Backoff { tries: 1 }
    }

    /// The wait before the next try, or `None` when the call has had all its tries (or the
    /// server asks for a longer wait than we are willing to sit through).
    pub(crate) fn next(&mut self, retry_after: Option<Duration>) -> Option<Duration> {
        if self.tries >= RETRY_ATTEMPTS {
            return None;
        }
        let wait = match retry_after {
            Some(wait) if wait > MAX_RETRY_AFTER => return None,
            Some(wait) => wait,
            None => {
                let full = BACKOFF_START
                    .saturating_mul(1 << (self.tries - 1).min(16))
                    .min(BACKOFF_MAX);
                // Half fixed, half random: spread out clients that failed together.
                let half = full / 2;
                half + half.mul_f64(rand::rng().random::<f64>())
            }
        };
        self.tries += 1;
        Some(wait)
    }

    /// Tries made so far.
    pub(crate) fn tries(&self) -> u32 {
        self.tries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            RETRY_AFTER,
            "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), Some(Duration::ZERO));
        let soon = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        headers.insert(RETRY_AFTER, soon.parse().unwrap());
        let wait = retry_after(&headers).unwrap();
        assert!(
            wait > Duration::from_secs(28) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        headers.insert(RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
        headers.insert("retry-after-sandbox-create", "4".parse().unwrap());
        headers.insert("retry-after-authenticated", "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(4)));
    }

    #[test]
    fn backoff_grows_is_capped_and_ends() {
        let mut backoff = Backoff::new();
        let first = backoff.next(None).unwrap();
        assert!(
            first >= BACKOFF_START / 2 && first <= BACKOFF_START,
            "{first:?}"
        );
        assert_eq!(
            backoff.next(Some(Duration::from_secs(2))),
            Some(Duration::from_secs(2))
        );
        assert!(backoff
            .next(Some(MAX_RETRY_AFTER + Duration::from_secs(1)))
            .is_none());
        while backoff.next(None).is_some() {}
        assert_eq!(backoff.tries(), RETRY_ATTEMPTS);
    }

    #[test]
    fn only_passing_statuses_are_retried() {
        for s in [429, 502, 503, 504] {
            assert!(is_retryable(s));
        }
        for s in [400, 401, 403, 404, 409, 500] {
            assert!(!is_retryable(s));
        }
    }
}

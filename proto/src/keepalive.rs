//! How often a client pings when a relay asks it to (`PROTOCOL.md` sections 12 and 15).
//!
//! A relay that copies a session's bytes without reading its frames cannot ping either side
//! itself; it hears each side alive only through the endpoints' own pings and pongs. So a
//! client announces, in its upgrade request, that it pings at least every N milliseconds
//! and will ping more often if asked; the relay's `101` answers with the longest interval it
//! can accept, which such a client then keeps to.

use std::time::Duration;

/// The upgrade header of both: in a request, the longest interval between the client's
/// pings (announcing that it honours the answer's); in a `101`, the longest interval the
/// server accepts. The value is whole milliseconds.
pub const PING_INTERVAL_HEADER: &str = "x-tether-ping-interval";

/// The shortest interval a client need keep to, whatever it is asked: 100 ms.
pub const MIN_PING_INTERVAL: Duration = Duration::from_millis(100);

/// The interval in a [`PING_INTERVAL_HEADER`] value, at least [`MIN_PING_INTERVAL`]; `None`
/// when it is not a whole number of milliseconds.
pub fn parse_interval(value: &str) -> Option<Duration> {
    let ms: u64 = value.trim().parse().ok()?;
    Some(Duration::from_millis(ms).max(MIN_PING_INTERVAL))
}

/// `interval` as a [`PING_INTERVAL_HEADER`] value.
pub fn format_interval(interval: Duration) -> String {
    interval.as_millis().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_whole_milliseconds_and_never_below_the_floor() {
        assert_eq!(parse_interval("10000"), Some(Duration::from_secs(10)));
        assert_eq!(parse_interval(" 250 "), Some(Duration::from_millis(250)));
        assert_eq!(parse_interval("0"), Some(MIN_PING_INTERVAL));
        assert_eq!(parse_interval("1.5"), None);
        assert_eq!(parse_interval("-3"), None);
        assert_eq!(parse_interval(""), None);
        assert_eq!(format_interval(Duration::from_millis(666)), "666");
    }
}

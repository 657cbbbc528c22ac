//! How the bench writes its numbers: durations in milliseconds, rates in decimal units as
//! network and disk speeds are quoted, sizes in binary units as memory and files are.

use std::time::Duration;

/// `0.712 ms`, `12.4 ms`, `1.20 s`.
pub(super) fn duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.3} ms")
    }
}

/// Decimal units, as network and disk speeds are quoted: `1.23 GB/s`, `61.0 MB/s`.
pub(super) fn rate(bytes_per_s: f64) -> String {
    if bytes_per_s >= 1e9 {
        format!("{:.2} GB/s", bytes_per_s / 1e9)
    } else {
        format!("{:.1} MB/s", bytes_per_s / 1e6)
    }
}

/// Binary units, as memory and files are: `5.2 MiB`, `23.5 GiB`, `12.0 KiB`.
pub(super) fn size(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / (1u64 << 10) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_naturally() {
        assert_eq!(duration(Duration::from_micros(712)), "0.712 ms");
        assert_eq!(duration(Duration::from_micros(12_400)), "12.4 ms");
        assert_eq!(duration(Duration::from_millis(1_200)), "1.20 s");
        assert_eq!(rate(1.234e9), "1.23 GB/s");
        assert_eq!(rate(61e6), "61.0 MB/s");
        assert_eq!(size(5 << 20), "5.0 MiB");
        assert_eq!(size(3 << 30), "3.0 GiB");
        assert_eq!(size(12 << 10), "12.0 KiB");
    }
}

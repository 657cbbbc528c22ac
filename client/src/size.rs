//! Sizes as people write them: `512M`, `2G`, `1.5GiB`, `64kb` or a plain byte count, in binary
//! units whatever the spelling. One parser for the CLI's flags and the relay's policy file.

/// Parses a size into bytes, or says how to write one.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let not_a_size = || format!("`{s}` is not a size: write one such as 512M or 2G");
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches('B') {
        "" => 0,
        "K" | "KI" => 10,
        "M" | "MI" => 20,
        "G" | "GI" => 30,
        "T" | "TI" => 40,
        _ => return Err(not_a_size()),
    };
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite())
        .ok_or_else(not_a_size)?;
    Ok((value * (1u64 << shift) as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_units_in_any_spelling() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64kb"), Ok(64 << 10));
        for bad in ["12X", "M", "", "1e400G", "-1G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}

//! Human duration parsing for CLI flags (`150us`, `200ms`, `1.5s`, `2m`, `1h`, bare seconds), shared
//! by every command so every time flag reads the same way.

use std::time::Duration;

/// Parse a duration: a non-negative decimal number followed by `ns`, `us`, `ms`, `s`, `m` or
/// `h`; a bare number means seconds. Errors say what was expected.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text.is_empty() {
        return Err("empty duration: expected e.g. 200ms, 1.5s, 2m".to_owned());
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit = unit.trim();
    let nanos_per_unit: f64 = match unit {
        "" | "s" => 1e9,
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "m" => 60e9,
        "h" => 3600e9,
        other => {
            return Err(format!(
                "invalid duration {s:?}: unknown unit {other:?} (expected ns, us, ms, s, m or h)"
            ));
        }
    };
    if number.is_empty() {
        return Err(format!(
            "invalid duration {s:?}: expected a number before the unit, e.g. 200ms"
        ));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: {number:?} is not a number"))?;
    let nanos = value * nanos_per_unit;
    // Cap at about 292 years (u64 nanoseconds) so a typo cannot overflow.
    if !nanos.is_finite() || nanos > u64::MAX as f64 {
        return Err(format!("invalid duration {s:?}: too large"));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

/// Parse a rate: a fraction in `[0, 1]` (`0.1`) or a percentage (`10%`).
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let text = s.trim();
    let (number, scale) = match text.strip_suffix('%') {
        Some(n) => (n.trim(), 100.0),
        None => (text, 1.0),
    };
    let value: f64 = number.parse().map_err(|_| {
        format!("invalid rate {s:?}: expected a fraction like 0.1 or a percentage like 10%")
    })?;
    let rate = value / scale;
    if !(0.0..=1.0).contains(&rate) {
        return Err(format!(
            "invalid rate {s:?}: must be between 0 and 1 (0% and 100%)"
        ));
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("150us"), Ok(Duration::from_micros(150)));
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("10ns"), Ok(Duration::from_nanos(10)));
        assert_eq!(parse_duration(" 5 ms "), Ok(Duration::from_millis(5)));
    }

    #[test]
    fn rejects_bad_input_with_clear_text() {
        let e = parse_duration("").expect_err("empty");
        assert!(e.contains("empty"), "{e}");
        let e = parse_duration("10x").expect_err("unit");
        assert!(e.contains("unknown unit \"x\""), "{e}");
        let e = parse_duration("ms").expect_err("no number");
        assert!(e.contains("expected a number"), "{e}");
        let e = parse_duration("1.2.3s").expect_err("bad number");
        assert!(e.contains("not a number"), "{e}");
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("1e400h").is_err());
    }

    #[test]
    fn parses_rates() {
        assert_eq!(parse_rate("0.1"), Ok(0.1));
        assert_eq!(parse_rate("10%"), Ok(0.1));
        assert_eq!(parse_rate("0"), Ok(0.0));
        assert_eq!(parse_rate("100%"), Ok(1.0));
        assert!(parse_rate("1.5").is_err());
        assert!(parse_rate("abc").is_err());
    }
}

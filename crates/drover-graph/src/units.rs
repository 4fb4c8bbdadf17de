//! Parsing of resource amounts and durations: CPU (`1`, `0.5`, `"500m"`),
//! memory sizes (`1024`, `512Mi`, `100M`) and durations (`30s`, `1h30m`,
//! `500ms`). Every parser is exact: it works on decimal digits, never on
//! floating point, and refuses values that are not whole units.
//!
//! Public so that command-line flags and configuration spell these values
//! exactly as build files do. Errors are messages ready to show.

/// Splits a non-negative decimal (`12`, `0.5`, `1.25`) into an integer
/// mantissa and the number of digits after the point.
fn parse_decimal(text: &str) -> Option<(u128, u32)> {
    let (int, frac) = match text.split_once('.') {
        Some((int, frac)) => (int, frac),
        None => (text, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) || frac.len() > 18 {
        return None;
    }
    let mut mantissa: u128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        mantissa = mantissa.checked_mul(10)?.checked_add(u128::from(b - b'0'))?;
    }
    Some((mantissa, u32::try_from(frac.len()).ok()?))
}

/// `mantissa / 10^scale * unit`, if it is a whole number that fits in u64.
fn scale_exact(mantissa: u128, scale: u32, unit: u128) -> Option<u64> {
    let divisor = 10u128.checked_pow(scale)?;
    let product = mantissa.checked_mul(unit)?;
    if product % divisor != 0 {
        return None;
    }
    u64::try_from(product / divisor).ok()
}

const CPU_HELP: &str = "expected a number of cores (1, 0.5) or millicores (\"500m\")";

/// CPU from a number of cores given as text (`"2"`, `"0.5"`) or millicores
/// (`"500m"`), in millicores.
pub fn parse_cpu_str(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let bad = || format!("invalid cpu {text:?}: {CPU_HELP}");
    if let Some(millis) = trimmed.strip_suffix('m') {
        let (mantissa, scale) = parse_decimal(millis).ok_or_else(bad)?;
        return scale_exact(mantissa, scale, 1)
            .ok_or_else(|| format!("invalid cpu {text:?}: millicores must be a whole number"));
    }
    let (mantissa, scale) = parse_decimal(trimmed).ok_or_else(bad)?;
    scale_exact(mantissa, scale, 1000)
        .ok_or_else(|| format!("invalid cpu {text:?}: not a whole number of millicores"))
}

/// CPU from a YAML/TOML number of cores, given by its source spelling.
pub(crate) fn parse_cpu_number(spelling: &str) -> Result<u64, String> {
    if spelling.trim_start().starts_with('-') {
        return Err(format!("invalid cpu {spelling}: must not be negative"));
    }
    let (mantissa, scale) = parse_decimal(spelling.trim().trim_start_matches('+'))
        .ok_or_else(|| format!("invalid cpu {spelling}: {CPU_HELP}"))?;
    scale_exact(mantissa, scale, 1000)
        .ok_or_else(|| format!("invalid cpu {spelling}: not a whole number of millicores"))
}

const SIZE_HELP: &str = "expected a size like 1024, 512Mi, 1Gi, 100M or 2G";

/// A size in bytes: a number with an optional binary (`Ki`, `Mi`, `Gi`, `Ti`,
/// `Pi`: powers of 1024) or decimal (`K`/`k`, `M`, `G`, `T`, `P`: powers of
/// 1000) suffix, optionally followed by `B`. `1.5Gi` is allowed when it is a
/// whole number of bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let bad = || format!("invalid size {text:?}: {SIZE_HELP}");
    if trimmed.starts_with('-') {
        return Err(format!("invalid size {text:?}: must be a non-negative number of bytes"));
    }
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let suffix = suffix.trim_start();
    let suffix = suffix.strip_suffix('B').unwrap_or(suffix);
    let unit: u128 = match suffix {
        "" => 1,
        "K" | "k" => 1000,
        "M" => 1000u128.pow(2),
        "G" => 1000u128.pow(3),
        "T" => 1000u128.pow(4),
        "P" => 1000u128.pow(5),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return Err(bad()),
    };
    let (mantissa, scale) = parse_decimal(number).ok_or_else(bad)?;
    scale_exact(mantissa, scale, unit)
        .ok_or_else(|| format!("invalid size {text:?}: not a whole number of bytes or too large"))
}

const DURATION_HELP: &str = "expected a duration like 500ms, 30s, 10m, 1h or 1h30m";

/// A duration in milliseconds: one or more `<number><unit>` parts with units
/// `ms`, `s`, `m`, `h`, `d` (`1h30m`, `1.5s`), or their words (`10 minutes`,
/// `1 hour 30 min`, `5sec`), with or without spaces. Must be above zero.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let bad = || format!("invalid timeout {text:?}: {DURATION_HELP}");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let split = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(split);
        if number.is_empty() {
            return Err(bad());
        }
        let after = after.trim_start();
        let unit_len = after.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let millis: u128 = match unit.to_ascii_lowercase().as_str() {
            "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 1,
            "s" | "sec" | "secs" | "second" | "seconds" => 1000,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000,
            "d" | "day" | "days" => 86_400_000,
            "" => return Err(format!("invalid timeout {text:?}: missing unit ({DURATION_HELP})")),
            _ => return Err(format!("invalid timeout {text:?}: unknown unit {unit:?} ({DURATION_HELP})")),
        };
        let (mantissa, scale) = parse_decimal(number).ok_or_else(bad)?;
        let part = scale_exact(mantissa, scale, millis)
            .ok_or_else(|| format!("invalid timeout {text:?}: not a whole number of milliseconds"))?;
        total = total.checked_add(part).ok_or_else(|| format!("invalid timeout {text:?}: too large"))?;
        rest = after.trim_start();
    }
    if total == 0 {
        return Err(format!("invalid timeout {text:?}: must be greater than zero"));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu() {
        assert_eq!(parse_cpu_str("500m"), Ok(500));
        assert_eq!(parse_cpu_str("2"), Ok(2000));
        assert_eq!(parse_cpu_str("0.25"), Ok(250));
        assert_eq!(parse_cpu_number("1"), Ok(1000));
        assert_eq!(parse_cpu_number("0.5"), Ok(500));
        assert_eq!(parse_cpu_number("1.0"), Ok(1000));
        assert!(parse_cpu_number("-1").is_err());
        assert!(parse_cpu_number("0.0001").is_err());
        assert!(parse_cpu_str("1.5m").is_err());
        assert!(parse_cpu_str("lots").is_err());
        assert!(parse_cpu_str("").is_err());
        assert!(parse_cpu_str("m").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_size("100M"), Ok(100_000_000));
        assert_eq!(parse_size("2G"), Ok(2_000_000_000));
        assert_eq!(parse_size("4k"), Ok(4000));
        assert_eq!(parse_size("1Ti"), Ok(1 << 40));
        assert_eq!(parse_size("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("10 MB"), Ok(10_000_000));
        assert_eq!(parse_size("7B"), Ok(7));
        assert_eq!(
            parse_size("512Mb"),
            Err("invalid size \"512Mb\": expected a size like 1024, 512Mi, 1Gi, 100M or 2G".into())
        );
        assert!(parse_size("Mi").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("0.5").is_err());
        assert!(parse_size("99999999999Pi").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("30s"), Ok(30_000));
        assert_eq!(parse_duration("10m"), Ok(600_000));
        assert_eq!(parse_duration("1h"), Ok(3_600_000));
        assert_eq!(parse_duration("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration("1h 30m 5s"), Ok(5_405_000));
        assert_eq!(parse_duration("1.5s"), Ok(1500));
        assert_eq!(parse_duration("1d"), Ok(86_400_000));
        assert!(parse_duration("30").unwrap_err().contains("missing unit"));
        assert!(parse_duration("0s").unwrap_err().contains("greater than zero"));
        assert!(parse_duration("10x").unwrap_err().contains("unknown unit \"x\""));
        assert_eq!(parse_duration("10 minutes"), Ok(600_000));
        assert_eq!(parse_duration("1 hour 30 min"), Ok(5_400_000));
        assert_eq!(parse_duration("5sec"), Ok(5000));
        assert_eq!(parse_duration("2 Days"), Ok(172_800_000));
        assert_eq!(parse_duration("250 ms"), Ok(250));
        assert!(parse_duration("10 fortnights").unwrap_err().contains("unknown unit \"fortnights\""));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("0.0001s").is_err());
    }
}

//! Parsing of command-line and config values: sizes, CPU and durations (the
//! build file's own parsers, so both spell them alike) and `K=V,...` lists.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};

/// `512Mi`, `10G`, `1048576`: bytes.
pub(crate) fn size(what: &str, text: &str) -> anyhow::Result<u64> {
    drover_graph::units::parse_size(text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("bad {what} {text:?}"))
}

/// `16Mi` or `off`: an optional limit in bytes (at least 1 KiB).
pub(crate) fn limit(what: &str, text: &str) -> anyhow::Result<Option<u64>> {
    if text.trim().eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    match size(what, text)? {
        bytes if bytes < 1024 => bail!("bad {what} {text:?}: at least 1Ki, or \"off\""),
        bytes => Ok(Some(bytes)),
    }
}

/// `2%` (of the filesystem), `5Gi`, or `0` (none): room a cache keeps free.
pub(crate) fn reserve(what: &str, text: &str) -> anyhow::Result<drover_cas::Reserve> {
    let reserve = match text.trim().strip_suffix('%') {
        Some(percent) => match percent.trim().parse::<u8>() {
            Ok(0) => drover_cas::Reserve::Nothing,
            Ok(p) if p <= 100 => drover_cas::Reserve::Percent(p),
            _ => bail!("bad {what} {text:?}: a share is a whole percentage from 0% to 100%"),
        },
        None => match size(what, text)? {
            0 => drover_cas::Reserve::Nothing,
            bytes => drover_cas::Reserve::Bytes(bytes),
        },
    };
    Ok(reserve)
}

/// `2`, `0.5`, `500m`: millicores, for `what` (a flag or a setting).
pub(crate) fn cpu(what: &str, text: &str) -> anyhow::Result<u64> {
    drover_graph::units::parse_cpu_str(text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("bad {what} {text:?}"))
}

/// `30s`, `1h30m`, `500ms`.
pub(crate) fn duration(what: &str, text: &str) -> anyhow::Result<Duration> {
    drover_graph::units::parse_duration(text)
        .map(Duration::from_millis)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("bad {what} {text:?}"))
}

/// A duration that may also be zero (`0`, `0s`, `0ms`): a wait that can be
/// turned off.
pub(crate) fn wait(what: &str, text: &str) -> anyhow::Result<Duration> {
    let digits = text.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &text.trim()[digits.len()..];
    if !digits.is_empty() && digits.chars().all(|c| c == '0') && ["", "ms", "s", "m", "h"].contains(&unit) {
        return Ok(Duration::ZERO);
    }
    duration(what, text)
}

/// `a=1,b=2` (empty: none). Keys are unique.
pub(crate) fn pairs(what: &str, text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            bail!("bad {what} {item:?}: expected KEY=VALUE");
        };
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() {
            bail!("bad {what} {item:?}: the key is empty");
        }
        if map.insert(key.to_owned(), value.to_owned()).is_some() {
            bail!("bad {what}: {key:?} is given twice");
        }
    }
    Ok(map)
}

/// `network=2,gpu=1`: named token amounts.
pub(crate) fn tokens(text: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    pairs("--tokens", text)?
        .into_iter()
        .map(|(k, v)| {
            let n = v.parse().with_context(|| format!("bad --tokens: {k}={v} is not a whole number"))?;
            Ok((k, n))
        })
        .collect()
}

/// The machine's CPUs.
pub(crate) fn cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// The machine's memory, from /proc/meminfo (0 if unknown).
pub(crate) fn memory() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else { return 0 };
    text.lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// A size for people to read: `25276510208` is `23.5 GiB`.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    // Rounded as it will be printed, so that 1,048,575 bytes is 1 MiB, not
    // 1024 KiB.
    let shown = |v: f64| if v >= 100.0 { v.round() } else { (v * 10.0).round() / 10.0 };
    while shown(value) >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let value = shown(value);
    if value >= 100.0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_are_a_share_or_a_size() {
        use drover_cas::Reserve;
        assert_eq!(reserve("r", "2%").expect("valid"), Reserve::Percent(2));
        assert_eq!(reserve("r", "1Gi").expect("valid"), Reserve::Bytes(1 << 30));
        assert_eq!(
            reserve("r", crate::cli::DEFAULT_KEEP_FREE).expect("valid"),
            drover_cas::DEFAULT_KEEP_FREE,
            "the flag's default is the library's"
        );
        assert_eq!(reserve("r", "5Gi").expect("valid"), Reserve::Bytes(5 << 30));
        assert_eq!(reserve("r", "0").expect("valid"), Reserve::Nothing);
        assert_eq!(reserve("r", "0%").expect("valid"), Reserve::Nothing);
        for bad in ["101%", "1.5%", "-1%", "lots"] {
            assert!(reserve("--cache-keep-free", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn waits_may_be_zero() {
        for zero in ["0", "0s", "00ms", " 0m "] {
            assert_eq!(wait("w", zero).expect("valid"), Duration::ZERO, "{zero}");
        }
        assert_eq!(wait("w", "5m").expect("valid"), Duration::from_secs(300));
        assert!(duration("d", "0s").is_err(), "other durations may not");
        for bad in ["0x", "", "0 s", "-1s"] {
            assert!(wait("w", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn limits_are_sizes_or_off() {
        assert_eq!(
            limit("l", crate::cli::DEFAULT_LOG_LIMIT).expect("valid"),
            Some(drover_worker::DEFAULT_LOG_LIMIT),
            "the flag's default is the library's"
        );
        assert_eq!(limit("l", "1Ki").expect("valid"), Some(1024));
        assert_eq!(limit("l", "OFF").expect("valid"), None);
        for bad in ["0", "1000", "lots", "-1Mi"] {
            assert!(limit("--log-limit", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(512 << 20), "512 MiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(25_276_510_208), "23.5 GiB");
        assert_eq!(bytes(3 << 50), "3 PiB");
        assert_eq!(bytes(1_048_575), "1 MiB", "rounded before the unit is chosen");
        assert_eq!(bytes(102_348), "99.9 KiB");
        assert_eq!(bytes(102_390), "100 KiB");
    }

    #[test]
    fn pairs_parse_and_reject_garbage() {
        let map = pairs("--labels", "os=linux, pool=big").expect("valid");
        assert_eq!(map.get("os").map(String::as_str), Some("linux"));
        assert_eq!(map.len(), 2);
        assert!(pairs("--labels", "").expect("empty").is_empty());
        assert!(pairs("--labels", "os").is_err());
        assert!(pairs("--labels", "os=a,os=b").is_err());
        assert!(tokens("gpu=x").is_err());
        assert_eq!(tokens("gpu=2").expect("valid").get("gpu"), Some(&2));
    }
}

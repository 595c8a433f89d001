//! Time formatting and parsing for the CLI. Calendar dates come from `jiff`; durations are the
//! CLI's own small syntax (`90s`, `10m`, `2h`, `7d`).

pub(crate) use relay_protocol::now_ms;

/// `YYYY-MM-DD HH:MM:SS` in UTC for a Unix-ms timestamp; past the year 9999 (only a client's
/// made-up `ts` gets there), the milliseconds themselves.
pub(crate) fn format_utc(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || format!("{ms} ms"),
            |t| t.strftime("%Y-%m-%d %H:%M:%S").to_string(),
        )
}

/// Parses a duration such as `90s`, `10m`, `2h`, `7d`, in milliseconds (the workspace's one
/// reading of them, [`relay_protocol::clock::parse_duration_ms`]).
pub(crate) use relay_protocol::clock::parse_duration_ms;

/// A length of time in seconds for options such as `--inbox-ttl`: a plain number is seconds
/// (`3600`), or a duration with its unit as `--since` takes it (`90s`, `10m`, `1h`, `7d`), in
/// whole seconds.
pub(crate) fn parse_secs(s: &str) -> Result<u64, String> {
    if let Ok(n) = s.trim().parse::<u64>() {
        return Ok(n);
    }
    match parse_duration_ms(s) {
        Some(ms) if ms % 1000 == 0 => Ok(ms / 1000),
        Some(_) => Err(format!("{s:?} is not a whole number of seconds")),
        None => Err(format!(
            "cannot read {s:?} as a length of time: use seconds (3600) or a duration such as 90s, 10m, 1h, 7d"
        )),
    }
}

/// A length of time in milliseconds for options such as `--heartbeat-ms`: a plain number is
/// milliseconds (`5000`), or a duration with its unit (`500ms`, `5s`, `1m`).
pub(crate) fn parse_ms(s: &str) -> Result<u64, String> {
    if let Ok(n) = s.trim().parse::<u64>() {
        return Ok(n);
    }
    parse_duration_ms(s).ok_or_else(|| {
        format!(
            "cannot read {s:?} as a length of time: use milliseconds (5000) or a duration such as 500ms, 5s, 1m"
        )
    })
}

/// `--since` values: a duration ago (`10m`) or a Unix-ms timestamp.
pub(crate) fn parse_since(s: &str) -> Result<u64, String> {
    if let Some(d) = parse_duration_ms(s) {
        return Ok(now_ms().saturating_sub(d));
    }
    s.parse::<u64>().map_err(|_| {
        format!("cannot read {s:?} as a time: use a duration ago such as 90s, 10m, 2h, 7d, or Unix milliseconds")
    })
}

/// `5m 3s` style for uptimes.
pub(crate) fn human_secs(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m {}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h {}m", s / 3600, (s / 60) % 60),
        s => format!("{}d {}h", s / 86_400, (s / 3600) % 24),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00");
        assert_eq!(format_utc(1_795_000_000_000), "2026-11-18 11:06:40");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(format_utc(u64::MAX), "18446744073709551615 ms");
        assert_eq!(parse_duration_ms("10m"), Some(600_000));
        assert_eq!(parse_duration_ms("2h"), Some(7_200_000));
        assert_eq!(parse_duration_ms("x"), None);
        assert_eq!(parse_duration_ms("5y"), None);
        assert!(parse_since("yesterday").is_err());
        assert_eq!(parse_since("123").unwrap(), 123);
        assert_eq!(human_secs(303), "5m 3s");
        assert_eq!(parse_secs("1h"), Ok(3600));
        assert_eq!(parse_secs("3600"), Ok(3600));
        assert!(parse_secs("1500ms").is_err() && parse_secs("1y").is_err());
        assert_eq!(parse_ms("5s"), Ok(5000));
        assert_eq!(parse_ms("250"), Ok(250));
    }
}

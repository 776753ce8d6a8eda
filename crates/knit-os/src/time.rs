//! The clock and the text forms of a time knit writes: RFC 3339 in UTC
//! (Kubernetes' `metav1.Time`, logs, ECS's `x-acs-date`) and RFC 2822
//! (cloud-init's messages) through the `time` crate, and HTTP dates
//! (`Last-Modified`) through `httpdate`.

use crate::error::{OsError, Result};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use time::format_description::well_known::{Rfc2822, Rfc3339};
pub use time::OffsetDateTime;

/// Milliseconds since the epoch (0 for a clock set before 1970).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Whole seconds since the epoch (0 for a clock set before 1970).
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `t` as `YYYY-MM-DDTHH:MM:SSZ`: UTC, whole seconds (Kubernetes' `Time`).
pub fn rfc3339(t: OffsetDateTime) -> String {
    let t = t
        .to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .unwrap_or(t);
    // Formatting a UTC time with a four-digit year cannot fail.
    t.format(&Rfc3339).unwrap_or_default()
}

/// `t` as `Tue, 01 Dec 2026 01:23:21 +0000`: RFC 2822 in UTC, whole
/// seconds (as cloud-init prints times). RFC 2822 has no year before 1900:
/// such a time is written as the empty string.
pub fn rfc2822(t: OffsetDateTime) -> String {
    let t = t
        .to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .unwrap_or(t);
    t.format(&Rfc2822).unwrap_or_default()
}

/// Milliseconds since the epoch as [`rfc3339`] (whole seconds).
pub fn rfc3339_ms(ms: i64) -> String {
    rfc3339(from_ms(ms))
}

/// Milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (logs).
pub fn rfc3339_millis(ms: i64) -> String {
    let whole = rfc3339_ms(ms);
    let stem = whole.strip_suffix('Z').unwrap_or(&whole);
    format!("{stem}.{:03}Z", ms.rem_euclid(1000))
}

/// An RFC 3339 time (any offset, any fraction).
pub fn parse_rfc3339(text: &str) -> Result<OffsetDateTime> {
    OffsetDateTime::parse(text, &Rfc3339).map_err(|_| OsError::Time {
        value: text.to_string(),
        rule: "must be an RFC 3339 time (2006-01-02T15:04:05Z)",
    })
}

/// Milliseconds since the epoch of `t`.
pub fn unix_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// The time `ms` milliseconds after the epoch (clamped to the years the
/// formats can write).
pub fn from_ms(ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Seconds since the epoch as an HTTP date (`Wed, 02 Dec 2026 08:12:09 GMT`).
pub fn http_date(secs: u64) -> String {
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs))
}

/// An HTTP date (IMF-fixdate, or the obsolete RFC 850 and asctime forms a
/// recipient must also take) as seconds since the epoch.
pub fn parse_http_date(text: &str) -> Result<u64> {
    httpdate::parse_http_date(text)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .ok_or_else(|| OsError::Time {
            value: text.to_string(),
            rule: "must be an HTTP date (Wed, 02 Dec 2026 08:12:09 GMT)",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_in_whole_seconds_and_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_ms(1_796_199_129_999), "2026-12-02T08:12:09Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(
            rfc3339_millis(1_796_199_129_042),
            "2026-12-02T08:12:09.042Z"
        );
        for ms in [
            0,
            68_169_599_000,
            951_782_400_000,
            1_796_199_129_000,
            4_102_444_800_000,
        ] {
            assert_eq!(unix_ms(parse_rfc3339(&rfc3339_ms(ms)).unwrap()), ms);
        }
        let ms = 1_796_199_129_042;
        assert_eq!(unix_ms(parse_rfc3339(&rfc3339_millis(ms)).unwrap()), ms);
        // Another offset is read, and written back in UTC.
        let t = parse_rfc3339("2026-12-02T10:12:09+02:00").unwrap();
        assert_eq!(rfc3339(t), "2026-12-02T08:12:09Z");
        let now = now_ms();
        assert!(now > 1_700_000_000_000);
        assert_eq!(
            unix_ms(parse_rfc3339(&rfc3339_ms(now)).unwrap()),
            now - now % 1000
        );
    }

    #[test]
    fn a_time_that_is_not_rfc3339_is_an_error_naming_it() {
        for bad in [
            "",
            "2026-12-02",
            "2026-12-02T08:12Z",
            "yesterday",
            "2026-13-02T08:12:09Z",
        ] {
            let err = parse_rfc3339(bad).unwrap_err();
            assert_eq!(err.code(), "TimeInvalid");
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn rfc2822_is_utc_in_whole_seconds_and_reads_back() {
        assert_eq!(rfc2822(from_ms(0)), "Thu, 01 Jan 1970 00:00:00 +0000");
        assert_eq!(
            rfc2822(from_ms(1_796_088_201_999)),
            "Tue, 01 Dec 2026 01:23:21 +0000"
        );
        assert_eq!(
            rfc2822(from_ms(951_782_400_000)),
            "Tue, 29 Feb 2000 00:00:00 +0000"
        );
        let t = parse_rfc3339("2026-12-01T03:23:21+02:00").unwrap();
        assert_eq!(rfc2822(t), "Tue, 01 Dec 2026 01:23:21 +0000");
        for ms in [0, 68_169_599_000, 951_782_400_000, 4_102_444_800_000] {
            let back = OffsetDateTime::parse(&rfc2822(from_ms(ms)), &Rfc2822).unwrap();
            assert_eq!(unix_ms(back), ms);
        }
        // 1800-01-01: before RFC 2822's years.
        assert_eq!(rfc2822(from_ms(-5_364_662_400_000)), "");
    }

    #[test]
    fn http_dates_round_trip() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(1_796_199_129), "Wed, 02 Dec 2026 08:12:09 GMT");
        for secs in [0, 68_169_599, 951_782_400, 1_796_199_129, 4_102_444_800] {
            assert_eq!(parse_http_date(&http_date(secs)).unwrap(), secs);
        }
        assert_eq!(
            parse_http_date("Wednesday, 02-Dec-26 08:12:09 GMT").unwrap(),
            1_796_199_129
        );
        assert_eq!(
            parse_http_date("Wed, 02 Dec 2026 08:12:09 PST")
                .unwrap_err()
                .code(),
            "TimeInvalid"
        );
    }
}

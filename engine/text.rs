//! Text for people: how times are written (one style everywhere: progress lines, `status`,
//! `runs`, messages about timeouts and retries), and what may reach a terminal (what an
//! agent or a program wrote is shown, never obeyed).

use std::time::Duration;

/// Shows a duration shortly, with the two largest units that matter: `850ms`, `12.3s`,
/// `4m 05s`, `2h 03m`, `3d 04h`. Each is truncated, never rounded up (59.96 s is `59.9s`,
/// not `60.0s`), so a value never reads as the next unit.
pub fn duration(d: Duration) -> String {
    const MINUTE: u64 = 60;
    const HOUR: u64 = 60 * MINUTE;
    const DAY: u64 = 24 * HOUR;
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    if s < MINUTE {
        return format!("{s}.{}s", d.subsec_millis() / 100);
    }
    if s < HOUR {
        return format!("{}m {:02}s", s / MINUTE, s % MINUTE);
    }
    if s < DAY {
        return format!("{}h {:02}m", s / HOUR, s % HOUR / MINUTE);
    }
    format!("{}d {:02}h", s / DAY, s % DAY / HOUR)
}

/// [`duration`] of a number of milliseconds, as the store keeps them (a negative span, from
/// a clock that went back, shows as `0ms`).
pub fn duration_ms(ms: i64) -> String {
    duration(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// A text safe to print on a terminal or in a log: control characters (ESC, BEL, a
/// carriage return that would overwrite the line, C1 controls...) are shown escaped
/// (`\u{1b}`), so that nothing an agent or a program wrote can move the cursor, set the
/// title or hide text. Newlines and tabs stay.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The end of a text of which `cut` bytes before `bytes` are already gone, in at most
/// `max` bytes, with a marker that says how many bytes in all were cut.
pub fn text_of(bytes: &[u8], cut: u64, max: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.len() <= max && cut == 0 {
        return s.into_owned();
    }
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!(
        "[... {} bytes cut ...]\n{}",
        cut + start as u64,
        &s[start..]
    )
}

/// The end of a text, at most `max` bytes, saying how many were cut.
pub fn tail(s: &str, max: usize) -> String {
    text_of(s.as_bytes(), 0, max)
}

/// Shows a number of bytes shortly, in binary units as `du -h` counts them: `512 B`,
/// `1.5 KiB`, `3.2 MiB`, `1.0 GiB`. Truncated to a tenth, never rounded up.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut unit = 0;
    let mut whole = n / 1024;
    let mut rest = n % 1024;
    while whole >= 1024 && unit + 1 < UNITS.len() {
        rest = whole % 1024;
        whole /= 1024;
        unit += 1;
    }
    format!("{whole}.{} {}", rest * 10 / 1024, UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::{duration, duration_ms};
    use std::time::Duration;

    fn ms(n: u64) -> String {
        duration(Duration::from_millis(n))
    }

    #[test]
    fn below_a_second_in_milliseconds() {
        assert_eq!(ms(0), "0ms");
        assert_eq!(ms(850), "850ms");
        assert_eq!(ms(999), "999ms");
        assert_eq!(duration(Duration::from_micros(999_999)), "999ms");
    }

    #[test]
    fn below_a_minute_in_tenths_of_seconds() {
        assert_eq!(ms(1000), "1.0s");
        assert_eq!(ms(12_345), "12.3s");
        assert_eq!(ms(59_960), "59.9s");
    }

    #[test]
    fn longer_in_two_units_the_second_padded() {
        assert_eq!(ms(60_000), "1m 00s");
        assert_eq!(ms(72_000), "1m 12s");
        assert_eq!(ms(245_000), "4m 05s");
        assert_eq!(ms(3_599_999), "59m 59s");
        assert_eq!(ms(3_600_000), "1h 00m");
        assert_eq!(ms(7_380_000), "2h 03m");
        assert_eq!(ms(86_399_999), "23h 59m");
        assert_eq!(ms(86_400_000), "1d 00h");
        assert_eq!(ms(3 * 86_400_000 + 4 * 3_600_000 + 59_000), "3d 04h");
    }

    #[test]
    fn extremes_do_not_overflow() {
        assert_eq!(
            duration(Duration::MAX),
            format!("{}d {:02}h", u64::MAX / 86_400, u64::MAX % 86_400 / 3600)
        );
        assert_eq!(duration_ms(i64::MAX), "106751991167d 07h");
        assert_eq!(duration_ms(-5), "0ms");
        assert_eq!(duration_ms(72_000), "1m 12s");
    }

    #[test]
    fn bytes_in_binary_units_truncated() {
        use super::bytes;
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(1024 * 1024 - 1), "1023.9 KiB");
        assert_eq!(bytes(3 * 1024 * 1024 + 300 * 1024), "3.2 MiB");
        assert_eq!(bytes(u64::MAX), "16383.9 PiB");
    }
}

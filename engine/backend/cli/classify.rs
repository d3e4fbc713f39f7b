//! Classifying a CLI agent's failure from what it printed: a rate limit, missing
//! authentication, a transient failure or a permanent one; and the waits messages spell out.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use regex::Regex;

use super::output::output_tail;
use crate::backend::CallError;
use crate::backend::process::ProcOutput;

/// Rate limits and quotas.
static RATE_LIMITED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)rate[ _-]?limit|usage limit|hit your limit|\b429\b|too many requests|quota|resource_exhausted|exhausted your capacity",
    )
    .expect("the rate-limit pattern is valid")
});

/// Authentication: the backend is not usable as set up.
pub(super) static UNAUTHENTICATED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)invalid api key|please run /login|not logged in|authentication_error|\b401\b|unauthorized|api key not valid|api_key_invalid")
        .expect("the authentication pattern is valid")
});

/// Failures worth retrying: overload, server errors, dropped connections.
static TRANSIENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)overloaded|\b5\d\d\b|api error|internal server error|service unavailable|stream disconnected|connection|network|timed? ?out|econnreset|fetch failed|high demand|temporary errors",
    )
    .expect("the transient pattern is valid")
});

/// An output schema the agent refuses: claude's validator ("--json-schema is not a valid
/// JSON Schema: ...", "--json-schema must be a JSON object"), OpenAI's strict mode through
/// codex (400 `invalid_json_schema`, "Invalid schema for response_format ..."). No retry can
/// fix it.
static SCHEMA_REFUSED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"invalid_json_schema|Invalid schema for response_format")
        .expect("the schema-refusal pattern is valid")
});

/// What to do about a refused schema.
const SCHEMA_REFUSED_HELP: &str = "the agent refused the stage's output schema, which no \
    retry can fix: change the schema (`ralph-flow check` says what each agent accepts), or set \
    `structured_output = \"prompt\"` on the agent to send the schema in the prompt";

/// The refusal of an output schema in an error message the agent reported (codex's
/// `error` and `turn.failed` events carry the service's body), if that is what it is.
pub(super) fn schema_refused(message: &str) -> Option<CallError> {
    SCHEMA_REFUSED.is_match(message).then(|| refused(message))
}

/// A refused output schema, with what to do about it.
pub(super) fn refused(message: &str) -> CallError {
    CallError::Refused {
        message: format!("{message} ({SCHEMA_REFUSED_HELP})"),
    }
}

/// Classifies an error message: a refused schema, a rate limit, missing authentication, a
/// transient failure; else what `otherwise` says.
pub(super) fn classify(
    message: &str,
    retry_after: Option<Duration>,
    otherwise: impl FnOnce() -> CallError,
) -> CallError {
    if let Some(refused) = schema_refused(message) {
        refused
    } else if RATE_LIMITED.is_match(message) {
        CallError::RateLimited {
            message: message.to_string(),
            retry_after,
        }
    } else if UNAUTHENTICATED.is_match(message) {
        CallError::Missing {
            message: message.to_string(),
        }
    } else if TRANSIENT.is_match(message) && !CLIENT_ERROR.is_match(message) {
        CallError::Transient {
            message: message.to_string(),
            retry_after,
        }
    } else {
        otherwise()
    }
}

/// Refusals of the invocation itself that no retry can fix: codex outside a git repository
/// without `--skip-git-repo-check`, gemini in an untrusted directory, claude's
/// `bypassPermissions` as root without `IS_SANDBOX=1`.
static PERMANENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)not inside a trusted directory|not running in a trusted directory|cannot be used with root/sudo privileges|unexpected argument|unknown option|unknown arguments?:",
    )
    .expect("the permanent pattern is valid")
});

/// The same error with another message.
pub(super) fn relabel(error: CallError, message: String) -> CallError {
    match error {
        CallError::RateLimited { retry_after, .. } => CallError::RateLimited {
            message,
            retry_after,
        },
        CallError::Transient { retry_after, .. } => CallError::Transient {
            message,
            retry_after,
        },
        CallError::Missing { .. } => CallError::Missing { message },
        CallError::Refused { .. } => CallError::Refused { message },
        CallError::Failed { .. } => CallError::Failed { message },
        CallError::Limit { limit, .. } => CallError::Limit { limit, message },
        timeout @ CallError::Timeout { .. } => timeout,
    }
}

/// An HTTP client error other than a timeout or a rate limit: retrying will not fix it.
static CLIENT_ERROR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b4(0[0-79]|[1-9]\d)\b").expect("the client-error pattern is valid")
});

/// The error of an agent that printed no result: classified from its output when it
/// failed, else an unexpected output.
pub(super) fn no_result(agent: &str, out: &ProcOutput, output: &str) -> CallError {
    if out.code == Some(0) {
        let tail = output_tail(out);
        return CallError::Failed {
            message: format!("{agent} printed no result (expected its JSON output): {tail}"),
        };
    }
    let message = ended(agent, out);
    if PERMANENT.is_match(output) {
        CallError::Failed { message }
    } else if RATE_LIMITED.is_match(output) {
        CallError::RateLimited {
            message,
            retry_after: retry_after(output),
        }
    } else if UNAUTHENTICATED.is_match(output) {
        CallError::Missing { message }
    } else {
        CallError::Transient {
            message,
            retry_after: None,
        }
    }
}

/// How a program that printed no result ended, with the last lines of its output:
/// "claude exited with code 1: ...".
pub(super) fn ended(agent: &str, out: &ProcOutput) -> String {
    let ending = match (out.code, out.signal) {
        (_, Some(signal)) => format!("{agent} was killed by signal {signal}"),
        (code, None) => format!("{agent} exited with code {}", code.unwrap_or(-1)),
    };
    format!("{ending}: {}", output_tail(out))
}

/// The wait until the reset time in "Claude AI usage limit reached|<epoch seconds>", or
/// one spelled out in the message ("try again in 5 minutes").
pub(super) fn retry_after(message: &str) -> Option<Duration> {
    static RESET: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)limit reached\|(\d{9,})").expect("the reset pattern is valid")
    });
    if let Some(epoch) = RESET
        .captures(message)
        .and_then(|c| c[1].parse::<u64>().ok())
    {
        return Some(Duration::from_secs(epoch.saturating_sub(unix_now())));
    }
    retry_hint(message)
}

/// A wait spelled out in a message: "retry in 17.5s", "try again in 5 minutes", "retry
/// after 30 seconds".
pub(super) fn retry_hint(message: &str) -> Option<Duration> {
    static HINT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?i)(?:retry|try again)\s+(?:after|in)\s+(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?)\b",
        )
        .expect("the retry pattern is valid")
    });
    let Some(captures) = HINT.captures(message) else {
        return clock_hint(message, unix_now(), *LOCAL_OFFSET);
    };
    let amount: f64 = captures[1].parse().ok()?;
    let unit = captures[2].to_ascii_lowercase();
    let seconds = match unit.as_str() {
        "ms" | "millisecond" | "milliseconds" => amount / 1000.0,
        u if u.starts_with('h') => amount * 3600.0,
        u if u.starts_with('m') => amount * 60.0,
        _ => amount,
    };
    Duration::try_from_secs_f64(seconds).ok()
}

/// The wait until a clock time in a message: codex's "... or try again at 8:35 AM." (its
/// usage limit, in the local time of the machine). The next such time after `now` (Unix
/// seconds), `offset` seconds east of UTC.
pub(super) fn clock_hint(message: &str, now: u64, offset: i64) -> Option<Duration> {
    static CLOCK: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)try again at\b[^.]*?\b(\d{1,2}):(\d{2})\s*([ap]\.?m\.?)?")
            .expect("the clock pattern is valid")
    });
    let captures = CLOCK.captures(message)?;
    let mut hour: i64 = captures[1].parse().ok()?;
    let minute: i64 = captures[2].parse().ok()?;
    if let Some(half) = captures.get(3) {
        let pm = half.as_str().to_ascii_lowercase().starts_with('p');
        hour = hour % 12 + if pm { 12 } else { 0 };
    }
    if hour > 23 || minute > 59 {
        return None;
    }
    let local_now = i64::try_from(now).ok()? + offset;
    let since_midnight = local_now.rem_euclid(86_400);
    let target = hour * 3600 + minute * 60;
    let wait = (target - since_midnight).rem_euclid(86_400);
    Some(Duration::from_secs(u64::try_from(wait).ok()?))
}

/// The local time zone's offset from UTC in seconds (east positive), as `date +%z` says;
/// 0 when it cannot tell.
static LOCAL_OFFSET: LazyLock<i64> = LazyLock::new(|| {
    let out = std::process::Command::new("date")
        .arg("+%z")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let (sign, digits) = match out.as_bytes().first() {
        Some(b'-') => (-1, &out[1..]),
        Some(b'+') => (1, &out[1..]),
        _ => return 0,
    };
    match (digits.get(0..2), digits.get(2..4)) {
        (Some(h), Some(m)) => match (h.parse::<i64>(), m.parse::<i64>()) {
            (Ok(h), Ok(m)) => sign * (h * 3600 + m * 60),
            _ => 0,
        },
        _ => 0,
    }
});

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_hints_are_read() {
        assert_eq!(
            retry_hint("Please retry in 17.5s."),
            Some(Duration::from_millis(17_500))
        );
        assert_eq!(
            retry_hint("Try again in 5 minutes"),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            retry_hint("retry after 2 hours"),
            Some(Duration::from_secs(7200))
        );
        assert_eq!(retry_hint("no hint"), None);
    }

    #[test]
    fn errors_are_classified() {
        let failed = || CallError::Failed {
            message: "other".into(),
        };
        assert!(matches!(
            classify("429 Too Many Requests", None, failed),
            CallError::RateLimited { .. }
        ));
        assert!(matches!(
            classify("API Error: 529 overloaded", None, failed),
            CallError::Transient { .. }
        ));
        assert!(matches!(
            classify("API Error: 400 prompt is too long", None, failed),
            CallError::Failed { .. }
        ));
        assert!(matches!(
            classify("Invalid API key · Please run /login", None, failed),
            CallError::Missing { .. }
        ));
        assert!(matches!(
            classify("something else", None, failed),
            CallError::Failed { .. }
        ));
    }
}

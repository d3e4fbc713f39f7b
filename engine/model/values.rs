//! The values of the model that are not tables: counts and durations (literal or templates over
//! params), actions, ids and the words they may not be.

use std::time::Duration;

/// A number written literally or as a template over params.
#[derive(Clone, Debug, PartialEq)]
pub enum Count {
    Literal(u64),
    Template(String),
}

/// A duration written literally (seconds, or a string such as "72h", kept as written so
/// that `explain` can show it the way the file does) or as a template over params.
#[derive(Clone, Debug, PartialEq)]
pub enum Dur {
    Literal(Duration),
    Written(Duration, String),
    Template(String),
}

/// What happens when a route case, a failure, a rejection or a limit is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ends the current iteration of the enclosing loop; the next one starts.
    Continue,
    /// Ends the enclosing loop successfully.
    Break,
    /// Fails the stage (and, outside a loop, the run).
    Fail,
    /// Gate timeouts only: approves.
    Approve,
    /// Gate timeouts only: rejects.
    Reject,
    /// Ends the whole run with a named exit.
    Exit(String),
    /// Runs the named stage next.
    Goto(String),
}

/// The actions written as one word (besides `exit:NAME` and stage ids).
pub const ACTION_WORDS: &[&str] = &["continue", "break", "fail", "approve", "reject"];

impl Action {
    /// Parses an action as written in files.
    pub fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "continue" => Action::Continue,
            "break" => Action::Break,
            "fail" => Action::Fail,
            "approve" => Action::Approve,
            "reject" => Action::Reject,
            _ => match s.strip_prefix("exit:") {
                Some(name) if is_ident(name) => Action::Exit(name.to_string()),
                Some(_) => return None,
                None if is_ident(s) => Action::Goto(s.to_string()),
                None => return None,
            },
        })
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Continue => f.write_str("continue"),
            Action::Break => f.write_str("break"),
            Action::Fail => f.write_str("fail"),
            Action::Approve => f.write_str("approve"),
            Action::Reject => f.write_str("reject"),
            Action::Exit(name) => write!(f, "exit:{name}"),
            Action::Goto(stage) => f.write_str(stage),
        }
    }
}

/// Words that cannot be used as ids, because actions or template names use them.
pub const RESERVED: &[&str] = &[
    "continue",
    "break",
    "fail",
    "approve",
    "reject",
    "exit",
    "params",
    "stages",
    "loops",
    "run",
    "iteration",
    "max_iterations",
    "feedback",
    "history",
    "attempt",
    "output",
    "item",
    "index",
    "loop",
    "true",
    "false",
    "none",
];

/// Tells whether a string is a valid id: a letter or `_`, then letters, digits, `_` or `-`.
pub fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The longest duration a workflow may write (366 days): longer ones are refused by the
/// checker, so that no deadline computed from one can overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 86_400);

/// Parses a duration such as `90`, `90s`, `10m`, `2h`, `1d` or `1h30m`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(secs) = s.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let mut total: u64 = 0;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().ok()?;
        num.clear();
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            return finish_ms(total, n, chars.next().is_none());
        } else {
            match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return None,
            }
        };
        total = total.checked_add(n.checked_mul(unit)?)?;
    }
    if !num.is_empty() {
        return None;
    }
    Some(Duration::from_secs(total))
}

fn finish_ms(total_secs: u64, ms: u64, at_end: bool) -> Option<Duration> {
    at_end.then(|| Duration::from_secs(total_secs) + Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2x"), None);
        assert_eq!(parse_duration("m"), None);
        assert_eq!(parse_duration("5m3"), None);
    }

    #[test]
    fn actions_parse() {
        assert_eq!(
            Action::parse("exit:stuck"),
            Some(Action::Exit("stuck".into()))
        );
        assert_eq!(Action::parse("fix_a"), Some(Action::Goto("fix_a".into())));
        assert_eq!(Action::parse("exit:"), None);
        assert_eq!(Action::parse("a b"), None);
    }
}

//! `claude -p --output-format json`: its result object, its errors and its denials.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use regex::Regex;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use super::classify::{classify, no_result, relabel, retry_hint};
use super::output::{detect_window, json_object};
use crate::backend::de::{Entries, lenient};
use crate::backend::process::ProcOutput;
use crate::backend::{AgentReply, CallError, Usage};

/// An object claude prints: its one object with `--output-format json`, one per line with
/// `stream-json`. Only the result is read.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Message {
    #[serde(rename = "result")]
    Result(Box<Outcome>),
    #[serde(other)]
    Other,
}

/// The result object: the answer, or the error, with the usage of the whole session.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Outcome {
    /// `success`, or `error_max_turns`, `error_during_execution`...
    #[serde(deserialize_with = "lenient")]
    subtype: Option<String>,
    #[serde(deserialize_with = "lenient")]
    is_error: bool,
    /// The final text (or the error's).
    #[serde(deserialize_with = "lenient")]
    result: Option<String>,
    /// The answer validated against `--json-schema`: any JSON.
    structured_output: Option<Value>,
    /// The HTTP status of an API error.
    #[serde(deserialize_with = "lenient")]
    api_error_status: Option<u64>,
    #[serde(deserialize_with = "lenient")]
    total_cost_usd: Option<f64>,
    /// The cost, as older versions name it.
    #[serde(deserialize_with = "lenient")]
    cost_usd: Option<f64>,
    #[serde(deserialize_with = "lenient")]
    session_id: Option<String>,
    #[serde(deserialize_with = "lenient")]
    usage: TokenUsage,
    /// The usage per model, the one that answered first.
    #[serde(rename = "modelUsage", deserialize_with = "lenient")]
    model_usage: Entries<IgnoredAny>,
    #[serde(deserialize_with = "lenient")]
    permission_denials: Vec<Denial>,
}

/// Anthropic's token counts: cache reads and writes apart from `input_tokens`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenUsage {
    #[serde(deserialize_with = "lenient")]
    input_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    output_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    cache_read_input_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    cache_creation_input_tokens: u64,
}

/// A tool use claude denied.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Denial {
    #[serde(deserialize_with = "lenient")]
    tool_name: Option<String>,
    #[serde(deserialize_with = "lenient")]
    tool_input: DeniedInput,
}

/// What a denied tool use was about: the first of these its input holds.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DeniedInput {
    #[serde(deserialize_with = "lenient")]
    file_path: Option<String>,
    #[serde(deserialize_with = "lenient")]
    command: Option<String>,
    #[serde(deserialize_with = "lenient")]
    path: Option<String>,
    #[serde(deserialize_with = "lenient")]
    notebook_path: Option<String>,
    #[serde(deserialize_with = "lenient")]
    url: Option<String>,
    #[serde(deserialize_with = "lenient")]
    pattern: Option<String>,
}

/// Whether stdout holds claude's result object.
pub(super) fn done(stdout: &[u8]) -> bool {
    outcome(&detect_window(stdout)).is_some()
}

/// The result object of `claude -p --output-format json` (or the last one of
/// `stream-json`, should the arguments ask for it).
fn outcome(stdout: &str) -> Option<Outcome> {
    let result = |text: &str| match json_object(text.trim())? {
        Message::Result(outcome) => Some(*outcome),
        Message::Other => None,
    };
    result(stdout).or_else(|| stdout.lines().rev().find_map(result))
}

pub(super) fn parse(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(result) = outcome(&stdout) else {
        let text = format!("{}\n{}", stdout, String::from_utf8_lossy(&out.stderr));
        return Err(no_result("claude", out, &text));
    };
    let text = match &result.structured_output {
        Some(answer) => answer.to_string(),
        None => result.result.clone().unwrap_or_default(),
    };
    let subtype = result.subtype.as_deref().unwrap_or("");
    if result.is_error || subtype.starts_with("error") {
        return Err(error(&result, subtype, &text));
    }
    let usage = &result.usage;
    Ok(AgentReply {
        text,
        usage: Usage {
            // Anthropic counts cache reads and writes apart from `input_tokens`.
            input_tokens: usage
                .input_tokens
                .saturating_add(usage.cache_read_input_tokens)
                .saturating_add(usage.cache_creation_input_tokens),
            output_tokens: usage.output_tokens,
            cached_tokens: usage.cache_read_input_tokens,
            cost_usd: result.total_cost_usd.or(result.cost_usd),
            ..Usage::default()
        },
        model: result.model_usage.0.first().map(|(name, _)| name.clone()),
        denied: denials(&result),
        session_id: result.session_id,
        raw: String::new(),
        ..AgentReply::default()
    })
}

/// The error of a result with `is_error`. An API error keeps `subtype: "success"` and
/// carries the HTTP status in `api_error_status`: 429 is a rate limit (claude prints no
/// reset time: "API Error: Request rejected (429) · ... Please try again later."), 5xx and
/// 529 (overloaded) are transient, 401 and 403 mean the backend is not usable as set up,
/// another 4xx is permanent.
fn error(result: &Outcome, subtype: &str, text: &str) -> CallError {
    let status = result.api_error_status;
    let message = match (status, subtype) {
        (Some(status), _) => format!("claude reported an error (HTTP {status}): {text}"),
        (None, "success" | "") => format!("claude reported an error: {text}"),
        (None, subtype) if text.is_empty() => format!("claude ended with {subtype}"),
        (None, subtype) => format!("claude ended with {subtype}: {text}"),
    };
    let retry_after = retry_after(text);
    match status {
        Some(429) => CallError::RateLimited {
            message,
            retry_after,
        },
        Some(401 | 403) => CallError::Missing { message },
        Some(408 | 409) => CallError::Transient {
            message,
            retry_after,
        },
        Some(s) if s >= 500 => CallError::Transient {
            message,
            retry_after,
        },
        Some(_) => CallError::Failed { message },
        None if text.is_empty() => CallError::Failed { message },
        None => relabel(
            classify(text, retry_after, || CallError::Failed {
                message: message.clone(),
            }),
            message,
        ),
    }
}

/// Actions claude reports it was denied: `permission_denials`, as "Tool: what".
fn denials(result: &Outcome) -> Vec<String> {
    result
        .permission_denials
        .iter()
        .map(|d| {
            let tool = d.tool_name.as_deref().unwrap_or("tool");
            let input = &d.tool_input;
            let what = [
                &input.file_path,
                &input.command,
                &input.path,
                &input.notebook_path,
                &input.url,
                &input.pattern,
            ]
            .into_iter()
            .find_map(Option::as_ref);
            match what {
                Some(w) => format!("{tool}: {w}"),
                None => tool.to_string(),
            }
        })
        .collect()
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
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        return Some(Duration::from_secs(epoch.saturating_sub(now)));
    }
    retry_hint(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cli::test_support::{REPLY, captured};

    #[test]
    fn the_claude_reset_epoch_gives_the_wait() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs();
        let wait =
            retry_after(&format!("Claude AI usage limit reached|{}", now + 600)).expect("a wait");
        assert!(wait <= Duration::from_secs(600) && wait >= Duration::from_secs(590));
    }

    #[test]
    fn a_schema_claude_refuses_is_a_refused_configuration() {
        for case in [
            capture!("claude", "schema_draft2020"),
            capture!("claude", "schema_unknown_keyword"),
            capture!("claude", "schema_not_object"),
        ] {
            match parse(&case) {
                Err(CallError::Refused { message }) => {
                    assert!(message.contains("--json-schema"), "{message}");
                    assert!(
                        message.contains("structured_output"),
                        "says what to do: {message}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_detector_sees_complete_results_only() {
        assert!(done(b"{\"type\":\"result\",\"result\":\"x\"}\n"));
        assert!(!done(b"{\"type\":\"result\",\"res"));
    }

    #[test]
    fn real_successes_parse() {
        let claude = parse(&capture!("claude", "ok")).expect("a reply");
        assert_eq!(claude.text, REPLY);
        assert_eq!(claude.usage.input_tokens, 4321 + 98);
        assert_eq!(claude.usage.cached_tokens, 98);
        assert_eq!(claude.usage.output_tokens, 765);
        assert!(claude.denied.is_empty());
        let structured = parse(&capture!("claude", "structured")).expect("a reply");
        assert_eq!(structured.text, r#"{"verdict":"MOCK-REPLY-4F7","count":3}"#);
    }

    #[test]
    fn claude_api_errors_use_the_http_status() {
        let rate = parse(&capture!("claude", "rate_limit")).expect_err("an error");
        assert!(matches!(rate, CallError::RateLimited { .. }), "{rate:?}");
        for out in [
            capture!("claude", "overloaded"),
            capture!("claude", "server_error"),
        ] {
            let e = parse(&out).expect_err("an error");
            assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        }
        let key = parse(&capture!("claude", "invalid_key")).expect_err("an error");
        assert!(matches!(key, CallError::Missing { .. }), "{key:?}");
        let message = parse(&capture!("claude", "overloaded"))
            .expect_err("an error")
            .to_string();
        assert!(
            message.contains("claude reported an error (HTTP 529): API Error: 529 Overloaded"),
            "{message}"
        );
        assert!(!message.contains("ended with success"), "{message}");
    }

    #[test]
    fn claude_a_400_is_permanent() {
        let result: Outcome = json_object(
            r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"result":"API Error: 400 prompt is too long"}"#,
        )
        .expect("an object");
        let e = error(&result, "success", "API Error: 400 prompt is too long");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
    }

    #[test]
    fn claude_denials_are_reported() {
        let reply = parse(&capture!("claude", "write_default")).expect("a reply");
        assert_eq!(
            reply.denied,
            ["Write: /WORK/claude-write_default/cwd/mock-written.txt"]
        );
        let reply = parse(&capture!("claude", "write_accept_edits")).expect("a reply");
        assert!(reply.denied.is_empty());
    }

    #[test]
    fn claude_bypass_as_root_is_permanent() {
        let e = parse(&capture!("claude", "write_bypass")).expect_err("an error");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
    }

    #[test]
    fn odd_fields_do_not_lose_the_answer() {
        let out = captured(
            r#"{"type":"result","subtype":"success","is_error":false,"result":"hi","usage":{"input_tokens":"7","output_tokens":3},"total_cost_usd":null,"permission_denials":null,"new_field":{"x":1}}"#,
            "",
            "0",
        );
        let reply = parse(&out).expect("a reply");
        assert_eq!(reply.text, "hi");
        assert_eq!(
            (reply.usage.input_tokens, reply.usage.output_tokens),
            (0, 3)
        );
        assert_eq!(reply.usage.cost_usd, None);
    }
}

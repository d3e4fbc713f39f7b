//! claude (`@anthropic-ai/claude-code`), run as `claude -p --output-format json`: its
//! permission modes, its result object, its errors and its denials.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use super::classify::{classify, ended, no_result, refused, relabel, retry_after};
use super::invocation::{Launch, Request};
use super::output::{detect_window, json_object};
use super::{CliAgent, Program};
use crate::backend::de::{Entries, lenient};
use crate::backend::process::ProcOutput;
use crate::backend::{AgentConfig, AgentReply, CallError, Capabilities, Usage};
use crate::model::Permissions;

/// The `claude` agent CLI.
pub(super) struct Claude;

impl CliAgent for Claude {
    fn program(&self) -> Option<Program> {
        Some(Program {
            name: "claude",
            variable: "RALPH_FLOW_CLAUDE",
            package: "@anthropic-ai/claude-code",
        })
    }

    fn key_variables(&self) -> &'static [&'static str] {
        &[
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "CLAUDE_CODE_OAUTH_TOKEN",
        ]
    }

    /// claude reports its cost and its tokens.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cost: true,
            usage: true,
        }
    }

    fn default_env(&self, config: &AgentConfig) -> Vec<(&'static str, &'static str)> {
        // claude retries API errors itself (10 times by default, silently): the executor
        // retries, with backoff and a visible status.
        let mut env = vec![("CLAUDE_CODE_MAX_RETRIES", MAX_RETRIES)];
        if config.permissions == Permissions::Full {
            // `bypassPermissions` refuses to run as root unless told it is sandboxed;
            // `permissions = "full"` is that decision.
            env.push(("IS_SANDBOX", "1"));
        }
        env
    }

    /// `IS_SANDBOX` is `permissions = "full"`'s decision: only the agent's own `env` changes
    /// it (claude takes only `1`, and a container may set `IS_SANDBOX=yes`).
    fn decided_env(&self) -> &'static [&'static str] {
        &["IS_SANDBOX"]
    }

    fn launch(&self, request: &Request<'_>) -> Result<Launch, CallError> {
        let mut argv = vec![request.program.to_string()];
        argv.extend(["-p", "--output-format", "json"].map(String::from));
        if let Some(m) = request.model {
            argv.extend(["--model".into(), m.clone()]);
        }
        if let Some(schema) = request.native {
            argv.extend(["--json-schema".into(), schema.to_string()]);
        }
        argv.extend(request.unless_set(
            &[
                "--permission-mode",
                "--dangerously-skip-permissions",
                "--allow-dangerously-skip-permissions",
            ],
            &[
                "--permission-mode",
                permission_mode(request.config.permissions),
            ],
        ));
        argv.extend(request.user_args.iter().cloned());
        Ok(Launch::stdin(argv, &request.prompt))
    }

    fn result_done(&self) -> Option<fn(&[u8]) -> bool> {
        Some(done)
    }

    fn parse(&self, out: &ProcOutput) -> Result<AgentReply, CallError> {
        parse(out)
    }
}

/// The value of `CLAUDE_CODE_MAX_RETRIES` a call gets unless set: claude's own retries of
/// API errors (its default is 10, with backoff, and it prints nothing meanwhile).
const MAX_RETRIES: &str = "2";

/// `claude --permission-mode` for a permissions setting. In `-p` mode `default` denies
/// every tool use that would ask (writes, most commands) and reports it in
/// `permission_denials`; `acceptEdits` allows file edits; `bypassPermissions` allows all
/// (as root only with `IS_SANDBOX=1`).
fn permission_mode(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "default",
        Permissions::Edit => "acceptEdits",
        Permissions::Full => "bypassPermissions",
    }
}

/// claude's refusal of `--json-schema`: its whole stderr, one line starting with this.
const SCHEMA_REFUSED: &str = "Error: --json-schema ";

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
        let stderr = String::from_utf8_lossy(&out.stderr);
        // claude refuses a schema with no result, and then says nothing else: a mention of a
        // refusal anywhere in its transcript (a file it read) is not one.
        if out.code != Some(0)
            && out.stdout.is_empty()
            && stderr.trim_start().starts_with(SCHEMA_REFUSED)
        {
            return Err(refused(&ended("claude", out)));
        }
        let text = format!("{stdout}\n{stderr}");
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;
    use crate::backend::cli::test_support::{REPLY, backend, captured};
    use crate::model::AgentKind;

    #[test]
    fn claude_gets_bounded_retries_and_the_sandbox_flag_for_full() {
        let env = backend(AgentKind::Claude, Permissions::ReadOnly).default_env();
        assert!(env.contains(&("CLAUDE_CODE_MAX_RETRIES", MAX_RETRIES)));
        assert!(!env.iter().any(|(k, _)| *k == "IS_SANDBOX"));
        let env = backend(AgentKind::Claude, Permissions::Full).default_env();
        assert!(env.contains(&("IS_SANDBOX", "1")));
    }

    #[test]
    fn a_refusal_only_claude_itself_prints_is_a_refused_schema() {
        let claude = captured(
            "",
            "Error: --json-schema is not a valid JSON Schema: strict mode: unknown keyword: \"foo\"\n",
            "1",
        );
        assert!(matches!(parse(&claude), Err(CallError::Refused { .. })));
        // A transcript that mentions a refusal (a file the agent read) and then crashed is
        // not one: it is retried like any other crash.
        let transcript = r#"{"type":"item.completed","item":{"type":"command_execution","aggregated_output":"Invalid schema for response_format 'x': invalid_json_schema; --json-schema is not a valid JSON Schema"}}"#;
        let crashed = captured(transcript, "thread panicked\n", "101");
        let all = format!("{transcript}\nthread panicked\n");
        let e = no_result("codex", &crashed, &all);
        assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
    }

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

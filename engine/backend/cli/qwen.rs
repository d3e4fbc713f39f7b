//! qwen (`@qwen-code/qwen-code`, a fork of gemini-cli that speaks the OpenAI-compatible API),
//! run headless as `qwen --approval-mode MODE --output-format json`: its approval modes, its
//! messages and result, its errors and the tool calls it denied.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::classify::{classify, no_result, refused, relabel, retry_hint};
use super::invocation::{Launch, Request};
use super::output::{detect_window, json_object};
use super::{CliAgent, Program};
use crate::backend::de::lenient;
use crate::backend::process::ProcOutput;
use crate::backend::{AgentReply, CallError, Capabilities, Usage};
use crate::model::Permissions;

/// The `qwen` agent CLI.
pub(super) struct Qwen;

impl CliAgent for Qwen {
    fn program(&self) -> Option<Program> {
        Some(Program {
            name: "qwen",
            variable: "RALPH_FLOW_QWEN",
            package: "@qwen-code/qwen-code",
        })
    }

    /// qwen reads an OpenAI-compatible API's key (its other auth types are set up in its
    /// settings).
    fn key_variables(&self) -> &'static [&'static str] {
        &["OPENAI_API_KEY", "DASHSCOPE_API_KEY"]
    }

    /// qwen reports its tokens, not their cost.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cost: false,
            usage: true,
        }
    }

    fn launch(&self, request: &Request<'_>) -> Result<Launch, CallError> {
        // Without a TTY on stdin, qwen runs headless with stdin as the prompt.
        let mut argv = vec![request.program.to_string()];
        if let Some(m) = request.model {
            argv.extend(["--model".into(), m.clone()]);
        }
        argv.extend(request.unless_set(
            &["--approval-mode", "--yolo", "-y"],
            &["--approval-mode", approval_mode(request.config.permissions)],
        ));
        if let Some(schema) = request.native {
            argv.extend(["--json-schema".into(), schema.to_string()]);
        }
        argv.extend(request.user_args.iter().cloned());
        argv.extend(["--output-format", "json"].map(String::from));
        Ok(Launch::stdin(argv, &request.prompt))
    }

    fn result_done(&self) -> Option<fn(&[u8]) -> bool> {
        Some(done)
    }

    fn parse(&self, out: &ProcOutput) -> Result<AgentReply, CallError> {
        parse(out)
    }
}

/// `qwen --approval-mode` for a permissions setting. Headless, `default` denies every tool
/// call that would ask (writes, commands) and lists it in `permission_denials`; `auto-edit`
/// allows file edits; `yolo` allows all (no sandbox).
fn approval_mode(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "default",
        Permissions::Edit => "auto-edit",
        Permissions::Full => "yolo",
    }
}

/// A message of qwen's JSON output (an array of them); only the result is read.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Message {
    #[serde(rename = "result")]
    Result(Box<Outcome>),
    #[serde(other)]
    Other,
}

/// The result: the answer or the error, with the usage of the whole session (side requests
/// such as its memory extraction included).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Outcome {
    /// `success`, or `error_during_execution`...
    #[serde(deserialize_with = "lenient")]
    subtype: Option<String>,
    #[serde(deserialize_with = "lenient")]
    is_error: bool,
    #[serde(deserialize_with = "lenient")]
    result: Option<String>,
    #[serde(deserialize_with = "lenient")]
    error: Failure,
    #[serde(deserialize_with = "lenient")]
    session_id: Option<String>,
    #[serde(deserialize_with = "lenient")]
    usage: TokenUsage,
    #[serde(deserialize_with = "lenient")]
    permission_denials: Vec<Denial>,
}

/// OpenAI's token counts as qwen passes them on: `input_tokens` includes the cached ones.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenUsage {
    #[serde(deserialize_with = "lenient")]
    input_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    output_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    cache_read_input_tokens: u64,
}

/// An error: in the result object, or the object qwen prints last on stderr.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Failure {
    #[serde(deserialize_with = "lenient")]
    message: Option<String>,
}

/// The object on stderr: `{"error": {"type", "message", "code"}}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ErrorObject {
    #[serde(deserialize_with = "lenient")]
    error: Failure,
}

/// A tool call qwen denied.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Denial {
    #[serde(deserialize_with = "lenient")]
    tool_name: Option<String>,
    #[serde(deserialize_with = "lenient")]
    tool_input: DeniedInput,
}

/// What a denied tool call was about: the first of these its input holds.
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
    url: Option<String>,
}

/// qwen's refusal of `--json-schema` (exit 52, on stderr, in colour).
const SCHEMA_REFUSED: &str = "--json-schema is not a valid JSON Schema";

/// Whether stdout holds qwen's result.
fn done(stdout: &[u8]) -> bool {
    outcome(&detect_window(stdout)).is_some()
}

/// The result in qwen's output: its JSON array of messages (or one per line, should the
/// arguments ask for `stream-json`).
fn outcome(stdout: &str) -> Option<Outcome> {
    let last = |messages: Vec<Value>| {
        messages
            .into_iter()
            .rev()
            .find_map(|m| match serde_json::from_value(m).ok()? {
                Message::Result(outcome) => Some(*outcome),
                Message::Other => None,
            })
    };
    let text = stdout.trim();
    if text.starts_with('[') && text.ends_with(']') {
        if let Ok(messages) = serde_json::from_str::<Vec<Value>>(text) {
            return last(messages);
        }
    }
    stdout
        .lines()
        .rev()
        .find_map(|l| match json_object(l.trim())? {
            Message::Result(outcome) => Some(*outcome),
            Message::Other => None,
        })
}

/// The JSON object that ends a text, past any log before it.
fn trailing_object<T: DeserializeOwned>(text: &str) -> Option<T> {
    let text = text.trim_end();
    let mut end = text.len();
    if let Some(object) = json_object(text.trim_start()) {
        return Some(object);
    }
    while let Some(start) = text[..end].rfind("\n{") {
        if let Some(object) = json_object(text[start..].trim()) {
            return Some(object);
        }
        end = start;
    }
    None
}

fn parse(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(result) = outcome(&stdout) {
        let subtype = result.subtype.as_deref().unwrap_or("");
        if !result.is_error && !subtype.starts_with("error") {
            return Ok(reply(result));
        }
        let text = result
            .error
            .message
            .clone()
            .or_else(|| result.result.clone())
            .unwrap_or_default();
        return Err(error(&text, subtype));
    }
    if stderr.contains(SCHEMA_REFUSED) {
        return Err(refused(&format!(
            "qwen refused the output schema: {}",
            strip_ansi(stderr.trim())
        )));
    }
    match trailing_object::<ErrorObject>(&stderr).and_then(|o| o.error.message) {
        Some(message) => Err(error(&message, "")),
        None => Err(no_result("qwen", out, &format!("{stdout}\n{stderr}"))),
    }
}

/// The reply of a successful session.
fn reply(result: Outcome) -> AgentReply {
    let usage = &result.usage;
    AgentReply {
        text: result.result.clone().unwrap_or_default(),
        usage: Usage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cached_tokens: usage.cache_read_input_tokens,
            ..Usage::default()
        },
        denied: denials(&result),
        session_id: result.session_id,
        ..AgentReply::default()
    }
}

/// An error qwen reported: "[API Error: 429 Rate limit reached ...]", "[API Error: 401
/// Incorrect API key ...]"; classified by its words (the status is among them).
fn error(message: &str, subtype: &str) -> CallError {
    let described = match subtype {
        "" | "success" => format!("qwen reported an error: {message}"),
        subtype => format!("qwen ended with {subtype}: {message}"),
    };
    relabel(
        classify(message, retry_hint(message), || CallError::Failed {
            message: described.clone(),
        }),
        described.clone(),
    )
}

/// Tool calls qwen reports it denied: `permission_denials`, as "tool: what".
fn denials(result: &Outcome) -> Vec<String> {
    result
        .permission_denials
        .iter()
        .map(|d| {
            let tool = d.tool_name.as_deref().unwrap_or("tool");
            let input = &d.tool_input;
            let what = [&input.file_path, &input.command, &input.path, &input.url]
                .into_iter()
                .find_map(Option::as_ref);
            match what {
                Some(w) => format!("{tool}: {w}"),
                None => tool.to_string(),
            }
        })
        .collect()
}

/// A text without its terminal colour codes (`ESC[31m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cli::test_support::{REPLY, argv_of, captured};
    use crate::model::AgentKind;

    #[test]
    fn permissions_map_to_approval_modes() {
        let has = |argv: &[String], mode: &str| {
            argv.windows(2)
                .any(|w| w[0] == "--approval-mode" && w[1] == mode)
        };
        assert!(has(
            &argv_of(AgentKind::Qwen, Permissions::ReadOnly),
            "default"
        ));
        assert!(has(
            &argv_of(AgentKind::Qwen, Permissions::Edit),
            "auto-edit"
        ));
        assert!(has(&argv_of(AgentKind::Qwen, Permissions::Full), "yolo"));
        let argv = argv_of(AgentKind::Qwen, Permissions::ReadOnly);
        assert_eq!(argv[argv.len() - 2..], ["--output-format", "json"]);
    }

    #[test]
    fn real_successes_parse() {
        let reply = parse(&capture!("qwen", "ok")).expect("a reply");
        assert_eq!(reply.text, REPLY);
        // Its memory extraction's side request counts too: two answers of the mock.
        assert_eq!(reply.usage.input_tokens, 2 * 4321);
        assert_eq!(reply.usage.cached_tokens, 2 * 98);
        assert_eq!(reply.usage.output_tokens, 2 * 765);
        assert_eq!(
            reply.session_id.as_deref(),
            Some("00000000-0000-4000-8000-000000000000")
        );
        assert!(reply.denied.is_empty());
        let structured = parse(&capture!("qwen", "structured")).expect("a reply");
        assert_eq!(structured.text, r#"{"verdict":"MOCK-REPLY-4F7","count":3}"#);
        assert!(done(&capture!("qwen", "ok").stdout));
        assert!(!done(b"[{\"type\":\"system\"}"));
    }

    #[test]
    fn api_errors_are_classified_from_their_words() {
        let e = parse(&capture!("qwen", "rate_limit")).expect_err("an error");
        let CallError::RateLimited { retry_after, .. } = &e else {
            panic!("a rate limit: {e:?}");
        };
        assert_eq!(retry_after.map(|d| d.as_secs()), Some(20), "{e:?}");
        let e = parse(&capture!("qwen", "server_error")).expect_err("an error");
        assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        let e = parse(&capture!("qwen", "invalid_key")).expect_err("an error");
        assert!(matches!(e, CallError::Missing { .. }), "{e:?}");
        assert!(e.to_string().contains("401 Incorrect API key"), "{e}");
        // Its error object alone (no result printed) says the same.
        let out = captured(
            "",
            &String::from_utf8_lossy(&capture!("qwen", "invalid_key").stderr),
            "1",
        );
        assert!(matches!(parse(&out), Err(CallError::Missing { .. })));
    }

    #[test]
    fn refusals_of_the_invocation_are_permanent() {
        match parse(&capture!("qwen", "schema_unknown_keyword")) {
            Err(CallError::Refused { message }) => {
                assert!(message.contains("unknown keyword"), "{message}");
                assert!(!message.contains('\u{1b}'), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let e = parse(&capture!("qwen", "bad_flag")).expect_err("an error");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
    }

    #[test]
    fn denied_tool_calls_are_reported() {
        let reply = parse(&capture!("qwen", "denied_default")).expect("a reply");
        assert_eq!(reply.text, REPLY);
        assert_eq!(
            reply.denied,
            [
                "write_file: /WORK/qwen-denied_default/cwd/mock-written.txt",
                "write_file: /WORK/qwen-denied_default/cwd/.git/mock-written.txt",
                "write_file: /WORK/qwen-denied_default/mock-outside.txt",
                "run_shell_command: echo from-shell > ../mock-outside-shell.txt",
                "run_shell_command: git add -A && git commit -q -m x",
                "run_shell_command: echo 'FAILED test_mean'; exit 1",
            ]
        );
        // auto-edit: every write goes through (into .git and out of the cwd too); commands
        // are denied.
        let reply = parse(&capture!("qwen", "denied_auto_edit")).expect("a reply");
        assert_eq!(
            reply.denied,
            [
                "run_shell_command: echo from-shell > ../mock-outside-shell.txt",
                "run_shell_command: git add -A && git commit -q -m x",
                "run_shell_command: echo 'FAILED test_mean'; exit 1",
            ]
        );
        let reply = parse(&capture!("qwen", "write_auto_edit")).expect("a reply");
        assert!(reply.denied.is_empty(), "{:?}", reply.denied);
        let reply = parse(&capture!("qwen", "denied_yolo")).expect("a reply");
        assert!(reply.denied.is_empty(), "{:?}", reply.denied);
    }
}

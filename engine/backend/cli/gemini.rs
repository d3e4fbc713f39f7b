//! gemini (`@google/gemini-cli`), run headless as `gemini --output-format json`: its
//! approval modes, its answer and statistics, or its error object (on stdout, or last on
//! stderr), its exit codes, and the tool calls it refused.

use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;

use super::classify::{UNAUTHENTICATED, classify, no_result, retry_hint};
use super::invocation::{Launch, Request};
use super::output::{collapse, json_object, output_tail};
use super::{CliAgent, Program};
use crate::backend::de::{Entries, lenient};
use crate::backend::process::ProcOutput;
use crate::backend::{AgentConfig, AgentReply, CallError, Capabilities, Usage};
use crate::model::Permissions;

/// The `gemini` agent CLI.
pub(super) struct Gemini;

impl CliAgent for Gemini {
    fn program(&self) -> Option<Program> {
        Some(Program {
            name: "gemini",
            variable: "RALPH_FLOW_GEMINI",
            package: "@google/gemini-cli",
        })
    }

    fn key_variables(&self) -> &'static [&'static str] {
        &["GEMINI_API_KEY", "GOOGLE_API_KEY"]
    }

    /// gemini reports its tokens, not their cost.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cost: false,
            usage: true,
        }
    }

    /// Headless gemini refuses an untrusted directory (exit 55): ralph-flow chose the cwd.
    /// (The variable, unlike `--skip-trust`, is ignored by older versions.)
    fn default_env(&self, _config: &AgentConfig) -> Vec<(&'static str, &'static str)> {
        vec![("GEMINI_CLI_TRUST_WORKSPACE", "true")]
    }

    fn launch(&self, request: &Request<'_>) -> Result<Launch, CallError> {
        // Without a TTY on stdin, gemini runs headless with stdin as the prompt.
        let mut argv = vec![request.program.to_string()];
        if let Some(m) = request.model {
            argv.extend(["--model".into(), m.clone()]);
        }
        argv.extend(request.unless_set(
            &["--approval-mode", "--yolo", "-y"],
            &["--approval-mode", approval_mode(request.config.permissions)],
        ));
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

/// `gemini --approval-mode` for a permissions setting. Headless `default` does not offer
/// the model its write and shell tools at all.
fn approval_mode(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "default",
        Permissions::Edit => "auto_edit",
        Permissions::Full => "yolo",
    }
}

/// What gemini prints: the answer with the statistics of the session, or an error.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Output {
    #[serde(deserialize_with = "lenient")]
    session_id: Option<String>,
    #[serde(deserialize_with = "lenient")]
    response: Option<String>,
    #[serde(deserialize_with = "lenient")]
    stats: Stats,
    #[serde(deserialize_with = "lenient")]
    error: Option<ApiError>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Stats {
    /// The models that served the session, by name.
    #[serde(deserialize_with = "lenient")]
    models: Entries<ModelStats>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ModelStats {
    #[serde(deserialize_with = "lenient")]
    roles: Roles,
    #[serde(deserialize_with = "lenient")]
    tokens: Tokens,
}

/// What a model served: newer versions say which model did the turn (`main`); the others
/// served side requests (`utility_router`...).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Roles {
    main: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Tokens {
    #[serde(deserialize_with = "lenient")]
    prompt: u64,
    #[serde(deserialize_with = "lenient")]
    candidates: u64,
    #[serde(deserialize_with = "lenient")]
    thoughts: u64,
    #[serde(deserialize_with = "lenient")]
    cached: u64,
}

/// gemini's error object.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ApiError {
    #[serde(rename = "type", deserialize_with = "lenient")]
    kind: Option<String>,
    #[serde(deserialize_with = "lenient")]
    message: Option<String>,
    code: Option<ErrorCode>,
}

/// An error's `code`: the HTTP status of an API error, or anything else.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ErrorCode {
    Status(u64),
    Other(Value),
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorCode::Status(status) => write!(f, "{status}"),
            ErrorCode::Other(value) => write!(f, "{value}"),
        }
    }
}

/// Whether stdout holds gemini's complete JSON object.
pub(super) fn done(stdout: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stdout);
    text.trim_end().ends_with('}') && leading_json_object::<IgnoredAny>(&text).is_some()
}

/// The JSON object of the output: all of it, or from the first line that opens one (past
/// any notice printed before it).
fn leading_json_object<T: DeserializeOwned>(text: &str) -> Option<T> {
    json_object(text.trim()).or_else(|| {
        let start = text.find("\n{")?;
        json_object(text[start..].trim())
    })
}

/// The JSON object that ends the output, past any log before it: gemini prints its error
/// object last on stderr, after its retry messages and stack traces.
fn trailing_json_object<T: DeserializeOwned>(text: &str) -> Option<T> {
    let text = text.trim_end();
    if !text.ends_with('}') {
        return None;
    }
    if let Some(object) = json_object(text.trim_start()) {
        return Some(object);
    }
    let mut end = text.len();
    while let Some(start) = text[..end].rfind("\n{") {
        if let Some(object) = json_object(text[start..].trim()) {
            return Some(object);
        }
        end = start;
    }
    None
}

/// Exit codes of gemini's headless mode that retrying will not fix: input error, sandbox
/// error, configuration error, turn limit.
const GEMINI_PERMANENT: [i32; 4] = [42, 44, 52, 53];

/// The exit code of gemini when it is not authenticated.
const GEMINI_AUTH: i32 = 41;

/// The exit code of headless gemini in an untrusted directory (it says to pass
/// `--skip-trust` or set `GEMINI_CLI_TRUST_WORKSPACE=true`).
const GEMINI_UNTRUSTED: i32 = 55;

/// The HTTP status an API error of gemini carries: the error object's `code`, else the
/// exit code, which is that status modulo 256 (429 exits 173, 503 exits 247).
fn gemini_status(error_code: Option<u64>, exit: Option<i32>) -> Option<u64> {
    if let Some(code) = error_code.filter(|c| (400..600).contains(c)) {
        return Some(code);
    }
    let exit = u64::try_from(exit?).ok()?;
    [400, 401, 403, 404, 408, 429, 500, 502, 503, 504]
        .into_iter()
        .find(|status| status % 256 == exit)
}

pub(super) fn parse(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut output: Output = leading_json_object(&stdout).unwrap_or_default();
    let error = output
        .error
        .take()
        .or_else(|| trailing_json_object::<Output>(&stderr).and_then(|o| o.error))
        .or_else(|| leading_json_object::<Output>(&stderr).and_then(|o| o.error));
    if let (Some(response), None) = (output.response.take(), &error) {
        if out.code == Some(0) || out.code.is_none() {
            return Ok(AgentReply {
                denied: denials(&stderr),
                ..reply(output, response)
            });
        }
    }
    let Some(error) = error else {
        if out.code == Some(GEMINI_UNTRUSTED) {
            return Err(CallError::Failed {
                message: format!("gemini refused the directory: {}", output_tail(out)),
            });
        }
        return Err(no_result("gemini", out, &format!("{stdout}\n{stderr}")));
    };
    Err(api_error(error, out.code))
}

/// The reply of a successful session: its usage summed over the models that served it, and
/// the model that did the turn (else the busiest one).
fn reply(output: Output, response: String) -> AgentReply {
    let mut reply = AgentReply {
        text: response,
        session_id: output.session_id,
        ..AgentReply::default()
    };
    let mut busiest = (0, None);
    let mut main = None;
    for (name, stats) in output.stats.models.0 {
        if stats.roles.main.is_some() {
            main = Some(name.clone());
        }
        let tokens = &stats.tokens;
        let usage = Usage {
            input_tokens: tokens.prompt,
            // Thinking is output too.
            output_tokens: tokens.candidates.saturating_add(tokens.thoughts),
            cached_tokens: tokens.cached,
            ..Usage::default()
        };
        if usage.tokens() >= busiest.0 {
            busiest = (usage.tokens(), Some(name));
        }
        reply.usage.add(&usage);
    }
    reply.model = main.or(busiest.1);
    reply
}

/// The tools gemini's approval modes withhold from the model: headless, `default` offers
/// none of them, `auto_edit` the file tools (`write_file`, `replace`) and `web_fetch`,
/// `yolo` all (seen in the requests of gemini 0.61).
const WITHHELD: [&str; 7] = [
    "run_shell_command",
    "write_file",
    "replace",
    "web_fetch",
    "activate_skill",
    "list_background_processes",
    "read_background_output",
];

/// Tool calls gemini refused, as "tool: what (why)". Its JSON has only counts
/// (`stats.tools.byName.<tool>.fail`); headless, it logs each failed call on stderr as
/// `Error executing tool <tool>: <message>`, and these messages are refusals: a tool the
/// approval mode withholds (`Tool "run_shell_command" not found. Did you mean ...`: the
/// call's arguments, the command, are not shown), a path outside the workspace (`.git`
/// counts as outside: `Path not in workspace: Attempted path "<path>" resolves outside the
/// allowed workspace directories: ...`), a policy's denial, a write the system refused
/// (EACCES), a sandbox too narrow. Other failures (a file not found, an edit that does not
/// apply) are not refusals; a shell command that fails is no failed call at all.
fn denials(stderr: &str) -> Vec<String> {
    static FAILED: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?m)^Error executing tool (\S+): (.*)$")
            .expect("the tool error pattern is valid")
    });
    static NOT_FOUND: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r#"^Tool "([^"]+)" not found"#).expect("the not-found pattern is valid")
    });
    static OUTSIDE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r#"Path not in workspace(?:: Attempted path "([^"]+)")?"#)
            .expect("the workspace pattern is valid")
    });
    static EACCES: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^Permission denied writing to file: (.*?)(?: \(EACCES\))?$")
            .expect("the permission pattern is valid")
    });
    let denied = FAILED
        .captures_iter(stderr)
        .filter_map(|c| {
            let tool = &c[1];
            let message = c[2].trim();
            if let Some(n) = NOT_FOUND.captures(message) {
                return WITHHELD
                    .contains(&&n[1])
                    .then(|| format!("{tool}: not offered to the model in this approval mode"));
            }
            if let Some(o) = OUTSIDE.captures(message) {
                return Some(match o.get(1) {
                    Some(path) => format!("{tool}: {} (outside the workspace)", path.as_str()),
                    None => format!("{tool}: a path outside the workspace"),
                });
            }
            if let Some(p) = EACCES.captures(message) {
                return Some(format!("{tool}: {} (permission denied)", &p[1]));
            }
            if message.starts_with("Tool execution denied by policy")
                || message.starts_with("Tool execution blocked")
                || message.starts_with("Sandbox expansion required")
            {
                return Some(format!("{tool}: {message}"));
            }
            None
        })
        .collect();
    collapse(denied)
}

/// Classifies gemini's error object: by the HTTP status it (or the exit code) carries,
/// else by its words and the exit code.
fn api_error(error: ApiError, code: Option<i32>) -> CallError {
    let message = error.message.unwrap_or_else(|| "unknown error".into());
    let kind = error.kind.unwrap_or_default();
    let status_code = match &error.code {
        Some(ErrorCode::Status(status)) => Some(*status),
        _ => None,
    };
    let status = gemini_status(status_code, code);
    let described = match status {
        Some(s) => format!("gemini: API error (HTTP {s}): {message}"),
        None => format!("gemini: {message}"),
    };
    let error_code = error.code.map(|c| c.to_string()).unwrap_or_default();
    let words = format!("{kind} {error_code} {message}");
    let retry_after = retry_hint(&message);
    match status {
        Some(429) => {
            return CallError::RateLimited {
                message: described,
                retry_after,
            };
        }
        Some(401 | 403) => return CallError::Missing { message: described },
        Some(400) if UNAUTHENTICATED.is_match(&message) => {
            return CallError::Missing { message: described };
        }
        Some(408) => {
            return CallError::Transient {
                message: described,
                retry_after,
            };
        }
        Some(s) if s >= 500 => {
            return CallError::Transient {
                message: described,
                retry_after,
            };
        }
        Some(_) => return CallError::Failed { message: described },
        None => {}
    }
    classify(&words, retry_after, || {
        if code.is_some_and(|c| GEMINI_PERMANENT.contains(&c)) {
            CallError::Failed {
                message: described.clone(),
            }
        } else if code == Some(GEMINI_AUTH) {
            CallError::Missing {
                message: described.clone(),
            }
        } else {
            CallError::Transient {
                message: described.clone(),
                retry_after: None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cli::test_support::{REPLY, backend, captured};
    use crate::model::AgentKind;

    #[test]
    fn the_detector_sees_complete_results_only() {
        assert!(done(b"{\n  \"response\": \"x\"\n}\n"));
        assert!(!done(b"{\n  \"response\": \"x\"\n"));
    }

    #[test]
    fn real_successes_parse() {
        let gemini = parse(&capture!("gemini", "ok")).expect("a reply");
        assert_eq!(gemini.text, REPLY);
        // The turn's model, not the router's (both report the same usage here).
        assert_eq!(gemini.model.as_deref(), Some("gemini-3.8-flash"));
        assert_eq!(gemini.usage.input_tokens, 4321 + 11);
    }

    #[test]
    fn gemini_untrusted_is_permanent_and_avoided() {
        let e = parse(&capture!("gemini", "untrusted")).expect_err("an error");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
        let env = backend(AgentKind::Gemini, Permissions::ReadOnly).default_env();
        assert!(env.contains(&("GEMINI_CLI_TRUST_WORKSPACE", "true")));
    }

    #[test]
    fn gemini_invalid_key_is_missing() {
        let e = parse(&capture!("gemini", "invalid_key")).expect_err("an error");
        assert!(matches!(e, CallError::Missing { .. }), "{e:?}");
    }

    #[test]
    fn gemini_api_errors_use_the_status() {
        let e = parse(&capture!("gemini", "rate_limit")).expect_err("an error");
        let CallError::RateLimited { retry_after, .. } = &e else {
            panic!("a rate limit: {e:?}");
        };
        assert!(retry_after.is_some_and(|d| d.as_secs() == 45), "{e:?}");
        for out in [
            capture!("gemini", "overloaded"),
            capture!("gemini", "server_error"),
        ] {
            let e = parse(&out).expect_err("an error");
            assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        }
        // The exit code alone: the HTTP status modulo 256.
        assert_eq!(gemini_status(None, Some(173)), Some(429));
        assert_eq!(gemini_status(None, Some(247)), Some(503));
        assert_eq!(gemini_status(None, Some(144)), Some(400));
        assert_eq!(gemini_status(None, Some(1)), None);
        assert_eq!(gemini_status(Some(53), Some(53)), None);
    }

    #[test]
    fn a_word_code_is_classified_by_its_words() {
        let out = captured(
            "",
            "retrying...\n{\"error\": {\"type\": \"Error\", \"code\": \"RESOURCE_EXHAUSTED\", \"message\": \"slow down\"}}\n",
            "1",
        );
        let e = parse(&out).expect_err("an error");
        assert!(matches!(e, CallError::RateLimited { .. }), "{e:?}");
        assert!(e.to_string().contains("slow down"), "{e}");
    }

    #[test]
    fn gemini_refused_tool_calls_are_reported() {
        // default: no write or shell tool is offered; the model asked for them anyway (what
        // it asked is not shown: the tool's name only).
        let reply = parse(&capture!("gemini", "denied_default")).expect("a reply");
        assert_eq!(reply.text, REPLY);
        assert_eq!(
            reply.denied,
            [
                "write_file: not offered to the model in this approval mode (3 times)",
                "run_shell_command: not offered to the model in this approval mode (3 times)",
            ]
        );
        // auto_edit: the write in the cwd went through, the writes into .git and out of the
        // cwd are outside the workspace, and there is no shell (no commit).
        let reply = parse(&capture!("gemini", "denied_auto_edit")).expect("a reply");
        assert_eq!(
            reply.denied,
            [
                "write_file: /WORK/gemini-denied_auto_edit/cwd/.git/mock-written.txt (outside the workspace)",
                "write_file: /WORK/gemini-denied_auto_edit/mock-outside.txt (outside the workspace)",
                "run_shell_command: not offered to the model in this approval mode (3 times)",
            ]
        );
        // yolo: the shell commits (and writes out of the cwd: no sandbox); write_file still
        // keeps to the workspace; the failing tests are no failed call.
        let reply = parse(&capture!("gemini", "denied_yolo")).expect("a reply");
        assert_eq!(
            reply.denied,
            [
                "write_file: /WORK/gemini-denied_yolo/cwd/.git/mock-written.txt (outside the workspace)",
                "write_file: /WORK/gemini-denied_yolo/mock-outside.txt (outside the workspace)",
            ]
        );
        let reply = parse(&capture!("gemini", "write_auto_edit")).expect("a reply");
        assert!(reply.denied.is_empty(), "{:?}", reply.denied);
    }

    #[test]
    fn gemini_ordinary_tool_failures_are_not_denials() {
        let stderr = concat!(
            "Error executing tool read_file: File not found: /w/x.txt\n",
            "Error executing tool replace: Failed to edit, could not find the string to replace.\n",
            "Error executing tool made_up_tool: Tool \"made_up_tool\" not found. Did you mean one of: \"read_file\"?\n",
            "Error executing tool write_file: Tool execution denied by policy.\n",
            "Error executing tool write_file: Permission denied writing to file: /w/ro.txt (EACCES)\n",
        );
        let reply = parse(&captured(r#"{"response": "x"}"#, stderr, "0")).expect("a reply");
        assert_eq!(
            reply.denied,
            [
                "write_file: Tool execution denied by policy.",
                "write_file: /w/ro.txt (permission denied)",
            ]
        );
    }

    #[test]
    fn huge_counts_do_not_overflow() {
        let stdout = format!(
            r#"{{"response": "x", "stats": {{"models": {{"m": {{"tokens": {{"candidates": {max}, "thoughts": {max}}}}}, "n": {{"tokens": {{"prompt": {max}}}}}}}}}}}"#,
            max = u64::MAX
        );
        let reply = parse(&captured(&stdout, "", "0")).expect("a reply");
        assert_eq!(reply.usage.output_tokens, u64::MAX);
    }
}

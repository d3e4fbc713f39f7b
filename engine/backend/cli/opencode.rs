//! opencode (`opencode-ai`), run as `opencode run --format json`: its permissions (set in
//! `OPENCODE_PERMISSION`), its events, its errors and the tool calls it refused.

use serde::Deserialize;
use serde_json::Value;

use super::classify::{classify, no_result, retry_hint};
use super::invocation::{Launch, Request};
use super::output::{collapse, json_object};
use super::{CliAgent, Program};
use crate::backend::de::lenient;
use crate::backend::process::ProcOutput;
use crate::backend::{AgentConfig, AgentReply, CallError, Capabilities, Usage};
use crate::model::Permissions;

/// The `opencode` agent CLI.
pub(super) struct Opencode;

impl CliAgent for Opencode {
    fn program(&self) -> Option<Program> {
        Some(Program {
            name: "opencode",
            variable: "RALPH_FLOW_OPENCODE",
            package: "opencode-ai",
        })
    }

    /// The keys of the providers opencode is most often set up with (it reads the one its
    /// configured provider names).
    fn key_variables(&self) -> &'static [&'static str] {
        &["OPENCODE_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"]
    }

    /// opencode reports its tokens (its cost only for the models its catalog prices).
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cost: false,
            usage: true,
        }
    }

    /// The permissions, as opencode's `permission` setting: what `permissions` allows runs,
    /// the rest is denied (never `ask`: headless, a question ends the session).
    fn default_env(&self, config: &AgentConfig) -> Vec<(&'static str, &'static str)> {
        vec![("OPENCODE_PERMISSION", permission(config.permissions))]
    }

    /// `OPENCODE_PERMISSION` is the `permissions` decision: only the agent's own `env`
    /// changes it.
    fn decided_env(&self) -> &'static [&'static str] {
        &["OPENCODE_PERMISSION"]
    }

    fn launch(&self, request: &Request<'_>) -> Result<Launch, CallError> {
        let mut argv = vec![request.program.to_string()];
        argv.extend(["run", "--format", "json"].map(String::from));
        if let Some(m) = request.model {
            argv.extend(["--model".into(), m.clone()]);
        }
        argv.extend(request.user_args.iter().cloned());
        Ok(Launch::stdin(argv, &request.prompt))
    }

    fn parse(&self, out: &ProcOutput) -> Result<AgentReply, CallError> {
        parse(out)
    }
}

/// `OPENCODE_PERMISSION` for a permissions setting. With `deny`, opencode does not offer the
/// model the tool at all; `external_directory` covers paths outside the working directory.
fn permission(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => r#"{"edit":"deny","bash":"deny","external_directory":"deny"}"#,
        Permissions::Edit => r#"{"edit":"allow","bash":"deny","external_directory":"deny"}"#,
        Permissions::Full => r#"{"*":"allow"}"#,
    }
}

/// An event of `opencode run --format json`, one per line.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Event {
    #[serde(rename = "step_start")]
    StepStart {
        #[serde(default, rename = "sessionID", deserialize_with = "lenient")]
        session: Option<String>,
    },
    #[serde(rename = "text")]
    Text {
        #[serde(default, deserialize_with = "lenient")]
        part: TextPart,
    },
    #[serde(rename = "tool_use")]
    ToolUse {
        #[serde(default, deserialize_with = "lenient")]
        part: ToolPart,
    },
    #[serde(rename = "step_finish")]
    StepFinish {
        #[serde(default, deserialize_with = "lenient")]
        part: FinishPart,
    },
    /// The session's error: an API error with its status, or another.
    #[serde(rename = "error")]
    Error {
        #[serde(default, deserialize_with = "lenient")]
        error: SessionError,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TextPart {
    #[serde(deserialize_with = "lenient")]
    text: Option<String>,
}

/// A tool call and how it ended.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ToolPart {
    #[serde(deserialize_with = "lenient")]
    tool: Option<String>,
    #[serde(deserialize_with = "lenient")]
    state: ToolState,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ToolState {
    #[serde(deserialize_with = "lenient")]
    status: Option<String>,
    input: Value,
    #[serde(deserialize_with = "lenient")]
    error: Option<String>,
}

/// The end of a step: its tokens.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FinishPart {
    #[serde(deserialize_with = "lenient")]
    tokens: Tokens,
}

/// opencode's token counts: `input` without the cache reads and writes, `reasoning` apart
/// from `output`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Tokens {
    #[serde(deserialize_with = "lenient")]
    input: u64,
    #[serde(deserialize_with = "lenient")]
    output: u64,
    #[serde(deserialize_with = "lenient")]
    reasoning: u64,
    #[serde(deserialize_with = "lenient")]
    cache: Cache,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Cache {
    #[serde(deserialize_with = "lenient")]
    read: u64,
    #[serde(deserialize_with = "lenient")]
    write: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SessionError {
    #[serde(deserialize_with = "lenient")]
    name: Option<String>,
    #[serde(deserialize_with = "lenient")]
    data: ErrorData,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ErrorData {
    #[serde(deserialize_with = "lenient")]
    message: Option<String>,
    #[serde(rename = "statusCode", deserialize_with = "lenient")]
    status: Option<u64>,
}

/// How opencode's usage starts: it prints it alone, on stderr, for an argument it does not
/// know.
const USAGE: &str = "opencode run [message..]";

fn parse(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut reply = AgentReply::default();
    // The text of the last step that had any: the answer.
    let mut step_text = String::new();
    let mut answer = None;
    let mut error = None;
    let mut denied = Vec::new();
    for event in stdout
        .lines()
        .filter_map(|l| json_object::<Event>(l.trim()))
    {
        match event {
            Event::StepStart { session } => {
                if reply.session_id.is_none() {
                    reply.session_id = session;
                }
                step_text.clear();
            }
            Event::Text { part } => step_text.push_str(part.text.as_deref().unwrap_or("")),
            Event::ToolUse { part } => denied.extend(denial(&part)),
            Event::StepFinish { part } => {
                let t = &part.tokens;
                reply.usage.add(&Usage {
                    input_tokens: t
                        .input
                        .saturating_add(t.cache.read)
                        .saturating_add(t.cache.write),
                    output_tokens: t.output.saturating_add(t.reasoning),
                    cached_tokens: t.cache.read,
                    ..Usage::default()
                });
                if !step_text.is_empty() {
                    answer = Some(std::mem::take(&mut step_text));
                }
            }
            Event::Error { error: e } => error = Some(e),
            Event::Other => {}
        }
    }
    if let Some(e) = error {
        return Err(api_error(e));
    }
    match answer {
        Some(text) if out.code == Some(0) || out.code.is_none() => Ok(AgentReply {
            text,
            denied: collapse(denied),
            ..reply
        }),
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if out.code != Some(0) && stdout.trim().is_empty() && stderr.starts_with(USAGE) {
                // An argument it does not know: it prints its usage and exits 1.
                return Err(CallError::Failed {
                    message: format!(
                        "opencode refused its arguments (it printed its usage, exit {}): check \
                         the agent's `args`",
                        out.code.unwrap_or(-1)
                    ),
                });
            }
            Err(no_result("opencode", out, &format!("{stdout}\n{stderr}")))
        }
    }
}

/// A tool call opencode refused, as "tool: what (why)": a tool its permissions withhold
/// (the model called it anyway: opencode turns it into its `invalid` tool), a rule that
/// denies the call, a question it could not ask (headless, it rejects it and ends the
/// session). A tool that failed otherwise (a command exiting non-zero) is none.
fn denial(part: &ToolPart) -> Option<String> {
    let state = &part.state;
    if state.status.as_deref() != Some("error") && part.tool.as_deref() != Some("invalid") {
        return None;
    }
    let input = |key: &str| {
        state
            .input
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    if part.tool.as_deref() == Some("invalid") {
        let tool = input("tool").unwrap_or_else(|| "tool".into());
        let withheld = input("error").is_some_and(|e| e.contains("unavailable tool"));
        return withheld
            .then(|| format!("{tool}: not offered to the model under these permissions"));
    }
    let tool = part.tool.clone().unwrap_or_else(|| "tool".into());
    let why = state.error.as_deref().unwrap_or("");
    let reason = if why.starts_with("The user has specified a rule which prevents") {
        "denied by a rule"
    } else if why.starts_with("The user rejected permission") {
        "rejected: no one to ask"
    } else {
        return None;
    };
    let what = ["filePath", "command", "path", "url"]
        .into_iter()
        .find_map(input);
    Some(match what {
        Some(w) => format!("{tool}: {w} ({reason})"),
        None => format!("{tool} ({reason})"),
    })
}

/// The session's error: by its HTTP status (429 a rate limit, 401 and 403 the key, 408 and
/// 5xx transient, another 4xx permanent), else by its words.
fn api_error(error: SessionError) -> CallError {
    let data = error.data;
    let message = data.message.unwrap_or_else(|| "unknown error".into());
    let name = error.name.unwrap_or_default();
    let described = match data.status {
        Some(s) => format!("opencode: API error (HTTP {s}): {message}"),
        None => format!("opencode: {name}: {message}"),
    };
    let retry_after = retry_hint(&message);
    match data.status {
        Some(429) => CallError::RateLimited {
            message: described,
            retry_after,
        },
        Some(401 | 403) => CallError::Missing { message: described },
        Some(408) => CallError::Transient {
            message: described,
            retry_after,
        },
        Some(s) if s >= 500 => CallError::Transient {
            message: described,
            retry_after,
        },
        Some(_) => CallError::Failed { message: described },
        None => classify(&format!("{name} {message}"), retry_after, || {
            CallError::Failed {
                message: described.clone(),
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cli::test_support::{REPLY, argv_of, backend};
    use crate::model::AgentKind;

    #[test]
    fn permissions_go_in_its_environment() {
        for (p, allows_edits) in [
            (Permissions::ReadOnly, false),
            (Permissions::Edit, true),
            (Permissions::Full, true),
        ] {
            let env = backend(AgentKind::Opencode, p).default_env();
            let [("OPENCODE_PERMISSION", value)] = env[..] else {
                panic!("{env:?}");
            };
            let rules: Value = serde_json::from_str(value).expect("JSON");
            let edit = rules.get("edit").or(rules.get("*"));
            assert_eq!(edit == Some(&Value::from("allow")), allows_edits, "{value}");
        }
        assert_eq!(
            argv_of(AgentKind::Opencode, Permissions::ReadOnly),
            ["opencode", "run", "--format", "json"]
        );
    }

    #[test]
    fn real_successes_parse() {
        let reply = parse(&capture!("opencode", "ok")).expect("a reply");
        assert_eq!(reply.text, REPLY);
        // The cache reads are apart from `input`; the session's title request reports none.
        assert_eq!(reply.usage.input_tokens, 4321);
        assert_eq!(reply.usage.cached_tokens, 98);
        assert_eq!(reply.usage.output_tokens, 765);
        assert_eq!(
            reply.session_id.as_deref(),
            Some("00000000-0000-4000-8000-000000000000")
        );
        let structured = parse(&capture!("opencode", "structured")).expect("a reply");
        assert_eq!(
            serde_json::from_str::<Value>(&structured.text).expect("JSON"),
            serde_json::json!({"verdict": "MOCK-REPLY-4F7", "count": 3})
        );
    }

    #[test]
    fn api_errors_use_the_status() {
        let e = parse(&capture!("opencode", "rate_limit")).expect_err("an error");
        let CallError::RateLimited { retry_after, .. } = &e else {
            panic!("a rate limit: {e:?}");
        };
        assert_eq!(retry_after.map(|d| d.as_secs()), Some(20), "{e:?}");
        let e = parse(&capture!("opencode", "server_error")).expect_err("an error");
        assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        let e = parse(&capture!("opencode", "invalid_key")).expect_err("an error");
        assert!(matches!(e, CallError::Missing { .. }), "{e:?}");
        assert!(e.to_string().contains("HTTP 401"), "{e}");
        let e = parse(&capture!("opencode", "bad_flag")).expect_err("an error");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
    }

    #[test]
    fn refused_tool_calls_are_reported() {
        // read-only: no write or shell tool is offered; the model called them anyway.
        let reply = parse(&capture!("opencode", "denied_read_only")).expect("a reply");
        assert_eq!(reply.text, REPLY);
        assert_eq!(
            reply.denied,
            [
                "write: not offered to the model under these permissions (3 times)",
                "bash: not offered to the model under these permissions (3 times)",
            ]
        );
        // edit: writes in the cwd (its .git too) go through; out of it, a rule denies it;
        // no shell is offered.
        let reply = parse(&capture!("opencode", "denied_edit")).expect("a reply");
        assert_eq!(
            reply.denied,
            [
                "write: /WORK/opencode-denied_edit/mock-outside.txt (denied by a rule)",
                "bash: not offered to the model under these permissions (3 times)",
            ]
        );
        let reply = parse(&capture!("opencode", "write_edit")).expect("a reply");
        assert!(reply.denied.is_empty(), "{:?}", reply.denied);
        let reply = parse(&capture!("opencode", "denied_full")).expect("a reply");
        assert!(reply.denied.is_empty(), "{:?}", reply.denied);
    }
}

//! Backends that run an agent's command-line program: `claude`, `codex`, `gemini`, or any
//! `command`.
//!
//! Each call runs the program once, in its own process group (see [`process`]), with the
//! prompt on stdin (or, for `command` agents, in a file or an argument): never through a
//! shell. Its stdout and stderr stream to `stdout` and `stderr` in the call's directory.
//! The agents' JSON output is parsed into the reply text, the usage and the session id,
//! and their errors are classified for the executor ([`CallError`]).
//!
//! Token counts mean the same for every agent: `input_tokens` counts the whole prompt,
//! cached part included, and `cached_tokens` is that cached part.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use regex::Regex;
use serde_json::{Map, Value};

use super::process::{self, Ended, ProcOutput, ProcSpec, SpawnError};
use super::{
    AgentCall, AgentConfig, AgentReply, Backend, CallError, CallFuture, Capabilities, Usage,
};
use crate::model::AgentKind;

/// Builds the backend of a `claude`, `codex`, `gemini` or `command` agent.
///
/// The program of the first three is the agent's `program`, else the one named by
/// `RALPH_FLOW_CLAUDE` (`RALPH_FLOW_CODEX`, `RALPH_FLOW_GEMINI`), else `claude` (`codex`,
/// `gemini`) looked up on PATH when called.
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, String> {
    let flavor = match config.kind {
        AgentKind::Claude => Flavor::Claude,
        AgentKind::Codex => Flavor::Codex,
        AgentKind::Gemini => Flavor::Gemini,
        AgentKind::Command => {
            if config.command.is_empty() {
                return Err(format!(
                    "agent `{}`: a command agent needs a `command`",
                    config.name
                ));
            }
            let via = match config.prompt_via.as_deref() {
                None | Some("stdin") => PromptVia::Stdin,
                Some("file") => PromptVia::File,
                Some("arg") => PromptVia::Arg,
                Some(other) => {
                    return Err(format!(
                        "agent `{}`: prompt_via must be stdin, file or arg, not `{other}`",
                        config.name
                    ));
                }
            };
            Flavor::Command(via)
        }
        other => {
            return Err(format!(
                "agent `{}`: the {} backend does not run a program",
                config.name,
                other.as_str()
            ));
        }
    };
    let program = match flavor {
        Flavor::Command(_) => String::new(),
        _ => program(config),
    };
    Ok(Box::new(CliBackend {
        config: config.clone(),
        flavor,
        program,
    }))
}

/// The program of a `claude`, `codex` or `gemini` agent: its `program`, else the one named
/// by `RALPH_FLOW_CLAUDE` (`RALPH_FLOW_CODEX`, `RALPH_FLOW_GEMINI`), else the kind's name.
pub fn program(config: &AgentConfig) -> String {
    let name = config.kind.as_str();
    config
        .program
        .clone()
        .or_else(|| std::env::var(format!("RALPH_FLOW_{}", name.to_uppercase())).ok())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| name.to_string())
}

/// Which program a backend runs, and so how it talks to it.
#[derive(Clone, Copy, Debug)]
enum Flavor {
    Claude,
    Codex,
    Gemini,
    Command(PromptVia),
}

/// How a `command` agent gets the prompt.
#[derive(Clone, Copy, Debug)]
enum PromptVia {
    Stdin,
    File,
    Arg,
}

/// A backend that runs a program per call.
struct CliBackend {
    config: AgentConfig,
    flavor: Flavor,
    /// The program of the `claude`, `codex` and `gemini` flavors.
    program: String,
}

impl Backend for CliBackend {
    fn capabilities(&self) -> Capabilities {
        match self.flavor {
            // `claude -p --json-schema` validates the final answer against the schema and
            // returns it as `structured_output`.
            Flavor::Claude => Capabilities {
                json_schema: true,
                cost: true,
                usage: true,
            },
            Flavor::Codex | Flavor::Gemini => Capabilities {
                json_schema: false,
                cost: false,
                usage: true,
            },
            Flavor::Command(_) => Capabilities::default(),
        }
    }

    fn call<'a>(&'a self, call: &'a AgentCall) -> CallFuture<'a> {
        Box::pin(self.run(call))
    }
}

impl CliBackend {
    async fn run(&self, call: &AgentCall) -> Result<AgentReply, CallError> {
        let (argv, stdin) = self.invocation(call)?;
        let spec = ProcSpec {
            argv,
            cwd: call.cwd.clone(),
            env: self.config.env.iter().chain(&call.env).cloned().collect(),
            stdin,
            timeout: call.timeout,
            idle_timeout: call.idle_timeout,
            stdout_path: Some(call.dir.join("stdout")),
            stderr_path: Some(call.dir.join("stderr")),
            pid_file: Some(call.dir.join("process")),
            result_done: match self.flavor {
                Flavor::Claude => Some(claude_done),
                Flavor::Codex => Some(codex_done),
                Flavor::Gemini => Some(gemini_done),
                Flavor::Command(_) => None,
            },
        };
        let out = process::run(&spec).await.map_err(|e| match e {
            SpawnError::NotFound { .. } => CallError::Missing {
                message: e.to_string(),
            },
            SpawnError::Other(message) => CallError::Failed { message },
        })?;
        match out.ended {
            Ended::Timeout => {
                return Err(CallError::Timeout {
                    after: call.timeout.unwrap_or_default(),
                    idle: false,
                    tail: output_tail(&out),
                });
            }
            Ended::Idle => {
                return Err(CallError::Timeout {
                    after: call.idle_timeout.unwrap_or_default(),
                    idle: true,
                    tail: output_tail(&out),
                });
            }
            Ended::Exited | Ended::AfterResult => {}
        }
        let reply = match self.flavor {
            Flavor::Claude => parse_claude(&out)?,
            Flavor::Codex => parse_codex(&out)?,
            Flavor::Gemini => parse_gemini(&out)?,
            Flavor::Command(_) => parse_command(&out)?,
        };
        Ok(AgentReply {
            raw: String::from_utf8_lossy(&out.stdout).into_owned(),
            ..reply
        })
    }

    /// The argv and the stdin of a call.
    fn invocation(&self, call: &AgentCall) -> Result<(Vec<String>, Option<Vec<u8>>), CallError> {
        let model = call.model.as_ref().or(self.config.model.as_ref());
        let extra = self.config.args.iter().chain(&call.args).cloned();
        let prompt = Some(call.prompt.clone().into_bytes());
        let mut argv = vec![self.program.clone()];
        match self.flavor {
            Flavor::Claude => {
                argv.extend(["-p", "--output-format", "json"].map(String::from));
                if let Some(m) = model {
                    argv.extend(["--model".into(), m.clone()]);
                }
                if let Some(schema) = &call.schema {
                    argv.extend(["--json-schema".into(), schema.to_string()]);
                }
                argv.extend(extra);
                Ok((argv, prompt))
            }
            Flavor::Codex => {
                argv.extend(["exec", "--json"].map(String::from));
                if let Some(m) = model {
                    argv.extend(["--model".into(), m.clone()]);
                }
                argv.extend(extra);
                // `-`: the prompt is on stdin.
                argv.push("-".into());
                Ok((argv, prompt))
            }
            Flavor::Gemini => {
                // Without a TTY on stdin, gemini runs headless with stdin as the prompt.
                if let Some(m) = model {
                    argv.extend(["--model".into(), m.clone()]);
                }
                argv.extend(extra);
                argv.extend(["--output-format", "json"].map(String::from));
                Ok((argv, prompt))
            }
            Flavor::Command(via) => {
                let mut argv: Vec<String> =
                    self.config.command.iter().cloned().chain(extra).collect();
                match via {
                    PromptVia::Stdin => Ok((argv, prompt)),
                    PromptVia::File => {
                        let path = call.dir.join("prompt.txt");
                        std::fs::write(&path, &call.prompt).map_err(|e| CallError::Failed {
                            message: format!("cannot write {}: {e}", path.display()),
                        })?;
                        place(&mut argv, "{prompt_file}", &path.display().to_string());
                        Ok((argv, None))
                    }
                    PromptVia::Arg => {
                        place(&mut argv, "{prompt}", &call.prompt);
                        Ok((argv, None))
                    }
                }
            }
        }
    }
}

/// Replaces a placeholder in the arguments after the program, or appends the value when
/// none holds it.
fn place(argv: &mut Vec<String>, placeholder: &str, value: &str) {
    let mut placed = false;
    for arg in argv.iter_mut().skip(1) {
        if arg.contains(placeholder) {
            *arg = arg.replace(placeholder, value);
            placed = true;
        }
    }
    if !placed {
        argv.push(value.to_string());
    }
}

// ---- claude ---------------------------------------------------------------------------

/// Whether stdout holds claude's result object.
fn claude_done(stdout: &[u8]) -> bool {
    claude_result(&String::from_utf8_lossy(tail_bytes(stdout, DETECT_WINDOW))).is_some()
}

/// The result object of `claude -p --output-format json` (or the last one of
/// `stream-json`, should the arguments ask for it).
fn claude_result(stdout: &str) -> Option<Map<String, Value>> {
    let is_result =
        |m: &Map<String, Value>| m.get("type").and_then(Value::as_str) == Some("result");
    if let Some(m) = json_object(stdout.trim()).filter(is_result) {
        return Some(m);
    }
    stdout
        .lines()
        .rev()
        .filter_map(|l| json_object(l.trim()))
        .find(is_result)
}

fn parse_claude(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(result) = claude_result(&stdout) else {
        let text = format!("{}\n{}", stdout, String::from_utf8_lossy(&out.stderr));
        return Err(no_result("claude", out, &text));
    };
    let text = result
        .get("structured_output")
        .filter(|v| !v.is_null())
        .map(Value::to_string)
        .or_else(|| {
            result
                .get("result")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .unwrap_or_default();
    let subtype = result.get("subtype").and_then(Value::as_str).unwrap_or("");
    let is_error = result
        .get("is_error")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        || subtype.starts_with("error");
    if is_error {
        let ended = format!("claude ended with {subtype}");
        if text.is_empty() {
            return Err(CallError::Failed { message: ended });
        }
        return Err(classify(&text, claude_retry_after(&text), || {
            CallError::Failed {
                message: format!("{ended}: {text}"),
            }
        }));
    }
    let usage = result.get("usage");
    let count = |k: &str| {
        usage
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let cache_read = count("cache_read_input_tokens");
    Ok(AgentReply {
        text,
        usage: Usage {
            // Anthropic counts cache reads and writes apart from `input_tokens`.
            input_tokens: count("input_tokens") + cache_read + count("cache_creation_input_tokens"),
            output_tokens: count("output_tokens"),
            cached_tokens: cache_read,
            cost_usd: result
                .get("total_cost_usd")
                .or_else(|| result.get("cost_usd"))
                .and_then(Value::as_f64),
        },
        session_id: string(&result, "session_id"),
        model: result
            .get("modelUsage")
            .and_then(Value::as_object)
            .and_then(|m| m.keys().next().cloned()),
        ..AgentReply::default()
    })
}

/// The wait until the reset time in "Claude AI usage limit reached|<epoch seconds>", or
/// one spelled out in the message ("try again in 5 minutes").
fn claude_retry_after(message: &str) -> Option<Duration> {
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

// ---- codex ----------------------------------------------------------------------------

/// Whether stdout holds the end of codex's turn.
fn codex_done(stdout: &[u8]) -> bool {
    String::from_utf8_lossy(tail_bytes(stdout, DETECT_WINDOW))
        .lines()
        .filter_map(|l| json_object(l.trim()))
        .any(|event| {
            matches!(
                event_type(&event),
                Some("turn.completed" | "turn.failed" | "task_complete")
            )
        })
}

/// The type of a codex event: `type`, or `msg.type` in the older format.
fn event_type(event: &Map<String, Value>) -> Option<&str> {
    event
        .get("type")
        .or_else(|| event.get("msg").and_then(|m| m.get("type")))
        .and_then(Value::as_str)
}

/// Parses the events of `codex exec --json`: the current ones (`thread.started`,
/// `item.completed`, `turn.completed`, `turn.failed`, `error`) and the older
/// `{"msg": {...}}` ones (`session_configured`, `agent_message`, `token_count`,
/// `task_complete`, `error`).
fn parse_codex(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut reply = AgentReply::default();
    let mut text = None;
    let mut completed = false;
    let mut failure = None;
    let mut last_error = None;
    for event in stdout.lines().filter_map(|l| json_object(l.trim())) {
        let msg = event.get("msg").and_then(Value::as_object);
        match (event_type(&event), msg) {
            (Some("thread.started"), None) => reply.session_id = string(&event, "thread_id"),
            (Some("item.completed"), None) => {
                let item = event.get("item").and_then(Value::as_object);
                let kind = item.and_then(|i| i.get("type").or_else(|| i.get("item_type")));
                if matches!(
                    kind.and_then(Value::as_str),
                    Some("agent_message" | "assistant_message")
                ) {
                    text = item.and_then(|i| string(i, "text"));
                }
            }
            (Some("turn.completed"), None) => {
                if let Some(u) = event.get("usage").and_then(Value::as_object) {
                    reply.usage.add(&codex_usage(u));
                }
                completed = true;
            }
            (Some("turn.failed"), None) => {
                failure = event
                    .get("error")
                    .and_then(Value::as_object)
                    .and_then(|e| string(e, "message"))
                    .or_else(|| Some("the turn failed".into()));
            }
            (Some("error"), None) => last_error = string(&event, "message"),
            (Some("session_configured"), Some(m)) => reply.session_id = string(m, "session_id"),
            (Some("agent_message"), Some(m)) => text = string(m, "message"),
            (Some("token_count"), Some(m)) => {
                // Totals so far: the last one counts.
                let totals = m
                    .get("info")
                    .and_then(|i| i.get("total_token_usage"))
                    .and_then(Value::as_object)
                    .unwrap_or(m);
                reply.usage = codex_usage(totals);
            }
            (Some("task_complete"), Some(m)) => {
                if let Some(t) = string(m, "last_agent_message") {
                    text = Some(t);
                }
                completed = true;
            }
            (Some("error"), Some(m)) => last_error = string(m, "message"),
            _ => {}
        }
    }
    // An `error` event alone may be a notice the agent recovered from ("Reconnecting...").
    let failure = failure.or_else(|| last_error.filter(|_| !completed));
    match failure {
        None if completed || (out.code == Some(0) && text.is_some()) => Ok(AgentReply {
            text: text.unwrap_or_default(),
            ..reply
        }),
        None => {
            let all = format!("{}\n{}", stdout, String::from_utf8_lossy(&out.stderr));
            Err(no_result("codex", out, &all))
        }
        Some(message) => Err(classify(&message, retry_hint(&message), || {
            CallError::Failed {
                message: format!("codex: {message}"),
            }
        })),
    }
}

fn codex_usage(u: &Map<String, Value>) -> Usage {
    let count = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input_tokens: count("input_tokens"),
        output_tokens: count("output_tokens"),
        cached_tokens: count("cached_input_tokens"),
        cost_usd: None,
    }
}

// ---- gemini ---------------------------------------------------------------------------

/// Whether stdout holds gemini's complete JSON object.
fn gemini_done(stdout: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stdout);
    text.trim_end().ends_with('}') && leading_json_object(&text).is_some()
}

/// The JSON object of the output: all of it, or from the first line that opens one (past
/// any notice printed before it).
fn leading_json_object(text: &str) -> Option<Map<String, Value>> {
    json_object(text.trim()).or_else(|| {
        let start = text.find("\n{")?;
        json_object(text[start..].trim())
    })
}

/// Exit codes of gemini's headless mode that retrying will not fix: input error, sandbox
/// error, configuration error, turn limit.
const GEMINI_PERMANENT: [i32; 4] = [42, 44, 52, 53];

/// The exit code of gemini when it is not authenticated.
const GEMINI_AUTH: i32 = 41;

fn parse_gemini(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let object = leading_json_object(&stdout);
    let error = object
        .as_ref()
        .and_then(|o| o.get("error").cloned())
        .or_else(|| leading_json_object(&stderr).and_then(|mut o| o.remove("error")))
        .and_then(|v| match v {
            Value::Object(m) => Some(m),
            _ => None,
        });
    let response = object
        .as_ref()
        .and_then(|o| o.get("response"))
        .and_then(Value::as_str);
    if let (Some(o), Some(response), None) = (&object, response, &error) {
        if out.code == Some(0) || out.code.is_none() {
            let mut reply = AgentReply {
                text: response.to_string(),
                session_id: string(o, "session_id"),
                ..AgentReply::default()
            };
            let models = o
                .get("stats")
                .and_then(|s| s.get("models"))
                .and_then(Value::as_object);
            let mut busiest = (0, None);
            for (name, stats) in models.into_iter().flatten() {
                let tokens = stats.get("tokens");
                let count = |k: &str| {
                    tokens
                        .and_then(|t| t.get(k))
                        .and_then(Value::as_u64)
                        .unwrap_or(0)
                };
                let usage = Usage {
                    input_tokens: count("prompt"),
                    // Thinking is output too.
                    output_tokens: count("candidates") + count("thoughts"),
                    cached_tokens: count("cached"),
                    cost_usd: None,
                };
                if usage.tokens() >= busiest.0 {
                    busiest = (usage.tokens(), Some(name.clone()));
                }
                reply.usage.add(&usage);
            }
            reply.model = busiest.1;
            return Ok(reply);
        }
    }
    let Some(error) = error else {
        return Err(no_result("gemini", out, &format!("{stdout}\n{stderr}")));
    };
    let message = string(&error, "message").unwrap_or_else(|| "unknown error".into());
    let kind = string(&error, "type").unwrap_or_default();
    let described = format!("gemini: {message}");
    let code = out.code;
    let error_code = error.get("code").map(Value::to_string).unwrap_or_default();
    let words = format!("{kind} {error_code} {message}");
    Err(classify(&words, retry_hint(&message), || {
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
    }))
}

// ---- command --------------------------------------------------------------------------

fn parse_command(out: &ProcOutput) -> Result<AgentReply, CallError> {
    // A program that exits non-zero (or is killed) gave no answer: that attempt failed,
    // unless what it printed says it was rate-limited or overloaded.
    let how = match (out.code, out.signal) {
        (Some(0), _) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.stdout_cut > 0 {
                // Only the end of a very long answer was kept: say so, with the true count.
                text = format!("[... {} bytes cut ...]\n{text}", out.stdout_cut);
            }
            return Ok(AgentReply {
                text,
                ..AgentReply::default()
            });
        }
        (_, Some(signal)) => format!("was killed by signal {signal}"),
        (code, None) => format!("exited with code {}", code.unwrap_or(-1)),
    };
    let said = output_tail(out);
    Err(classify(&said, retry_hint(&said), || CallError::Failed {
        message: format!("the agent's program {how}: {said}"),
    }))
}

// ---- classification -------------------------------------------------------------------

/// Rate limits and quotas.
static RATE_LIMITED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)rate[ _-]?limit|usage limit|hit your limit|\b429\b|too many requests|quota|resource_exhausted|exhausted your capacity",
    )
    .expect("the rate-limit pattern is valid")
});

/// Authentication: the backend is not usable as set up.
static UNAUTHENTICATED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)invalid api key|please run /login|not logged in|authentication_error|\b401\b|unauthorized")
        .expect("the authentication pattern is valid")
});

/// Failures worth retrying: overload, server errors, dropped connections.
static TRANSIENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)overloaded|\b5\d\d\b|api error|internal server error|service unavailable|stream disconnected|connection|network|timed? ?out|econnreset|fetch failed",
    )
    .expect("the transient pattern is valid")
});

/// Classifies an error message: a rate limit, missing authentication, a transient failure;
/// else what `otherwise` says.
fn classify(
    message: &str,
    retry_after: Option<Duration>,
    otherwise: impl FnOnce() -> CallError,
) -> CallError {
    if RATE_LIMITED.is_match(message) {
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

/// An HTTP client error other than a timeout or a rate limit: retrying will not fix it.
static CLIENT_ERROR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b4(0[0-79]|[1-9]\d)\b").expect("the client-error pattern is valid")
});

/// The error of an agent that printed no result: classified from its output when it
/// failed, else an unexpected output.
fn no_result(agent: &str, out: &ProcOutput, output: &str) -> CallError {
    let tail = output_tail(out);
    if out.code == Some(0) {
        return CallError::Failed {
            message: format!("{agent} printed no result (expected its JSON output): {tail}"),
        };
    }
    let ending = match (out.code, out.signal) {
        (_, Some(signal)) => format!("{agent} was killed by signal {signal}"),
        (code, None) => format!("{agent} exited with code {}", code.unwrap_or(-1)),
    };
    let message = format!("{ending}: {tail}");
    if RATE_LIMITED.is_match(output) {
        CallError::RateLimited {
            message,
            retry_after: claude_retry_after(output),
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

/// A wait spelled out in a message: "retry in 17.5s", "try again in 5 minutes", "retry
/// after 30 seconds".
fn retry_hint(message: &str) -> Option<Duration> {
    static HINT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?i)(?:retry|try again)\s+(?:after|in)\s+(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?)\b",
        )
        .expect("the retry pattern is valid")
    });
    let captures = HINT.captures(message)?;
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

// ---- helpers --------------------------------------------------------------------------

/// How much of the end of stdout the result detectors look at.
const DETECT_WINDOW: usize = 1 << 20;

/// How many lines of output a timeout or a failure reports.
const TAIL_LINES: usize = 20;

/// The most characters a tail holds.
const TAIL_CHARS: usize = 4000;

fn tail_bytes(bytes: &[u8], n: usize) -> &[u8] {
    &bytes[bytes.len().saturating_sub(n)..]
}

/// Parses a text that is one JSON object.
fn json_object(text: &str) -> Option<Map<String, Value>> {
    if !text.starts_with('{') || !text.ends_with('}') {
        return None;
    }
    match serde_json::from_str(text) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

fn string(object: &Map<String, Value>, key: &str) -> Option<String> {
    object.get(key).and_then(Value::as_str).map(String::from)
}

/// The last lines of a text, at most [`TAIL_CHARS`] characters.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let tail = lines[lines.len().saturating_sub(n)..].join("\n");
    let skip = tail.chars().count().saturating_sub(TAIL_CHARS);
    tail.chars().skip(skip).collect()
}

/// The last lines of stdout and of stderr.
fn output_tail(out: &ProcOutput) -> String {
    let stdout = last_lines(&String::from_utf8_lossy(&out.stdout), TAIL_LINES);
    let stderr = last_lines(&String::from_utf8_lossy(&out.stderr), TAIL_LINES);
    match (stdout.is_empty(), stderr.is_empty()) {
        (_, true) => stdout,
        (true, false) => stderr,
        (false, false) => format!("{stdout}\n--- stderr ---\n{stderr}"),
    }
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

    #[test]
    fn the_claude_reset_epoch_gives_the_wait() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs();
        let wait = claude_retry_after(&format!("Claude AI usage limit reached|{}", now + 600))
            .expect("a wait");
        assert!(wait <= Duration::from_secs(600) && wait >= Duration::from_secs(590));
    }

    #[test]
    fn placeholders_are_replaced_or_the_value_appended() {
        let mut argv = vec!["tool".to_string(), "--in={prompt}".into()];
        place(&mut argv, "{prompt}", "hi");
        assert_eq!(argv, ["tool", "--in=hi"]);
        let mut argv = vec!["tool".to_string(), "-x".into()];
        place(&mut argv, "{prompt}", "hi");
        assert_eq!(argv, ["tool", "-x", "hi"]);
    }

    #[test]
    fn detectors_see_complete_results_only() {
        assert!(claude_done(b"{\"type\":\"result\",\"result\":\"x\"}\n"));
        assert!(!claude_done(b"{\"type\":\"result\",\"res"));
        assert!(codex_done(
            b"{\"type\":\"turn.started\"}\n{\"type\":\"turn.completed\"}\n"
        ));
        assert!(!codex_done(b"{\"type\":\"turn.started\"}\n"));
        assert!(gemini_done(b"{\n  \"response\": \"x\"\n}\n"));
        assert!(!gemini_done(b"{\n  \"response\": \"x\"\n"));
    }
}

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
use crate::model::{AgentKind, Permissions};

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
                return Err("a command agent needs a `command`".to_string());
            }
            let via = match config.prompt_via.as_deref() {
                None | Some("stdin") => PromptVia::Stdin,
                Some("file") => PromptVia::File,
                Some("arg") => PromptVia::Arg,
                Some(other) => {
                    return Err(format!(
                        "prompt_via must be stdin, file or arg, not `{other}`"
                    ));
                }
            };
            Flavor::Command(via)
        }
        other => {
            return Err(format!(
                "the {} backend does not run a program",
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
            // `codex exec --output-schema FILE` sends the schema as the Responses API's
            // strict `text.format` json_schema: the server constrains the final message.
            Flavor::Codex => Capabilities {
                json_schema: true,
                cost: false,
                usage: true,
            },
            Flavor::Gemini => Capabilities {
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
        // A retried call starts fresh files; the earlier output stays as `stdout.1`...
        for name in ["stdout", "stderr"] {
            set_aside(&call.dir.join(name));
        }
        let mut env: Vec<(String, String)> =
            self.config.env.iter().chain(&call.env).cloned().collect();
        for (key, value) in self.default_env() {
            if !env.iter().any(|(k, _)| k == key) && std::env::var_os(key).is_none() {
                env.push((key.to_string(), value.to_string()));
            }
        }
        let spec = ProcSpec {
            argv,
            cwd: call.cwd.clone(),
            env,
            stdin,
            timeout: call.timeout,
            idle_timeout: call.idle_timeout,
            stdout_path: Some(call.dir.join("stdout")),
            stderr_path: Some(call.dir.join("stderr")),
            pid_file: Some(call.dir.join("process")),
            process_log: None,
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

    /// Environment variables a call gets unless the agent's `env` (or ralph-flow's own
    /// environment) sets them.
    fn default_env(&self) -> Vec<(&'static str, &'static str)> {
        match self.flavor {
            Flavor::Claude => {
                // claude retries API errors itself (10 times by default, silently): the
                // executor retries, with backoff and a visible status.
                let mut env = vec![("CLAUDE_CODE_MAX_RETRIES", CLAUDE_MAX_RETRIES)];
                if self.config.permissions == Permissions::Full {
                    // `bypassPermissions` refuses to run as root unless told it is sandboxed;
                    // `permissions = "full"` is that decision.
                    env.push(("IS_SANDBOX", "1"));
                }
                env
            }
            // Headless gemini refuses an untrusted directory (exit 55): ralph-flow chose the
            // cwd. (The variable, unlike `--skip-trust`, is ignored by older versions.)
            Flavor::Gemini => vec![("GEMINI_CLI_TRUST_WORKSPACE", "true")],
            Flavor::Codex | Flavor::Command(_) => Vec::new(),
        }
    }

    /// The argv and the stdin of a call.
    fn invocation(&self, call: &AgentCall) -> Result<(Vec<String>, Option<Vec<u8>>), CallError> {
        let model = call.model.as_ref().or(self.config.model.as_ref());
        let user: Vec<String> = self.config.args.iter().chain(&call.args).cloned().collect();
        let extra = user.clone().into_iter();
        let prompt = Some(call.prompt.clone().into_bytes());
        let mut argv = vec![self.program.clone()];
        let permissions = self.config.permissions;
        // The agent's own `args` may set the permission flags; then they win.
        let unless_set = |flags: &[&str], ours: &[&str]| -> Vec<String> {
            if user.iter().any(|a| {
                flags
                    .iter()
                    .any(|f| a == f || a.starts_with(&format!("{f}=")))
            }) {
                Vec::new()
            } else {
                ours.iter().map(|s| s.to_string()).collect()
            }
        };
        match self.flavor {
            Flavor::Claude => {
                argv.extend(["-p", "--output-format", "json"].map(String::from));
                if let Some(m) = model {
                    argv.extend(["--model".into(), m.clone()]);
                }
                if let Some(schema) = &call.schema {
                    argv.extend(["--json-schema".into(), schema.to_string()]);
                }
                argv.extend(unless_set(
                    &[
                        "--permission-mode",
                        "--dangerously-skip-permissions",
                        "--allow-dangerously-skip-permissions",
                    ],
                    &["--permission-mode", claude_permission_mode(permissions)],
                ));
                argv.extend(extra);
                Ok((argv, prompt))
            }
            Flavor::Codex => {
                // ralph-flow chooses the cwd, and `permissions` is the trust decision:
                // outside a git repository codex otherwise exits ("Not inside a trusted
                // directory and --skip-git-repo-check was not specified").
                argv.extend(["exec", "--json", "--skip-git-repo-check"].map(String::from));
                argv.extend(unless_set(
                    &[
                        "--sandbox",
                        "-s",
                        "--full-auto",
                        "--dangerously-bypass-approvals-and-sandbox",
                        "--yolo",
                    ],
                    &["--sandbox", codex_sandbox(permissions)],
                ));
                if let Some(m) = model {
                    argv.extend(["--model".into(), m.clone()]);
                }
                if let Some(schema) = &call.schema {
                    let path = call.dir.join("output-schema.json");
                    std::fs::write(&path, schema.to_string()).map_err(|e| CallError::Failed {
                        message: format!("cannot write {}: {e}", path.display()),
                    })?;
                    argv.extend(["--output-schema".into(), path.display().to_string()]);
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
                argv.extend(unless_set(
                    &["--approval-mode", "--yolo", "-y"],
                    &["--approval-mode", gemini_approval_mode(permissions)],
                ));
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

/// The value of `CLAUDE_CODE_MAX_RETRIES` a call gets unless set: claude's own retries of
/// API errors (its default is 10, with backoff, and it prints nothing meanwhile).
const CLAUDE_MAX_RETRIES: &str = "2";

/// `claude --permission-mode` for a permissions setting. In `-p` mode `default` denies
/// every tool use that would ask (writes, most commands) and reports it in
/// `permission_denials`; `acceptEdits` allows file edits; `bypassPermissions` allows all
/// (as root only with `IS_SANDBOX=1`).
fn claude_permission_mode(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "default",
        Permissions::Edit => "acceptEdits",
        Permissions::Full => "bypassPermissions",
    }
}

/// `codex exec --sandbox` for a permissions setting (`exec` never asks for approval: what
/// the sandbox forbids fails).
fn codex_sandbox(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "read-only",
        Permissions::Edit => "workspace-write",
        Permissions::Full => "danger-full-access",
    }
}

/// `gemini --approval-mode` for a permissions setting. Headless `default` does not offer
/// the model its write and shell tools at all.
fn gemini_approval_mode(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "default",
        Permissions::Edit => "auto_edit",
        Permissions::Full => "yolo",
    }
}

/// Moves an existing output file aside (`stdout` to the first free `stdout.N`), so that a
/// retried call in the same directory starts a fresh one.
fn set_aside(path: &std::path::Path) {
    if !path.exists() {
        return;
    }
    for n in 1.. {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        let target = std::path::PathBuf::from(name);
        if !target.exists() {
            if let Err(e) = std::fs::rename(path, &target) {
                tracing::warn!("cannot move {} aside: {e}", path.display());
            }
            return;
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
        return Err(claude_error(&result, subtype, &text));
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
        raw: String::new(),
        denied: claude_denials(&result),
        ..AgentReply::default()
    })
}

/// The error of a result with `is_error`. An API error keeps `subtype: "success"` and
/// carries the HTTP status in `api_error_status`: 429 is a rate limit (claude prints no
/// reset time: "API Error: Request rejected (429) · ... Please try again later."), 5xx and
/// 529 (overloaded) are transient, 401 and 403 mean the backend is not usable as set up,
/// another 4xx is permanent.
fn claude_error(result: &Map<String, Value>, subtype: &str, text: &str) -> CallError {
    let status = result.get("api_error_status").and_then(Value::as_u64);
    let message = match (status, subtype) {
        (Some(status), _) => format!("claude reported an error (HTTP {status}): {text}"),
        (None, "success" | "") => format!("claude reported an error: {text}"),
        (None, subtype) if text.is_empty() => format!("claude ended with {subtype}"),
        (None, subtype) => format!("claude ended with {subtype}: {text}"),
    };
    let retry_after = claude_retry_after(text);
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
fn claude_denials(result: &Map<String, Value>) -> Vec<String> {
    let Some(denials) = result.get("permission_denials").and_then(Value::as_array) else {
        return Vec::new();
    };
    denials
        .iter()
        .filter_map(Value::as_object)
        .map(|d| {
            let tool = string(d, "tool_name").unwrap_or_else(|| "tool".into());
            let input = d.get("tool_input").and_then(Value::as_object);
            let what = input.and_then(|i| {
                [
                    "file_path",
                    "command",
                    "path",
                    "notebook_path",
                    "url",
                    "pattern",
                ]
                .iter()
                .find_map(|k| string(i, k))
            });
            match what {
                Some(w) => format!("{tool}: {w}"),
                None => tool,
            }
        })
        .collect()
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
            denied: codex_denials(&String::from_utf8_lossy(&out.stderr)),
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

/// Actions codex reports it refused: its JSON events do not say (a refused patch, a
/// command failing on the read-only file system look like any tool output), but its log on
/// stderr does: `ERROR codex_core::tools::router: error=patch rejected: writing is blocked
/// by read-only sandbox; rejected by user approval settings`.
fn codex_denials(stderr: &str) -> Vec<String> {
    static DENIED: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?m)ERROR codex_core::tools::router: error=(.*(?:rejected|blocked|denied).*)$")
            .expect("the denial pattern is valid")
    });
    DENIED
        .captures_iter(stderr)
        .map(|c| c[1].trim().to_string())
        .collect()
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

/// The JSON object that ends the output, past any log before it: gemini prints its error
/// object last on stderr, after its retry messages and stack traces.
fn trailing_json_object(text: &str) -> Option<Map<String, Value>> {
    let text = text.trim_end();
    if !text.ends_with('}') {
        return None;
    }
    if let Some(m) = json_object(text.trim_start()) {
        return Some(m);
    }
    let mut end = text.len();
    while let Some(start) = text[..end].rfind("\n{") {
        if let Some(m) = json_object(text[start..].trim()) {
            return Some(m);
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

fn parse_gemini(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let object = leading_json_object(&stdout);
    let error = object
        .as_ref()
        .and_then(|o| o.get("error").cloned())
        .or_else(|| trailing_json_object(&stderr).and_then(|mut o| o.remove("error")))
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
            let mut main = None;
            for (name, stats) in models.into_iter().flatten() {
                // Newer versions say which model did the turn (`roles.main`); the others
                // served side requests (`utility_router`...).
                if stats.get("roles").and_then(|r| r.get("main")).is_some() {
                    main = Some(name.clone());
                }
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
            reply.model = main.or(busiest.1);
            return Ok(reply);
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
    let message = string(&error, "message").unwrap_or_else(|| "unknown error".into());
    let kind = string(&error, "type").unwrap_or_default();
    let code = out.code;
    let status = gemini_status(error.get("code").and_then(Value::as_u64), code);
    let described = match status {
        Some(s) => format!("gemini: API error (HTTP {s}): {message}"),
        None => format!("gemini: {message}"),
    };
    let error_code = error.get("code").map(Value::to_string).unwrap_or_default();
    let words = format!("{kind} {error_code} {message}");
    let retry_after = retry_hint(&message);
    match status {
        Some(429) => {
            return Err(CallError::RateLimited {
                message: described,
                retry_after,
            });
        }
        Some(401 | 403) => return Err(CallError::Missing { message: described }),
        Some(400) if UNAUTHENTICATED.is_match(&message) => {
            return Err(CallError::Missing { message: described });
        }
        Some(408) => {
            return Err(CallError::Transient {
                message: described,
                retry_after,
            });
        }
        Some(s) if s >= 500 => {
            return Err(CallError::Transient {
                message: described,
                retry_after,
            });
        }
        Some(_) => return Err(CallError::Failed { message: described }),
        None => {}
    }
    Err(classify(&words, retry_after, || {
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
fn relabel(error: CallError, message: String) -> CallError {
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
        CallError::Failed { .. } => CallError::Failed { message },
        timeout @ CallError::Timeout { .. } => timeout,
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
    if PERMANENT.is_match(output) {
        CallError::Failed { message }
    } else if RATE_LIMITED.is_match(output) {
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
fn clock_hint(message: &str, now: u64, offset: i64) -> Option<Duration> {
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

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
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

    // ---- the real CLIs' captured output (tests/fakes/captures, see tests/realcli) ----------

    macro_rules! capture {
        ($cli:literal, $case:literal) => {
            captured(
                include_str!(concat!(
                    "../../tests/fakes/captures/",
                    $cli,
                    "/",
                    $case,
                    ".stdout"
                )),
                include_str!(concat!(
                    "../../tests/fakes/captures/",
                    $cli,
                    "/",
                    $case,
                    ".stderr"
                )),
                include_str!(concat!(
                    "../../tests/fakes/captures/",
                    $cli,
                    "/",
                    $case,
                    ".exit"
                )),
            )
        };
    }

    fn captured(stdout: &str, stderr: &str, exit: &str) -> ProcOutput {
        ProcOutput {
            code: Some(exit.trim().parse().expect("an exit code")),
            signal: None,
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            ended: Ended::Exited,
            elapsed: Duration::from_secs(1),
            stdout_cut: 0,
            stderr_cut: 0,
        }
    }

    const REPLY: &str = "MOCK-REPLY-4F7: the mock model says hello.";

    fn backend(kind: AgentKind, permissions: Permissions) -> CliBackend {
        let config = AgentConfig {
            name: "a".into(),
            kind,
            permissions,
            ..AgentConfig::default()
        };
        let flavor = match kind {
            AgentKind::Claude => Flavor::Claude,
            AgentKind::Codex => Flavor::Codex,
            _ => Flavor::Gemini,
        };
        CliBackend {
            config,
            flavor,
            program: kind.as_str().into(),
        }
    }

    fn call_in(dir: &std::path::Path, schema: Option<Value>) -> AgentCall {
        AgentCall {
            stage: "s".into(),
            scope: String::new(),
            attempt: 1,
            prompt: "p".into(),
            model: None,
            args: Vec::new(),
            env: Vec::new(),
            cwd: dir.to_path_buf(),
            dir: dir.to_path_buf(),
            timeout: None,
            idle_timeout: None,
            schema,
            max_tokens: None,
        }
    }

    fn argv_of(kind: AgentKind, permissions: Permissions) -> Vec<String> {
        let dir = tempfile::tempdir().expect("a temp dir");
        backend(kind, permissions)
            .invocation(&call_in(dir.path(), None))
            .expect("an invocation")
            .0
    }

    #[test]
    fn real_successes_parse() {
        let claude = parse_claude(&capture!("claude", "ok")).expect("a reply");
        assert_eq!(claude.text, REPLY);
        assert_eq!(claude.usage.input_tokens, 4321 + 98);
        assert_eq!(claude.usage.cached_tokens, 98);
        assert_eq!(claude.usage.output_tokens, 765);
        assert!(claude.denied.is_empty());
        let structured = parse_claude(&capture!("claude", "structured")).expect("a reply");
        assert_eq!(structured.text, r#"{"verdict":"MOCK-REPLY-4F7","count":3}"#);
        let codex = parse_codex(&capture!("codex", "ok")).expect("a reply");
        assert_eq!(codex.text, REPLY);
        assert_eq!(
            (codex.usage.input_tokens, codex.usage.output_tokens),
            (4321, 765)
        );
        assert_eq!(codex.usage.cached_tokens, 98);
        let structured = parse_codex(&capture!("codex", "structured")).expect("a reply");
        assert_eq!(
            serde_json::from_str::<Value>(&structured.text).expect("JSON"),
            serde_json::json!({"verdict": "MOCK-REPLY-4F7", "count": 3})
        );
        let gemini = parse_gemini(&capture!("gemini", "ok")).expect("a reply");
        assert_eq!(gemini.text, REPLY);
        // The turn's model, not the router's (both report the same usage here).
        assert_eq!(gemini.model.as_deref(), Some("gemini-3.8-flash"));
        assert_eq!(gemini.usage.input_tokens, 4321 + 11);
    }

    #[test]
    fn claude_api_errors_use_the_http_status() {
        let rate = parse_claude(&capture!("claude", "rate_limit")).expect_err("an error");
        assert!(matches!(rate, CallError::RateLimited { .. }), "{rate:?}");
        for out in [
            capture!("claude", "overloaded"),
            capture!("claude", "server_error"),
        ] {
            let e = parse_claude(&out).expect_err("an error");
            assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        }
        let key = parse_claude(&capture!("claude", "invalid_key")).expect_err("an error");
        assert!(matches!(key, CallError::Missing { .. }), "{key:?}");
        let message = parse_claude(&capture!("claude", "overloaded"))
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
        let result = json_object(
            r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"result":"API Error: 400 prompt is too long"}"#,
        )
        .expect("an object");
        let e = claude_error(&result, "success", "API Error: 400 prompt is too long");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
    }

    #[test]
    fn claude_denials_are_reported() {
        let reply = parse_claude(&capture!("claude", "write_default")).expect("a reply");
        assert_eq!(
            reply.denied,
            ["Write: /WORK/claude-write_default/cwd/mock-written.txt"]
        );
        let reply = parse_claude(&capture!("claude", "write_accept_edits")).expect("a reply");
        assert!(reply.denied.is_empty());
    }

    #[test]
    fn claude_bypass_as_root_is_permanent() {
        let e = parse_claude(&capture!("claude", "write_bypass")).expect_err("an error");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
    }

    #[test]
    fn claude_gets_bounded_retries_and_the_sandbox_flag_for_full() {
        let env = backend(AgentKind::Claude, Permissions::ReadOnly).default_env();
        assert!(env.contains(&("CLAUDE_CODE_MAX_RETRIES", CLAUDE_MAX_RETRIES)));
        assert!(!env.iter().any(|(k, _)| *k == "IS_SANDBOX"));
        let env = backend(AgentKind::Claude, Permissions::Full).default_env();
        assert!(env.contains(&("IS_SANDBOX", "1")));
    }

    #[test]
    fn permissions_map_to_each_clis_flags() {
        use AgentKind::*;
        use Permissions::*;
        let has = |argv: &[String], pair: [&str; 2]| {
            argv.windows(2).any(|w| w[0] == pair[0] && w[1] == pair[1])
        };
        assert!(has(
            &argv_of(Claude, ReadOnly),
            ["--permission-mode", "default"]
        ));
        assert!(has(
            &argv_of(Claude, Edit),
            ["--permission-mode", "acceptEdits"]
        ));
        assert!(has(
            &argv_of(Claude, Full),
            ["--permission-mode", "bypassPermissions"]
        ));
        assert!(has(&argv_of(Codex, ReadOnly), ["--sandbox", "read-only"]));
        assert!(has(&argv_of(Codex, Edit), ["--sandbox", "workspace-write"]));
        assert!(has(
            &argv_of(Codex, Full),
            ["--sandbox", "danger-full-access"]
        ));
        assert!(has(
            &argv_of(Gemini, ReadOnly),
            ["--approval-mode", "default"]
        ));
        assert!(has(
            &argv_of(Gemini, Edit),
            ["--approval-mode", "auto_edit"]
        ));
        assert!(has(&argv_of(Gemini, Full), ["--approval-mode", "yolo"]));
        // The agent's own flags win.
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut b = backend(Codex, Edit);
        b.config.args = vec!["--sandbox".into(), "read-only".into()];
        let argv = b.invocation(&call_in(dir.path(), None)).expect("argv").0;
        assert_eq!(argv.iter().filter(|a| *a == "--sandbox").count(), 1);
    }

    #[test]
    fn codex_high_demand_is_transient() {
        let e = parse_codex(&capture!("codex", "server_error")).expect_err("an error");
        assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        let e = parse_codex(&capture!("codex", "overloaded")).expect_err("an error");
        assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        let e = parse_codex(&capture!("codex", "rate_limit")).expect_err("an error");
        assert!(matches!(e, CallError::RateLimited { .. }), "{e:?}");
        let e = parse_codex(&capture!("codex", "invalid_key")).expect_err("an error");
        assert!(matches!(e, CallError::Missing { .. }), "{e:?}");
    }

    #[test]
    fn codex_outside_a_git_repo_is_permanent_and_avoided() {
        let e = parse_codex(&capture!("codex", "untrusted")).expect_err("an error");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
        assert!(
            argv_of(AgentKind::Codex, Permissions::ReadOnly)
                .contains(&"--skip-git-repo-check".to_string())
        );
    }

    #[test]
    fn codex_usage_limit_clock_time_gives_the_wait() {
        let e = parse_codex(&capture!("codex", "usage_limit")).expect_err("an error");
        let CallError::RateLimited { retry_after, .. } = e else {
            panic!("a rate limit: {e:?}");
        };
        let wait = retry_after.expect("a wait");
        assert!(wait <= Duration::from_secs(86_400), "{wait:?}");
        // 2026-11-23 11:47:00 UTC.
        let now = 1_795_434_420;
        let msg = "You’ve hit your usage limit. Upgrade to Pro, visit https://chatgpt.com/settings/usage to purchase more credits or try again at 12:47 PM.";
        assert_eq!(clock_hint(msg, now, 0), Some(Duration::from_secs(3600)));
        assert_eq!(clock_hint(msg, now, 3600), Some(Duration::ZERO));
        assert_eq!(
            clock_hint("try again at 8:35 AM.", now, 0),
            Some(Duration::from_secs(
                86_400 - (11 * 3600 + 47 * 60) + 8 * 3600 + 35 * 60
            ))
        );
        assert_eq!(
            clock_hint("or try again at Nov 24th, 2026 12:05 AM.", now, 0),
            Some(Duration::from_secs(86_400 - (11 * 3600 + 47 * 60) + 5 * 60))
        );
    }

    #[test]
    fn codex_gets_the_output_schema_in_a_file() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let schema = serde_json::json!({"type": "object"});
        let b = backend(AgentKind::Codex, Permissions::ReadOnly);
        assert!(b.capabilities().json_schema);
        let argv = b
            .invocation(&call_in(dir.path(), Some(schema.clone())))
            .expect("argv")
            .0;
        let at = argv
            .iter()
            .position(|a| a == "--output-schema")
            .expect("the flag");
        let written = std::fs::read_to_string(&argv[at + 1]).expect("the schema file");
        assert_eq!(
            serde_json::from_str::<Value>(&written).expect("JSON"),
            schema
        );
        assert_eq!(argv.last().map(String::as_str), Some("-"));
    }

    #[test]
    fn codex_denials_come_from_its_log() {
        let reply = parse_codex(&capture!("codex", "write_read_only")).expect("a reply");
        assert_eq!(reply.denied.len(), 1, "{:?}", reply.denied);
        assert!(
            reply.denied[0].starts_with("patch rejected"),
            "{:?}",
            reply.denied
        );
        let reply = parse_codex(&capture!("codex", "write_workspace")).expect("a reply");
        assert!(reply.denied.is_empty());
    }

    #[test]
    fn gemini_untrusted_is_permanent_and_avoided() {
        let e = parse_gemini(&capture!("gemini", "untrusted")).expect_err("an error");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
        let env = backend(AgentKind::Gemini, Permissions::ReadOnly).default_env();
        assert!(env.contains(&("GEMINI_CLI_TRUST_WORKSPACE", "true")));
    }

    #[test]
    fn gemini_invalid_key_is_missing() {
        let e = parse_gemini(&capture!("gemini", "invalid_key")).expect_err("an error");
        assert!(matches!(e, CallError::Missing { .. }), "{e:?}");
    }

    #[test]
    fn gemini_api_errors_use_the_status() {
        let e = parse_gemini(&capture!("gemini", "rate_limit")).expect_err("an error");
        let CallError::RateLimited { retry_after, .. } = &e else {
            panic!("a rate limit: {e:?}");
        };
        assert!(retry_after.is_some_and(|d| d.as_secs() == 45), "{e:?}");
        for out in [
            capture!("gemini", "overloaded"),
            capture!("gemini", "server_error"),
        ] {
            let e = parse_gemini(&out).expect_err("an error");
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
    fn earlier_output_is_set_aside() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let out = dir.path().join("stdout");
        std::fs::write(&out, "first").expect("written");
        set_aside(&out);
        std::fs::write(&out, "second").expect("written");
        set_aside(&out);
        assert!(!out.exists());
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).expect("read");
        assert_eq!(read("stdout.1"), "first");
        assert_eq!(read("stdout.2"), "second");
        set_aside(&dir.path().join("stderr"));
    }
}

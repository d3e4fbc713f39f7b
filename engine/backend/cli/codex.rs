//! codex (`@openai/codex`), run as `codex exec --json`: its sandboxes, its events (the
//! current ones and the older `msg` ones), its errors and the actions its sandbox refused.

use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;

use super::classify::{classify, no_result, retry_hint};
use super::invocation::{Launch, Request, write_failed};
use super::output::{collapse, detect_window, json_object};
use super::{CliAgent, Program};
use crate::backend::de::lenient;
use crate::backend::process::ProcOutput;
use crate::backend::{AgentConfig, AgentReply, CallError, Capabilities, Usage};
use crate::model::Permissions;

/// The `codex` agent CLI.
pub(super) struct Codex;

impl CliAgent for Codex {
    fn program(&self) -> Option<Program> {
        Some(Program {
            name: "codex",
            variable: "RALPH_FLOW_CODEX",
            package: "@openai/codex",
        })
    }

    fn key_variables(&self) -> &'static [&'static str] {
        &["OPENAI_API_KEY", "CODEX_API_KEY"]
    }

    /// codex reports its tokens, not their cost.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cost: false,
            usage: true,
        }
    }

    /// codex logs the commands its sandbox refused at WARN only (its default shows errors):
    /// the denials are read from that log.
    fn default_env(&self, _config: &AgentConfig) -> Vec<(&'static str, &'static str)> {
        vec![("RUST_LOG", RUST_LOG)]
    }

    /// `RUST_LOG` in ralph-flow's environment is ralph-flow's own log filter
    /// (`ralph_flow=debug` would silence codex's log): only the agent's `env` sets codex's.
    fn decided_env(&self) -> &'static [&'static str] {
        &["RUST_LOG"]
    }

    fn launch(&self, request: &Request<'_>) -> Result<Launch, CallError> {
        let mut argv = vec![request.program.to_string()];
        // ralph-flow chooses the cwd, and `permissions` is the trust decision: outside a git
        // repository codex otherwise exits ("Not inside a trusted directory and
        // --skip-git-repo-check was not specified").
        argv.extend(["exec", "--json", "--skip-git-repo-check"].map(String::from));
        argv.extend(request.unless_set(
            &[
                "--sandbox",
                "-s",
                "--full-auto",
                "--dangerously-bypass-approvals-and-sandbox",
                "--yolo",
            ],
            &["--sandbox", sandbox(request.config.permissions)],
        ));
        if let Some(m) = request.model {
            argv.extend(["--model".into(), m.clone()]);
        }
        if let Some(schema) = request.native {
            let path = request.call.dir.join("output-schema.json");
            std::fs::write(&path, schema.to_string()).map_err(|e| write_failed(&path, e))?;
            argv.extend(["--output-schema".into(), path.display().to_string()]);
        }
        argv.extend(request.user_args.iter().cloned());
        // `-`: the prompt is on stdin.
        argv.push("-".into());
        Ok(Launch::stdin(argv, &request.prompt))
    }

    fn result_done(&self) -> Option<fn(&[u8]) -> bool> {
        Some(done)
    }

    fn parse(&self, out: &ProcOutput) -> Result<AgentReply, CallError> {
        parse(out)
    }
}

/// The log filter of codex: its default (errors, among them the patches it rejects) and the
/// sandbox's refusals (`codex_sandboxing::violation: recorded sandbox violation: ...`).
const RUST_LOG: &str = "error,codex_sandboxing::violation=warn";

/// `codex exec --sandbox` for a permissions setting (`exec` never asks for approval: what
/// the sandbox forbids fails).
fn sandbox(p: Permissions) -> &'static str {
    match p {
        Permissions::ReadOnly => "read-only",
        Permissions::Edit => "workspace-write",
        Permissions::Full => "danger-full-access",
    }
}

/// A line of `codex exec --json`: an event, or an event of the older format, wrapped in
/// `msg`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Line {
    Event(Event),
    Older { msg: OlderEvent },
}

/// An event of the current format. Others (`turn.started`, `item.started`...) are ignored.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Event {
    #[serde(rename = "thread.started")]
    ThreadStarted {
        #[serde(default, deserialize_with = "lenient")]
        thread_id: Option<String>,
    },
    #[serde(rename = "item.completed")]
    ItemCompleted {
        #[serde(default, deserialize_with = "lenient")]
        item: Item,
    },
    #[serde(rename = "turn.completed")]
    TurnCompleted {
        #[serde(default, deserialize_with = "lenient")]
        usage: Option<TokenUsage>,
    },
    #[serde(rename = "turn.failed")]
    TurnFailed {
        #[serde(default, deserialize_with = "lenient")]
        error: Option<Failure>,
    },
    /// An error, or a notice the agent may recover from ("Reconnecting...").
    #[serde(rename = "error")]
    Error {
        #[serde(default, deserialize_with = "lenient")]
        message: Option<String>,
    },
    #[serde(other)]
    Other,
}

/// An event of the older format, in `msg`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum OlderEvent {
    #[serde(rename = "session_configured")]
    SessionConfigured {
        #[serde(default, deserialize_with = "lenient")]
        session_id: Option<String>,
    },
    #[serde(rename = "agent_message")]
    AgentMessage {
        #[serde(default, deserialize_with = "lenient")]
        message: Option<String>,
    },
    /// The totals so far, in `info.total_token_usage` or in the event itself.
    #[serde(rename = "token_count")]
    TokenCount {
        #[serde(default, deserialize_with = "lenient")]
        info: Option<TokenInfo>,
        #[serde(flatten)]
        usage: TokenUsage,
    },
    #[serde(rename = "task_complete")]
    TaskComplete {
        #[serde(default, deserialize_with = "lenient")]
        last_agent_message: Option<String>,
    },
    #[serde(rename = "error")]
    Error {
        #[serde(default, deserialize_with = "lenient")]
        message: Option<String>,
    },
    #[serde(other)]
    Other,
}

/// A completed item: the agent's message is the answer; a command that failed may show a
/// refusal of the sandbox.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Item {
    #[serde(rename = "type", deserialize_with = "lenient")]
    kind: Option<String>,
    /// The type, as some versions name it.
    #[serde(deserialize_with = "lenient")]
    item_type: Option<String>,
    #[serde(deserialize_with = "lenient")]
    text: Option<String>,
    /// A `command_execution`'s command (`/bin/bash -lc '...'`), its output and exit code.
    #[serde(deserialize_with = "lenient")]
    command: Option<String>,
    #[serde(deserialize_with = "lenient")]
    aggregated_output: Option<String>,
    #[serde(deserialize_with = "lenient")]
    exit_code: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Failure {
    #[serde(deserialize_with = "lenient")]
    message: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenInfo {
    #[serde(deserialize_with = "lenient")]
    total_token_usage: Option<TokenUsage>,
}

/// OpenAI's token counts: `input_tokens` includes the cached ones.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenUsage {
    #[serde(deserialize_with = "lenient")]
    input_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    output_tokens: u64,
    #[serde(deserialize_with = "lenient")]
    cached_input_tokens: u64,
}

impl From<TokenUsage> for Usage {
    fn from(u: TokenUsage) -> Self {
        Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_tokens: u.cached_input_tokens,
            ..Usage::default()
        }
    }
}

/// Whether stdout holds the end of codex's turn.
pub(super) fn done(stdout: &[u8]) -> bool {
    detect_window(stdout)
        .lines()
        .filter_map(|l| json_object::<Line>(l.trim()))
        .any(|line| {
            matches!(
                line,
                Line::Event(Event::TurnCompleted { .. } | Event::TurnFailed { .. })
                    | Line::Older {
                        msg: OlderEvent::TaskComplete { .. }
                    }
            )
        })
}

/// Parses the events of `codex exec --json`: the current ones (`thread.started`,
/// `item.completed`, `turn.completed`, `turn.failed`, `error`) and the older
/// `{"msg": {...}}` ones (`session_configured`, `agent_message`, `token_count`,
/// `task_complete`, `error`).
pub(super) fn parse(out: &ProcOutput) -> Result<AgentReply, CallError> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut reply = AgentReply::default();
    let mut text = None;
    let mut completed = false;
    let mut failure = None;
    let mut last_error = None;
    let mut refused = Vec::new();
    for line in stdout.lines().filter_map(|l| json_object::<Line>(l.trim())) {
        match line {
            Line::Event(event) => match event {
                Event::ThreadStarted { thread_id } => reply.session_id = thread_id,
                Event::ItemCompleted { item } => match item.kind.or(item.item_type).as_deref() {
                    Some("agent_message" | "assistant_message") => text = item.text,
                    Some("command_execution") if item.exit_code.is_some_and(|c| c != 0) => {
                        if let Some(r) = refused_command(item.command, item.aggregated_output) {
                            refused.push(r);
                        }
                    }
                    _ => {}
                },
                Event::TurnCompleted { usage } => {
                    if let Some(u) = usage {
                        reply.usage.add(&u.into());
                    }
                    completed = true;
                }
                Event::TurnFailed { error } => {
                    failure = Some(
                        error
                            .and_then(|e| e.message)
                            .unwrap_or_else(|| "the turn failed".into()),
                    );
                }
                Event::Error { message } => last_error = message,
                Event::Other => {}
            },
            Line::Older { msg } => match msg {
                OlderEvent::SessionConfigured { session_id } => reply.session_id = session_id,
                OlderEvent::AgentMessage { message } => text = message,
                OlderEvent::TokenCount { info, usage } => {
                    // Totals so far: the last one counts.
                    reply.usage = info
                        .and_then(|i| i.total_token_usage)
                        .unwrap_or(usage)
                        .into();
                }
                OlderEvent::TaskComplete { last_agent_message } => {
                    if let Some(t) = last_agent_message {
                        text = Some(t);
                    }
                    completed = true;
                }
                OlderEvent::Error { message } => last_error = message,
                OlderEvent::Other => {}
            },
        }
    }
    // An `error` event alone may be a notice the agent recovered from ("Reconnecting...").
    let failure = failure.or_else(|| last_error.filter(|_| !completed));
    match failure {
        None if completed || (out.code == Some(0) && text.is_some()) => Ok(AgentReply {
            text: text.unwrap_or_default(),
            denied: denials(&String::from_utf8_lossy(&out.stderr), refused),
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

/// What the sandbox answers a command it refuses, as the command's output shows it: the
/// file system is mounted read-only outside the writable roots (and `.git` inside them), and
/// seccomp refuses the network.
static REFUSAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"Read-only file system|Operation not permitted")
        .expect("the refusal pattern is valid")
});

/// A command the sandbox refused, as its item shows it: the command, its output and the
/// refusal.
struct Refused {
    command: String,
    output: String,
    refusal: String,
}

/// The refusal a failed command's output shows, if any (failing tests are no refusal).
fn refused_command(command: Option<String>, output: Option<String>) -> Option<Refused> {
    let output = output.unwrap_or_default();
    let refusal = REFUSAL.find(&output)?.as_str().to_string();
    Some(Refused {
        command: unwrap_shell(command.as_deref().unwrap_or("a command")),
        output,
        refusal,
    })
}

/// The command codex ran in a shell, without the shell: `/bin/bash -lc 'git commit -m x'`
/// is `git commit -m x`.
fn unwrap_shell(command: &str) -> String {
    static SHELL: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^(?:\S*/)?(?:bash|zsh|sh) -l?c (.*)$").expect("the shell pattern is valid")
    });
    let Some(inner) = SHELL.captures(command).map(|c| c[1].to_string()) else {
        return command.to_string();
    };
    if inner.len() >= 2 && inner.starts_with('\'') && inner.ends_with('\'') {
        inner[1..inner.len() - 1].replace("'\\''", "'")
    } else if inner.len() >= 2 && inner.starts_with('"') && inner.ends_with('"') {
        let mut out = String::new();
        let mut chars = inner[1..inner.len() - 1].chars();
        while let Some(c) = chars.next() {
            match (c, chars.clone().next()) {
                ('\\', Some(n @ ('"' | '\\' | '$' | '`'))) => {
                    out.push(n);
                    chars.next();
                }
                _ => out.push(c),
            }
        }
        out
    } else {
        inner
    }
}

/// Actions codex's sandbox refused, as "tool: what (why)":
///
/// - a patch (`apply_patch`) it rejects: its log on stderr says so, `ERROR
///   codex_core::tools::router: error=patch rejected: writing outside of the project;
///   rejected by user approval settings` (its events show nothing, not even a `file_change`);
/// - a command: a `command_execution` item whose output shows the refusal ("Read-only file
///   system"), when there is one: codex 0.169 often leaves out the item of a command its
///   sandbox refused (a race: a command that fails at once has none), but logs each refusal
///   at WARN, `codex_sandboxing::violation: recorded sandbox violation:
///   resource=filesystem backend=linux_sandbox reason=read_only_file_system path=<path or
///   unknown>` (shown by the `RUST_LOG` the backend sets). A logged refusal that no item
///   shows is reported from the log (the command is not logged: a `git commit` refused in
///   `.git` is "path=unknown").
fn denials(stderr: &str, refused: Vec<Refused>) -> Vec<String> {
    static ROUTER: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?m)ERROR codex_core::tools::router: error=(.*(?:rejected|blocked|denied).*)$")
            .expect("the denial pattern is valid")
    });
    static VIOLATION: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?m)codex_sandboxing::violation: recorded sandbox violation: (.*)$")
            .expect("the violation pattern is valid")
    });
    let mut denied: Vec<String> = ROUTER
        .captures_iter(stderr)
        .map(|c| {
            let error = c[1].trim();
            match error.strip_prefix("patch rejected: ") {
                Some(why) => {
                    let why = why.split(';').next().unwrap_or(why).trim();
                    format!("apply_patch: rejected, {why}")
                }
                None => error.to_string(),
            }
        })
        .collect();
    // Each logged refusal an item shows is reported from the item, which names the command:
    // by the path the log names, else (`path=unknown`) any item left.
    let violations: Vec<Violation> = VIOLATION
        .captures_iter(stderr)
        .map(|c| Violation::read(&c[1]))
        .collect();
    let mut shown: Vec<bool> = vec![false; refused.len()];
    let mut unexplained = vec![true; violations.len()];
    for (v, open) in violations.iter().zip(unexplained.iter_mut()) {
        let Some(path) = &v.path else { continue };
        if let Some(i) =
            (0..refused.len()).find(|&i| !shown[i] && refused[i].output.contains(path.as_str()))
        {
            shown[i] = true;
            *open = false;
        }
    }
    for (v, open) in violations.iter().zip(unexplained.iter_mut()) {
        if v.path.is_some() || !*open {
            continue;
        }
        if let Some(i) = (0..refused.len()).find(|&i| !shown[i]) {
            shown[i] = true;
            *open = false;
        }
    }
    denied.extend(
        refused
            .iter()
            .map(|r| format!("shell: {} ({})", r.command, r.refusal)),
    );
    denied.extend(
        violations
            .iter()
            .zip(unexplained)
            .filter(|(_, open)| *open)
            .map(|(v, _)| v.to_string()),
    );
    collapse(denied)
}

/// A refusal codex's sandbox logged: `resource=filesystem backend=linux_sandbox
/// reason=read_only_file_system path=../x.txt` (`path=unknown` when it cannot tell).
struct Violation {
    resource: Option<String>,
    reason: Option<String>,
    path: Option<String>,
}

impl Violation {
    fn read(fields: &str) -> Self {
        let field = |k: &str| {
            fields
                .split_whitespace()
                .filter_map(|f| f.split_once('='))
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        };
        // The path comes last, and may hold spaces.
        let path = fields
            .split_once("path=")
            .map(|(_, p)| p.trim().to_string());
        Violation {
            resource: field("resource"),
            reason: field("reason"),
            path: path.filter(|p| !p.is_empty() && p != "unknown"),
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let why = match self.reason.as_deref() {
            Some("read_only_file_system") => "read-only file system".to_string(),
            Some(reason) => reason.replace('_', " "),
            None => "refused".to_string(),
        };
        match (self.resource.as_deref(), &self.path) {
            (Some("filesystem") | None, Some(p)) => write!(f, "shell: a write to {p} ({why})"),
            (Some("filesystem") | None, None) => {
                write!(f, "shell: a write, path not logged ({why})")
            }
            (Some(resource), _) => write!(f, "shell: {resource} access ({why})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::Value;

    use super::*;
    use crate::backend::cli::classify::clock_hint;
    use crate::backend::cli::test_support::{REPLY, argv_of, backend};
    use crate::model::AgentKind;

    #[test]
    fn codex_logs_its_sandbox_refusals() {
        let env = backend(AgentKind::Codex, Permissions::Edit).default_env();
        assert_eq!(env, [("RUST_LOG", RUST_LOG)]);
    }

    #[test]
    fn a_schema_openai_strict_mode_refuses_is_a_refused_configuration() {
        match parse(&capture!("codex", "schema_refused")) {
            Err(CallError::Refused { message }) => {
                assert!(message.contains("invalid_json_schema"), "{message}");
                assert!(message.contains("structured_output"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_detector_sees_complete_results_only() {
        assert!(done(
            b"{\"type\":\"turn.started\"}\n{\"type\":\"turn.completed\"}\n"
        ));
        assert!(!done(b"{\"type\":\"turn.started\"}\n"));
    }

    #[test]
    fn real_successes_parse() {
        let codex = parse(&capture!("codex", "ok")).expect("a reply");
        assert_eq!(codex.text, REPLY);
        assert_eq!(
            (codex.usage.input_tokens, codex.usage.output_tokens),
            (4321, 765)
        );
        assert_eq!(codex.usage.cached_tokens, 98);
        let structured = parse(&capture!("codex", "structured")).expect("a reply");
        assert_eq!(
            serde_json::from_str::<Value>(&structured.text).expect("JSON"),
            serde_json::json!({"verdict": "MOCK-REPLY-4F7", "count": 3})
        );
    }

    #[test]
    fn codex_high_demand_is_transient() {
        let e = parse(&capture!("codex", "server_error")).expect_err("an error");
        assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        let e = parse(&capture!("codex", "overloaded")).expect_err("an error");
        assert!(matches!(e, CallError::Transient { .. }), "{e:?}");
        let e = parse(&capture!("codex", "rate_limit")).expect_err("an error");
        assert!(matches!(e, CallError::RateLimited { .. }), "{e:?}");
        let e = parse(&capture!("codex", "invalid_key")).expect_err("an error");
        assert!(matches!(e, CallError::Missing { .. }), "{e:?}");
    }

    #[test]
    fn codex_outside_a_git_repo_is_permanent_and_avoided() {
        let e = parse(&capture!("codex", "untrusted")).expect_err("an error");
        assert!(matches!(e, CallError::Failed { .. }), "{e:?}");
        assert!(
            argv_of(AgentKind::Codex, Permissions::ReadOnly)
                .contains(&"--skip-git-repo-check".to_string())
        );
    }

    #[test]
    fn codex_usage_limit_clock_time_gives_the_wait() {
        let e = parse(&capture!("codex", "usage_limit")).expect_err("an error");
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
    fn codex_denials_come_from_its_log() {
        let reply = parse(&capture!("codex", "write_read_only")).expect("a reply");
        assert_eq!(
            reply.denied,
            ["apply_patch: rejected, writing is blocked by read-only sandbox"]
        );
        let reply = parse(&capture!("codex", "write_workspace")).expect("a reply");
        assert!(reply.denied.is_empty());
    }

    #[test]
    fn codex_refused_writes_and_commits_are_reported_failing_tests_are_not() {
        // workspace-write: the write in the cwd went through; the patches into .git and out
        // of the cwd were rejected; the shell write out of the cwd and `git commit` (its
        // index.lock in .git) hit the read-only file system. codex showed no item for
        // either command: only its log names them. The failing tests are no refusal.
        let reply = parse(&capture!("codex", "denied_workspace")).expect("a reply");
        assert_eq!(
            reply.denied,
            [
                "apply_patch: rejected, writing outside of the project (2 times)",
                "shell: a write to ../mock-outside-shell.txt (read-only file system)",
                "shell: a write, path not logged (read-only file system)",
            ]
        );
        assert_eq!(reply.text, REPLY);
        let reply = parse(&capture!("codex", "denied_read_only")).expect("a reply");
        assert_eq!(
            reply.denied,
            [
                "apply_patch: rejected, writing is blocked by read-only sandbox (3 times)",
                "shell: a write to ../mock-outside-shell.txt (read-only file system)",
                "shell: a write, path not logged (read-only file system)",
            ]
        );
        // danger-full-access: everything went through, the failing tests too.
        let reply = parse(&capture!("codex", "denied_full")).expect("a reply");
        assert!(reply.denied.is_empty(), "{:?}", reply.denied);
    }

    #[test]
    fn codex_refused_commands_it_shows_are_reported_with_the_command() {
        // The same case in another run of codex 0.169 (capture.sh codex/denied_workspace):
        // here codex showed the items of both refused commands, and logged both refusals.
        let stdout = concat!(
            "{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n",
            "{\"type\":\"item.completed\",\"item\":{\"id\":\"item_1\",\"type\":\"command_execution\",\"command\":\"/bin/bash -lc 'echo from-shell > ../mock-outside-shell.txt'\",\"aggregated_output\":\"/bin/bash: line 1: ../mock-outside-shell.txt: Read-only file system\\n\",\"exit_code\":1,\"status\":\"failed\"}}\n",
            "{\"type\":\"item.completed\",\"item\":{\"id\":\"item_2\",\"type\":\"command_execution\",\"command\":\"/bin/bash -lc 'git add -A && git commit -q -m x'\",\"aggregated_output\":\"fatal: Unable to create '/WORK/codex-denied_workspace/cwd/.git/index.lock': Read-only file system\\n\",\"exit_code\":128,\"status\":\"failed\"}}\n",
            "{\"type\":\"item.completed\",\"item\":{\"id\":\"item_3\",\"type\":\"command_execution\",\"command\":\"/bin/bash -lc \\\"echo 'FAILED test_mean'; exit 1\\\"\",\"aggregated_output\":\"FAILED test_mean\\n\",\"exit_code\":1,\"status\":\"failed\"}}\n",
            "{\"type\":\"item.completed\",\"item\":{\"id\":\"item_4\",\"type\":\"agent_message\",\"text\":\"done\"}}\n",
            "{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}\n",
        );
        let stderr = concat!(
            "2026-11-26T21:23:29.071184Z ERROR codex_core::tools::router: error=patch rejected: writing outside of the project; rejected by user approval settings\n",
            "2026-11-26T21:23:29.369842Z  WARN codex_sandboxing::violation: recorded sandbox violation: resource=filesystem backend=linux_sandbox reason=read_only_file_system path=../mock-outside-shell.txt\n",
            "2026-11-26T21:23:29.628653Z  WARN codex_sandboxing::violation: recorded sandbox violation: resource=filesystem backend=linux_sandbox reason=read_only_file_system path=unknown\n",
        );
        let reply = parse(&crate::backend::cli::test_support::captured(
            stdout, stderr, "0",
        ))
        .expect("a reply");
        assert_eq!(
            reply.denied,
            [
                "apply_patch: rejected, writing outside of the project",
                "shell: echo from-shell > ../mock-outside-shell.txt (Read-only file system)",
                "shell: git add -A && git commit -q -m x (Read-only file system)",
            ]
        );
        // A path with spaces is read whole.
        let spaced = "x  WARN codex_sandboxing::violation: recorded sandbox violation: resource=filesystem backend=linux_sandbox reason=read_only_file_system path=../my notes.txt\n";
        let reply = parse(&crate::backend::cli::test_support::captured(
            "{\"type\":\"turn.completed\"}\n",
            spaced,
            "0",
        ))
        .expect("a reply");
        assert_eq!(
            reply.denied,
            ["shell: a write to ../my notes.txt (read-only file system)"]
        );
        // Without the log (RUST_LOG not set), the items alone.
        let reply = parse(&crate::backend::cli::test_support::captured(
            stdout, "", "0",
        ))
        .expect("a reply");
        assert_eq!(reply.denied.len(), 2, "{:?}", reply.denied);
    }

    #[test]
    fn shell_wrappers_are_removed() {
        assert_eq!(
            unwrap_shell("/bin/bash -lc 'git commit -m x'"),
            "git commit -m x"
        );
        assert_eq!(
            unwrap_shell("/bin/bash -lc \"echo 'a'; echo \\\"b\\\" \\$HOME\""),
            "echo 'a'; echo \"b\" $HOME"
        );
        assert_eq!(unwrap_shell("bash -c 'it'\\''s'"), "it's");
        assert_eq!(unwrap_shell("git status"), "git status");
    }

    #[test]
    fn unknown_events_and_fields_are_ignored() {
        let out = crate::backend::cli::test_support::captured(
            concat!(
                "{\"type\":\"thread.started\",\"thread_id\":\"t-1\"}\n",
                "{\"type\":\"some.new_event\",\"payload\":[1,2]}\n",
                "{\"type\":\"item.completed\",\"item\":{\"type\":\"agent_message\",\"text\":\"hi\",\"extra\":{}}}\n",
                "{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":5,\"output_tokens\":\"2\"}}\n",
            ),
            "",
            "0",
        );
        let reply = parse(&out).expect("a reply");
        assert_eq!(reply.text, "hi");
        assert_eq!(reply.session_id.as_deref(), Some("t-1"));
        assert_eq!(
            (reply.usage.input_tokens, reply.usage.output_tokens),
            (5, 0)
        );
    }
}

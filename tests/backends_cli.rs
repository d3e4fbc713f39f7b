//! Tests of the CLI backends through the fake `claude`, `codex`, `gemini`, `qwen` and
//! `opencode` in tests/fakes, and of `command` agents.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ralph_flow::backend::{AgentCall, AgentConfig, AgentReply, CallError, cli};
use ralph_flow::model::{AgentKind, Permissions};

mod common;

/// A fake CLI's path (its schema checks installed: see `common::node_deps`).
fn fake(name: &str) -> String {
    let _ = common::node_deps();
    format!("{}/tests/fakes/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A temporary run directory with a call directory in it.
struct Scene {
    dir: tempfile::TempDir,
}

impl Scene {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("call")).expect("call dir");
        Scene { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn call(&self, prompt: &str, env: &[(&str, &str)]) -> AgentCall {
        AgentCall {
            stage: "stage".into(),
            scope: String::new(),
            attempt: 1,
            prompt: prompt.into(),
            model: None,
            args: Vec::new(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd: self.dir.path().to_path_buf(),
            dir: self.path("call"),
            timeout: Some(Duration::from_secs(30)),
            idle_timeout: None,
            schema: None,
            max_tokens: None,
            ..AgentCall::default()
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("log")).expect("the fake's log")
    }
}

fn agent(kind: AgentKind) -> AgentConfig {
    AgentConfig {
        name: kind.as_str().into(),
        kind,
        program: Some(fake(kind.as_str())),
        ..AgentConfig::default()
    }
}

async fn run(config: &AgentConfig, call: &AgentCall) -> Result<AgentReply, CallError> {
    let backend = cli::build(config).expect("builds");
    backend.call(call).await
}

async fn run_mode(kind: AgentKind, mode: &str) -> Result<AgentReply, CallError> {
    let scene = Scene::new();
    run(&agent(kind), &scene.call("hi", &[("FAKE_MODE", mode)])).await
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs()
}

const TRICKY: &str = "He said \"done\" \\o/\n\tnext line\n";

// ---- claude ---------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn claude_success_parses_text_usage_cost_and_session() {
    let scene = Scene::new();
    let log = scene.path("log").display().to_string();
    let mut config = agent(AgentKind::Claude);
    config.model = Some("claude-opus-4-1".into());
    config.args = vec!["--permission-mode".into(), "acceptEdits".into()];
    config.env = vec![("FAKE_REPLY".into(), TRICKY.into())];
    let mut call = scene.call("the prompt\nline 2", &[("FAKE_LOG", &log)]);
    call.args = vec!["--max-turns".into(), "5".into()];
    let reply = run(&config, &call).await.expect("a reply");
    assert_eq!(reply.text, TRICKY);
    assert_eq!(reply.usage.input_tokens, 110);
    assert_eq!(reply.usage.cached_tokens, 10);
    assert_eq!(reply.usage.output_tokens, 20);
    assert_eq!(reply.usage.cost_usd, Some(0.0123));
    assert_eq!(reply.session_id.as_deref(), Some("fake-claude-session-1"));
    assert_eq!(reply.model.as_deref(), Some("claude-opus-4-1"));
    assert!(reply.raw.contains("\"type\":\"result\""));
    let stdout = std::fs::read_to_string(scene.path("call/stdout")).expect("stdout file");
    assert_eq!(stdout, reply.raw);
    let log = scene.log();
    let args: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("arg: "))
        .collect();
    assert_eq!(
        args,
        [
            "-p",
            "--output-format",
            "json",
            "--model",
            "claude-opus-4-1",
            "--permission-mode",
            "acceptEdits",
            "--max-turns",
            "5"
        ]
    );
    assert!(log.contains("prompt:\nthe prompt\nline 2\n"), "{log}");
    let cwd = scene.dir.path().canonicalize().expect("canonical");
    assert!(log.contains(&format!("cwd: {}", cwd.display())), "{log}");
}

#[tokio::test(flavor = "current_thread")]
async fn claude_passes_the_schema_and_returns_the_structured_output() {
    let scene = Scene::new();
    let log = scene.path("log").display().to_string();
    let config = agent(AgentKind::Claude);
    let backend = cli::build(&config).expect("builds");
    let mut call = scene.call(
        "hi",
        &[
            ("FAKE_LOG", &log),
            ("FAKE_STRUCTURED", r#"{"verdict":"pass"}"#),
        ],
    );
    call.schema = Some(serde_json::json!({"type": "object"}));
    let reply = backend.call(&call).await.expect("a reply");
    assert_eq!(reply.text, r#"{"verdict":"pass"}"#);
    assert!(
        scene
            .log()
            .contains("arg: --json-schema\narg: {\"type\":\"object\"}\n")
    );
}

#[tokio::test(flavor = "current_thread")]
async fn claude_usage_limit_is_a_rate_limit_until_the_reset() {
    let scene = Scene::new();
    let reset = (now() + 120).to_string();
    let call = scene.call(
        "hi",
        &[("FAKE_MODE", "usage_limit"), ("FAKE_RESET_EPOCH", &reset)],
    );
    match run(&agent(AgentKind::Claude), &call).await {
        Err(CallError::RateLimited {
            retry_after: Some(wait),
            ..
        }) => assert!(wait <= Duration::from_secs(120) && wait >= Duration::from_secs(100)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn claude_overload_and_garbage_are_transient() {
    for mode in ["overloaded", "garbage"] {
        let result = run_mode(AgentKind::Claude, mode).await;
        assert!(
            matches!(result, Err(CallError::Transient { .. })),
            "{mode}: {result:?}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn claude_errors_fail_with_the_subtype() {
    match run_mode(AgentKind::Claude, "error").await {
        Err(CallError::Failed { message }) => assert!(message.contains("error_max_turns")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_missing_program_is_missing() {
    let scene = Scene::new();
    for kind in [AgentKind::Claude, AgentKind::Codex, AgentKind::Gemini] {
        let mut config = agent(kind);
        config.program = Some(scene.path("no-such-agent").display().to_string());
        let result = run(&config, &scene.call("hi", &[])).await;
        assert!(
            matches!(result, Err(CallError::Missing { .. })),
            "{result:?}"
        );
    }
    let mut config = agent(AgentKind::Command);
    config.command = vec!["ralph-flow-no-such-command".into()];
    let result = run(&config, &scene.call("hi", &[])).await;
    assert!(
        matches!(result, Err(CallError::Missing { .. })),
        "{result:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_hanging_agent_times_out() {
    let scene = Scene::new();
    let mut call = scene.call("hi", &[("FAKE_MODE", "hang")]);
    call.timeout = Some(Duration::from_millis(500));
    match run(&agent(AgentKind::Claude), &call).await {
        Err(CallError::Timeout { after, idle, .. }) => {
            assert_eq!(after, Duration::from_millis(500));
            assert!(!idle);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_silent_agent_hits_the_idle_timeout() {
    for kind in [AgentKind::Claude, AgentKind::Gemini] {
        let scene = Scene::new();
        let mut call = scene.call("hi", &[("FAKE_MODE", "hang")]);
        call.idle_timeout = Some(Duration::from_millis(300));
        match run(&agent(kind), &call).await {
            Err(CallError::Timeout { after, idle, .. }) => {
                assert_eq!(after, Duration::from_millis(300));
                assert!(idle);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_result_followed_by_a_hang_is_kept() {
    for kind in [AgentKind::Claude, AgentKind::Codex, AgentKind::Gemini] {
        let scene = Scene::new();
        let mut call = scene.call(
            "hi",
            &[("FAKE_MODE", "hang_after_result"), ("FAKE_REPLY", "kept")],
        );
        call.timeout = Some(Duration::from_millis(800));
        call.idle_timeout = Some(Duration::from_millis(200));
        let reply = run(&agent(kind), &call).await.expect("the result");
        assert_eq!(reply.text, "kept", "{kind:?}");
        // Without a model, gemini's model router makes a side request of its own (2 output
        // tokens in the capture), counted too.
        let router = if kind == AgentKind::Gemini { 2 } else { 0 };
        assert_eq!(reply.usage.output_tokens, 20 + router, "{kind:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_sequence_fails_first_then_succeeds() {
    let scene = Scene::new();
    let state = scene.path("state").display().to_string();
    let env = [
        ("FAKE_STATE_DIR", state.as_str()),
        ("FAKE_SEQUENCE", "rate_limit ok"),
    ];
    std::fs::create_dir(scene.path("state")).expect("state dir");
    std::fs::write(scene.path("state/reply.2"), "second answer").expect("reply file");
    let config = agent(AgentKind::Claude);
    let first = run(&config, &scene.call("hi", &env)).await;
    assert!(
        matches!(first, Err(CallError::RateLimited { .. })),
        "{first:?}"
    );
    let second = run(&config, &scene.call("hi", &env))
        .await
        .expect("a reply");
    assert_eq!(second.text, "second answer");
    assert_eq!(second.session_id.as_deref(), Some("fake-claude-session-2"));
}

// ---- codex ----------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn codex_success_parses_the_last_message_usage_and_thread() {
    let scene = Scene::new();
    let log = scene.path("log").display().to_string();
    let mut config = agent(AgentKind::Codex);
    config.args = vec!["--sandbox".into(), "workspace-write".into()];
    let mut call = scene.call("do it", &[("FAKE_LOG", &log), ("FAKE_REPLY", TRICKY)]);
    call.model = Some("gpt-5-codex".into());
    let reply = run(&config, &call).await.expect("a reply");
    assert_eq!(reply.text, TRICKY);
    assert_eq!(reply.session_id.as_deref(), Some("fake-codex-session-1"));
    assert_eq!(reply.usage.input_tokens, 100);
    assert_eq!(reply.usage.cached_tokens, 10);
    assert_eq!(reply.usage.output_tokens, 20);
    assert_eq!(reply.usage.cost_usd, None);
    let log = scene.log();
    let args: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("arg: "))
        .collect();
    assert_eq!(
        args,
        [
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--model",
            "gpt-5-codex",
            "--sandbox",
            "workspace-write",
            "-"
        ]
    );
    assert!(log.contains("prompt:\ndo it\n"), "{log}");
}

#[tokio::test(flavor = "current_thread")]
async fn codex_errors_are_classified() {
    match run_mode(AgentKind::Codex, "rate_limit_in").await {
        Err(CallError::RateLimited { retry_after, .. }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(90)));
        }
        other => panic!("{other:?}"),
    }
    // The real 429: "exceeded retry limit, last status: 429 Too Many Requests".
    match run_mode(AgentKind::Codex, "rate_limit").await {
        Err(CallError::RateLimited { .. }) => {}
        other => panic!("{other:?}"),
    }
    for mode in ["overloaded", "garbage"] {
        let result = run_mode(AgentKind::Codex, mode).await;
        assert!(
            matches!(result, Err(CallError::Transient { .. })),
            "{mode}: {result:?}"
        );
    }
    match run_mode(AgentKind::Codex, "error").await {
        Err(CallError::Failed { message }) => assert!(message.contains("not supported")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn codex_older_events_are_understood() {
    let scene = Scene::new();
    let script = r#"cat >/dev/null
echo '{"id":"0","msg":{"type":"session_configured","session_id":"old-session","model":"gpt-5"}}'
echo '{"id":"1","msg":{"type":"agent_message","message":"old answer"}}'
echo '{"id":"1","msg":{"type":"token_count","input_tokens":50,"cached_input_tokens":5,"output_tokens":7}}'
echo '{"id":"1","msg":{"type":"task_complete","last_agent_message":"old answer"}}'
"#;
    let old = scene.path("old-codex");
    std::fs::write(&old, format!("#!/bin/sh\n{script}")).expect("script");
    make_executable(&old);
    let mut config = agent(AgentKind::Codex);
    config.program = Some(old.display().to_string());
    let reply = run(&config, &scene.call("hi", &[])).await.expect("a reply");
    assert_eq!(reply.text, "old answer");
    assert_eq!(reply.session_id.as_deref(), Some("old-session"));
    assert_eq!(reply.usage.input_tokens, 50);
    assert_eq!(reply.usage.cached_tokens, 5);
    assert_eq!(reply.usage.output_tokens, 7);
}

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

// ---- gemini ---------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn gemini_success_parses_the_response_and_stats() {
    let scene = Scene::new();
    let log = scene.path("log").display().to_string();
    let mut config = agent(AgentKind::Gemini);
    config.model = Some("gemini-2.5-flash".into());
    config.args = vec!["--yolo".into()];
    let call = scene.call("ask", &[("FAKE_LOG", &log), ("FAKE_REPLY", TRICKY)]);
    let reply = run(&config, &call).await.expect("a reply");
    assert_eq!(reply.text, TRICKY);
    assert_eq!(reply.usage.input_tokens, 100);
    assert_eq!(reply.usage.cached_tokens, 10);
    assert_eq!(reply.usage.output_tokens, 20);
    assert_eq!(reply.model.as_deref(), Some("gemini-2.5-flash"));
    assert_eq!(reply.session_id.as_deref(), Some("fake-gemini-session-1"));
    let log = scene.log();
    let args: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("arg: "))
        .collect();
    assert_eq!(
        args,
        [
            "--model",
            "gemini-2.5-flash",
            "--yolo",
            "--output-format",
            "json"
        ]
    );
    assert!(log.contains("prompt:\nask\n"), "{log}");
}

#[tokio::test(flavor = "current_thread")]
async fn gemini_errors_are_classified() {
    match run_mode(AgentKind::Gemini, "rate_limit").await {
        Err(CallError::RateLimited { retry_after, .. }) => {
            // "Please retry in 45.123456789s."
            assert_eq!(retry_after.map(|d| d.as_secs()), Some(45));
        }
        other => panic!("{other:?}"),
    }
    for mode in ["overloaded", "garbage"] {
        let result = run_mode(AgentKind::Gemini, mode).await;
        assert!(
            matches!(result, Err(CallError::Transient { .. })),
            "{mode}: {result:?}"
        );
    }
    match run_mode(AgentKind::Gemini, "error").await {
        Err(CallError::Failed { message }) => assert!(message.contains("max session turns")),
        other => panic!("{other:?}"),
    }
}

// ---- qwen and opencode ------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn qwen_and_opencode_replies_and_errors_come_through() {
    for kind in [AgentKind::Qwen, AgentKind::Opencode] {
        let scene = Scene::new();
        let call = scene.call(
            "hi",
            &[
                ("FAKE_REPLY", TRICKY),
                ("FAKE_INPUT_TOKENS", "300"),
                ("FAKE_CACHED_TOKENS", "40"),
                ("FAKE_OUTPUT_TOKENS", "30"),
                ("FAKE_SESSION", "s-1"),
                ("FAKE_LOG", &scene.path("log").display().to_string()),
            ],
        );
        let reply = run(&agent(kind), &call).await.expect("a reply");
        assert_eq!(reply.text, TRICKY, "{kind}");
        assert_eq!(reply.session_id.as_deref(), Some("s-1"), "{kind}");
        assert_eq!(reply.usage.output_tokens, 30, "{kind}");
        assert_eq!(reply.usage.cached_tokens, 40, "{kind}");
        assert_eq!(reply.usage.input_tokens, 300, "{kind}");
        // Read-only by default.
        let log = scene.log();
        match kind {
            AgentKind::Qwen => assert!(log.contains("arg: --approval-mode\narg: default"), "{log}"),
            _ => assert!(log.contains("arg: run\narg: --format\narg: json"), "{log}"),
        }
        match run_mode(kind, "rate_limit").await {
            Err(CallError::RateLimited { retry_after, .. }) => {
                // "Please try again in 20s."
                assert_eq!(retry_after.map(|d| d.as_secs()), Some(20), "{kind}");
            }
            other => panic!("{kind}: {other:?}"),
        }
        let result = run_mode(kind, "server_error").await;
        assert!(
            matches!(result, Err(CallError::Transient { .. })),
            "{kind}: {result:?}"
        );
        let result = run_mode(kind, "invalid_key").await;
        assert!(
            matches!(result, Err(CallError::Missing { .. })),
            "{kind}: {result:?}"
        );
        // A flag the real CLI does not take is refused the same way: no retry fixes it.
        let scene = Scene::new();
        let mut config = agent(kind);
        config.args = vec!["--no-such-flag".into()];
        let result = run(&config, &scene.call("hi", &[])).await;
        assert!(
            matches!(result, Err(CallError::Failed { .. })),
            "{kind}: {result:?}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn qwen_and_opencode_denials_follow_the_permissions() {
    for (kind, permissions, denied) in [
        (AgentKind::Qwen, Permissions::ReadOnly, 6),
        (AgentKind::Qwen, Permissions::Full, 0),
        (AgentKind::Opencode, Permissions::ReadOnly, 2),
        (AgentKind::Opencode, Permissions::Full, 0),
    ] {
        let scene = Scene::new();
        let mut config = agent(kind);
        config.permissions = permissions;
        let reply = run(&config, &scene.call("hi", &[("FAKE_MODE", "denied")]))
            .await
            .expect("a reply");
        assert_eq!(
            reply.denied.len(),
            denied,
            "{kind} {permissions:?}: {:?}",
            reply.denied
        );
    }
}

// ---- command --------------------------------------------------------------------------

fn command(argv: &[&str], via: Option<&str>) -> AgentConfig {
    AgentConfig {
        name: "script".into(),
        kind: AgentKind::Command,
        command: argv.iter().map(|s| s.to_string()).collect(),
        prompt_via: via
            .map(|v| ralph_flow::model::PromptVia::parse(v).expect("stdin, file or arg"))
            .unwrap_or_default(),
        ..AgentConfig::default()
    }
}

/// A prompt a shell would mangle: it must arrive as it is.
const SHELLY: &str = "it's $(touch pwned) `touch pwned` \"q\" *\nline 2";

#[tokio::test(flavor = "current_thread")]
async fn command_gets_the_prompt_on_stdin_with_env_and_args() {
    let scene = Scene::new();
    let mut config = command(
        &[
            "/bin/sh",
            "-c",
            "printf '%s|%s|%s|' \"$A\" \"$B\" \"$1\"; cat",
        ],
        None,
    );
    config.env = vec![("A".into(), "from-agent".into())];
    config.args = vec!["zero".into()];
    let mut call = scene.call(SHELLY, &[("B", "from-call")]);
    call.args = vec!["one".into()];
    let reply = run(&config, &call).await.expect("a reply");
    assert_eq!(reply.text, format!("from-agent|from-call|one|{SHELLY}"));
    assert_eq!(reply.raw, reply.text);
    // Any program reports no token usage: unknown, not 0.
    assert_eq!(reply.usage, ralph_flow::backend::Usage::unreported_call());
}

#[tokio::test(flavor = "current_thread")]
async fn command_gets_the_prompt_in_a_file() {
    let scene = Scene::new();
    let config = command(
        &[
            "/bin/sh",
            "-c",
            "printf 'file:'; cat \"$1\"",
            "sh",
            "{prompt_file}",
        ],
        Some("file"),
    );
    let reply = run(&config, &scene.call(SHELLY, &[]))
        .await
        .expect("a reply");
    assert_eq!(reply.text, format!("file:{SHELLY}"));
    let written = std::fs::read_to_string(scene.path("call/prompt.txt")).expect("prompt file");
    assert_eq!(written, SHELLY);
    // Without the placeholder, the path is appended.
    let config = command(&["/bin/cat"], Some("file"));
    let reply = run(&config, &scene.call("appended", &[]))
        .await
        .expect("a reply");
    assert_eq!(reply.text, "appended");
}

#[tokio::test(flavor = "current_thread")]
async fn command_gets_the_prompt_as_an_argument() {
    let scene = Scene::new();
    let config = command(
        &["/bin/sh", "-c", "printf 'arg:%s' \"$1\"", "sh", "{prompt}"],
        Some("arg"),
    );
    let reply = run(&config, &scene.call(SHELLY, &[]))
        .await
        .expect("a reply");
    assert_eq!(reply.text, format!("arg:{SHELLY}"));
    let config = command(&["/bin/echo", "-n"], Some("arg"));
    let reply = run(&config, &scene.call(SHELLY, &[]))
        .await
        .expect("a reply");
    assert_eq!(reply.text, SHELLY);
    assert!(!scene.path("pwned").exists());
}

#[tokio::test(flavor = "current_thread")]
async fn command_failures_fail_the_attempt_with_the_output_tail() {
    let scene = Scene::new();
    let config = command(
        &["/bin/sh", "-c", "echo out; echo broken >&2; exit 4"],
        None,
    );
    match run(&config, &scene.call("hi", &[])).await {
        Err(CallError::Failed { message }) => {
            assert!(message.contains("code 4"), "{message}");
            assert!(message.contains("broken"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let config = command(&["/bin/sh", "-c", "kill -9 $$"], None);
    match run(&config, &scene.call("hi", &[])).await {
        Err(CallError::Failed { message }) => {
            assert!(message.contains("signal 9"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // What the program said decides otherwise: an overload is worth retrying.
    let config = command(
        &[
            "/bin/sh",
            "-c",
            "echo 'HTTP 503 Service Unavailable' >&2; exit 1",
        ],
        None,
    );
    match run(&config, &scene.call("hi", &[])).await {
        Err(CallError::Transient { .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn command_timeouts_report_the_tail() {
    let scene = Scene::new();
    let config = command(&["/bin/sh", "-c", "echo working; sleep 1000"], None);
    let mut call = scene.call("hi", &[]);
    call.idle_timeout = Some(Duration::from_millis(300));
    match run(&config, &call).await {
        Err(CallError::Timeout { idle, tail, .. }) => {
            assert!(idle);
            assert_eq!(tail, "working");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_command_agents_do_not_build() {
    assert!(cli::build(&command(&[], None)).is_err());
    // An unknown `prompt_via` cannot get this far: `PromptVia::parse` refuses it, and so
    // does the checker.
    assert!(ralph_flow::model::PromptVia::parse("carrier-pigeon").is_none());
    let replay = AgentConfig {
        kind: AgentKind::Replay,
        ..AgentConfig::default()
    };
    assert!(cli::build(&replay).is_err());
}

// ---- the real CLIs' cases (the fakes replay tests/fakes/captures) -----------------------

async fn run_with(
    kind: AgentKind,
    permissions: Permissions,
    mode: &str,
) -> Result<AgentReply, CallError> {
    let scene = Scene::new();
    let config = AgentConfig {
        permissions,
        ..agent(kind)
    };
    run(&config, &scene.call("hi", &[("FAKE_MODE", mode)])).await
}

#[tokio::test(flavor = "current_thread")]
async fn real_api_errors_are_classified_alike() {
    for kind in [AgentKind::Claude, AgentKind::Codex, AgentKind::Gemini] {
        let r = run_mode(kind, "server_error").await;
        assert!(
            matches!(r, Err(CallError::Transient { .. })),
            "{kind:?}: {r:?}"
        );
        let r = run_mode(kind, "overloaded").await;
        assert!(
            matches!(r, Err(CallError::Transient { .. })),
            "{kind:?}: {r:?}"
        );
        let r = run_mode(kind, "rate_limit").await;
        assert!(
            matches!(r, Err(CallError::RateLimited { .. })),
            "{kind:?}: {r:?}"
        );
        let r = run_mode(kind, "invalid_key").await;
        assert!(
            matches!(r, Err(CallError::Missing { .. })),
            "{kind:?}: {r:?}"
        );
    }
    match run_mode(AgentKind::Codex, "usage_limit").await {
        Err(CallError::RateLimited {
            retry_after: Some(wait),
            ..
        }) => assert!(wait <= Duration::from_secs(3600), "{wait:?}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn untrusted_directories_are_passed() {
    // ralph-flow passes --skip-git-repo-check and GEMINI_CLI_TRUST_WORKSPACE=true.
    for kind in [AgentKind::Codex, AgentKind::Gemini] {
        let r = run_mode(kind, "untrusted").await;
        assert!(r.is_ok(), "{kind:?}: {r:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn permissions_decide_writes_and_denials_are_reported() {
    use Permissions::*;
    let reply = run_with(AgentKind::Claude, ReadOnly, "denied")
        .await
        .expect("a reply");
    assert_eq!(reply.denied.len(), 1, "{:?}", reply.denied);
    assert!(reply.denied[0].starts_with("Write: "), "{:?}", reply.denied);
    for p in [Edit, Full] {
        let reply = run_with(AgentKind::Claude, p, "denied")
            .await
            .expect("a reply");
        assert!(reply.denied.is_empty(), "{p:?}: {:?}", reply.denied);
    }
    // codex: read-only refuses every write, edit (workspace-write) the patches into .git and
    // out of the cwd, the shell write out of it and the commit (its index.lock is in .git);
    // the commands are in codex's log only because the backend sets its RUST_LOG.
    let reply = run_with(AgentKind::Codex, ReadOnly, "denied")
        .await
        .expect("a reply");
    assert_eq!(
        reply.denied,
        [
            "apply_patch: rejected, writing is blocked by read-only sandbox (3 times)",
            "shell: a write to ../mock-outside-shell.txt (read-only file system)",
            "shell: a write, path not logged (read-only file system)",
        ]
    );
    let reply = run_with(AgentKind::Codex, Edit, "denied")
        .await
        .expect("a reply");
    assert_eq!(
        reply.denied,
        [
            "apply_patch: rejected, writing outside of the project (2 times)",
            "shell: a write to ../mock-outside-shell.txt (read-only file system)",
            "shell: a write, path not logged (read-only file system)",
        ]
    );
    let reply = run_with(AgentKind::Codex, Full, "denied")
        .await
        .expect("a reply");
    assert!(reply.denied.is_empty(), "{:?}", reply.denied);
    // gemini: read-only (default) offers no write or shell tool, edit (auto_edit) no shell,
    // so no commit; write_file keeps to the workspace (.git is outside it) even under yolo.
    let reply = run_with(AgentKind::Gemini, ReadOnly, "denied")
        .await
        .expect("a reply");
    assert_eq!(
        reply.denied,
        [
            "write_file: not offered to the model in this approval mode (3 times)",
            "run_shell_command: not offered to the model in this approval mode (3 times)",
        ]
    );
    let reply = run_with(AgentKind::Gemini, Edit, "denied")
        .await
        .expect("a reply");
    assert_eq!(reply.denied.len(), 3, "{:?}", reply.denied);
    assert!(
        reply.denied.contains(
            &"run_shell_command: not offered to the model in this approval mode (3 times)".into()
        ),
        "{:?}",
        reply.denied
    );
    assert!(
        reply.denied[0].starts_with("write_file: /")
            && reply.denied[0].ends_with("/cwd/.git/mock-written.txt (outside the workspace)"),
        "{:?}",
        reply.denied
    );
    let reply = run_with(AgentKind::Gemini, Full, "denied")
        .await
        .expect("a reply");
    assert_eq!(reply.denied.len(), 2, "{:?}", reply.denied);
    assert!(
        reply
            .denied
            .iter()
            .all(|d| d.ends_with("(outside the workspace)")),
        "{:?}",
        reply.denied
    );
    // As root without IS_SANDBOX, bypassPermissions refuses to start: not worth a retry.
    let r = run_mode(AgentKind::Claude, "root_bypass").await;
    assert!(matches!(r, Err(CallError::Failed { .. })), "{r:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_retried_call_starts_fresh_output_files() {
    let scene = Scene::new();
    let config = agent(AgentKind::Codex);
    let call = scene.call("hi", &[("FAKE_MODE", "server_error")]);
    run(&config, &call).await.expect_err("an error");
    let call = scene.call("hi", &[("FAKE_REPLY", "second")]);
    let reply = run(&config, &call).await.expect("a reply");
    let stdout = std::fs::read_to_string(scene.path("call/stdout")).expect("stdout");
    assert_eq!(stdout, reply.raw);
    assert!(!stdout.contains("high demand"), "{stdout}");
    let first = std::fs::read_to_string(scene.path("call/stdout.1")).expect("stdout.1");
    assert!(first.contains("high demand"), "{first}");
}

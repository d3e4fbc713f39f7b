//! The `acp` agent kind against the fake ACP agent (tests/fakes/acp/agent.py), which replays
//! real agents' captured sessions (tests/fakes/captures/acp) and does the captured agent's
//! own writes and commands only when ralph-flow allowed them: the backend driven directly,
//! and whole workflows.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Project;
use ralph_flow::backend::{Activity, AgentCall, AgentConfig, AgentReply, CallError, build};
use ralph_flow::model::AgentKind;
use ralph_flow::permit::{Edit, Rules};

fn fake() -> String {
    common::fakes().join("acp/agent.py").display().to_string()
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A workspace that is a git repository with one commit, pushed to a bare `origin` next
/// to it (as the captures had it).
struct Repo {
    _tmp: tempfile::TempDir,
    work: PathBuf,
    origin: PathBuf,
    call_dir: PathBuf,
}

impl Repo {
    fn new() -> Repo {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("work");
        let origin = tmp.path().join("origin.git");
        let call_dir = tmp.path().join("call");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::create_dir_all(&call_dir).unwrap();
        git(tmp.path(), &["init", "-q", "--bare", "origin.git"]);
        git(&work, &["init", "-q", "-b", "main"]);
        git(&work, &["config", "user.email", "t@example.com"]);
        git(&work, &["config", "user.name", "t"]);
        std::fs::write(work.join("README.md"), "# demo\n").unwrap();
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "-qm", "init"]);
        git(
            &work,
            &["remote", "add", "origin", origin.to_str().unwrap()],
        );
        git(&work, &["push", "-q", "origin", "main"]);
        Repo {
            _tmp: tmp,
            work,
            origin,
            call_dir,
        }
    }

    fn origin_head(&self) -> String {
        git(&self.origin, &["rev-parse", "main"])
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.call_dir.join("fake.log")).unwrap_or_default()
    }

    fn artifact(&self, name: &str) -> String {
        std::fs::read_to_string(self.call_dir.join(name)).unwrap_or_default()
    }
}

fn config(policy: &str, env: &[(&str, &str)]) -> AgentConfig {
    AgentConfig {
        name: "acp".into(),
        kind: AgentKind::Acp,
        command: vec![fake()],
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        policy: Arc::new(Rules::level(policy).unwrap()),
        ..AgentConfig::default()
    }
}

/// Calls the backend once in the repository; returns the result and what it reported.
fn call(
    repo: &Repo,
    cfg: &AgentConfig,
    timeout: Duration,
) -> (Result<AgentReply, CallError>, Vec<Activity>) {
    let backend = build(cfg).unwrap();
    assert!(backend.watches());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let call = AgentCall {
        stage: "s".into(),
        attempt: 1,
        prompt: "Write notes.txt, commit it with git, then push to origin.".into(),
        env: vec![(
            "FAKE_LOG".into(),
            repo.call_dir.join("fake.log").display().to_string(),
        )],
        cwd: repo.work.clone(),
        dir: repo.call_dir.clone(),
        timeout: Some(timeout),
        watch: Some(tx),
        ..AgentCall::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let result = rt.block_on(backend.call(&call));
    let mut seen = Vec::new();
    while let Ok(a) = rx.try_recv() {
        seen.push(a);
    }
    (result, seen)
}

#[test]
fn the_commit_level_lets_claude_commit_and_denies_its_push_with_the_rule() {
    let repo = Repo::new();
    let before = repo.origin_head();
    let cfg = config("commit", &[("FAKE_ACP_CASE", "claude/edit_commit_push")]);
    let (result, seen) = call(&repo, &cfg, Duration::from_secs(60));
    let reply = result.unwrap_or_else(|e| panic!("{e}\n{}", repo.log()));
    assert_eq!(reply.text, "MOCK-REPLY-4F7: the mock model says hello.");
    // The allowed write and commit ran; the denied push did not.
    assert_eq!(
        std::fs::read_to_string(repo.work.join("notes.txt")).unwrap(),
        "written by the mock model\n"
    );
    assert_eq!(git(&repo.work, &["log", "-1", "--format=%s"]), "add notes");
    assert_eq!(repo.origin_head(), before, "the push must not have run");
    assert_eq!(
        reply.denied,
        vec![
            "git push origin HEAD: denied by policy `commit`: deny `git push *` (git push origin HEAD)"
        ]
    );
    // Every decision was reported, and the tool calls.
    let decisions: Vec<(String, bool)> = seen
        .iter()
        .filter_map(|a| match a {
            Activity::Permission { asked, decision } => Some((asked.clone(), decision.allowed)),
            _ => None,
        })
        .collect();
    assert_eq!(
        decisions,
        vec![
            ("Write notes.txt".to_string(), true),
            (
                "git add -A && git commit -q -m 'add notes'".to_string(),
                true
            ),
            ("git push origin HEAD".to_string(), false),
        ]
    );
    assert!(
        seen.iter().any(|a| matches!(a, Activity::Tool { kind, status, .. } if kind == "execute" && status == "failed")),
        "{seen:?}"
    );
    // Usage and cost where claude-agent-acp reports them.
    // Its cache reads (392, apart from `inputTokens` in its `totalTokens`) are added in.
    assert_eq!(reply.usage.input_tokens, 17284 + 392);
    assert_eq!(reply.usage.cached_tokens, 392);
    assert_eq!(reply.usage.output_tokens, 3060);
    assert_eq!(reply.usage.cost_usd, Some(0.16301800000000002));
    // The artifacts: the wire both ways, the transcript for people.
    let wire = repo.artifact("acp.jsonl");
    assert!(
        wire.contains(r#""method":"session/request_permission""#),
        "{wire}"
    );
    assert!(wire.contains(r#""optionId":"reject""#), "{wire}");
    let md = repo.artifact("transcript.md");
    assert!(md.contains("denied by policy `commit`"), "{md}");
    assert!(
        md.contains("- tool `execute`: git add -A && git commit -q -m 'add notes' (completed)"),
        "{md}"
    );
    // The session asked before acting: claude-agent-acp starts in its `auto` mode.
    assert!(
        repo.log().contains(r#""modeId": "default""#),
        "{}",
        repo.log()
    );
}

#[test]
fn under_read_only_everything_is_denied_and_nothing_runs() {
    let repo = Repo::new();
    let before = repo.origin_head();
    let cfg = config("read-only", &[("FAKE_ACP_CASE", "claude/edit_commit_push")]);
    let (result, _) = call(&repo, &cfg, Duration::from_secs(60));
    let reply = result.unwrap_or_else(|e| panic!("{e}\n{}", repo.log()));
    assert_eq!(reply.denied.len(), 3, "{:?}", reply.denied);
    assert!(
        reply.denied[0].contains("`edit` is not allowed"),
        "{:?}",
        reply.denied
    );
    assert!(
        reply.denied[1].contains("no command is allowed"),
        "{:?}",
        reply.denied
    );
    assert!(!repo.work.join("notes.txt").exists());
    assert_eq!(git(&repo.work, &["log", "-1", "--format=%s"]), "init");
    assert_eq!(repo.origin_head(), before);
}

#[test]
fn a_write_through_the_client_is_decided_by_the_policy() {
    // qwen asks, then writes through `fs/write_text_file` (which the policy decides again:
    // client.rs's tests refuse writes there).
    let repo = Repo::new();
    // The `commit` level without edits: the write is refused (qwen, in its `default` mode,
    // asks before it writes), the commit allowed.
    let mut cfg = config("commit", &[("FAKE_ACP_CASE", "qwen/edit_commit_push")]);
    cfg.policy = Arc::new(Rules {
        name: "no-edits".into(),
        edit: Edit::Nothing,
        ..Rules::level("commit").unwrap()
    });
    let (result, seen) = call(&repo, &cfg, Duration::from_secs(60));
    let reply = result.unwrap_or_else(|e| panic!("{e}\n{}", repo.log()));
    assert!(!repo.work.join("notes.txt").exists());
    assert!(
        reply.denied[0].starts_with(
            "Writing to notes.txt: denied by policy `no-edits`: `edit` is not allowed"
        ),
        "{:?}",
        reply.denied
    );
    assert!(!seen.iter().any(|a| matches!(a, Activity::Wrote(_))));
    assert_eq!(repo.artifact("written.txt"), "");

    let repo = Repo::new();
    let cfg = config("commit", &[("FAKE_ACP_CASE", "qwen/edit_commit_push")]);
    let (result, seen) = call(&repo, &cfg, Duration::from_secs(60));
    result.unwrap_or_else(|e| panic!("{e}\n{}", repo.log()));
    assert_eq!(
        std::fs::read_to_string(repo.work.join("notes.txt")).unwrap(),
        "written by the mock model\n"
    );
    assert!(
        seen.contains(&Activity::Wrote("notes.txt".into())),
        "{seen:?}"
    );
    assert_eq!(repo.artifact("written.txt"), "notes.txt\n");
}

#[test]
fn a_hanging_agent_is_cancelled_at_the_timeout_and_killed() {
    let repo = Repo::new();
    for mode in ["hang", "ignore_cancel"] {
        let cfg = config(
            "commit",
            &[("FAKE_ACP_CASE", "claude/ok"), ("FAKE_MODE", mode)],
        );
        let t = Instant::now();
        let (result, _) = call(&repo, &cfg, Duration::from_secs(2));
        let e = result.expect_err("a timeout");
        assert!(
            matches!(e, CallError::Timeout { idle: false, .. }),
            "{mode}: {e:?}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{mode}: {:?}",
            t.elapsed()
        );
        assert!(
            repo.log().contains("session/cancel"),
            "{mode}: {}",
            repo.log()
        );
    }
}

#[test]
fn a_crash_is_transient_and_garbage_is_not_acp() {
    let repo = Repo::new();
    let cfg = config("commit", &[("FAKE_MODE", "crash")]);
    let (result, _) = call(&repo, &cfg, Duration::from_secs(30));
    let e = result.expect_err("a crash");
    let CallError::Transient { message, .. } = &e else {
        panic!("transient: {e:?}");
    };
    assert!(message.contains("the fake agent crashed"), "{message}");

    let cfg = config("commit", &[("FAKE_MODE", "garbage")]);
    let (result, _) = call(&repo, &cfg, Duration::from_secs(30));
    let e = result.expect_err("garbage");
    let CallError::Failed { message } = &e else {
        panic!("failed: {e:?}");
    };
    assert!(message.contains("does not speak ACP"), "{message}");

    let mut cfg = config("commit", &[]);
    cfg.command = vec!["surely-not-an-acp-agent-3f1".into()];
    let (result, _) = call(&repo, &cfg, Duration::from_secs(30));
    assert!(
        matches!(result, Err(CallError::Missing { .. })),
        "{result:?}"
    );
}

#[test]
fn an_unknown_model_is_refused_naming_those_offered() {
    let repo = Repo::new();
    let mut cfg = config("commit", &[("FAKE_ACP_CASE", "gemini/ok")]);
    cfg.model = Some("gpt-9".into());
    let (result, _) = call(&repo, &cfg, Duration::from_secs(30));
    let e = result.expect_err("refused");
    let CallError::Refused { message } = &e else {
        panic!("refused: {e:?}");
    };
    assert!(message.contains("`gpt-9`"), "{message}");
    assert!(message.contains("`gemini-2.5-pro`"), "{message}");
}

/// A workflow with one `acp` stage run by the fake.
fn acp_workflow(permissions: &str, timeout: &str) -> String {
    format!(
        r#"name = "a"

[agents.main]
kind = "acp"
command = ["{}"]
permissions = "{permissions}"
timeout = "{timeout}"

[stages.work]
kind = "agent"
agent = "main"
prompt = "Write notes.txt, commit it with git, then push to origin."
output = {{ extract = "json", schema = {{ type = "object", required = ["verdict"], properties = {{ verdict = {{ enum = ["VALID", "INVALID"] }} }} }} }}
"#,
        fake()
    )
}

#[test]
fn a_workflow_gets_its_answer_tool_calls_and_denials_through_acp() {
    // A bare remote that has the first commit: a push that ran would move its `main`.
    let (p, remote) = Project::with_origin();
    let origin = remote.path().join("o.git");
    let remote_log = || {
        let out = std::process::Command::new("git")
            .args([
                "--git-dir",
                origin.to_str().unwrap(),
                "log",
                "--format=%s",
                "main",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(remote_log().trim(), "init");
    p.workflow("w.toml", &acp_workflow("commit", "60s"));
    let out = p.run_env(
        &["run", "w.toml", "--json"],
        &[
            ("FAKE_ACP_CASE", "claude/edit_commit_push"),
            ("FAKE_REPLY", r#"{"verdict": "VALID"}"#),
        ],
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.json["outputs"]["work"]["verdict"], "VALID");
    // The progress (plain lines, stderr not being a terminal) shows the tool calls as they
    // start, and the denial with its rule on a line of its own.
    assert!(
        out.stderr.contains("work: ⚙ Write notes.txt"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "⛔ work: git push origin HEAD: denied by policy `commit`: deny `git push *`"
        ),
        "{}",
        out.stderr
    );
    let store = p.store_text();
    // The tool calls and the decisions are events of the stage.
    assert!(store.contains(r#""kind":"tool""#), "{store}");
    assert!(store.contains("edit: Write notes.txt"), "{store}");
    assert!(store.contains(r#""kind":"permission""#), "{store}");
    assert!(
        store.contains("allowed by policy `commit`: allow `git commit *`"),
        "{store}"
    );
    assert!(store.contains(r#""kind":"denied""#), "{store}");
    // The denied push is in denied.txt with its rule, and did not run; the commit did.
    let denied = p.attempt_file("denied.txt");
    assert!(
        denied.contains(
            "git push origin HEAD: denied by policy `commit`: deny `git push *` (git push origin HEAD)"
        ),
        "{denied}"
    );
    assert_eq!(p.git(&["log", "-1", "--format=%s"]).trim(), "add notes");
    assert_eq!(
        remote_log().trim(),
        "init",
        "the denied push reached the remote"
    );
    assert!(p.attempt_file("acp.jsonl").contains("session/prompt"));
    assert!(p.attempt_file("transcript.md").contains("Write notes.txt"));
}

#[test]
fn a_workflow_whose_agent_hangs_ends_at_its_timeout() {
    let p = Project::new();
    p.workflow("w.toml", &acp_workflow("read-only", "2s"));
    let t = Instant::now();
    let out = p.run_env(
        &["run", "w.toml", "--json"],
        &[
            ("FAKE_ACP_CASE", "claude/ok"),
            ("FAKE_MODE", "ignore_cancel"),
        ],
    );
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    assert!(
        p.store_text().contains("timed out after 2s"),
        "{}",
        p.store_text()
    );
}

#[test]
fn check_wants_a_command_and_refuses_keys_and_modes_acp_does_not_take() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "a"

[agents.main]
kind = "acp"
base_url = "http://localhost:1"
structured_output = "json_schema"

[stages.work]
kind = "agent"
agent = "main"
prompt = "hi"
"#,
    );
    let out = p.run(&["check", "w.toml"]);
    assert_ne!(out.code, 0);
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(
        all.contains("agent `main` of kind `acp` needs `command`"),
        "{all}"
    );
    assert!(all.contains("base_url"), "{all}");
    assert!(
        all.contains("an `acp` agent has no schema mode of its own"),
        "{all}"
    );
}

#[test]
fn sigterm_cancels_the_turn_and_the_agent_ends() {
    let p = Project::new();
    p.workflow("w.toml", &acp_workflow("read-only", "10m"));
    let log = p.dir().join("fake.log");
    let run = p.spawn_env(
        &["run", "w.toml", "--json"],
        &[
            ("FAKE_ACP_CASE", "claude/ok"),
            ("FAKE_MODE", "hang"),
            ("FAKE_LOG", log.to_str().unwrap()),
        ],
    );
    // The turn is under way.
    p.wait_for(|| p.read("fake.log").contains("session/prompt"));
    let agent: i64 = p
        .read("fake.log")
        .lines()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["pid"].as_i64())
        .unwrap();
    let t = Instant::now();
    run.signal(nix::sys::signal::Signal::SIGTERM);
    let out = run.finish();
    assert_eq!(out.code, 143, "{}", out.stderr);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    // The agent was told, and is gone.
    p.wait_for(|| !common::alive(i32::try_from(agent).unwrap()));
    let wire = p.attempt_file("acp.jsonl");
    let cancel = wire
        .lines()
        .last()
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .unwrap();
    assert_eq!(cancel["from"], "client", "{wire}");
    assert_eq!(cancel["msg"]["method"], "session/cancel", "{wire}");
}

#[test]
fn the_agents_errors_are_classified_as_captured() {
    let repo = Repo::new();
    for (case, rate_limited) in [
        ("claude/invalid_key", false),
        ("claude/rate_limit", true),
        ("gemini/invalid_key", false),
        ("qwen/invalid_key", false),
        ("qwen/rate_limit", true),
        ("opencode/invalid_key", false),
    ] {
        let cfg = config("commit", &[("FAKE_ACP_CASE", case)]);
        let (result, _) = call(&repo, &cfg, Duration::from_secs(60));
        let e = result.expect_err(case);
        if rate_limited {
            assert!(matches!(e, CallError::RateLimited { .. }), "{case}: {e:?}");
        } else {
            let CallError::Refused { message } = &e else {
                panic!("{case}: refused: {e:?}");
            };
            assert!(message.contains("set its API key"), "{case}: {message}");
        }
    }
}

#[test]
fn gemini_creates_a_file_through_the_client_after_reading_it_missing() {
    let repo = Repo::new();
    let before = repo.origin_head();
    let cfg = config("commit", &[("FAKE_ACP_CASE", "gemini/edit_commit_push")]);
    let (result, seen) = call(&repo, &cfg, Duration::from_secs(60));
    let reply = result.unwrap_or_else(|e| panic!("{e}\n{}", repo.log()));
    assert_eq!(
        std::fs::read_to_string(repo.work.join("notes.txt")).unwrap(),
        "written by the mock model\n"
    );
    assert!(
        seen.contains(&Activity::Wrote("notes.txt".into())),
        "{seen:?}"
    );
    assert_eq!(repo.artifact("written.txt"), "notes.txt\n");
    assert_eq!(git(&repo.work, &["log", "-1", "--format=%s"]), "add notes");
    assert_eq!(repo.origin_head(), before);
    assert_eq!(reply.denied.len(), 1, "{:?}", reply.denied);
    assert!(
        reply.denied[0].contains("deny `git push *`"),
        "{:?}",
        reply.denied
    );
}

//! Whole runs through each backend: the fake claude, codex and gemini CLIs (their documented
//! output formats, rate limits and errors) and local HTTP servers speaking the OpenAI and
//! Anthropic APIs. No network, no LLM.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::Project;
use serde_json::json;

fn with_env(p: &Project, env: &[(&str, &str)], args: &[&str]) -> common::Out {
    p.run_env(args, env)
}

const REVIEW: &str = r#"
[stages.review]
kind = "agent"
agent = "main"
prompt = "Review the code."
output = { extract = "json", schema = { type = "object", required = ["verdict"], properties = { verdict = { enum = ["VALID", "INVALID"] } } } }
"#;

fn now() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string()
}

fn workflow(agents: &str) -> String {
    format!("name = \"b\"\n{agents}\n{REVIEW}")
}

#[test]
fn claude_codex_and_gemini_answers_and_usage_are_read() {
    for kind in ["claude", "codex", "gemini"] {
        let p = Project::new();
        p.workflow(
            "w.toml",
            &workflow(&format!(
                "[agents.main]\nkind = \"{kind}\"\nmodel = \"m-1\""
            )),
        );
        let state = p.dir().join("fake");
        let out = with_env(
            &p,
            &[
                ("FAKE_REPLY", r#"{"verdict": "VALID"}"#),
                ("FAKE_STRUCTURED", r#"{"verdict": "VALID"}"#),
                ("FAKE_STATE_DIR", state.to_str().unwrap()),
                ("FAKE_LOG", p.dir().join("fake.log").to_str().unwrap()),
            ],
            &["run", "w.toml", "--json"],
        );
        assert_eq!(out.code, 0, "{kind}: {}", out.stderr);
        assert_eq!(out.json["outputs"]["review"]["verdict"], "VALID", "{kind}");
        let log = p.read("fake.log");
        assert!(
            log.contains("Review the code."),
            "{kind}: the prompt went on stdin: {log}"
        );
        assert!(
            log.contains("arg: m-1"),
            "{kind}: the model is passed: {log}"
        );
        let store = p.store_text();
        assert!(
            store.contains("\"output_tokens\":20,\"cached_tokens\":10"),
            "{kind}: usage recorded: {store}"
        );
    }
}

#[test]
fn a_rate_limit_waits_without_using_up_an_attempt_and_transient_failures_retry() {
    let now = now();
    for (seq, kind) in [
        ("rate_limit ok", "rate_limited"),
        ("overloaded garbage ok", "retry"),
    ] {
        let p = Project::new();
        p.workflow(
            "w.toml",
            &workflow("[agents.main]\nkind = \"claude\"").replace(
                "prompt = \"Review the code.\"",
                "prompt = \"Review the code.\"\nretries = 0",
            ),
        );
        let state = p.dir().join("fake");
        let out = with_env(
            &p,
            &[
                ("FAKE_SEQUENCE", seq),
                ("FAKE_RESET_EPOCH", &now),
                ("FAKE_REPLY", r#"{"verdict": "INVALID"}"#),
                ("FAKE_STATE_DIR", state.to_str().unwrap()),
            ],
            &["run", "w.toml", "--json"],
        );
        assert_eq!(out.code, 0, "{seq}: {}", out.stderr);
        assert_eq!(out.json["outputs"]["review"]["verdict"], "INVALID");
        let store = p.store_text();
        assert!(
            store.contains(&format!("\"kind\":\"{kind}\"")),
            "{seq}: {store}"
        );
        // One attempt: neither the wait nor the retries used one up.
        assert!(store.contains("\"attempts\":1"), "{seq}: {store}");
    }
}

#[test]
fn fallback_agents_take_over_when_one_is_missing_or_rate_limited() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &workflow(
            "[agents.main]\nkind = \"claude\"\nfallbacks = [\"second\"]\n[agents.second]\nkind = \"gemini\"\nfallbacks = [\"third\"]\n[agents.third]\nkind = \"codex\"",
        ),
    );
    let out = with_env(
        &p,
        &[
            ("RALPH_FLOW_CLAUDE", "/nonexistent/claude"),
            ("RALPH_FLOW_GEMINI", "/nonexistent/gemini"),
            ("FAKE_REPLY", r#"{"verdict": "VALID"}"#),
        ],
        &["run", "w.toml", "--json"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let store = p.store_text();
    assert!(store.contains("falling back to `second`"), "{store}");
    assert!(store.contains("falling back to `third`"), "{store}");
    assert!(store.contains("\"agent\":\"third\""), "{store}");

    let p = Project::new();
    p.workflow(
        "w.toml",
        &workflow("[agents.main]\nkind = \"gemini\"\nfallbacks = [\"other\"]\n[agents.other]\nkind = \"claude\""),
    );
    let state = p.dir().join("fake");
    std::fs::create_dir_all(&state).unwrap();
    let out = with_env(
        &p,
        &[
            ("FAKE_SEQUENCE", "rate_limit ok"),
            ("FAKE_RESET_EPOCH", &now()),
            ("FAKE_STATE_DIR", state.to_str().unwrap()),
            ("FAKE_REPLY", r#"{"verdict": "VALID"}"#),
        ],
        &["run", "w.toml", "--json"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let store = p.store_text();
    assert!(store.contains("falling back to `other`"), "{store}");
    assert!(
        store.contains("\"agent\":\"other\""),
        "the answer came from the fallback: {store}"
    );
}

#[test]
fn a_prompt_over_the_context_window_fails_before_anything_is_sent() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            "name = \"cw\"\n[agents.main]\nkind = \"claude\"\ncontext_window = 50\n[stages.big]\nkind = \"agent\"\nagent = \"main\"\nprompt = \"# Task\\nsmall\\n\\n# Context\\n{}\"\n",
            "word ".repeat(100)
        ),
    );
    let out = with_env(
        &p,
        &[("FAKE_LOG", p.dir().join("fake.log").to_str().unwrap())],
        &["run", "w.toml"],
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("context window of 50"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("# Context"),
        "names the largest part: {}",
        out.stderr
    );
    assert!(!p.dir().join("fake.log").exists(), "nothing was sent");
}

#[test]
fn an_agent_that_produced_its_result_is_not_killed_as_idle() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &workflow("[agents.main]\nkind = \"claude\"\nidle_timeout = \"1s\"\ntimeout = \"3s\""),
    );
    let out = with_env(
        &p,
        &[
            ("FAKE_MODE", "hang_after_result"),
            ("FAKE_REPLY", r#"{"verdict": "VALID"}"#),
        ],
        &["run", "w.toml", "--json"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["review"]["verdict"], "VALID");

    let out = with_env(&p, &[("FAKE_MODE", "hang")], &["run", "w.toml"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("idle"), "{}", out.stderr);
}

/// A canned HTTP response: status, extra headers, body.
type Canned = (u16, Vec<(&'static str, String)>, String);

/// A local HTTP server answering each request with the next canned response.
struct Server {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
}

fn serve(responses: Vec<Canned>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    std::thread::spawn(move || {
        let mut queue = responses.into_iter();
        let mut last = None;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            seen.lock()
                .unwrap()
                .push(format!("{head}{}", String::from_utf8_lossy(&body)));
            let (status, headers, text) = match queue.next() {
                Some(r) => {
                    last = Some(r.clone());
                    r
                }
                None => last.clone().unwrap(),
            };
            let mut resp = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                text.len()
            );
            for (k, v) in headers {
                resp.push_str(&format!("{k}: {v}\r\n"));
            }
            resp.push_str("\r\n");
            resp.push_str(&text);
            let _ = stream.write_all(resp.as_bytes());
        }
    });
    Server { url, requests }
}

#[test]
fn openai_and_anthropic_compatible_servers_answer_with_retry_after_honoured() {
    let chat = json!({"id": "c1", "model": "qwen", "choices": [{"message": {"role": "assistant", "content": "{\"verdict\": \"VALID\"}"}}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 10}}});
    let server = serve(vec![
        (
            429,
            vec![("retry-after", "1".to_string())],
            json!({"error": {"message": "slow down"}}).to_string(),
        ),
        (200, vec![], chat.to_string()),
    ]);
    let p = Project::new();
    p.workflow(
        "w.toml",
        &workflow(&format!(
            "[agents.main]\nkind = \"openai\"\nmodel = \"qwen\"\nbase_url = \"{}/v1\"",
            server.url
        )),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["review"]["verdict"], "VALID");
    let reqs = server.requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 2, "the 429 was retried");
    assert!(reqs[1].contains("POST /v1/chat/completions"), "{}", reqs[1]);
    assert!(
        reqs[1].contains("json_schema"),
        "native JSON-schema output: {}",
        reqs[1]
    );
    assert!(p.store_text().contains("rate_limited"));

    let msg = json!({"id": "m1", "model": "claude-x", "content": [{"type": "text", "text": "{\"verdict\": \"INVALID\"}"}],
        "usage": {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 0}});
    let server = serve(vec![
        (529, vec![], json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string()),
        (200, vec![], msg.to_string()),
    ]);
    let p = Project::new();
    p.workflow(
        "w.toml",
        &workflow(&format!(
            "[agents.main]\nkind = \"anthropic\"\nmodel = \"claude-x\"\nbase_url = \"{}/v1\"\napi_key_env = \"HOME\"",
            server.url
        )),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["review"]["verdict"], "INVALID");
    let reqs = server.requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 2, "the 529 was retried");
    assert!(reqs[1].contains("anthropic-version"), "{}", reqs[1]);
    // The key is never written into artifacts or the store.
    let home = std::env::var("HOME").unwrap();
    let artifacts = walk(&p.dir().join(".ralph-flow/runs"));
    assert!(
        !artifacts.contains(&format!("\"{home}\"")),
        "the key leaked into artifacts"
    );
}

fn walk(dir: &std::path::Path) -> String {
    let mut out = String::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.push_str(&walk(&p));
            } else {
                out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    out
}

#[test]
fn templates_see_undefined_earlier_values_and_failed_checks_give_their_feedback_template() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "fb"
[agents.bot]
kind = "command"
command = ["scripted"]

[stages.fix]
kind = "loop"
max_iterations = 3
until = "stages.test.output.passed"

[stages.fix.stages.work]
kind = "agent"
agent = "bot"
prompt = "last: [{{ stages.test.last.stderr }}] feedback: [{{ feedback }}]"

[stages.fix.stages.test]
kind = "check"
needs = ["work"]
argv = ["sh", "-c", "echo noise; echo \"FAIL: $0\" >&2; test \"$0\" = green", "{{ stages.work.output.text | trim }}"]
feedback = "{{ output.stderr | trim }}"
"#,
    );
    p.answer("work", 1, "red");
    p.answer("work", 2, "green");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(p.prompt("work", 1), "last: [] feedback: []");
    assert_eq!(
        p.prompt("work", 2),
        "last: [FAIL: red\n] feedback: [FAIL: red]",
        "the check's own feedback template, not the engine's message"
    );
}

/// A codex agent under `permissions = "edit"` (workspace-write) whose commit its sandbox
/// refused (the fake replays the real codex: capture `denied_workspace`) says so: in the
/// progress, as a `denied` event in `logs`, and in the attempt's `denied.txt`. ralph-flow's
/// own RUST_LOG does not hide codex's log of the refusals.
#[test]
fn a_codex_commit_its_sandbox_refused_is_reported() {
    let p = Project::new();
    p.git_init();
    p.workflow(
        "w.toml",
        r#"
name = "w"

[agents.a]
kind = "codex"
permissions = "edit"

[stages.work]
kind = "agent"
agent = "a"
prompt = "Fix the bug and commit."
"#,
    );
    p.git(&["add", "-A"]);
    p.git(&["commit", "-qm", "the workflow"]);
    let out = with_env(
        &p,
        &[("FAKE_MODE", "denied"), ("RUST_LOG", "ralph_flow=error")],
        &["run", "w.toml", "--json"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    // What the refused commit left: the agent's file, never committed.
    let status = p.git(&["status", "--porcelain"]);
    assert_eq!(status.lines().count(), 1, "{status}");
    let denied = [
        "apply_patch: rejected, writing outside of the project (2 times)",
        "shell: a write to ../mock-outside-shell.txt (read-only file system)",
        "shell: a write, path not logged (read-only file system)",
        "git: 1 changed file left uncommitted",
    ];
    let line = format!(
        "! work: agent `a` was denied 4 actions (its `permissions` is `edit`): {}",
        denied.join("; ")
    );
    assert!(out.stderr.contains(&line), "{}", out.stderr);
    let logs = p.run(&["logs", &run]);
    assert_eq!(logs.code, 0, "{}", logs.stderr);
    let event = logs
        .stdout
        .lines()
        .find(|l| l.contains("denied"))
        .unwrap_or_else(|| panic!("no denied event: {}", logs.stdout));
    assert!(
        event.contains("agent `a` was denied 4 actions (its `permissions` is `edit`)")
            && event.contains(denied[2])
            && event.contains(denied[3]),
        "{event}"
    );
    // The attempt's artifacts are records of the run's artifacts.jsonl.
    let records = p.read(&format!(".ralph-flow/runs/{run}/artifacts.jsonl"));
    let texts: Vec<String> = records
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["path"] == "work/attempt-1/denied.txt")
        .map(|r| r["text"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(texts, [denied.join("\n")], "{records}");
}

/// A stage's own `permissions` (a policy that comes down to `edit`) reaches the agent CLI it
/// calls instead of the agent's `read-only`: the fake codex replays what the real one did
/// under workspace-write (its commit refused), not what read-only refuses, and the denials
/// name the stage's policy.
#[test]
fn a_stage_policy_reaches_the_cli_as_its_level() {
    let p = Project::new();
    p.git_init();
    p.workflow(
        "w.toml",
        r#"
name = "w"

[policy.careful]
extends = "edit"

[agents.a]
kind = "codex"
permissions = "read-only"

[stages.work]
kind = "agent"
agent = "a"
prompt = "Fix the bug and commit."
permissions = "careful"
"#,
    );
    p.git(&["add", "-A"]);
    p.git(&["commit", "-qm", "the workflow"]);
    let out = with_env(
        &p,
        &[("FAKE_MODE", "denied"), ("RUST_LOG", "ralph_flow=error")],
        &["run", "w.toml", "--json"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let denied = [
        "apply_patch: rejected, writing outside of the project (2 times)",
        "shell: a write to ../mock-outside-shell.txt (read-only file system)",
        "shell: a write, path not logged (read-only file system)",
        "git: 1 changed file left uncommitted",
    ];
    let line = format!(
        "! work: agent `a` was denied 4 actions (its `permissions` is `careful`): {}",
        denied.join("; ")
    );
    assert!(out.stderr.contains(&line), "{}", out.stderr);
}

/// An agent's `permissions` naming a policy: the CLI gets the level the policy comes down
/// to (`edit = true` over `read-only` is `edit`), and the denials name the policy.
#[test]
fn an_agent_policy_reaches_the_cli_as_its_level() {
    let p = Project::new();
    p.git_init();
    p.workflow(
        "w.toml",
        r#"
name = "w"

[policy.writer]
edit = true

[agents.a]
kind = "codex"
permissions = "writer"

[stages.work]
kind = "agent"
agent = "a"
prompt = "Fix the bug and commit."
"#,
    );
    p.git(&["add", "-A"]);
    p.git(&["commit", "-qm", "the workflow"]);
    let out = with_env(
        &p,
        &[("FAKE_MODE", "denied"), ("RUST_LOG", "ralph_flow=error")],
        &["run", "w.toml", "--json"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "! work: agent `a` was denied 4 actions (its `permissions` is `writer`): apply_patch: rejected, writing outside of the project (2 times)"
        ),
        "{}",
        out.stderr
    );
}

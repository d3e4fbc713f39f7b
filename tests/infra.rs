//! Failures that are not the work's: an agent that is not installed, a server that cannot be
//! reached, a recording with no answer. None of them may look like a verdict on the work:
//! nothing of them reaches an agent as feedback, and the run says what the cause was.
#![allow(clippy::unwrap_used)]

mod common;

use common::Project;

/// A driver (a scripted command agent) and a reviewer that cannot be reached, in a loop.
fn unreachable_reviewer(on_error: &str) -> String {
    format!(
        r#"name = "infra"

[agents.bot]
kind = "command"
command = ["scripted"]

[agents.remote]
kind = "openai"
model = "m"
base_url = "http://127.0.0.1:1/v1"

[stages.attempts]
kind = "loop"
max_iterations = 2
on_exhausted = "fail"

[stages.attempts.stages.driver]
kind = "agent"
agent = "bot"
prompt = """Write the code.
{{% for h in history %}}Earlier feedback: {{{{ h.feedback }}}}
{{% endfor %}}"""

[stages.attempts.stages.reviewer]
kind = "agent"
agent = "remote"
needs = ["driver"]
prompt = "Review: {{{{ stages.driver.output.text }}}}"
{on_error}
"#
    )
}

#[test]
fn an_unreachable_agent_fails_the_loop_and_names_the_cause() {
    let p = Project::new();
    p.workflow("w.toml", &unreachable_reviewer(""));
    p.answer("driver", 1, "code one");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(out.json["exit"], "failed");
    // No second iteration was started as if a reviewer had rejected the code.
    assert_eq!(p.calls("driver"), 1);
    // The root cause is in the progress line of the stage and in the run's final message.
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("✗ attempts#1/reviewer failed"))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(
        line.contains("POST http://127.0.0.1:1/v1/chat/completions failed"),
        "{line}"
    );
    let message = out.json["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`reviewer` failed in iteration 1")
            && message.contains("POST http://127.0.0.1:1"),
        "{message}"
    );
}

#[test]
fn on_error_continue_goes_on_without_feeding_the_error_to_the_agent() {
    let p = Project::new();
    p.workflow("w.toml", &unreachable_reviewer("on_error = \"continue\""));
    p.answer("driver", 1, "code one");
    p.answer("driver", 2, "code two");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(p.calls("driver"), 2, "{}", out.stderr);
    let second = p.prompt("driver", 2);
    assert!(!second.contains("127.0.0.1"), "{second}");
    assert!(!second.contains("Earlier feedback: agent"), "{second}");
}

#[test]
fn a_missing_agent_program_stops_the_run_before_anything_starts() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "missing"

[agents.main]
kind = "claude"

[stages.draft]
kind = "agent"
agent = "main"
prompt = "Draft it."
"#,
    );
    let out = p.run_env(
        &["run", "w.toml"],
        &[("RALPH_FLOW_CLAUDE", "/nonexistent/claude")],
    );
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("w.toml:3:9")
            && out
                .stderr
                .contains("`/nonexistent/claude` is not installed")
            && out
                .stderr
                .contains("npm install -g @anthropic-ai/claude-code"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("nothing was started"), "{}", out.stderr);
    // No run was recorded, and nothing was attempted.
    let runs = p.run(&["runs", "--json"]);
    assert_eq!(runs.json, serde_json::json!([]), "{}", runs.stdout);
}

#[test]
fn an_http_agent_without_its_key_stops_the_run_before_anything_starts() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "keyless"

[agents.main]
kind = "openai"
model = "gpt-5"
api_key_env = "RF_TEST_SURELY_UNSET_KEY_91c2"

[stages.draft]
kind = "agent"
agent = "main"
prompt = "Draft it."
"#,
    );
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("the API key variable `RF_TEST_SURELY_UNSET_KEY_91c2` is not set"),
        "{}",
        out.stderr
    );
    // The message is said once, not once per layer.
    assert_eq!(
        out.stderr.matches("agent `main`").count(),
        1,
        "{}",
        out.stderr
    );
}

#[test]
fn a_recording_without_an_answer_is_no_feedback() {
    let p = Project::new();
    p.workflow("w.toml", &unreachable_reviewer(""));
    // A recording that answers the driver but not the reviewer.
    p.write(
        "rec.jsonl",
        "{\"scope\":\"attempts#1\",\"stage\":\"driver\",\"attempt\":1,\"agent\":\"bot\",\"prompt_bytes\":15,\"reply\":{\"text\":\"code\",\"raw\":\"\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1,\"cached_tokens\":0,\"cost_usd\":null},\"session_id\":null,\"model\":null}}\n",
    );
    let out = p.run(&["run", "w.toml", "--replay", "rec.jsonl", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let message = out.json["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("has no answer for stage `reviewer`"),
        "{message}"
    );
    // The loop did not go on to a second iteration as if the review had been negative.
    assert!(!out.stderr.contains("attempts#2"), "{}", out.stderr);
}

#[test]
fn a_replayed_run_resumes_from_its_recording_and_a_changed_prompt_is_named() {
    let p = Project::new();
    let w = r#"name = "gated"

[params.topic]
type = "string"
default = "cats"

[agents.bot]
kind = "command"
command = ["scripted"]

[stages.a]
kind = "agent"
agent = "bot"
prompt = "About {{ params.topic }}."

[stages.ok]
kind = "gate"
needs = ["a"]
message = "Go on?"

[stages.b]
kind = "agent"
agent = "bot"
needs = ["ok"]
prompt = "Then {{ stages.a.output.text }}."
"#;
    p.workflow("w.toml", w);
    p.answer("a", 1, "alpha");
    p.answer("b", 1, "beta");
    let live = p.run(&[
        "run",
        "w.toml",
        "--record",
        "rec.jsonl",
        "--no-wait",
        "--json",
    ]);
    assert_eq!(live.code, 75, "{}", live.stderr);
    let run = live.json["run"].as_str().unwrap().to_string();
    assert_eq!(p.run(&["approve", &run, "ok"]).code, 0);
    let done = p.run(&["resume", &run, "--json"]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    // The resumed half was recorded too, after the first half.
    let rec = p.read("rec.jsonl");
    assert_eq!(rec.lines().count(), 2, "{rec}");

    // Replay, with the agent gone: the resume keeps answering from the recording.
    std::fs::remove_dir_all(p.dir().join("answers")).unwrap();
    std::fs::create_dir_all(p.dir().join("answers")).unwrap();
    let replayed = p.run(&[
        "run",
        "w.toml",
        "--replay",
        "rec.jsonl",
        "--no-wait",
        "--json",
    ]);
    assert_eq!(replayed.code, 75, "{}", replayed.stderr);
    let run = replayed.json["run"].as_str().unwrap().to_string();
    assert_eq!(p.run(&["approve", &run, "ok"]).code, 0);
    let done = p.run(&["resume", &run, "--json"]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert_eq!(done.json["outputs"]["b"]["text"], "beta");
    assert_eq!(p.calls("b"), 0, "the agent was not called on resume");

    // Other params change the prompt: the replay says which stage differs.
    let other = p.run(&[
        "run",
        "w.toml",
        "--replay",
        "rec.jsonl",
        "--set",
        "topic=dogs",
        "--no-wait",
    ]);
    assert_eq!(other.code, 75, "{}", other.stderr);
    assert!(
        other
            .stderr
            .contains("the prompt of stage `a` differs from the one recorded"),
        "{}",
        other.stderr
    );
    assert!(
        !other.stderr.contains("stage `b` differs"),
        "b has not run yet: {}",
        other.stderr
    );
}

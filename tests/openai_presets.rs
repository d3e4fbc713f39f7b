//! The shipped presets, run with every agent pointed at an OpenAI-compatible server (the
//! `openai` kind), as a new user would with a local model. The server here speaks the
//! dialect of llama-cpp-python's server, as captured from the real one
//! (tests/fixtures/servers/llama-cpp-python/): it streams server-sent events, answers HTTP
//! 500 to `response_format: {type: json_schema}`, and constrains the answer to bare JSON
//! under `{type: json_object, schema}`. The model's answers are scripted per stage.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::Project;
use serde_json::{Value, json};
use wiremock::{Request, Respond, ResponseTemplate};

/// A scripted model behind llama-cpp-python's dialect.
#[derive(Clone, Default)]
struct Model {
    /// (a text the prompt contains, the answers in order; the last repeats).
    script: Vec<(&'static str, Vec<String>)>,
    /// Every request body received.
    seen: Arc<Mutex<Vec<Value>>>,
    calls: Arc<Mutex<HashMap<&'static str, usize>>>,
}

/// A captured exchange of llama-cpp-python's server.
fn capture(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/servers/llama-cpp-python")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

impl Respond for Model {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        self.seen.lock().unwrap().push(body.clone());
        let format = body
            .pointer("/response_format/type")
            .and_then(Value::as_str);
        if format == Some("json_schema") {
            // What ralph-flow's request gets from the real server (`strict: false`).
            let rejected = capture("json_schema_loose");
            return ResponseTemplate::new(500)
                .insert_header("content-type", "application/json")
                .set_body_string(rejected["raw"].as_str().unwrap());
        }
        let prompt = body
            .pointer("/messages/0/content")
            .and_then(Value::as_str)
            .unwrap();
        let Some((needle, answers)) = self.script.iter().find(|(n, _)| prompt.contains(n)) else {
            return ResponseTemplate::new(200).set_body_json(completion("I do not know.", 10));
        };
        let n = {
            let mut calls = self.calls.lock().unwrap();
            let c = calls.entry(needle).or_default();
            *c += 1;
            *c
        };
        let mut text = answers[(n - 1).min(answers.len() - 1)].clone();
        if format == Some("json_object") {
            // The grammar the schema compiles to admits the JSON document alone.
            text = unfence(&text);
        }
        if body["stream"] == json!(true) {
            ResponseTemplate::new(200)
                .insert_header("content-type", "text/event-stream")
                .set_body_string(stream(&text))
        } else {
            ResponseTemplate::new(200).set_body_json(completion(&text, 10))
        }
    }
}

impl Model {
    fn requests(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }
}

/// The JSON inside a ```json fence, or the text itself.
fn unfence(text: &str) -> String {
    match text.split_once("```json") {
        Some((_, rest)) => rest.split("```").next().unwrap().trim().to_string(),
        None => text.trim().to_string(),
    }
}

fn completion(text: &str, prompt_tokens: u64) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gemma",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5}
    })
}

/// An answer as llama-cpp-python streams it, built from a captured stream: its role chunk,
/// one of its content chunks per piece of the text, a keep-alive comment as the server
/// sends during long generations, its final chunk (`delta: {}` with the finish reason, and
/// no usage: the server ignores `stream_options`), then `[DONE]`.
fn stream(text: &str) -> String {
    let captured = capture("stream_json_object_schema");
    let events: Vec<&str> = captured["raw"]
        .as_str()
        .unwrap()
        .split("\n\n")
        .filter(|e| e.starts_with("data: {"))
        .collect();
    let (first, content, last) = (events[0], events[1], events[events.len() - 1]);
    let mut piece: Value = serde_json::from_str(&content["data: ".len()..]).unwrap();
    let mut out = format!("{first}\n\n");
    let chars: Vec<char> = text.chars().collect();
    for (i, part) in chars.chunks(7).enumerate() {
        piece["choices"][0]["delta"]["content"] = json!(part.iter().collect::<String>());
        out.push_str(&format!("data: {piece}\n\n"));
        if i == 0 {
            out.push_str(": ping - 2026-11-23 11:44:11.151215+00:00\n\n");
        }
    }
    out.push_str(&format!("{last}\n\ndata: [DONE]\n\n"));
    out
}

/// Starts the server (see [`common::serve_posts`]) and returns its base URI.
fn serve(model: &Model) -> String {
    common::serve_posts(model.clone())
}

/// A workflow that extends a built-in preset and points the given agents at the server.
fn wrapper(server: &str, preset: &str, agents: &[&str], params: &str) -> String {
    let mut w = format!(
        "name = \"local-{preset}\"\nextends = {{ workflow = \"{preset}\", params = {{ {params} }} }}\n"
    );
    for a in agents {
        w.push_str(&format!(
            "\n[agents.{a}]\nkind = \"openai\"\nmodel = \"gemma\"\nbase_url = \"{}/v1\"\n",
            server
        ));
    }
    w
}

fn run(p: &Project, args: &[&str]) -> common::Out {
    p.run(args)
}

/// The structured-output warning: once per agent, naming the setting.
fn assert_stepped_down_once(stderr: &str, agents: usize) {
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("rejected structured output `json_schema`"))
        .count();
    assert_eq!(warnings, agents, "{stderr}");
    assert!(
        stderr.contains("set `structured_output = \"json_object\"` on the agent"),
        "{stderr}"
    );
}

fn git(p: &Project, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(p.dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn cairo_reaches_success_with_a_local_model() {
    let model = Model {
        script: vec![
            (
                "You are the driver.",
                vec![
                    "Here is the code.\n```json\n{\"code\": \"struct Stack<T> { items: Array<T> }\", \"notes\": \"first try\"}\n```".into(),
                ],
            ),
            (
                "You are the reviewer.",
                vec![r#"{"verdict": "VALID", "issues": []}"#.into()],
            ),
        ],
        ..Model::default()
    };
    let server = serve(&model);
    let p = Project::new();
    p.write(
        "w.toml",
        &wrapper(
            &server,
            "cairo-driver-reviewer",
            &["driver_codex", "reviewer_codex"],
            "prompt = \"task.md\", rubric = \"rubric.md\", work_dir = \"work\", max_attempts = 2",
        ),
    );
    p.write("task.md", "Implement a generic Stack<T>.\n");
    p.write("rubric.md", "- R1: uses generics\n");
    p.write("work/Scarb.toml", "[package]\nname = \"demo\"\n");
    let out = run(&p, &["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["exit"], "success");
    assert!(p.read("work/src/lib.cairo").contains("struct Stack<T>"));
    assert_stepped_down_once(&out.stderr, 2);
    // The first request of each agent asked for json_schema; every later one json_object
    // with the schema, and none was retried as if the 500 were transient.
    let formats: Vec<String> = model
        .requests()
        .iter()
        .map(|r| {
            r.pointer("/response_format/type")
                .and_then(Value::as_str)
                .unwrap_or("none")
                .to_string()
        })
        .collect();
    assert_eq!(
        formats,
        ["json_schema", "json_object", "json_schema", "json_object"],
        "{formats:?}"
    );
    assert!(
        model.requests()[1]["response_format"]["schema"]["required"]
            .as_array()
            .is_some_and(|r| r.contains(&json!("code")))
    );
    assert!(model.requests().iter().all(|r| r["stream"] == json!(true)));
}

#[test]
fn wiggum_ends_clean_in_a_repository_without_a_gitignore() {
    let model = Model {
        script: vec![(
            "You are reviewing this repository with fresh eyes.",
            vec!["I read every file under src.\nNO_ISSUES".into()],
        )],
        ..Model::default()
    };
    let server = serve(&model);
    let p = Project::new();
    // A committed tree with no .gitignore at all.
    p.write(
        "src/lib.rs",
        "pub fn add(a: i32, b: i32) -> i32 { a + b }\n",
    );
    p.write("criteria.md", "Correctness first.\n");
    p.write(
        "w.toml",
        &wrapper(
            &server,
            "wiggum-review",
            &["reviewer"],
            "criteria = \"criteria.md\", paths = [\"src\"], max_iterations = 3",
        ),
    );
    std::fs::remove_dir_all(p.dir().join("answers")).unwrap();
    git(&p, &["init", "-q"]);
    git(
        &p,
        &["-c", "user.name=t", "-c", "user.email=t@t", "add", "."],
    );
    git(
        &p,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "init",
        ],
    );
    let out = run(&p, &["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["exit"], "clean");
    // The state directory exists and git does not see it.
    assert!(p.dir().join(".ralph-flow/state.db").is_file());
    assert_eq!(git(&p, &["status", "--porcelain"]), "");
    // A markers stage has no schema: no response_format was asked for.
    assert!(
        model
            .requests()
            .iter()
            .all(|r| r.get("response_format").is_none())
    );
}

#[test]
fn spider_reaches_success_through_its_gates_with_a_local_model() {
    let spec = "```json\n{\"spec_path\": \"docs/spec.md\", \"summary\": \"a word counter\"}\n```";
    let plan = "```json\n{\"plan_path\": \"docs/plan.md\", \"phases\": [{\"id\": \"core\", \"title\": \"Counting\", \"goal\": \"count words\", \"acceptance\": [\"counts ascii\"]}]}\n```";
    let work = "```json\n{\"summary\": \"counting\", \"files_changed\": [\"src/lib.rs\"]}\n```";
    let model = Model {
        script: vec![
            ("You are the Specify step", vec![spec.into()]),
            ("You are the Plan step", vec![plan.into()]),
            ("You are the Implement step", vec![work.into()]),
            ("You are the Defend step", vec![work.into()]),
            (
                "You are the Evaluate step",
                vec!["All criteria met.\nVERDICT: PASS".into()],
            ),
            (
                "You are the Review step",
                vec!["Looks right.\nVERDICT: APPROVE".into()],
            ),
        ],
        ..Model::default()
    };
    let server = serve(&model);
    let p = Project::new();
    p.write(
        "w.toml",
        &wrapper(
            &server,
            "spider",
            &["claude", "codex"],
            "test_command = \"true\", gate_timeout = \"1h\"",
        ),
    );
    p.write("BRIEF.md", "A CLI that counts words.\n");
    // What tool-using agents would have written: an HTTP model writes no files.
    p.write("docs/spec.md", "# Word count\n");
    p.write("docs/plan.md", "# Plan\n");
    p.write("docs/review.md", "# Review\n");
    p.git_init();
    let out = run(&p, &["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let id = out.json["run"].as_str().unwrap().to_string();
    assert_eq!(run(&p, &["approve", &id, "approve_spec"]).code, 0);
    let out = run(&p, &["resume", &id, "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    assert_eq!(run(&p, &["approve", &id, "approve_plan"]).code, 0);
    let out = run(&p, &["resume", &id, "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["exit"], "success");
    // Each agent steps down once in the whole run: a resume starts it where an earlier
    // process of the run left it (the step-down is kept as a run event).
    let schema_requests = model
        .requests()
        .iter()
        .filter(|r| {
            r.pointer("/response_format/type").and_then(|t| t.as_str()) == Some("json_schema")
        })
        .count();
    assert_eq!(
        schema_requests, 2,
        "one json_schema request per agent, over three processes"
    );
    let logs = run(&p, &["logs", &id]);
    assert_eq!(
        logs.stdout
            .matches("rejected structured output `json_schema`")
            .count(),
        2,
        "{}",
        logs.stdout
    );
}

/// README.md's "Local models" example, as written there, reaches the preset's success exit
/// against a server that answers as llama-cpp-python does.
#[test]
fn the_readme_local_model_example_reaches_success() {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let section = &readme[readme.find("## Local models").expect("the section")..];
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a toml block");
    assert!(
        block.contains("base_url = \"http://127.0.0.1:8080/v1\""),
        "{block}"
    );
    let model = Model {
        script: vec![
            (
                "You are the driver.",
                vec!["```json\n{\"code\": \"fn main() {}\"}\n```".into()],
            ),
            (
                "You are the reviewer.",
                vec![r#"{"verdict": "VALID", "issues": []}"#.into()],
            ),
        ],
        ..Model::default()
    };
    let server = serve(&model);
    let p = Project::new();
    p.write(
        "cairo-local.toml",
        &block.replace("http://127.0.0.1:8080", &server),
    );
    p.write("task.md", "Write main.\n");
    p.write("rubric.md", "- R1: it compiles\n");
    p.write("work/Scarb.toml", "[package]\nname = \"demo\"\n");
    let out = run(&p, &["run", "cairo-local.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["exit"], "success");
    assert!(p.read("work/src/lib.cairo").contains("fn main"));
    // The agents were sent json_object, as the example says, never json_schema.
    assert!(model.requests().iter().all(|r| {
        r.pointer("/response_format/type").and_then(Value::as_str) == Some("json_object")
    }));
}

/// llama-cpp-python streams no usage (it ignores `stream_options.include_usage`): every
/// call's usage is unknown. The run says so rather than counting 0 tokens: `check` warns
/// that the tokens budget may not count the agent (RF062), the run notes it once for the
/// agent, its summary line, `status` (text and JSON) and `logs` say unknown, never 0.
#[test]
fn a_server_that_streams_no_usage_leaves_usage_unknown_never_zero() {
    let model = Model {
        script: vec![("Review", vec!["Looks right.".into()])],
        ..Model::default()
    };
    let server = serve(&model);
    let p = Project::new();
    p.write(
        "w.toml",
        &format!(
            r#"name = "local-usage"
budget = {{ tokens = 100000 }}

[agents.llama]
kind = "openai"
model = "gemma"
base_url = "{server}/v1"

[stages.first]
kind = "agent"
agent = "llama"
prompt = "Review the first part."

[stages.second]
kind = "agent"
agent = "llama"
needs = ["first"]
prompt = "Review the second part."
"#
        ),
    );
    let check = run(&p, &["check", "w.toml"]);
    assert_eq!(check.code, 0, "a warning only: {}", check.stderr);
    let said = format!("{}{}", check.stdout, check.stderr);
    assert!(said.contains("RF062"), "{said}");
    assert!(
        said.contains("may not count the calls of agent `llama`"),
        "{said}"
    );

    let out = run(&p, &["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(model.requests().iter().all(|r| r["stream"] == json!(true)));
    // Once for the agent, not once per call.
    let notes = out
        .stderr
        .lines()
        .filter(|l| l.contains("agent `llama` reported no token usage"))
        .count();
    assert_eq!(notes, 1, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("tokens unknown (2 calls reported no usage)"),
        "the summary line: {}",
        out.stderr
    );
    assert!(!out.stderr.contains(" 0 tokens"), "{}", out.stderr);
    assert_eq!(out.json["usage"]["unreported"], 2, "{}", out.json);
    let id = out.json["run"].as_str().unwrap().to_string();

    let status = run(&p, &["status", &id, "--json"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    let doc = &status.json;
    assert_eq!(doc["usage_unknown_calls"], 2, "{doc}");
    for key in ["input_tokens", "output_tokens", "cached_tokens"] {
        assert!(
            doc["total"][key].is_null(),
            "{key} is unknown, not 0: {doc}"
        );
    }
    for n in doc["nodes"].as_array().unwrap() {
        assert!(n["usage"]["input_tokens"].is_null(), "{n}");
        assert_eq!(n["usage"]["unreported"], 1, "{n}");
    }

    let status = run(&p, &["status", &id]);
    assert!(
        status
            .stdout
            .contains("total: unknown tokens (2 calls reported no usage)"),
        "{}",
        status.stdout
    );
    assert!(!status.stdout.contains("0/0/0"), "{}", status.stdout);

    let logs = run(&p, &["logs", &id]);
    assert!(
        logs.stdout.contains("reported no token usage")
            && logs.stdout.contains("tokens budget of the run"),
        "the note is an event: {}",
        logs.stdout
    );
    let warnings = logs
        .stdout
        .lines()
        .filter(|l| l.contains("reported no token usage"))
        .count();
    assert_eq!(warnings, 1, "{}", logs.stdout);
}

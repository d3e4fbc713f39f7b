//! Hover: keys (both syntaxes, the table they are in), stage references (in templates and in
//! prompt files), filters and params.

use serde_json::{Value, json};

use crate::client::{Client, position_of, project};

/// The Markdown of a hover at the first `needle` (plus `delta` bytes) of a file.
fn hover(c: &mut Client, uri: &str, text: &str, needle: &str, delta: usize) -> String {
    let answer = c.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri}, "position": position_of(text, needle, delta)}),
    );
    assert_eq!(answer["contents"]["kind"], "markdown", "{answer:#}");
    answer["contents"]["value"]
        .as_str()
        .unwrap_or_else(|| panic!("no hover text at `{needle}`: {answer:#}"))
        .to_string()
}

fn doc(spec: &ralph_flow::spec::TableSpec, key: &str) -> &'static str {
    spec.field(key)
        .unwrap_or_else(|| panic!("no key {key} in {}", spec.name))
        .doc
}

#[test]
fn a_key_shows_its_reference_text_in_toml() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    let h = hover(&mut c, &u, &text, "prompt_file = \"specify", 2);
    assert!(h.contains("`prompt_file`"), "{h}");
    assert!(h.contains("key of `stage`"), "{h}");
    assert!(
        h.contains(doc(&ralph_flow::spec::STAGE, "prompt_file")),
        "{h}"
    );
    assert!(h.contains("for kinds: agent"), "{h}");
    // The same word in an agent's table and in a stage's: each its own table's text.
    let agent = hover(&mut c, &u, &text, "timeout = \"30m\"", 1);
    assert!(agent.contains("key of `agent`"), "{agent}");
    assert!(
        agent.contains(doc(&ralph_flow::spec::AGENT, "timeout")),
        "{agent}"
    );
    let stage = hover(&mut c, &u, &text, "timeout = \"{{ params.gate_timeout", 1);
    assert!(stage.contains("key of `stage`"), "{stage}");
    assert!(
        stage.contains(doc(&ralph_flow::spec::STAGE, "timeout")),
        "{stage}"
    );
    assert_ne!(agent, stage);
    c.shutdown();
}

#[test]
fn a_key_shows_its_reference_text_in_kdl() {
    let dir = project();
    let path = dir.path().join("workflows/wiggum-review.kdl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    // A node name.
    let h = hover(&mut c, &u, &text, "on_exhausted \"report\"", 3);
    assert!(h.contains("`on_exhausted`"), "{h}");
    assert!(
        h.contains(doc(&ralph_flow::spec::STAGE, "on_exhausted")),
        "{h}"
    );
    // A property name, in the `stuck` table.
    let h = hover(&mut c, &u, &text, "repeats=2", 1);
    assert!(h.contains("key of `stuck`"), "{h}");
    assert!(h.contains(doc(&ralph_flow::spec::STUCK, "repeats")), "{h}");
    // A param's `type`, not a stage's `kind`.
    let h = hover(&mut c, &u, &text, "type=\"int\"", 1);
    assert!(h.contains("key of `param`"), "{h}");
    c.shutdown();
}

#[test]
fn a_stage_reference_shows_the_stage_in_a_template_and_in_a_prompt_file() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    let h = hover(&mut c, &u, &text, "stages.specify.output.summary", 9);
    assert!(h.contains("stage `specify`** (agent)"), "{h}");
    assert!(
        h.contains("Writes (or revises) the spec from the brief."),
        "{h}"
    );
    assert!(h.contains("agent: `{{ params.author_backend }}`"), "{h}");
    // The fields of its output schema (schemas/spider-spec.schema.json).
    for field in ["`spec_path`", "`summary`", "`open_questions`"] {
        assert!(h.contains(field), "{field} in {h}");
    }
    // In `needs`, the same.
    let n = hover(&mut c, &u, &text, "needs = [\"specify\"]", 11);
    assert_eq!(n, h);

    let prompt = dir.path().join("prompts/spider/defend.md.j2");
    let ptext = std::fs::read_to_string(&prompt).unwrap_or_else(|e| panic!("{e}"));
    let pu = c.open(&prompt, &ptext);
    let h = hover(&mut c, &pu, &ptext, "stages.implement.output", 8);
    assert!(h.contains("stage `implement`** (agent)"), "{h}");
    for field in ["`files_changed`", "`tests_added`", "`commit`"] {
        assert!(h.contains(field), "{field} in {h}");
    }
    c.shutdown();
}

#[test]
fn a_filter_shows_its_signature_and_a_param_its_type_and_default() {
    let dir = project();
    let path = dir.path().join("workflows/spider.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Client::start(dir.path());
    let u = c.open(&path, &text);
    let h = hover(&mut c, &u, &text, "| join('; ')", 3);
    assert!(h.contains("join(value, joiner"), "{h}");
    assert!(h.contains("filter"), "{h}");
    let h = hover(&mut c, &u, &text, "| length", 3);
    assert!(h.contains("length(value)"), "{h}");
    // A use and the definition of a param.
    let h = hover(&mut c, &u, &text, "{{ params.author_backend", 11);
    assert!(h.contains("param `author_backend`**: string"), "{h}");
    assert!(h.contains("default: `\"claude\"`"), "{h}");
    assert!(h.contains("choices: `\"claude\"`, `\"codex\"`"), "{h}");
    assert!(h.contains("The agent that writes the spec"), "{h}");
    let d = hover(&mut c, &u, &text, "[params.author_backend]", 9);
    assert_eq!(d, h);
    // Nothing to say on plain text.
    let none = c.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": u}, "position": position_of(&text, "# SPIDER as", 3)}),
    );
    assert_eq!(none, Value::Null);
    c.shutdown();
}

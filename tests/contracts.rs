//! The test doubles' schema contracts: the checkers that make the fakes and the mock API refuse
//! the output schemas the real agents refuse (tests/fakes/schema-check/claude.cjs: claude's
//! Ajv; tests/realcli/openai_strict.py: OpenAI's strict mode), checked against the captures
//! of the real CLIs, and every schema ralph-flow ships, once lowered by
//! `ralph_flow::dialect`, passed through both. Needs node (and npm, the first time) and python3.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use ralph_flow::dialect::{Dialect, lower};
use serde_json::{Value, json};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn capture(case: &str) -> String {
    std::fs::read_to_string(root().join("tests/fakes/captures").join(case)).unwrap()
}

/// What claude decides about `--json-schema TEXT`: Ok(warnings on stderr) or Err(the line it
/// prints).
fn claude_check(text: &str) -> Result<String, String> {
    common::node_deps().unwrap();
    let out = Command::new("node")
        .arg(root().join("tests/fakes/schema-check/claude.cjs"))
        .arg(text)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(0) => Ok(stderr),
        Some(1) => Err(stdout),
        other => panic!("claude.cjs exited {other:?}: {stderr}"),
    }
}

/// What OpenAI's strict mode decides about a schema: Ok or Err(its message).
fn strict_check(schema: &Value) -> Result<(), String> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), schema.to_string()).unwrap();
    let out = Command::new("python3")
        .arg(root().join("tests/realcli/openai_strict.py"))
        .arg(file.path())
        .output()
        .expect("python3 runs");
    match out.status.code() {
        Some(0) => Ok(()),
        Some(1) => Err(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        other => panic!(
            "openai_strict.py exited {other:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The shipped output schemas (workflow.schema.json describes workflow files).
fn shipped() -> Vec<(PathBuf, Value)> {
    let mut out: Vec<_> = std::fs::read_dir(root().join("schemas"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| !p.ends_with("workflow.schema.json"))
        .map(|p| {
            let v = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (p, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 10, "the shipped schemas: {out:?}");
    out
}

/// Lowers `schema` to both dialects and asserts that both checkers accept the result.
fn assert_both_accept(what: &str, schema: &Value) {
    let claude = lower(schema, Dialect::Claude)
        .unwrap_or_else(|r| panic!("{what}: the claude lowering refused: {r:?}"));
    let text = claude.schema.to_string();
    if let Err(line) = claude_check(&text) {
        panic!("{what}: claude would refuse the lowered schema {text}:\n{line}");
    }
    let strict = lower(schema, Dialect::OpenAiStrict)
        .unwrap_or_else(|r| panic!("{what}: the OpenAI strict lowering refused: {r:?}"));
    if let Err(message) = strict_check(&strict.schema) {
        panic!(
            "{what}: OpenAI's strict mode would refuse the lowered schema {}:\n{message}",
            strict.schema
        );
    }
}

#[test]
fn the_claude_checker_decides_the_captured_cases_as_claude_did() {
    for case in [
        "schema_draft2020",
        "schema_unknown_keyword",
        "schema_not_object",
    ] {
        // The schema is claude's last argument.
        let argv = capture(&format!("claude/{case}.argv"));
        let schema = argv.lines().last().unwrap();
        assert_eq!(
            claude_check(schema),
            Err(capture(&format!("claude/{case}.stderr"))),
            "{case}"
        );
    }
    let draft7 = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"verdict": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["verdict"],
    });
    assert_eq!(claude_check(&draft7.to_string()), Ok(String::new()));
}

#[test]
fn the_fakes_replay_the_refusals_with_the_checkers_message() {
    common::node_deps().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run = |fake: &str, args: &[&str]| {
        let mut c = Command::new(common::fakes().join(fake));
        c.args(args)
            .current_dir(dir.path())
            .env("FAKE_SESSION", "00000000-0000-4000-8000-000000000000")
            .stdin(std::process::Stdio::null());
        c.output().unwrap()
    };
    // claude: the capture itself, then another refusal in its place.
    let claude = |schema: &str| {
        run(
            "claude",
            &["-p", "--output-format", "json", "--json-schema", schema],
        )
    };
    let argv = capture("claude/schema_draft2020.argv");
    let out = claude(argv.lines().last().unwrap());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr, capture("claude/schema_draft2020.stderr"));
    assert!(out.stdout.is_empty());
    let out = claude(r#"{"type":"object","prefixItems":[]}"#);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "Error: --json-schema is not a valid JSON Schema: strict mode: unknown keyword: \"prefixItems\"\n"
    );
    // codex: the captured refusal (capture.sh's schema without additionalProperties), then
    // one whose message has quotes (escaped twice in codex's event).
    let loose = dir.path().join("loose.json");
    std::fs::write(&loose, r#"{"type":"object","properties":{"verdict":{"type":"string"},"count":{"type":"integer"}},"required":["verdict","count"]}"#).unwrap();
    let args = [
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--output-schema",
        loose.to_str().unwrap(),
        "-",
    ];
    let out = run("codex", &args);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        capture("codex/schema_refused.stdout")
    );
    std::fs::write(&loose, r#"{"type":"array","items":{"type":"string"}}"#).unwrap();
    let out = run("codex", &args);
    assert_eq!(out.status.code(), Some(1));
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let body: Value = serde_json::from_str(events[2]["message"].as_str().unwrap()).unwrap();
    assert_eq!(
        body["error"]["message"],
        "Invalid schema for response_format 'codex_output_schema': schema must be a JSON Schema \
         of 'type: \"object\"', got 'type: \"array\"'."
    );
    assert_eq!(body["error"]["param"], "text.format.schema");
}

#[test]
fn the_openai_strict_checker_passes_its_self_test() {
    let out = Command::new("python3")
        .arg(root().join("tests/realcli/openai_strict.py"))
        .arg("--self-test")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_shipped_schema_lowered_is_accepted_by_claude_and_openai_strict() {
    for (path, schema) in shipped() {
        assert_both_accept(&path.display().to_string(), &schema);
    }
}

#[test]
fn the_raw_shipped_schemas_are_refused_by_claude_which_proves_the_checker_is_real() {
    for (path, schema) in shipped() {
        let refused = claude_check(&schema.to_string());
        assert_eq!(
            refused,
            Err(
                "Error: --json-schema is not a valid JSON Schema: no schema with key or ref \
                 \"https://json-schema.org/draft/2020-12/schema\"\n"
                    .to_string()
            ),
            "{}",
            path.display()
        );
        assert!(strict_check(&schema).is_err(), "{}", path.display());
    }
}

#[test]
fn tricky_author_schemas_lowered_are_accepted_by_both() {
    let d2020 = "https://json-schema.org/draft/2020-12/schema";
    let corpus = [
        (
            "optional fields",
            json!({"$schema": d2020, "type": "object",
                   "properties": {"a": {"type": "string"}, "b": {"type": "integer", "minimum": 0}},
                   "required": ["a"]}),
        ),
        (
            "nested arrays of objects",
            json!({"type": "object", "properties": {"rows": {"type": "array", "minItems": 1, "items": {
                "type": "object", "properties": {
                    "cells": {"type": "array", "items": {"type": "object",
                        "properties": {"v": {"type": "number"}, "note": {"type": "string", "maxLength": 80}},
                        "required": ["v"]}}},
                "required": ["cells"]}}}, "required": ["rows"]}),
        ),
        (
            "enums",
            json!({"type": "object", "properties": {
                "verdict": {"enum": ["PASS", "FAIL"]},
                "level": {"type": "integer", "enum": [1, 2, 3]},
                "kind": {"const": "review"}}, "required": ["verdict", "level", "kind"]}),
        ),
        (
            "nullable unions",
            json!({"type": "object", "properties": {
                "reason": {"type": ["string", "null"]},
                "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                "pick": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
                "required": ["reason", "score"]}),
        ),
        (
            "$defs with $ref",
            json!({"$schema": d2020, "type": "object", "$defs": {
                    "item": {"type": "object", "properties": {"name": {"type": "string"},
                        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}},
                        "required": ["name"]}},
                   "properties": {"first": {"$ref": "#/$defs/item"},
                                  "rest": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
                   "required": ["first", "rest"], "additionalProperties": false}),
        ),
        (
            "annotations and formats",
            json!({"type": "object", "title": "T", "description": "d", "properties": {
                "when": {"type": "string", "format": "date-time", "description": "x", "default": "now",
                         "examples": ["2026-01-01T00:00:00Z"]},
                "id": {"type": "string", "pattern": "^[a-z]+$"}}, "required": ["when", "id"]}),
        ),
    ];
    for (what, schema) in corpus {
        assert_both_accept(what, &schema);
    }
}

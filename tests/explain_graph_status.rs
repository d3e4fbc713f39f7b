//! Snapshot tests of what people read: `ralph-flow explain` and `ralph-flow graph` (both
//! formats) of every shipped preset, and `ralph-flow status` (text and `--json`) of the
//! README's demo run, replayed from its recording.
//!
//! The presets are named as `workflows/NAME`, run from the crate root, so the snapshots hold
//! no absolute path. In `status`, what changes from run to run is replaced: the run id by
//! `[run]`, times by `[time]` (text) or `[ms]` (JSON), the run's duration by `[duration]`,
//! the temporary directory by `[dir]`, the workflow's content hash by `[hash]`.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn ralph(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ralph-flow"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// Runs ralph-flow from the crate root; it must succeed and print nothing on stderr.
fn shown(args: &[&str]) -> String {
    let out = ralph(Path::new(env!("CARGO_MANIFEST_DIR")), args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "ralph-flow {args:?} exited with {:?}:\n{stderr}",
        out.status.code()
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `workflows/NAME` for a preset's absolute path.
fn preset(path: &Path) -> String {
    format!("workflows/{}", path.file_name().unwrap().to_str().unwrap())
}

#[test]
fn explain_of_each_preset() {
    insta::glob!("../workflows", "*.{toml,kdl}", |path| {
        let file = preset(path);
        let text = shown(&["explain", &file]);
        if file.starts_with("workflows/spider.") {
            // Durations as the file writes them: the gates' `{{ params.gate_timeout }}` is
            // the param's "72h", not 259200 seconds.
            assert!(text.contains("after 72h without an answer"), "{text}");
            assert!(!text.contains("259200"), "{text}");
        }
        insta::assert_snapshot!(text);
    });
}

#[test]
fn mermaid_graph_of_each_preset() {
    insta::glob!("../workflows", "*.{toml,kdl}", |path| {
        let text = shown(&["graph", &preset(path), "--format", "mermaid"]);
        assert!(text.starts_with("flowchart"), "{text}");
        insta::assert_snapshot!(text);
    });
}

#[test]
fn dot_graph_of_each_preset() {
    insta::glob!("../workflows", "*.{toml,kdl}", |path| {
        let text = shown(&["graph", &preset(path), "--format", "dot"]);
        assert!(text.starts_with("digraph"), "{text}");
        insta::assert_snapshot!(text);
    });
}

/// The default format of `graph` is Mermaid.
#[test]
fn graph_draws_mermaid_by_default() {
    assert_eq!(
        shown(&["graph", "workflows/spider.toml"]),
        shown(&["graph", "workflows/spider.toml", "--format", "mermaid"])
    );
}

/// Runs the README's demo in a clean git checkout and returns the directory and the run id.
/// `--max-concurrency 1` makes the order in which a body's stages settle (and `status` lists
/// them) the body's order: `clean_tree` and `stats` both wait only on `review`.
fn demo_run() -> (tempfile::TempDir, String) {
    let dir = common::demo_checkout();
    let out = ralph(
        dir.path(),
        &[
            &["run"][..],
            &common::WIGGUM_REPLAY,
            &["--max-concurrency", "1", "--progress", "quiet"],
        ]
        .concat(),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = json["run"].as_str().unwrap().to_string();
    (dir, id)
}

/// Replaces what changes from run to run in a text: the directory, the run id and times.
fn redact_text(text: &str, dir: &Path, id: &str) -> String {
    let text = text
        .replace(&dir.display().to_string(), "[dir]")
        .replace(id, "[run]");
    let time = regex::Regex::new(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z").unwrap();
    let duration = regex::Regex::new(r"(?m), duration .+$").unwrap();
    let text = time.replace_all(&text, "[time]");
    duration
        .replace_all(&text, ", duration [duration]")
        .into_owned()
}

/// Replaces what changes from run to run in a JSON document: the times and durations (in
/// milliseconds), the content hash, and in every string the directory and the run id.
fn redact_json(value: &mut serde_json::Value, dir: &Path, id: &str) {
    const MILLISECONDS: &[&str] = &[
        "started_at",
        "updated_at",
        "finished_at",
        "duration_ms",
        "at",
        "requested_at",
        "deadline",
        "since",
    ];
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if MILLISECONDS.contains(&key.as_str()) && v.is_number() {
                    *v = "[ms]".into();
                } else if key == "workflow_hash" {
                    *v = "[hash]".into();
                } else if key == "trace_id" || key == "span_id" {
                    // Drawn for each run (its OpenTelemetry trace).
                    *v = "[id]".into();
                } else {
                    redact_json(v, dir, id);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                redact_json(v, dir, id);
            }
        }
        serde_json::Value::String(s) => *s = redact_text(s, dir, id),
        _ => {}
    }
}

#[test]
fn status_of_the_demo_run() {
    let (dir, id) = demo_run();
    let out = ralph(dir.path(), &["status", &id]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(&format!("run {id}: wiggum-review")),
        "the run shown is the demo's:\n{text}"
    );
    insta::assert_snapshot!("status", redact_text(&text, dir.path(), &id));

    let out = ralph(dir.path(), &["status", "--json"]);
    assert!(out.status.success());
    let mut json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["id"], id.as_str(), "the newest run is the demo's");
    assert_eq!(json["exit"], serde_json::json!(["clean", 0]));
    redact_json(&mut json, dir.path(), &id);
    insta::assert_snapshot!("status_json", serde_json::to_string_pretty(&json).unwrap());
}

/// A skip that spreads is said in words and drawn; an optional stage says so.
#[test]
fn explain_and_graphs_show_where_a_skip_spreads_and_what_is_optional() {
    let spreads = "tests/fixtures/check/invalid/RF026-skip-spreads.toml";
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = |args: &[&str]| String::from_utf8(ralph(root, args).stdout).unwrap();
    let explain = text(&["explain", spreads]);
    assert!(
        explain.contains(
            "`deploy` runs `./deploy.sh`, after `sign_off`, skipped whenever `sign_off` is skipped."
        ),
        "{explain}"
    );
    assert!(
        explain.contains(
            "`announce` runs `./announce.sh`, after `deploy`, skipped whenever `deploy` is skipped."
        ),
        "{explain}"
    );
    let mermaid = text(&["graph", spreads]);
    assert!(
        mermaid.contains("sign_off -->|\"skipped with it\"| deploy"),
        "{mermaid}"
    );
    let dot = text(&["graph", "--format", "dot", spreads]);
    assert!(
        dot.contains("sign_off -> deploy [label=\"skipped with it\"]"),
        "{dot}"
    );
    let optional = "tests/fixtures/check/valid/optional.toml";
    let explain = text(&["explain", optional]);
    assert!(
        explain.contains("only when `params.sign_off`, optional (when skipped, what needs it runs as if it had run)."),
        "{explain}"
    );
    assert!(
        explain.contains("`deploy` runs `./deploy.sh`, after `sign_off`.\n"),
        "an optional need's skip does not spread: {explain}"
    );
    assert!(text(&["graph", optional]).contains("human approval<br/>optional"));
}

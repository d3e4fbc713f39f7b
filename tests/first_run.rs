//! A new user's first steps: `init` of every shipped preset in an empty project gives a
//! workflow that `check --deny-warnings` passes, and a gate answered without `$USER` records
//! who answered.
#![allow(clippy::unwrap_used)]

mod common;

use common::Project;

/// The presets `ralph-flow presets` lists.
fn preset_names(p: &Project) -> Vec<String> {
    let out = p.run(&["presets", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let list = out.json.as_array().cloned().unwrap_or_default();
    let names: Vec<String> = list
        .iter()
        .filter_map(|e| e["name"].as_str().map(String::from))
        .collect();
    assert!(names.len() >= 6, "{}", out.stdout);
    names
}

#[test]
fn every_preset_from_init_checks_without_a_warning() {
    let p = Project::new();
    for name in preset_names(&p) {
        for format in ["toml", "kdl"] {
            let dir = Project::new();
            let init = dir.run(&["init", &name, "--format", format]);
            assert_eq!(init.code, 0, "init {name}: {}", init.stderr);
            // The prompt directory the workflow points to is there, with a note.
            let note = dir.read(&format!("prompts/{name}/README.md"));
            assert!(note.contains("replaces that prompt"), "{note}");
            let file = format!("workflows/{name}.{format}");
            let check = dir.run(&["check", &file, "--deny-warnings"]);
            assert_eq!(
                check.code, 0,
                "check --deny-warnings of a fresh `init {name}` ({format}):\n{}\n{}",
                check.stdout, check.stderr
            );
        }
    }
}

#[test]
fn a_gate_answered_without_user_records_the_login_name() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"
name = "w"

[stages.ok]
kind = "gate"
message = "Go on?"
timeout = "1h"
on_timeout = "reject"
"#,
    );
    let waiting = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(waiting.code, 75, "{}", waiting.stderr);
    let run = waiting.json["run"].as_str().unwrap().to_string();
    let mut approve = std::process::Command::new(env!("CARGO_BIN_EXE_ralph-flow"));
    approve
        .args(["approve", &run, "ok"])
        .current_dir(p.dir())
        .env_remove("USER")
        .env_remove("LOGNAME");
    let out = approve.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let login = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let login = String::from_utf8_lossy(&login.stdout).trim().to_string();
    assert!(!login.is_empty());
    let logs = p.run(&["logs", &run]);
    assert!(
        logs.stdout.contains(&format!("by {login}")),
        "the approver is the login name: {}",
        logs.stdout
    );
    assert!(!logs.stdout.contains("unknown"), "{}", logs.stdout);
}

#[test]
fn a_full_claude_agent_runs_as_root_whatever_is_sandbox_the_environment_has() {
    // claude's bypassPermissions takes only IS_SANDBOX=1 as root; a container may set
    // IS_SANDBOX=yes. `permissions = "full"` decides it, not the inherited value.
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"
name = "w"

[agents.claude]
kind = "claude"
permissions = "full"

[stages.write]
kind = "agent"
agent = "claude"
prompt = "Write the file."
"#,
    );
    let out = p.run_env(
        &["run", "w.toml", "--json"],
        &[("FAKE_MODE", "denied"), ("IS_SANDBOX", "yes")],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stderr.contains("root/sudo"), "{}", out.stderr);
}

/// An agent that refuses its schema at run time all the same (a newer CLI with other rules:
/// here a double that prints what claude printed for the draft 2020-12 declaration) is not
/// retried: its fallback takes over, and without one the run stops as a configuration error
/// (exit 3) saying what to change.
#[test]
fn a_schema_refused_at_run_time_hands_over_or_stops_with_exit_3() {
    let p = Project::new();
    let captured = common::fakes().join("captures/claude/schema_draft2020.stderr");
    p.write(
        "newer-claude",
        &format!(
            "#!/bin/sh\necho \"$*\" >> calls.log\ncat '{}' >&2\nexit 1\n",
            captured.display()
        ),
    );
    let script = p.dir().join("newer-claude");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let workflow = |fallbacks: &str| {
        format!(
            r#"
name = "w"

[agents.claude]
kind = "claude"
fallbacks = [{fallbacks}]

[agents.codex]
kind = "codex"

[stages.ask]
kind = "agent"
agent = "claude"
prompt = "Give a verdict."
output = {{ extract = "json", schema = {{ type = "object", required = ["verdict"], properties = {{ verdict = {{ type = "string" }} }} }} }}
"#
        )
    };
    let newer = script.display().to_string();
    p.workflow("handover.toml", &workflow("\"codex\""));
    let out = p.run_env(
        &["run", "handover.toml", "--json"],
        &[
            ("FAKE_REPLY", r#"{"verdict": "VALID"}"#),
            ("RALPH_FLOW_CLAUDE", newer.as_str()),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["ask"]["verdict"], "VALID");
    assert_eq!(
        p.read("calls.log").lines().count(),
        1,
        "claude was not retried"
    );
    assert!(
        out.stderr.contains("refused its configuration"),
        "{}",
        out.stderr
    );

    std::fs::remove_file(p.dir().join("calls.log")).unwrap();
    p.workflow("alone.toml", &workflow(""));
    let out = p.run_env(
        &["run", "alone.toml"],
        &[("RALPH_FLOW_CLAUDE", newer.as_str())],
    );
    assert_eq!(out.code, 3, "a configuration error: {}", out.stderr);
    assert_eq!(p.read("calls.log").lines().count(), 1, "not retried");
    assert!(
        out.stderr.contains("no schema with key or ref")
            && out.stderr.contains("structured_output = \"prompt\"")
            && out.stderr.contains("resume"),
        "says what to change: {}",
        out.stderr
    );
}

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

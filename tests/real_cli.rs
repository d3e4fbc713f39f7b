//! Whole runs through the real claude, codex, gemini, qwen and opencode CLIs, each pointed
//! at the local mock of its API (tests/realcli/mock_api.py, 127.0.0.1 only): one agent stage
//! with an output schema per CLI. Needs the CLIs installed by tests/realcli/install.sh (in target/realcli,
//! or the directory named by RALPH_FLOW_REAL_CLI_DIR) and python3; skipped otherwise.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use common::Project;

/// The reply of the mock's `structured` scenario.
const VERDICT: &str = "MOCK-REPLY-4F7";

fn real_cli_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("RALPH_FLOW_REAL_CLI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/realcli"));
    let bin = dir.join("node_modules/.bin");
    ["claude", "codex", "gemini"]
        .iter()
        .all(|c| bin.join(c).exists())
        .then_some(bin)
}

/// Says why the test did nothing, on stderr past the test harness's capture (which hides
/// `eprintln!` of passing tests).
/// Where the CLIs are required (`RALPH_FLOW_REQUIRE_REAL_CLI`, set by .ci/run once they are
/// installed), a test that cannot run them fails instead.
fn skipped(why: &str) {
    use std::io::Write;
    assert!(
        std::env::var_os("RALPH_FLOW_REQUIRE_REAL_CLI").is_none(),
        "the real CLIs are required here: {why}"
    );
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

const WORKFLOW: &str = r#"
name = "real"

[agents.main]
kind = "KIND"

[stages.ask]
kind = "agent"
agent = "main"
prompt = "Give a verdict and a count."
timeout = "120s"
output = { extract = "json", schema = { type = "object", required = ["verdict", "count"], additionalProperties = false, properties = { verdict = { type = "string" }, count = { type = "integer" } } } }
"#;

/// `HOME` with each CLI pointed at the mock (`base`: its URL with the scenario), and the
/// environment that points the CLIs there.
fn mock_home(p: &Project, bin: &Path, kind: &str, base: &str) -> Vec<(String, String)> {
    let home = p.dir().join("home");
    std::fs::create_dir_all(home.join(".codex")).unwrap();
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::write(
        home.join(".codex/config.toml"),
        format!(
            "model_provider = \"mock\"\n\n[model_providers.mock]\nname = \"mock\"\n\
             base_url = \"{base}/v1\"\nenv_key = \"MOCK_API_KEY\"\nwire_api = \"responses\"\n\
             request_max_retries = 0\nstream_max_retries = 0\n"
        ),
    )
    .unwrap();
    std::fs::write(
        home.join(".gemini/settings.json"),
        r#"{"security":{"auth":{"selectedType":"gemini-api-key"}},"general":{"maxAttempts":1}}"#,
    )
    .unwrap();
    [
        (
            format!("RALPH_FLOW_{}", kind.to_uppercase()),
            bin.join(kind).display().to_string(),
        ),
        ("HOME".into(), home.display().to_string()),
        ("ANTHROPIC_BASE_URL".into(), base.into()),
        ("ANTHROPIC_API_KEY".into(), "sk-ant-mock-key".into()),
        (
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
            "1".into(),
        ),
        (
            "CODEX_HOME".into(),
            home.join(".codex").display().to_string(),
        ),
        ("MOCK_API_KEY".into(), "mock-key".into()),
        ("GEMINI_API_KEY".into(), "mock-key".into()),
        ("GOOGLE_GEMINI_BASE_URL".into(), base.into()),
    ]
    .into()
}

/// Under `permissions = "edit"` the real codex (workspace-write: `.git` is read-only) and
/// gemini (auto_edit: no shell tool) cannot commit; the mock's model writes a file and
/// commits (scenario `commit`), and the run says the commit was denied.
#[test]
fn a_commit_codex_or_gemini_may_not_make_is_reported() {
    let Some(bin) = real_cli_dir() else {
        skipped("real CLIs not installed (run tests/realcli/install.sh)");
        return;
    };
    let Some(mock) = common::MockApi::start() else {
        skipped("python3 cannot run tests/realcli/mock_api.py");
        return;
    };
    let base = format!("http://127.0.0.1:{}/s/commit", mock.port);
    for kind in ["codex", "gemini"] {
        let p = Project::new();
        p.git_init();
        p.write(".gitignore", ".ralph-flow/\nanswers/\nprobe.log\nhome/\n");
        p.workflow(
            "w.toml",
            &format!(
                "name = \"real\"\n\n[agents.main]\nkind = \"{kind}\"\npermissions = \"edit\"\n\n\
                 [stages.fix]\nkind = \"agent\"\nagent = \"main\"\nprompt = \"Fix and commit.\"\n\
                 timeout = \"120s\"\n"
            ),
        );
        let env = mock_home(&p, &bin, kind, &base);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let out = p.run_env(&["run", "w.toml", "--json"], &env);
        assert_eq!(out.code, 0, "{kind}: {}\n{}", out.stderr, out.stdout);
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains("! fix: agent `main` was denied"))
            .unwrap_or_else(|| panic!("{kind}: no denial: {}", out.stderr));
        assert!(line.contains("(its `permissions` is `edit`)"), "{line}");
        // codex names the commit when it shows the command's item, else its log says a
        // write was refused (a race in codex 0.169); gemini names the tool it lacks.
        let named = match kind {
            "codex" => {
                line.contains("shell: git add -A && git commit -q -m x (Read-only file system)")
                    || line.contains("shell: a write, path not logged (read-only file system)")
            }
            _ => line.contains("run_shell_command: not offered to the model in this approval mode"),
        };
        assert!(named, "{kind}: {line}");
        // The file was written, not committed.
        assert!(
            p.read("mock-written.txt")
                .contains("written by the mock model"),
            "{kind}"
        );
        assert_eq!(p.git(&["log", "--format=%s"]).trim(), "init", "{kind}");
    }
}

#[test]
fn claude_codex_and_gemini_run_a_stage_against_the_mock_api() {
    let Some(bin) = real_cli_dir() else {
        skipped("real CLIs not installed (run tests/realcli/install.sh)");
        return;
    };
    let Some(mock) = common::MockApi::start() else {
        skipped("python3 cannot run tests/realcli/mock_api.py");
        return;
    };
    let base = format!("http://127.0.0.1:{}/s/structured", mock.port);
    for kind in ["claude", "codex", "gemini"] {
        let p = Project::new();
        p.workflow("w.toml", &WORKFLOW.replace("KIND", kind));
        let env = mock_home(&p, &bin, kind, &base);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let out = p.run_env(&["run", "w.toml", "--json"], &env);
        assert_eq!(out.code, 0, "{kind}: {}\n{}", out.stderr, out.stdout);
        assert_eq!(
            out.json["outputs"]["ask"]["verdict"], VERDICT,
            "{kind}: {}",
            out.stdout
        );
        assert_eq!(
            out.json["outputs"]["ask"]["count"], 3,
            "{kind}: {}",
            out.stdout
        );
        // gemini's model router makes a side request (2 output tokens from the mock).
        let output_tokens = if kind == "gemini" { 765 + 2 } else { 765 };
        let store = p.store_text();
        assert!(
            store.contains(&format!("\"output_tokens\":{output_tokens}")),
            "{kind}: usage recorded: {store}"
        );
    }
}

/// The qwen and opencode of tests/realcli/install.sh, when installed there.
fn newer_cli_dir() -> Option<PathBuf> {
    let bin = real_cli_dir()?;
    ["qwen", "opencode"]
        .iter()
        .all(|c| bin.join(c).exists())
        .then_some(bin)
}

/// `HOME` with qwen and opencode pointed at the mock's Chat Completions (`base`: its URL
/// with the scenario), and the environment that points them there.
fn mock_home_chat(p: &Project, bin: &Path, kind: &str, base: &str) -> Vec<(String, String)> {
    let home = p.dir().join("home");
    std::fs::create_dir_all(home.join(".qwen")).unwrap();
    std::fs::create_dir_all(home.join(".config/opencode")).unwrap();
    std::fs::write(
        home.join(".qwen/settings.json"),
        r#"{"model":{"generationConfig":{"maxRetries":0}}}"#,
    )
    .unwrap();
    std::fs::write(
        home.join(".config/opencode/opencode.json"),
        format!(
            r#"{{"provider":{{"mock":{{"npm":"@ai-sdk/openai-compatible","name":"Mock","options":{{"baseURL":"{base}/v1","apiKey":"mock-key"}},"models":{{"mock-model":{{"name":"Mock"}}}}}}}},"model":"mock/mock-model","autoupdate":false,"share":"disabled"}}"#
        ),
    )
    .unwrap();
    [
        (
            format!("RALPH_FLOW_{}", kind.to_uppercase()),
            bin.join(kind).display().to_string(),
        ),
        ("HOME".into(), home.display().to_string()),
        ("OPENAI_BASE_URL".into(), format!("{base}/v1")),
        ("OPENAI_API_KEY".into(), "mock-key".into()),
        ("OPENAI_MODEL".into(), "qwen-mock".into()),
    ]
    .into()
}

/// qwen answers through its `--json-schema` tool, opencode (no schema flag) in text; both
/// report the usage of the mock's answers.
#[test]
fn qwen_and_opencode_run_a_stage_against_the_mock_api() {
    let Some(bin) = newer_cli_dir() else {
        skipped("qwen and opencode not installed (run tests/realcli/install.sh)");
        return;
    };
    let Some(mock) = common::MockApi::start() else {
        skipped("python3 cannot run tests/realcli/mock_api.py");
        return;
    };
    let base = format!("http://127.0.0.1:{}/s/structured", mock.port);
    for kind in ["qwen", "opencode"] {
        let p = Project::new();
        p.workflow("w.toml", &WORKFLOW.replace("KIND", kind));
        let env = mock_home_chat(&p, &bin, kind, &base);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let out = p.run_env(&["run", "w.toml", "--json"], &env);
        assert_eq!(out.code, 0, "{kind}: {}\n{}", out.stderr, out.stdout);
        assert_eq!(
            out.json["outputs"]["ask"]["verdict"], VERDICT,
            "{kind}: {}",
            out.stdout
        );
        assert_eq!(
            out.json["outputs"]["ask"]["count"], 3,
            "{kind}: {}",
            out.stdout
        );
        // qwen's usage counts its memory extraction's side request too (another answer of
        // the mock's), when it makes one.
        let store = p.store_text();
        assert!(
            ["765", "1530"]
                .iter()
                .any(|n| store.contains(&format!("\"output_tokens\":{n}"))),
            "{kind}: usage recorded: {store}"
        );
    }
}

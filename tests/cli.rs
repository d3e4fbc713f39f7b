//! End-to-end tests of the command line: exit codes and what it prints.

use std::path::Path;

use assert_cmd::Command;

struct Test {
    dir: tempfile::TempDir,
}

impl Test {
    fn new() -> Self {
        Test {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn file(self, name: &str, text: &str) -> Self {
        let path = self.dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("dir");
        }
        std::fs::write(path, text).expect("write");
        self
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::cargo_bin("ralph-flow")
            .expect("binary")
            .current_dir(self.dir.path())
            .env("NO_COLOR", "1")
            .args(args)
            .output()
            .expect("run");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

const GOOD: &str = r#"
name = "demo"
[params.n]
type = "int"
default = 3
[agents.a]
kind = "claude"
[stages.plan]
kind = "agent"
agent = "a"
prompt = "Plan {{ params.n }} things."
[stages.work]
kind = "loop"
needs = ["plan"]
max_iterations = "{{ params.n }}"
until = "stages.test.output.passed"
[stages.work.stages.build]
kind = "agent"
agent = "a"
prompt = "Do it. {{ stages.plan.output.text }} {{ feedback }}"
[stages.work.stages.test]
kind = "check"
needs = ["build"]
argv = ["cargo", "test"]
"#;

#[test]
fn check_accepts_a_good_workflow() {
    let (code, _, err) = Test::new().file("w.toml", GOOD).run(&["check", "w.toml"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("0 errors, 0 warnings"), "{err}");
}

#[test]
fn check_reports_every_problem_with_place_and_code() {
    let bad = GOOD
        .replace("needs = [\"build\"]", "needs = [\"biuld\"]")
        .replace("kind = \"claude\"", "kind = \"claud\"")
        .replace("{{ params.n }} things", "{{ params.m }} things");
    let (code, _, err) = Test::new()
        .file("w.toml", &bad)
        .run(&["check", "--format", "short", "w.toml"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("w.toml:7:8: error[RF005]: `claud` is not a valid value for `kind`"),
        "{err}"
    );
    assert!(err.contains("error[RF012]: there is no param `m`"), "{err}");
    assert!(
        err.contains("error[RF010]: there is no stage `biuld` (did you mean `build`?)"),
        "{err}"
    );
    assert!(
        !err.contains("no agent `a`"),
        "a broken definition must not cascade into reference errors: {err}"
    );
}

#[test]
fn check_json_format_lists_diagnostics() {
    let (code, out, _) = Test::new()
        .file("w.toml", "name = \"x\"\nbogus = 1\n")
        .run(&["check", "--format", "json", "w.toml"]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v[0]["code"], "RF002");
    assert_eq!(v[0]["location"]["line"], 2);
    assert_eq!(v[0]["location"]["column"], 1);
}

#[test]
fn set_checks_param_types_and_required_params() {
    let wf = "name = \"x\"\n[params.n]\ntype = \"int\"\n[params.m]\ntype = \"string\"\n[stages.a]\nkind = \"command\"\nargv = [\"echo\", \"{{ params.n }}\"]\n";
    let t = Test::new().file("w.toml", wf);
    let (code, _, err) = t.run(&["check", "--format", "short", "--set", "n=x", "w.toml"]);
    assert_eq!(code, 3);
    assert!(
        err.contains("error[RF051]: --set n=x: `x` is not a valid int"),
        "{err}"
    );
    assert!(
        err.contains("error[RF052]: param `m` is required and has no value"),
        "{err}"
    );
}

#[test]
fn graph_and_explain_describe_the_plan() {
    let t = Test::new().file("w.toml", GOOD);
    let (code, out, err) = t.run(&["graph", "w.toml", "--format", "dot"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("digraph \"demo\""), "{out}");
    assert!(out.contains("subgraph cluster_work"), "{out}");
    assert!(
        out.contains("loop work (at most 3) until stages.test.output.passed"),
        "{out}"
    );
    let (code, out, _) = t.run(&["explain", "w.toml"]);
    assert_eq!(code, 0);
    assert!(out.contains("`work` repeats its body at most 3 times; it ends when `stages.test.output.passed` holds"), "{out}");
    assert!(
        out.contains("`test` checks that `cargo test` must pass, after `build`"),
        "{out}"
    );
}

#[test]
fn graph_refuses_an_invalid_workflow() {
    let (code, out, err) = Test::new()
        .file("w.toml", "name = \"x\"\n[stages.a]\nkind = \"loop\"\n")
        .run(&["graph", "w.toml"]);
    assert_eq!(code, 3);
    assert!(out.is_empty());
    assert!(err.contains("RF022"), "{err}");
}

#[test]
fn dot_output_renders_with_graphviz() {
    let has_dot = std::process::Command::new("dot").arg("-V").output().is_ok();
    if !has_dot {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install graphviz to test DOT output"
        );
        eprintln!("graphviz is not installed; skipping");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for entry in std::fs::read_dir(root.join("workflows")).expect("workflows") {
        let path = entry.expect("entry").path();
        let out = Command::cargo_bin("ralph-flow")
            .expect("bin")
            .args(["graph", "--format", "dot"])
            .arg(&path)
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut dot = std::process::Command::new("dot")
            .arg("-Tsvg")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("dot");
        use std::io::Write;
        dot.stdin
            .take()
            .expect("stdin")
            .write_all(&out.stdout)
            .expect("write");
        let res = dot.wait_with_output().expect("dot");
        assert!(
            res.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&res.stderr)
        );
        assert!(String::from_utf8_lossy(&res.stdout).contains("<svg"));
    }
}

#[test]
fn fmt_converts_toml_to_kdl_and_back() {
    let t = Test::new().file("w.toml", GOOD);
    let (code, kdl, err) = t.run(&["fmt", "--to", "kdl", "w.toml"]);
    assert_eq!(code, 0, "{err}");
    assert!(kdl.contains("stage \"work\" kind=\"loop\""), "{kdl}");
    let t = t.file("w.kdl", &kdl);
    let (code, _, err) = t.run(&["check", "w.kdl"]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn usage_errors_exit_with_the_configuration_code() {
    let (code, _, err) = Test::new().run(&["check"]);
    assert_eq!(code, 3, "{err}");
    let (code, _, _) = Test::new().run(&["--help"]);
    assert_eq!(code, 0);
}

#[test]
fn missing_file_is_reported() {
    let (code, _, err) = Test::new().run(&["check", "--format", "short", "nope.toml"]);
    assert_eq!(code, 3);
    assert!(
        err.contains("error[RF017]: cannot read workflow file `nope.toml`"),
        "{err}"
    );
}

#[test]
fn lsp_says_what_is_wrong_when_no_editor_speaks_to_it() {
    // Started by hand, its input closed: no panic, a sentence and exit 1.
    let out = Command::cargo_bin("ralph-flow")
        .unwrap_or_else(|e| panic!("{e}"))
        .arg("lsp")
        .write_stdin("")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("closed the connection before it sent `initialize`"),
        "{err}"
    );
    // Something that is no LSP message.
    let out = Command::cargo_bin("ralph-flow")
        .unwrap_or_else(|e| panic!("{e}"))
        .arg("lsp")
        .write_stdin("Content-Length: 5\r\n\r\n{bad}")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is not a Language Server Protocol message"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A completion script of `ralph-flow completions SHELL`.
fn completion_script(shell: &str) -> String {
    let (code, out, err) = Test::new().run(&["completions", shell]);
    assert_eq!(code, 0, "{err}");
    out
}

/// Whether a program is on PATH (a shell a completion test drives).
fn have(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn bash_completes_subcommands_their_options_and_files() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(dir.path().join("workflows")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("rf.bash"), completion_script("bash"))
        .unwrap_or_else(|e| panic!("{e}"));
    // As bash calls the function on Tab: $1 the command, $2 the word, $3 the one before.
    let complete = |words: &[&str]| -> String {
        let script = format!(
            "source ./rf.bash; COMP_WORDS=({}); COMP_CWORD={}; _ralph__flow_presets ralph-flow {} {}; echo \"${{COMPREPLY[@]}}\"",
            words
                .iter()
                .map(|w| format!("'{w}'"))
                .collect::<Vec<_>>()
                .join(" "),
            words.len() - 1,
            format_args!("'{}'", words[words.len() - 1]),
            format_args!("'{}'", words[words.len() - 2]),
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &script])
            .env("PATH", with_binary_on_path())
            .current_dir(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("bash: {e}"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(complete(&["ralph-flow", "ap"]), "approve");
    assert!(
        complete(&["ralph-flow", "l"])
            .split(' ')
            .any(|w| w == "lsp")
    );
    // A subcommand's own options (clap_complete names the cases of a `-` binary wrongly;
    // the script is mended, and this holds it).
    assert_eq!(complete(&["ralph-flow", "run", "--sta"]), "--state-dir");
    assert!(complete(&["ralph-flow", "completions", ""]).contains("zsh"));
    // A path value completes to files.
    assert_eq!(
        complete(&["ralph-flow", "run", "--replay", "wor"]),
        "workflows"
    );
    // The workflow of `run`, `check`, `graph` and `explain` completes to presets and files.
    assert_eq!(
        complete(&["ralph-flow", "run", "wig"]),
        "wiggum-review wiggum-review-acp"
    );
    assert_eq!(complete(&["ralph-flow", "explain", "wor"]), "workflows");
    let both = complete(&["ralph-flow", "check", ""]);
    assert!(
        both.contains("spider") && both.contains("workflows"),
        "{both}"
    );
    // Not where a preset is no workflow.
    assert_eq!(complete(&["ralph-flow", "export", "wig"]), "");
}

/// PATH with the built `ralph-flow` first, for the completion scripts that call it.
fn with_binary_on_path() -> std::ffi::OsString {
    let bin = assert_cmd::cargo::cargo_bin("ralph-flow");
    let dir = bin.parent().unwrap_or_else(|| panic!("{}", bin.display()));
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(paths).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn fish_and_zsh_take_their_scripts_and_the_others_are_written() {
    if have("fish") {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("rf.fish");
        std::fs::write(&path, completion_script("fish")).unwrap_or_else(|e| panic!("{e}"));
        let out = std::process::Command::new("fish")
            .args([
                "--no-config",
                "-c",
                &format!(
                    "source {}; complete -C 'ralph-flow ap'; complete -C 'ralph-flow run --sta'; complete -C 'ralph-flow graph wig'",
                    path.display()
                ),
            ])
            .env("PATH", with_binary_on_path())
            .output()
            .unwrap_or_else(|e| panic!("fish: {e}"));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("approve\tApprove a gate of a run"), "{said}");
        assert!(said.contains("--state-dir"), "{said}");
        assert!(said.contains("wiggum-review\tpreset"), "{said}");
    } else {
        eprintln!("SKIPPED: fish is not installed; its completion script is not tried");
    }
    if have("zsh") {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("_ralph-flow");
        std::fs::write(&path, completion_script("zsh")).unwrap_or_else(|e| panic!("{e}"));
        let out = std::process::Command::new("zsh")
            .arg("-n")
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("zsh: {e}"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Driven as a Tab in an interactive zsh would be (tests/shell/capture.zsh).
        let offered = |line: &str| -> String {
            let out = std::process::Command::new("timeout")
                .arg("20")
                .arg("zsh")
                .arg("-f")
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shell/capture.zsh"))
                .arg(line)
                .arg(dir.path())
                .env("PATH", with_binary_on_path())
                .current_dir(dir.path())
                .output()
                .unwrap_or_else(|e| panic!("zsh: {e}"));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(offered("ralph-flow ap"), "<<approve>>\n");
        assert_eq!(offered("ralph-flow run --sta"), "<<--state-dir>>\n");
        let run = offered("ralph-flow run ");
        assert!(
            run.contains("<<wiggum-review>>") && run.contains("<<_ralph-flow>>"),
            "{run}"
        );
    } else {
        eprintln!("SKIPPED: zsh is not installed; its completion script is not parsed");
    }
    for shell in ["zsh", "powershell", "elvish"] {
        let script = completion_script(shell);
        assert!(
            script.contains("approve") && script.contains("lsp"),
            "{shell}"
        );
    }
}

#[test]
fn the_man_pages_come_from_the_same_definitions() {
    let t = Test::new();
    let (code, page, err) = t.run(&["man"]);
    assert_eq!(code, 0, "{err}");
    assert!(page.contains(".TH ralph-flow 1"), "{page}");
    for sub in ["approve", "lsp", "completions", "serve"] {
        assert!(page.contains(sub), "the page lacks `{sub}`");
    }
    let (code, _, err) = t.run(&["man", "--out-dir", "pages"]);
    assert_eq!(code, 0, "{err}");
    let run = std::fs::read_to_string(t.dir.path().join("pages/ralph-flow-run.1"))
        .unwrap_or_else(|e| panic!("no page for `run`: {e}"));
    assert!(run.contains("state\\-dir"), "{run}");
}

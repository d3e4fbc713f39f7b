//! End-to-end runs of the shipped presets (workflows/*.toml, *.kdl) with scripted fake
//! agents: each test copies the preset with its prompts and schemas into a scratch project
//! and runs a small wrapper that `extends` the preset and replaces its agents by `command`
//! agents running tests/fakes/scripted. No network, no LLM.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::Project;

/// Copies workflows/, prompts/ and schemas/ into the project, keeping their layout.
fn with_presets(p: &Project) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["workflows", "prompts", "schemas"] {
        common::copy_dir(&root.join(dir), &p.dir().join(dir));
    }
}

/// A wrapper that extends a preset and answers every agent with the scripted fake.
fn wrapper(preset: &str, agents: &[&str], params: &str) -> String {
    let mut w = format!(
        "name = \"test-{}\"\nextends = {{ workflow = \"workflows/{preset}\", params = {{ {params} }} }}\n",
        preset.split('.').next().unwrap()
    );
    for a in agents {
        w.push_str(&format!(
            "\n[agents.{a}]\nkind = \"command\"\ncommand = [\"scripted\"]\n"
        ));
    }
    w
}

/// Everything the runs of a project logged, for failure messages.
fn logs(p: &Project) -> String {
    let runs = p.run(&["runs", "--json"]);
    let mut out = String::new();
    for r in runs.json.as_array().cloned().unwrap_or_default() {
        let id = r["id"].as_str().unwrap_or_default().to_string();
        out.push_str(&p.run(&["logs", &id]).stdout);
    }
    out
}

/// The answer of a scripted stage once its numbered answers run out.
fn last(p: &Project, stage: &str, text: &str) {
    p.write(&format!("answers/{stage}/last"), text);
}

fn fenced(json: &str) -> String {
    format!("Done.\n```json\n{json}\n```\n")
}

/// A test command that fails its first `fails` runs with `message`, then passes.
fn flaky_tests(p: &Project, fails: u32, message: &str) {
    p.write(
        "flaky.sh",
        &format!(
            "n=$(cat .flaky 2>/dev/null || echo 0)\necho $((n+1)) > .flaky\nif [ \"$n\" -lt {fails} ]; then echo '{message}'; exit 1; fi\necho 'all tests passed'\n"
        ),
    );
}

// ------------------------------------------------------------------------------ spider

#[test]
fn spider_rejected_spec_is_rewritten_with_the_comment_then_every_phase_is_built_and_reviewed() {
    let p = Project::new();
    p.git_init();
    with_presets(&p);
    p.workflow(
        "w.toml",
        &wrapper(
            "spider.toml",
            &["claude", "codex"],
            "test_command = \"sh flaky.sh\", gate_timeout = \"1h\"",
        ),
    );
    p.write("BRIEF.md", "A CLI that counts words.\n");
    // What the specify and plan agents would have written.
    p.write("docs/spec.md", "# Word count\n");
    p.write("docs/plan.md", "# Plan\n");
    flaky_tests(&p, 1, "FAIL: counts_empty_input expected 0 got 1");
    p.answer(
        "specify",
        1,
        &fenced(r#"{"spec_path": "docs/spec.md", "summary": "draft one"}"#),
    );
    p.answer("specify", 2, &fenced(r#"{"spec_path": "docs/spec.md", "summary": "draft two, with unicode", "changes": ["unicode"]}"#));
    p.answer(
        "plan",
        1,
        &fenced(
            r#"{"plan_path": "docs/plan.md", "phases": [
                {"id": "phase-1-core", "title": "Counting", "goal": "count words", "acceptance": ["counts ascii"]},
                {"id": "phase-2-cli", "title": "CLI", "goal": "a binary", "acceptance": ["reads stdin"]}]}"#,
        ),
    );
    p.answer(
        "implement",
        1,
        &fenced(r#"{"summary": "core", "files_changed": ["src/lib.rs"]}"#),
    );
    p.answer(
        "implement",
        2,
        &fenced(r#"{"summary": "cli", "files_changed": ["src/main.rs"]}"#),
    );
    p.answer(
        "implement",
        3,
        &fenced(r#"{"summary": "cli, now reading stdin", "files_changed": ["src/main.rs"]}"#),
    );
    last(
        &p,
        "write_tests",
        &fenced(r#"{"summary": "tests", "files_changed": []}"#),
    );
    p.answer("evaluate", 1, "all criteria met\nVERDICT: PASS\n");
    p.answer("evaluate", 2, "GAP: 1: stdin is not read\nVERDICT: FAIL\n");
    p.answer("evaluate", 3, "VERDICT: PASS\n");
    p.answer("review", 1, "Looks right.\nVERDICT: APPROVE\n");

    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "waits on the spec gate: {}", out.stderr);
    assert_eq!(
        out.json["waiting_on"],
        serde_json::json!(["specify_loop#1/approve_spec"])
    );
    let run = out.json["run"].as_str().unwrap().to_string();
    let r = p.run(&[
        "reject",
        &run,
        "approve_spec",
        "--comment",
        "handle unicode words",
        "--by",
        "ana",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out = p.run(&["resume", &run, "--no-wait", "--json"]);
    assert_eq!(
        out.code, 75,
        "the rewritten spec waits again: {}",
        out.stderr
    );
    assert_eq!(
        out.json["waiting_on"],
        serde_json::json!(["specify_loop#2/approve_spec"])
    );
    let second = p.prompt("specify", 2);
    assert!(
        second.contains("handle unicode words"),
        "the comment is the feedback: {second}"
    );
    assert!(
        second.contains("A CLI that counts words."),
        "the brief is read: {second}"
    );

    assert_eq!(p.run(&["approve", &run, "approve_spec"]).code, 0);
    let out = p.run(&["resume", &run, "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "the plan gate: {}", out.stderr);
    assert_eq!(
        out.json["waiting_on"],
        serde_json::json!(["plan_loop#1/approve_plan"])
    );
    assert_eq!(p.run(&["approve", &run, "approve_plan"]).code, 0);
    let out = p.run(&["resume", &run, "--json"]);
    assert_eq!(out.code, 0, "{}", logs(&p));
    assert_eq!(out.json["exit"], "success");

    assert_eq!(p.calls("specify"), 2);
    assert_eq!(p.calls("plan"), 1);
    // Phase 1: the defend loop goes round once more after the failing tests.
    assert_eq!(
        p.calls("write_tests"),
        4,
        "phase 1: red then green; phase 2: once per attempt"
    );
    assert!(
        p.prompt("write_tests", 2)
            .contains("FAIL: counts_empty_input"),
        "the failing test output is the next round's feedback: {}",
        p.prompt("write_tests", 2)
    );
    // Phase 2: the evaluation's gap is the next implement attempt's feedback.
    assert_eq!(p.calls("implement"), 3);
    let third = p.prompt("implement", 3);
    assert!(third.contains("phase-2-cli"), "{third}");
    assert!(third.contains("GAP: 1: stdin is not read"), "{third}");
    assert_eq!(p.calls("evaluate"), 3);
    assert_eq!(p.calls("review"), 1);
}

// ----------------------------------------------------------------------------- council

#[test]
fn council_escalates_to_the_deep_model_on_low_confidence_and_keeps_learnings() {
    let p = Project::new();
    p.git_init();
    with_presets(&p);
    p.workflow(
        "w.toml",
        &wrapper(
            "council.kdl",
            &["claude", "gemini", "codex", "oracle", "deep_claude"],
            "test_command = \"sh flaky.sh\"",
        ),
    );
    p.write("TASK.md", "Make resize keep the aspect ratio.\n");
    flaky_tests(&p, 1, "FAIL: resize keeps ratio: expected 3 got 2");
    let analysis = |c: u32| {
        fenced(&format!(
            r#"{{"root_cause": "rounding", "approach": "use floats", "confidence": {c}, "would_increase_confidence": ["how the worker rounds"]}}"#
        ))
    };
    p.answer(
        "implement",
        1,
        &format!(
            "LEARNING: resize lives in src/img.rs\n{}",
            fenced(r#"{"summary": "first try", "approach": "direct", "confidence": 60, "would_increase_confidence": ["what the test expects"]}"#)
        ),
    );
    p.answer(
        "implement",
        2,
        // Under a schema (claude --json-schema, codex --output-schema) the answer is bare
        // JSON with its own learnings and no LEARNING: lines: they are kept.
        r#"{"summary": "rounding fixed", "approach": "oracle", "confidence": 90, "learnings": ["floats keep the ratio"]}"#,
    );
    p.answer("gather", 1, &fenced(r#"{"answers": [{"question": "what the test expects", "answer": "3"}], "summary": "tried direct"}"#));
    p.answer("analyze_fast", 1, &analysis(85));
    p.answer("analyze_wide", 1, &analysis(40));
    p.answer("oracle", 1, &analysis(90));
    p.answer("review", 1, "VERDICT: PASS\n");

    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["attempts"]["outcome"], "break");
    assert_eq!(out.json["outputs"]["attempts"]["iterations"], 2);
    assert_eq!(
        p.calls("oracle"),
        1,
        "confidence 40 < 70 escalates in attempt 2"
    );
    assert_eq!(
        p.calls("council_patch"),
        0,
        "the council starts at attempt 4"
    );
    assert_eq!(p.calls("block"), 0);
    let gather = p.prompt("gather", 1);
    assert!(
        gather.contains("expected 3 got 2"),
        "failing tests first: {gather}"
    );
    assert!(
        gather.contains("what the test expects"),
        "the question asked: {gather}"
    );
    let oracle = p.prompt("oracle", 1);
    assert!(oracle.contains("confidence 40"), "{oracle}");
    let implement = p.prompt("implement", 2);
    assert!(implement.contains("Deep analysis"), "{implement}");
    assert!(
        implement.contains("LEARNING: resize lives in src/img.rs"),
        "learnings read back: {implement}"
    );
    let learnings = p.read("LEARNINGS.md");
    assert!(
        learnings.contains("LEARNING: resize lives in src/img.rs (attempt 1)"),
        "{learnings}"
    );
    assert!(
        learnings.contains("LEARNING: floats keep the ratio (attempt 2)"),
        "a schema answer's own learnings are recorded: {learnings}"
    );
    // The prompts count the attempts of `max_attempts` (5 by default).
    let first = p.prompt("implement", 1);
    assert!(first.contains("attempt 1 of 5 of a fix loop"), "{first}");
}

#[test]
fn council_with_confident_analyses_does_not_call_the_deep_model_before_its_turn() {
    let p = Project::new();
    p.git_init();
    with_presets(&p);
    p.workflow(
        "w.toml",
        &wrapper(
            "council.kdl",
            &["claude", "gemini", "codex", "oracle", "deep_claude"],
            "test_command = \"sh flaky.sh\", max_attempts = 2",
        ),
    );
    p.write("TASK.md", "Fix it.\n");
    flaky_tests(&p, 10, "FAIL: still broken");
    let analysis = fenced(
        r#"{"root_cause": "x", "approach": "y", "confidence": 80, "would_increase_confidence": []}"#,
    );
    last(
        &p,
        "implement",
        &fenced(r#"{"summary": "s", "approach": "a", "confidence": 50}"#),
    );
    last(&p, "gather", &fenced(r#"{"answers": [], "summary": "s"}"#));
    last(&p, "analyze_fast", &analysis);
    last(&p, "analyze_wide", &analysis);
    p.answer("block", 1, "Blocked: the tests never passed.");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 2, "blocked: {}", out.stderr);
    assert_eq!(out.json["exit"], "blocked");
    assert_eq!(p.calls("oracle"), 0, "confident, and not yet two failures");
    assert_eq!(p.calls("implement"), 2);
    let block = p.prompt("block", 1);
    assert!(
        block.contains("FAIL: still broken"),
        "full context: {block}"
    );
    assert!(block.contains("Attempt 2"), "{block}");
    let second = p.prompt("implement", 2);
    assert!(second.contains("attempt 2 of 2 of a fix loop"), "{second}");
}

// ------------------------------------------------------------------------------ wiggum

fn wiggum_project() -> Project {
    let p = Project::new();
    p.git_init();
    with_presets(&p);
    p.workflow("w.toml", &wrapper("wiggum-review.toml", &["reviewer"], ""));
    p.git(&["add", "-A"]);
    p.git(&["commit", "-qm", "presets"]);
    p
}

#[test]
fn wiggum_clean_loop_ends_on_no_issues_with_a_clean_tree_and_keeps_stats() {
    let p = wiggum_project();
    p.answer("review", 1, "ISSUE: src/a.rs:1 unused import\n");
    p.answer("review", 2, "NO_ISSUES\n");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["review_loop"]["iterations"], 2);
    let second = p.prompt("review", 2);
    assert!(second.contains("unused import"), "{second}");
    // No criteria file in the project: the preset's own criteria.
    assert!(second.contains("- Correctness:"), "{second}");
    assert!(
        second.contains("iteration 1: 1 issue(s); review answered in 1 attempt(s)"),
        "per-iteration stats in the history: {second}"
    );
}

#[test]
fn wiggum_stuck_loop_stops_when_the_findings_repeat() {
    let p = wiggum_project();
    last(&p, "review", "ISSUE: src/a.rs:1 unused import\n");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(out.json["exit"], "stuck");
    assert_eq!(p.calls("review"), 2);
    // Giving up wrote the report of what stayed unfixed, from the loop's history.
    let run = out.json["run"].as_str().unwrap();
    let report = p.read(&format!(".ralph-flow/runs/{run}/unfixed.md"));
    assert!(
        report.contains("gave up (stuck) after 2 iteration(s)"),
        "{report}"
    );
    assert!(
        report.contains("### Iteration 1\n- src/a.rs:1 unused import"),
        "{report}"
    );
    assert!(
        out.stderr.contains("unfixed.md"),
        "the exit says where: {}",
        out.stderr
    );
}

// ------------------------------------------------------------------------ cairo (001)

/// A Scarb project with a task and a rubric; the fake `scarb` on PATH verifies.
fn cairo_project(max_attempts: u32) -> Project {
    let p = Project::new();
    with_presets(&p);
    p.workflow(
        "w.toml",
        &wrapper(
            "cairo-driver-reviewer.toml",
            &["driver_codex", "reviewer_codex"],
            &format!(
                "prompt = \"task.md\", rubric = \"rubric.md\", work_dir = \"work\", max_attempts = {max_attempts}"
            ),
        ),
    );
    p.write(
        "task.md",
        "Implement a generic Stack<T> with push and pop.\n",
    );
    p.write(
        "rubric.md",
        "- R1: uses generics\n- R2: pop returns Option<T>\n",
    );
    p.write(
        "work/Scarb.toml",
        "[package]\nname = \"demo\"\nversion = \"0.1.0\"\n",
    );
    p
}

fn code(n: u32) -> String {
    fenced(&format!(
        "{{\"code\": \"// attempt {n}\\nstruct Stack<T> {{ items: Array<T> }}\", \"notes\": \"try {n}\"}}"
    ))
}

const INVALID: &str = r#"{"verdict": "INVALID", "issues": [{"criterion": "R2", "severity": "error", "description": "pop returns T, not Option<T>", "suggestion": "return Option<T>"}]}"#;
const VALID: &str = r#"{"verdict": "VALID", "issues": []}"#;

#[test]
fn cairo_exit_0_after_an_invalid_review_and_a_failed_verify_with_both_feedbacks_in_the_history() {
    let p = cairo_project(3);
    for n in 1..=3 {
        p.answer("driver", n, &code(n));
    }
    p.answer("reviewer", 1, INVALID);
    p.answer("reviewer", 2, VALID);
    p.answer("reviewer", 3, VALID);
    p.write("answers/scarb-fail", "build\n");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stderr, logs(&p));
    assert_eq!(out.json["exit"], "success");
    // Attempt 2 is told what the reviewer found; attempt 3 what verify found.
    let second = p.prompt("driver", 2);
    assert!(second.contains("pop returns T, not Option<T>"), "{second}");
    let third = p.prompt("driver", 3);
    assert!(third.contains("verify: scarb build failed"), "{third}");
    assert!(third.contains("Identifier not found"), "{third}");
    // The code of the last attempt is in the project; verify ran fmt, build and test there.
    assert!(p.read("work/src/lib.cairo").starts_with("// attempt 3"));
    let scarb = p.read("answers/.scarb");
    let steps: Vec<&str> = scarb
        .lines()
        .map(|l| l.split(" (in ").next().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "scarb fmt --check",
            "scarb build",
            "scarb fmt --check",
            "scarb build",
            "scarb test"
        ]
    );
    assert!(scarb.lines().all(|l| l.ends_with("/work)")), "{scarb}");
    // The reviewer judged the code the driver wrote.
    assert!(p.prompt("reviewer", 1).contains("// attempt 1"));
    // Per-attempt artifacts: each attempt's prompts, answers and verify result, written out
    // by `export` from the run's records.
    let run = out.json["run"].as_str().unwrap().to_string();
    let dir = p.dir().join(".ralph-flow/runs").join(&run);
    assert!(
        !dir.join("attempts#1/driver/attempt-1/prompt.md").exists(),
        "records are not files until exported"
    );
    let export = p.run(&["export", &run]);
    assert_eq!(export.code, 0, "{}", export.stderr);
    assert!(export.stdout.contains("files of run"), "{}", export.stdout);
    assert!(dir.join("attempts#1/driver/attempt-1/prompt.md").is_file());
    assert!(dir.join("attempts#1/reviewer/attempt-1/raw.txt").is_file());
    for (scope, stage) in [
        ("attempts#1", "driver"),
        ("attempts#1", "reviewer"),
        ("attempts#2", "verify"),
        ("attempts#3", "verify"),
    ] {
        let a = dir.join(scope).join(stage).join("attempt-1");
        assert!(a.is_dir(), "no artifacts in {}", a.display());
    }
    let verify2 =
        std::fs::read_to_string(dir.join("attempts#2/verify/attempt-1/feedback.md")).unwrap();
    assert!(verify2.contains("scarb build failed"), "{verify2}");
}

#[test]
fn cairo_exit_1_when_the_attempts_run_out() {
    let p = cairo_project(2);
    last(&p, "driver", &code(1));
    last(&p, "reviewer", INVALID);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(out.json["exit"], "max_attempts");
    assert_eq!(p.calls("driver"), 2);
    assert!(p.read("answers/.scarb").is_empty(), "verify never ran");
}

#[test]
fn cairo_exit_2_on_an_unfixable_verdict_without_verifying() {
    let p = cairo_project(5);
    last(&p, "driver", &code(1));
    p.answer(
        "reviewer",
        1,
        r#"{"verdict": "UNFIXABLE", "issues": [{"criterion": "R1", "severity": "error", "description": "Cairo has no such trait"}]}"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_eq!(out.json["exit"], "unfixable");
    assert_eq!(p.calls("driver"), 1);
    assert!(p.read("answers/.scarb").is_empty());
}

#[test]
fn cairo_exit_3_on_a_configuration_error() {
    let p = cairo_project(5);
    // An unknown backend, and the preset run without its required params.
    let out = p.run(&["run", "w.toml", "--set", "driver_backend=gemini"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("not one of the choices"),
        "{}",
        out.stderr
    );
    let out = p.run(&["run", "cairo-driver-reviewer"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("prompt"), "{}", out.stderr);
    assert_eq!(p.calls("driver"), 0);
}

// ---------------------------------------------------------------------------- task-loop

fn task_loop_project(max_attempts: u32) -> Project {
    let p = Project::new();
    p.git_init();
    with_presets(&p);
    p.workflow(
        "w.toml",
        &wrapper(
            "task-loop.toml",
            &["claude", "codex", "oracle"],
            &format!(
                "tracker_command = \"cat tasks.json\", tracker_update = \"printf '%s %s %s\\\\n' \\\"$TASK_ID\\\" \\\"$STATUS\\\" \\\"$COMMENT\\\" >> tracker.log\", test_command = \"true\", max_attempts = {max_attempts}"
            ),
        ),
    );
    p.write(
        "tasks.json",
        r#"{"tasks": [
            {"id": "T-1", "title": "Wire the export button", "depends_on": ["T-2"]},
            {"id": "T-2", "title": "Export to CSV", "priority": "low"}]}"#,
    );
    last(
        &p,
        "implement",
        "Implemented.\nLEARNING: exports live in src/export.ts\nDONE\n",
    );
    p
}

#[test]
fn task_loop_orders_by_dependency_and_routes_a_failure_to_its_fix_strategy() {
    let p = task_loop_project(5);
    p.answer(
        "review",
        1,
        &fenced(r#"{"category": "PASS", "summary": "good", "issues": []}"#),
    );
    p.answer(
        "review",
        2,
        &fenced(r#"{"category": "UNWIRED_CODE", "summary": "button not wired", "issues": ["src/ui.ts:5 onClick missing"]}"#),
    );
    p.answer(
        "review",
        3,
        &fenced(r#"{"category": "PASS", "summary": "good", "issues": []}"#),
    );
    p.answer("wire_code", 1, "Wired onClick.");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", logs(&p));
    assert_eq!(p.calls("wire_code"), 1);
    for other in ["rewrite_tests", "oracle", "write_e2e", "focused_fix"] {
        assert_eq!(p.calls(other), 0, "{other} was not chosen");
    }
    let log = p.read("tracker.log");
    let t2 = log.find("T-2 closed").expect(&log);
    let t1 = log.find("T-1 closed").expect(&log);
    assert!(t2 < t1, "T-1 depends on T-2, so T-2 goes first: {log}");
    assert!(
        log.contains("T-1 in_progress Review of attempt 1 failed (UNWIRED_CODE)"),
        "{log}"
    );
    assert!(p.prompt("wire_code", 1).contains("onClick missing"));
    let again = p.prompt("implement", 3);
    assert!(
        again.contains("T-1") && again.contains("UNWIRED_CODE"),
        "{again}"
    );
    assert!(
        p.read("LEARNINGS.md")
            .contains("LEARNING: exports live in src/export.ts")
    );
}

#[test]
fn task_loop_blocks_a_task_with_full_context_after_its_attempts_and_goes_on() {
    let p = task_loop_project(2);
    p.answer(
        "review",
        1,
        &fenced(r#"{"category": "EDGE_CASE", "summary": "empty rows", "issues": ["a"]}"#),
    );
    p.answer(
        "review",
        2,
        &fenced(r#"{"category": "BAD_TESTS", "summary": "tests assert nothing", "issues": ["b"]}"#),
    );
    p.answer(
        "review",
        3,
        &fenced(r#"{"category": "PASS", "summary": "good", "issues": []}"#),
    );
    p.answer("focused_fix", 1, "fixed");
    p.answer("rewrite_tests", 1, "rewritten");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 2, "some_blocked: {}", out.stderr);
    assert_eq!(out.json["exit"], "some_blocked");
    let log = p.read("tracker.log");
    assert!(
        log.contains("T-2 blocked Blocked by ralph-flow after 2 attempts."),
        "{log}"
    );
    assert!(
        log.contains("empty rows") && log.contains("tests assert nothing"),
        "{log}"
    );
    assert!(log.contains("T-1 closed"), "the next task still ran: {log}");
}

// ------------------------------------------------------------------------ ticket-pipeline

/// An implementer that answers from the script and commits: on its first pass every
/// ticket appends to the same file (so the second to land conflicts); after an eviction it
/// starts again from main and writes its own file.
const IMPLEMENTER: &str = r#"p=$(cat)
printf '%s' "$p" | scripted || exit 1
id=$(printf '%s\n' "$p" | sed -n 's/^## Ticket `\([^`]*\)`.*/\1/p' | head -n 1)
[ "$id" = "slow-ticket" ] && sleep 1
if printf '%s' "$p" | grep -q 'evicted from the merge queue'; then
  git reset -q --hard main
  echo "$id" > "$id.txt"
else
  echo "$id" >> shared.txt
fi
git add -A && git commit -qm "$id"
"#;

fn ticket_project(max_landings: u32) -> Project {
    let p = Project::new();
    p.git_init();
    with_presets(&p);
    p.write("implementer.sh", IMPLEMENTER);
    let mut w = wrapper(
        "ticket-pipeline.toml",
        &["claude"],
        &format!(
            "build_command = \"true\", test_command = \"true\", land_checks = \"true\", max_landings = {max_landings}"
        ),
    );
    w.push_str(&format!(
        "\n[agents.codex]\nkind = \"command\"\ncommand = [\"sh\", \"{}\"]\n",
        p.dir().join("implementer.sh").display()
    ));
    p.workflow("w.toml", &w);
    p.git(&["add", "-A"]);
    p.git(&["commit", "-qm", "presets"]);
    p.answer(
        "discover",
        1,
        &fenced(
            r#"{"tickets": [
              {"id": "fast-ticket", "title": "Fast", "description": "d", "priority": "high", "tier": "trivial"},
              {"id": "slow-ticket", "title": "Slow", "description": "d", "priority": "low", "tier": "small"}],
             "reasoning": "r"}"#,
        ),
    );
    last(&p, "implement", &fenced(r#"{"summary": "done"}"#));
    p
}

#[test]
fn ticket_pipeline_an_evicted_ticket_goes_round_again_and_lands_on_its_second_try() {
    let p = ticket_project(2);
    // Once both tickets landed, discovery runs again and finds nothing new.
    p.answer(
        "discover",
        2,
        &fenced(r#"{"tickets": [], "reasoning": "all done"}"#),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stderr, out.stdout);
    assert_eq!(out.json["outputs"]["rounds"]["iterations"], 2);
    let round2 = p.prompt("discover", 2);
    assert!(round2.contains("Round 2 of 3"), "{round2}");
    assert!(
        round2.contains("ticket/fast-ticket") && round2.contains("ticket/slow-ticket"),
        "the merged branches are listed: {round2}"
    );
    assert_eq!(p.calls("implement"), 3, "fast once, slow twice");
    // The first round's fan-out, from the store.
    let run = out.json["run"].as_str().unwrap().to_string();
    let status = p.run(&["status", &run, "--json"]);
    let tickets = status.json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "tickets" && n["scope"] == "rounds#1")
        .unwrap_or_else(|| panic!("{}", status.stdout))
        .clone();
    let results = tickets["output"]["results"].as_array().unwrap().clone();
    let iterations: Vec<u64> = results
        .iter()
        .map(|r| r["iterations"].as_u64().unwrap())
        .collect();
    assert_eq!(iterations, vec![1, 2], "{results:?}");
    let evicted = (1..=3)
        .map(|n| p.prompt("implement", n))
        .find(|t| t.contains("evicted from the merge queue"))
        .expect("the second pass gets the eviction context");
    assert!(evicted.contains("rebase_conflict"), "{evicted}");
    assert!(evicted.contains("slow-ticket"), "{evicted}");
    let files = p.git(&["ls-tree", "--name-only", "main"]);
    assert!(
        files.contains("shared.txt") && files.contains("slow-ticket.txt"),
        "{files}"
    );
}

#[test]
fn ticket_pipeline_rediscovers_unlanded_tickets_in_the_next_run() {
    let p = ticket_project(1);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 2, "the slow ticket did not land: {}", out.stderr);
    assert_eq!(out.json["exit"], "some_unlanded");
    p.answer(
        "discover",
        2,
        &fenced(r#"{"tickets": [], "reasoning": "nothing"}"#),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let second = p.prompt("discover", 2);
    let resume = second
        .split("Unfinished tickets from earlier runs")
        .nth(1)
        .unwrap_or_else(|| panic!("{second}"));
    let resume = resume.split("##").next().unwrap();
    assert!(resume.contains("slow-ticket"), "{second}");
    assert!(
        !resume.contains("fast-ticket"),
        "landed tickets are not resumed: {second}"
    );
    // The evicted ticket was recorded when its passes ran out, with why.
    let evicted = second
        .split("Tickets the merge queue evicted in earlier runs")
        .nth(1)
        .unwrap_or_else(|| panic!("{second}"));
    let evicted = evicted.split("##").next().unwrap();
    assert!(
        evicted.contains("`slow-ticket` (small, 1 passes") && evicted.contains("last eviction:"),
        "{second}"
    );
    assert!(!evicted.contains("fast-ticket"), "{second}");
}

//! End-to-end runs of the executor through the command line, with scripted agents
//! (tests/fakes/scripted), probes and fake CLIs. No network, no LLM.
#![allow(clippy::unwrap_used)]

mod common;

use common::Project;
use serde_json::json;

const BOT: &str = r#"
[agents.bot]
kind = "command"
command = ["scripted"]
"#;

#[test]
fn a_loop_runs_until_its_condition_with_feedback_of_the_failed_iteration() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"name = "until"
{BOT}
[stages.attempts]
kind = "loop"
max_iterations = 4
until = "stages.verify.output.passed"

[stages.attempts.stages.work]
kind = "agent"
agent = "bot"
prompt = "iteration {{{{ iteration }}}} of {{{{ max_iterations }}}}; feedback: {{{{ feedback }}}}"

[stages.attempts.stages.verify]
kind = "check"
needs = ["work"]
argv = ["sh", "-c", "test \"$0\" = ok || {{ echo \"wanted ok, got $0\"; exit 1; }}", "{{{{ stages.work.output.text | trim }}}}"]
"#
        ),
    );
    p.answer("work", 1, "bad");
    p.answer("work", 2, "worse");
    p.answer("work", 3, "ok");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // Nothing reads the loop's history, so its output does not carry it.
    assert_eq!(
        out.json["outputs"]["attempts"],
        json!({"iterations": 3, "outcome": "until"})
    );
    let second = p.prompt("work", 2);
    assert!(second.contains("iteration 2 of 4"), "{second}");
    assert!(
        second.contains("wanted ok, got bad"),
        "feedback of the failed check: {second}"
    );
    assert!(
        p.prompt("work", 1).contains("feedback: \n") || p.prompt("work", 1).ends_with("feedback: ")
    );
}

#[test]
fn a_loop_stops_as_stuck_when_the_findings_repeat() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"name = "stuck"
{BOT}
[exits.stuck]
code = 4

[stages.review_loop]
kind = "loop"
max_iterations = 10
until = "stages.review.output.no_issues"
stuck = {{ on = "stages.review.output.issues", repeats = 2, then = "exit:stuck" }}

[stages.review_loop.stages.review]
kind = "agent"
agent = "bot"
prompt = "review; earlier findings: {{{{ history | length }}}}"
output = {{ extract = "markers", markers.no_issues = {{ pattern = "^NO_ISSUES$" }}, markers.issues = {{ prefix = "ISSUE:", many = true }} }}
"#
        ),
    );
    p.answer("review", 1, "ISSUE: a\nISSUE: b\n");
    p.answer("review", 2, "ISSUE: b\n");
    p.answer("review", 3, "ISSUE: b\n");
    p.answer("review", 4, "NO_ISSUES\n");
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(out.code, 4, "stuck exit: {}", out.stderr);
    assert_eq!(p.calls("review"), 3, "the fourth review never runs");
    assert!(out.stderr.contains("stuck"), "{}", out.stderr);
}

#[test]
fn routes_choose_the_next_stage_and_escalation_runs_only_when_it_holds() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"name = "routes"
{BOT}
[exits.unfixable]
code = 2

[stages.attempts]
kind = "loop"
max_iterations = 5
on_exhausted = "exit:failed"

[[stages.attempts.escalation]]
when = "iteration >= 3"
run = ["oracle"]

[stages.attempts.stages.review]
kind = "agent"
agent = "bot"
prompt = "review {{{{ iteration }}}}"
output = {{ extract = "json", schema = {{ type = "object", required = ["verdict"], properties = {{ verdict = {{ enum = ["VALID", "INVALID", "UNFIXABLE"] }} }} }} }}
route = {{ on = "verdict", cases = {{ VALID = "verify", INVALID = "continue", UNFIXABLE = "exit:unfixable" }} }}

[stages.attempts.stages.oracle]
kind = "agent"
agent = "bot"
needs = ["review"]
prompt = "deep analysis"

[stages.attempts.stages.verify]
kind = "command"
argv = ["true"]
route = {{ on = "exit_code", cases = {{ "0" = "break" }} }}
"#
        ),
    );
    p.answer("review", 1, r#"{"verdict": "INVALID"}"#);
    p.answer("review", 2, r#"{"verdict": "INVALID"}"#);
    p.answer("review", 3, r#"{"verdict": "INVALID"}"#);
    p.answer("review", 4, r#"{"verdict": "UNFIXABLE"}"#);
    p.answer("oracle", 1, "look at the types");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_eq!(out.json["exit"], "unfixable");
    assert_eq!(p.calls("review"), 4);
    // INVALID continues before oracle runs; the escalation never ran in iterations 1-2.
    assert_eq!(
        p.calls("oracle"),
        0,
        "oracle needs review, which ended each iteration"
    );

    // VALID routes to verify, which breaks the loop: success.
    let p2 = Project::new();
    p2.workflow("w.toml", &p.read("w.toml"));
    p2.answer("review", 1, r#"{"verdict": "INVALID"}"#);
    p2.answer("review", 2, r#"{"verdict": "VALID"}"#);
    let out = p2.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["attempts"]["outcome"], "break");
    assert_eq!(out.json["outputs"]["verify"]["exit_code"], 0);
}

#[test]
fn escalation_rules_add_stages_from_the_iteration_they_hold() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"name = "escalate"
{BOT}
[stages.attempts]
kind = "loop"
max_iterations = 4
until = "stages.judge.output.text | trim == 'done'"

[[stages.attempts.escalation]]
when = "iteration >= 3 or (stages.fast.output.text | trim) == 'unsure'"
run = ["slow"]

[stages.attempts.stages.fast]
kind = "agent"
agent = "bot"
prompt = "fast {{{{ iteration }}}}"

[stages.attempts.stages.slow]
kind = "agent"
agent = "bot"
needs = ["fast"]
prompt = "slow {{{{ iteration }}}}"

[stages.attempts.stages.judge]
kind = "agent"
agent = "bot"
needs = ["fast", "slow"]
prompt = "judge {{{{ iteration }}}}: slow ran: {{{{ stages.slow.ran }}}}"
"#
        ),
    );
    p.answer("fast", 1, "sure");
    p.answer("fast", 2, "unsure");
    p.answer("fast", 3, "sure");
    p.answer("slow", 1, "deep 2");
    p.answer("slow", 2, "deep 3");
    p.answer("judge", 1, "again");
    p.answer("judge", 2, "again");
    p.answer("judge", 3, "done");
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        p.calls("slow"),
        2,
        "iteration 2 (unsure) and 3 (iteration >= 3)"
    );
    assert!(p.prompt("judge", 1).contains("slow ran: False"));
    assert!(p.prompt("judge", 2).contains("slow ran: True"));
    assert!(p.prompt("slow", 1).contains("slow 2"));
}

#[test]
fn a_route_to_a_stage_runs_only_the_chosen_branch() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"name = "categories"
{BOT}
[stages.categorize]
kind = "agent"
agent = "bot"
prompt = "categorize"
output = {{ extract = "regex", pattern = "CATEGORY: (?P<category>[A-C])" }}
route = {{ on = "category", cases = {{ A = "wire", B = "rewrite" }}, default = "fail" }}

[stages.wire]
kind = "command"
argv = ["echo", "wired"]

[stages.rewrite]
kind = "command"
argv = ["echo", "rewritten"]

[stages.report]
kind = "command"
needs = ["wire", "rewrite"]
argv = ["echo", "{{{{ stages.wire.status }}}} {{{{ stages.rewrite.status }}}}"]
"#
        ),
    );
    p.answer("categorize", 1, "thinking...\nCATEGORY: B\n");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["report"]["stdout"], "skipped done\n");
    assert!(out.json["outputs"].get("wire").is_none());

    let p2 = Project::new();
    p2.workflow("w.toml", &p.read("w.toml"));
    p2.answer("categorize", 1, "CATEGORY: C\n");
    let out = p2.run(&["run", "w.toml", "--json"]);
    assert_eq!(
        out.code, 1,
        "C has no case: the default fails the run: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "stage `categorize` (w.toml:7:9) failed: its route on `category` gave `C`, which leads to `fail`"
        ),
        "the failure names the stage's file, line and column: {}",
        out.stderr
    );
}

#[test]
fn for_each_honours_its_concurrency_limit_and_a_resource_of_capacity_one() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "fanout"

[resources.merge_queue]
capacity = 1

[stages.list]
kind = "command"
argv = ["echo", "[1, 2, 3, 4, 5, 6]"]
output = { extract = "json" }

[stages.items]
kind = "for_each"
needs = ["list"]
over = "stages.list.output"
as = "n"
max_concurrency = 3

[stages.items.stages.work]
kind = "command"
argv = ["probe", "work-{{ n }}", "0.3", "{{ n * 10 }}"]

[stages.items.stages.land]
kind = "command"
needs = ["work"]
resource = "merge_queue"
argv = ["probe", "land-{{ n }}", "0.1"]
"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let log = p.probe_log();
    assert_eq!(max_overlap(&log, "work-"), 3, "{log}");
    assert_eq!(max_overlap(&log, "land-"), 1, "{log}");
    let results = out.json["outputs"]["items"]["results"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(results, 6);
}

#[test]
fn max_concurrency_on_the_command_line_caps_everything() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "cap"
[stages.a]
kind = "command"
argv = ["probe", "a", "0.3"]
[stages.b]
kind = "command"
argv = ["probe", "b", "0.3"]
[stages.c]
kind = "command"
argv = ["probe", "c", "0.3"]
"#,
    );
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(max_overlap(&p.probe_log(), ""), 3);
    std::fs::remove_file(p.dir().join("probe.log")).unwrap();
    let out = p.run(&["run", "w.toml", "--max-concurrency", "1"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(max_overlap(&p.probe_log(), ""), 1);
}

fn max_overlap(log: &str, prefix: &str) -> usize {
    let mut events: Vec<(u128, i32)> = Vec::new();
    for line in log.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() == 3 && parts[1].starts_with(prefix) {
            let t: u128 = parts[2].parse().unwrap();
            events.push((t, if parts[0] == "start" { 1 } else { -1 }));
        }
    }
    events.sort_by_key(|(t, d)| (*t, *d));
    let (mut cur, mut max) = (0i32, 0i32);
    for (_, d) in events {
        cur += d;
        max = max.max(cur);
    }
    usize::try_from(max).unwrap()
}

const GATED: &str = r#"name = "gated"

[stages.plan]
kind = "command"
argv = ["echo", "the plan"]

[stages.review]
kind = "loop"
needs = ["plan"]
max_iterations = 3
until = "stages.approve_plan.output.approved"

[stages.review.stages.revise]
kind = "command"
argv = ["echo", "revision {{ iteration }}: {{ feedback }}"]

[stages.review.stages.approve_plan]
kind = "gate"
needs = ["revise"]
message = "Approve revision {{ iteration }}?"

[stages.other]
kind = "command"
argv = ["echo", "independent"]
"#;

#[test]
fn a_gate_waits_and_a_rejection_comment_is_the_next_attempts_feedback() {
    let p = Project::new();
    p.workflow("w.toml", GATED);
    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "waiting: {}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    assert_eq!(out.json["waiting_on"], json!(["review#1/approve_plan"]));
    assert_eq!(
        out.json["outputs"]["other"]["stdout"], "independent\n",
        "other branches go on"
    );
    assert!(
        out.stderr
            .contains(&format!("ralph-flow approve {run} 'review#1/approve_plan'")),
        "{}",
        out.stderr
    );

    let bad = p.run(&["approve", &run, "nope"]);
    assert_eq!(bad.code, 3);
    assert!(
        bad.stderr.contains("waiting: review#1/approve_plan"),
        "{}",
        bad.stderr
    );
    let no_comment = p.run(&["reject", &run, "approve_plan"]);
    assert_eq!(no_comment.code, 3);

    let r = p.run(&[
        "reject",
        &run,
        "approve_plan",
        "--comment",
        "add error handling",
        "--by",
        "ana",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out = p.run(&["resume", &run, "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "waits again: {}", out.stderr);
    let a = p.run(&["approve", &run, "approve_plan", "--by", "bo"]);
    assert_eq!(a.code, 0, "{}", a.stderr);
    let out = p.run(&["resume", &run, "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["approve_plan"]["approved"], true);
    assert_eq!(out.json["outputs"]["approve_plan"]["by"], "bo");
    assert!(
        out.json["outputs"]["revise"]["stdout"]
            .as_str()
            .unwrap()
            .contains(
                "revision 2: The gate `approve_plan` was rejected by ana: add error handling"
            ),
        "{}",
        out.json
    );
    assert_eq!(out.json["outputs"]["review"]["iterations"], 2);
    // Who answered, and when, is recorded.
    let logs = p.run(&["logs", &run]);
    assert!(
        logs.stdout.contains("rejected by ana: add error handling"),
        "{}",
        logs.stdout
    );
    assert!(logs.stdout.contains("approved by bo"), "{}", logs.stdout);
}

#[test]
fn a_waiting_run_polls_and_picks_up_an_answer_from_another_terminal() {
    let p = Project::new();
    p.workflow("w.toml", GATED);
    let child = p.spawn(&["run", "w.toml", "--json"]);
    let run = p.wait_for_run();
    p.wait_for(|| p.run(&["approve", &run, "approve_plan"]).code == 0);
    let out = child.finish();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["review"]["iterations"], 1);
}

#[test]
fn gate_timeouts_apply_their_action() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "timeout"
[exits.abandoned]
code = 5

[stages.ask]
kind = "gate"
message = "Ship it?"
timeout = "300ms"
on_timeout = "approve"

[stages.ask_again]
kind = "gate"
needs = ["ask"]
message = "Really?"
timeout = "300ms"
on_timeout = "exit:abandoned"
"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["ask"]["approved"], true);
    assert_eq!(out.json["outputs"]["ask"]["by"], "timeout");
}

#[test]
fn an_invalid_output_is_retried_with_the_validation_errors_then_fails_showing_them() {
    let p = Project::new();
    let wf = format!(
        r#"name = "repair"
{BOT}
[stages.plan]
kind = "agent"
agent = "bot"
prompt = "plan it"
retries = 1
output = {{ extract = "fenced_json", schema = {{ type = "object", required = ["steps"], properties = {{ steps = {{ type = "array", minItems = 1 }} }} }} }}
"#
    );
    p.workflow("w.toml", &wf);
    p.answer("plan", 1, "```json\n{\"step\": []}\n```");
    p.answer("plan", 2, "Here:\n```json\n{\"steps\": [\"a\"]}\n```");
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["plan"]["steps"], json!(["a"]));
    let second = p.prompt("plan", 2);
    assert!(second.contains("could not be used"), "{second}");
    assert!(
        second.contains("steps"),
        "the validation error names the field: {second}"
    );

    let p = Project::new();
    p.workflow("w.toml", &wf);
    p.answer("plan", 1, "no json");
    p.answer("plan", 2, "```json\n{\"steps\": []}\n```");
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("did not validate after 2 attempts"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("/steps"),
        "the exact error: {}",
        out.stderr
    );
}

#[test]
fn a_timeout_kills_the_whole_process_group_and_an_idle_timeout_catches_silence() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "timeouts"
[stages.slow]
kind = "command"
argv = ["sh", "-c", "sleep 60 & echo $! > grandchild.pid; wait"]
timeout = "1s"
"#,
    );
    let t = std::time::Instant::now();
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(t.elapsed().as_secs() < 20);
    assert!(out.stderr.contains("process group"), "{}", out.stderr);
    let pid: i32 = p.read("grandchild.pid").trim().parse().unwrap();
    p.wait_for(|| !common::alive(pid));
    assert!(p.store_text().contains("timed_out"));

    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "idle"
[stages.hung]
kind = "command"
argv = ["sh", "-c", "echo started; sleep 60"]
idle_timeout = "1s"
timeout = "30s"

[stages.chatty]
kind = "command"
argv = ["sh", "-c", "for i in 1 2 3 4; do echo $i; sleep 0.4; done"]
idle_timeout = "1s"
"#,
    );
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("produced no output for 1.0s"),
        "{}",
        out.stderr
    );
    assert!(p.store_text().contains("chatty"), "chatty finished");
}

/// A for_each over `over` whose items all start at once, each in its own worktree, running
/// `script` (with the item as `$0`).
fn items_in_worktrees(over: &str, worktree: &str, script: &str) -> String {
    format!(
        r#"name = "trees"
[stages.items]
kind = "for_each"
over = "{over}"
as = "t"
max_concurrency = 12
worktree = {worktree}

[stages.items.stages.edit]
kind = "command"
argv = ["sh", "-c", "{script}", "{{{{ t }}}}"]
"#
    )
}

#[test]
fn templates_name_the_projects_own_checkout_from_inside_a_worktree() {
    let p = Project::new();
    p.git_init();
    p.workflow(
        "w.toml",
        &items_in_worktrees(
            "['a']",
            r#"{ branch = "root/{{ t }}", cleanup = "never" }"#,
            "pwd -P > {{ run.root }}/where.txt; echo {{ run.cwd }} >> {{ run.root }}/where.txt; git -C {{ run.root }} branch --show-current >> {{ run.root }}/where.txt",
        ),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let written =
        std::fs::read_to_string(p.dir().join("where.txt")).expect("written in the project");
    let lines: Vec<&str> = written.lines().collect();
    let [pwd, cwd, branch] = lines.as_slice() else {
        panic!("{written}")
    };
    let real = |x: &str| std::fs::canonicalize(x).expect("a directory");
    assert_eq!(real(pwd), real(cwd), "run.cwd is where the item runs");
    assert_ne!(
        real(cwd),
        real(p.dir().to_str().unwrap_or_default()),
        "in its worktree"
    );
    assert_eq!(*branch, "main", "run.root is the project's own checkout");
}

#[test]
fn many_items_add_and_remove_worktrees_at_once() {
    // Worktree changes of one repository must not race (`worktree prune` against a
    // half-done `worktree add`, lock files): twelve items start together.
    let p = Project::new();
    p.git_init();
    p.workflow(
        "w.toml",
        &items_in_worktrees(
            "range(12) | list",
            r#"{ branch = "many/{{ t }}", cleanup = "always" }"#,
            "echo $0 > f.txt && git add f.txt && git commit --allow-empty -qm item-$0",
        ),
    );
    for round in 0..3 {
        let out = p.run(&["run", "w.toml", "--json"]);
        assert_eq!(out.code, 0, "round {round}: {}", out.stderr);
    }
    for t in 0..12 {
        let log = p.git(&["log", "-1", "--format=%s", &format!("many/{t}")]);
        assert_eq!(log.trim(), format!("item-{t}"));
    }
    assert_eq!(
        p.git(&["worktree", "list"]).lines().count(),
        1,
        "every worktree was removed"
    );
}

#[test]
fn two_runs_in_one_repository_add_and_remove_worktrees_without_racing() {
    // Two processes, twelve items each, all starting at once: the repository's worktree
    // lock (in its git directory) serializes them across processes.
    let p = Project::new();
    p.git_init();
    for (name, prefix) in [("a.toml", "a"), ("b.toml", "b")] {
        p.workflow(
            name,
            &items_in_worktrees(
                "range(12) | list",
                &format!(r#"{{ branch = "{prefix}/{{{{ t }}}}", cleanup = "always" }}"#),
                &format!(
                    "echo $0 > f.txt && git add f.txt && git commit --allow-empty -qm {prefix}-$0"
                ),
            ),
        );
    }
    for round in 0..2 {
        let a = p.spawn(&["run", "a.toml", "--state-dir", ".rf-a"]);
        let b = p.spawn(&["run", "b.toml", "--state-dir", ".rf-b"]);
        let (a, b) = (a.finish(), b.finish());
        assert_eq!(a.code, 0, "round {round}, a: {}", a.stderr);
        assert_eq!(b.code, 0, "round {round}, b: {}", b.stderr);
    }
    for prefix in ["a", "b"] {
        for t in 0..12 {
            let log = p.git(&["log", "-1", "--format=%s", &format!("{prefix}/{t}")]);
            assert_eq!(log.trim(), format!("{prefix}-{t}"));
        }
    }
    assert_eq!(p.git(&["worktree", "list"]).lines().count(), 1);
}

#[test]
fn parallel_items_get_their_own_git_worktrees() {
    let p = Project::new();
    p.git_init();
    p.workflow(
        "w.toml",
        &items_in_worktrees(
            "['a', 'b', 'c']",
            r#"{ branch = "ticket/{{ t }}", cleanup = "never" }"#,
            "echo $0 > file.txt && git add file.txt && git commit -qm $0 && pwd",
        ),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let dirs: Vec<String> = out.json["outputs"]["items"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["stdout"].as_str().unwrap().trim().to_string())
        .collect();
    assert_eq!(dirs.len(), 3);
    assert!(dirs.iter().all(|d| d.contains("worktrees")), "{dirs:?}");
    let unique: std::collections::HashSet<_> = dirs.iter().collect();
    assert_eq!(unique.len(), 3, "no two items share a tree");
    for t in ["a", "b", "c"] {
        let log = p.git(&["log", "-1", "--format=%s", &format!("ticket/{t}")]);
        assert_eq!(log.trim(), t);
    }
    assert_eq!(
        p.git(&["status", "--porcelain"]).trim(),
        "?? w.toml",
        "the main tree is untouched"
    );
}

#[test]
fn ctrl_c_stops_agents_persists_and_resume_continues() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "interrupt"
[stages.first]
kind = "command"
argv = ["echo", "one"]

[stages.long]
kind = "command"
needs = ["first"]
argv = ["sh", "-c", "if [ -f done-once ]; then echo two; else touch done-once; sleep 60 & echo $! > grandchild.pid; wait; fi"]
"#,
    );
    let child = p.spawn(&["run", "w.toml", "--json"]);
    p.wait_for(|| p.dir().join("grandchild.pid").exists());
    std::thread::sleep(std::time::Duration::from_millis(200));
    child.signal(nix::sys::signal::Signal::SIGINT);
    let out = child.finish();
    assert_eq!(out.code, 130, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    let pid: i32 = p.read("grandchild.pid").trim().parse().unwrap();
    p.wait_for(|| !common::alive(pid));
    let out = p.run(&["resume", &run, "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["long"]["stdout"], "two\n");
    assert_eq!(out.json["outputs"]["first"]["stdout"], "one\n");
}

/// SIGTERM and SIGHUP (a `kill`, a service manager's stop, a CI cancel, a closed terminal)
/// stop a run as Ctrl-C does: nothing is left running, the run is interrupted, and `resume`
/// continues it; the exit code is 128 + the signal.
#[test]
fn sigterm_and_sighup_stop_a_run_as_ctrl_c_does() {
    use nix::sys::signal::Signal;
    for (signal, code) in [(Signal::SIGTERM, 143), (Signal::SIGHUP, 129)] {
        let p = Project::new();
        p.workflow(
            "w.toml",
            r#"name = "signals"
[stages.long]
kind = "command"
argv = ["sh", "-c", "if [ -f done-once ]; then echo two; else touch done-once; sleep 60 & echo $! > grandchild.pid; wait; fi"]
"#,
        );
        let child = p.spawn(&["run", "w.toml", "--json"]);
        p.wait_for(|| p.dir().join("grandchild.pid").exists());
        std::thread::sleep(std::time::Duration::from_millis(200));
        child.signal(signal);
        let out = child.finish();
        assert_eq!(out.code, code, "{signal}: {}", out.stderr);
        assert_eq!(
            out.json["status"], "interrupted",
            "{signal}: {}",
            out.stdout
        );
        assert!(
            out.stderr
                .contains(&format!("interrupted by {}", signal.as_str())),
            "{}",
            out.stderr
        );
        let run = out.json["run"].as_str().unwrap().to_string();
        let pid: i32 = p.read("grandchild.pid").trim().parse().unwrap();
        p.wait_for(|| !common::alive(pid));
        let status = p.run(&["status", &run, "--json"]);
        assert_eq!(status.json["status"], "interrupted", "{}", status.stdout);
        let out = p.run(&["resume", &run, "--json"]);
        assert_eq!(out.code, 0, "{signal}: {}", out.stderr);
        assert_eq!(out.json["outputs"]["long"]["stdout"], "two\n");
    }
}

#[test]
fn budgets_bound_a_run_with_their_declared_outcome() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "budget"
budget = { tokens = 2500, on_exceeded = "exit:over_budget" }

[exits.over_budget]
code = 6

[agents.bot]
kind = "claude"

[stages.work]
kind = "loop"
max_iterations = 10

[stages.work.stages.step]
kind = "agent"
agent = "bot"
prompt = "step {{ iteration }}"
"#,
    );
    let mut rec = String::new();
    for i in 1..=10 {
        rec.push_str(&format!(
            "{{\"scope\":\"work#{i}\",\"stage\":\"step\",\"attempt\":1,\"agent\":\"bot\",\"prompt_bytes\":6,\"reply\":{{\"text\":\"did {i}\",\"raw\":\"\",\"usage\":{{\"input_tokens\":800,\"output_tokens\":200,\"cached_tokens\":0,\"cost_usd\":0.01}},\"session_id\":null,\"model\":null}}}}\n"
        ));
    }
    p.write("rec.jsonl", &rec);
    let out = p.run(&["run", "w.toml", "--replay", "rec.jsonl", "--json"]);
    assert_eq!(out.code, 6, "{}", out.stderr);
    assert_eq!(out.json["exit"], "over_budget");
    assert!(
        p.store_text().contains("budget of the run is spent"),
        "the reason is recorded"
    );
}

#[test]
fn record_then_replay_runs_the_same_with_no_agent() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"name = "rec"
{BOT}
[stages.a]
kind = "agent"
agent = "bot"
prompt = "a"
[stages.b]
kind = "agent"
agent = "bot"
needs = ["a"]
prompt = "b after {{{{ stages.a.output.text }}}}"
"#
        ),
    );
    p.answer("a", 1, "alpha");
    p.answer("b", 1, "beta");
    let live = p.run(&["run", "w.toml", "--record", "rec.jsonl", "--json"]);
    assert_eq!(live.code, 0, "{}", live.stderr);
    std::fs::remove_dir_all(p.dir().join("answers")).unwrap();
    let replay = p.run(&["run", "w.toml", "--replay", "rec.jsonl", "--json"]);
    assert_eq!(replay.code, 0, "{}", replay.stderr);
    assert_eq!(live.json["outputs"], replay.json["outputs"]);
}

#[test]
fn resume_refuses_a_changed_workflow_unless_allowed_and_a_run_has_one_executor() {
    let p = Project::new();
    p.workflow("w.toml", GATED);
    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75);
    let run = out.json["run"].as_str().unwrap().to_string();
    p.write("w.toml", &GATED.replace("independent", "changed"));
    let refused = p.run(&["resume", &run, "--no-wait"]);
    assert_eq!(refused.code, 3);
    assert!(
        refused.stderr.contains("--allow-changed"),
        "{}",
        refused.stderr
    );
    let allowed = p.run(&["resume", &run, "--no-wait", "--allow-changed"]);
    assert_eq!(allowed.code, 75, "{}", allowed.stderr);
    // A live run holds its lock.
    let child = p.spawn(&["resume", &run, "--allow-changed"]);
    let pid = u32::try_from(child.pid()).unwrap();
    p.wait_for(|| {
        p.store()
            .and_then(|s| {
                ralph_flow::store::Store::lock_holder(&s, &run)
                    .ok()
                    .flatten()
            })
            .is_some_and(|h| h.pid == pid)
    });
    let second = p.run(&["resume", &run, "--allow-changed", "--no-wait"]);
    assert_eq!(second.code, 3, "{}", second.stderr);
    assert!(second.stderr.contains("held by pid"), "{}", second.stderr);
    child.signal(nix::sys::signal::Signal::SIGINT);
    let _ = child.finish();
}

#[test]
fn a_stage_reads_outputs_of_earlier_runs_of_the_same_workflow() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"name = "memory"
{BOT}
[stages.learn]
kind = "agent"
agent = "bot"
prompt = "earlier: {{% for r in earlier_runs('learn') %}}[{{{{ r.output.learnings | join(',') }}}}]{{% endfor %}}"
output = {{ extract = "markers", markers.learnings = {{ prefix = "LEARNING:", many = true }} }}
"#
        ),
    );
    p.answer("learn", 1, "LEARNING: run tests first\n");
    p.answer("learn", 2, "LEARNING: keep diffs small\n");
    p.answer("learn", 3, "nothing new\n");
    for _ in 0..3 {
        let out = p.run(&["run", "w.toml"]);
        assert_eq!(out.code, 0, "{}", out.stderr);
    }
    assert_eq!(p.prompt("learn", 1), "earlier: ");
    assert_eq!(p.prompt("learn", 2), "earlier: [run tests first]");
    assert_eq!(
        p.prompt("learn", 3),
        "earlier: [keep diffs small][run tests first]",
        "newest first"
    );
}

#[test]
fn a_gate_waiting_in_several_scopes_is_answered_by_its_qualified_name() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "gates"
[stages.items]
kind = "for_each"
over = "['a', 'b']"
as = "t"
key = "t"

[stages.items.stages.ship]
kind = "gate"
message = "Ship {{ t }}?"
timeout = "1h"
on_timeout = "reject"
"#,
    );
    let out = p.run(&["run", "w.toml", "--no-wait", "--json"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    assert!(
        out.stderr
            .contains(&format!("approve: ralph-flow approve {run} 'items#a/ship'")),
        "{}",
        out.stderr
    );
    // The bare id is ambiguous: the answer names the places.
    let out = p.run(&["approve", &run, "ship"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("waits in 2 places: items#a/ship, items#b/ship"),
        "{}",
        out.stderr
    );
    // status shows the commands with the qualified names.
    let status = p.run(&["status", &run]);
    assert!(
        status
            .stdout
            .contains(&format!("ralph-flow approve {run} 'items#b/ship'")),
        "{}",
        status.stdout
    );
    assert_eq!(p.run(&["approve", &run, "items#a/ship"]).code, 0);
    assert_eq!(
        p.run(&["reject", &run, "items#b/ship", "--comment", "not b"])
            .code,
        0
    );
    let out = p.run(&["resume", &run, "--json"]);
    let store = p.store_text();
    assert!(
        store.contains("\"approved\":true") || store.contains("approved by"),
        "{store}"
    );
    assert!(store.contains("not b"), "{store}");
    assert_ne!(out.code, 75, "nothing waits any more: {}", out.stderr);
}

#[test]
fn a_list_is_spread_into_argv_one_argument_per_item() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "spread"
[params.paths]
type = "list"
default = ["a b", "$(touch pwned)", "c"]

[stages.show]
kind = "command"
argv = ["sh", "-c", "for a in \"$@\"; do echo \"[$a]\"; done", "show", "{{ params.paths | spread }}", "last"]
"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.json["outputs"]["show"]["stdout"],
        "[a b]\n[$(touch pwned)]\n[c]\n[last]\n"
    );
    assert!(!p.dir().join("pwned").exists());
    // Anywhere but as a whole argv item, `spread` is an error that says so.
    p.workflow(
        "w.toml",
        r#"name = "spread"
[params.paths]
type = "list"
default = ["a", "b"]

[stages.show]
kind = "command"
argv = ["echo", "--paths={{ params.paths | spread }}"]
"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 3, "the check refuses it: {}", out.stderr);
    assert!(
        out.stderr.contains("`spread` must be the whole argv item"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_whole_run_works_in_its_own_worktree_and_branch() {
    let p = Project::new();
    p.git_init();
    p.workflow(
        "w.toml",
        r#"name = "tree"
worktree = { branch = "ralph/{{ params.topic }}" }

[params.topic]
type = "string"
default = "notes"

[stages.write]
kind = "command"
argv = ["sh", "-c", "pwd; echo hello > notes.md && git add notes.md && git commit -qm notes"]

[stages.read]
kind = "command"
needs = ["write"]
argv = ["cat", "notes.md"]
"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let pwd = out.json["outputs"]["write"]["stdout"].as_str().unwrap();
    assert!(
        pwd.contains(".ralph-flow/worktrees/") && pwd.trim_end().ends_with("/@run"),
        "{pwd}"
    );
    assert_eq!(out.json["outputs"]["read"]["stdout"], "hello\n");
    // The work is on the run's branch; the checkout the run started from is untouched.
    assert_eq!(
        p.git(&["log", "-1", "--format=%s", "ralph/notes"]).trim(),
        "notes"
    );
    assert!(!p.dir().join("notes.md").exists());
    assert_eq!(p.git(&["branch", "--show-current"]).trim(), "main");
    // It succeeded: its worktree is gone (cleanup on_success).
    assert_eq!(p.git(&["worktree", "list"]).lines().count(), 1);
    let explain = p.run(&["explain", "w.toml"]);
    assert!(
        explain.stdout.contains(
            "The whole run works in its own git worktree, on branch `ralph/{{ params.topic }}`"
        ),
        "{}",
        explain.stdout
    );
}

#[test]
fn a_loop_and_a_gate_that_give_up_run_a_stage_that_sees_the_history() {
    let p = Project::new();
    let flow = |gate_first: bool| {
        format!(
            r#"name = "give-up"
[exits.blocked]
code = 2
[exits.expired]
code = 4
[stages.attempts]
kind = "loop"
max_iterations = {}
until = "stages.try.output.exit_code == 0"
on_exhausted = "block"
[stages.attempts.stages.try]
kind = "command"
argv = ["sh", "-c", "echo try {{{{ iteration }}}}; exit 2"]
ok_codes = [0, 2]
[stages.block]
kind = "command"
argv = ["echo", "{{{{ stages.attempts.output.outcome }}}}: {{{{ stages.attempts.output.history | map(attribute='outputs') | map(attribute='try') | map(attribute='stdout') | map('trim') | join(', ') }}}}"]
then = "exit:blocked"
[stages.ship]
kind = "gate"
message = "Ship it?"
timeout = "1s"
on_timeout = "remind"
[stages.remind]
kind = "command"
argv = ["echo", "nobody answered"]
then = "exit:expired"
"#,
            if gate_first { 50 } else { 3 }
        )
    };
    p.workflow("w.toml", &flow(false));
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_eq!(out.json["exit"], "blocked");
    assert_eq!(
        out.json["outputs"]["block"]["stdout"],
        "exhausted: try 1, try 2, try 3\n"
    );
    // The gate's timeout runs `remind`, whose `then` ends the run (the loop is still busy).
    p.workflow("w.toml", &flow(true).replace("exit 2", "sleep 0.2; exit 2"));
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 4, "{}", out.stderr);
    assert_eq!(out.json["exit"], "expired");
    assert_eq!(out.json["outputs"]["remind"]["stdout"], "nobody answered\n");
}

#[test]
fn a_loop_that_succeeds_or_breaks_keeps_its_history_for_the_stages_after_it() {
    let p = Project::new();
    let flow = |end: &str| {
        format!(
            r#"name = "learnings"
[stages.attempts]
kind = "loop"
max_iterations = 5
{end}
[stages.attempts.stages.try]
kind = "command"
argv = ["sh", "-c", "echo try {{{{ iteration }}}}; test {{{{ iteration }}}} -ge 3"]
ok_codes = [0, 1]
feedback = "exit {{{{ output.exit_code }}}}"
[stages.attempts.stages.stop]
kind = "command"
needs = ["try"]
when = "stages.try.output.exit_code == 0 and {break_on}"
argv = ["true"]
on_fail = "fail"
route = {{ on = "exit_code", cases = {{ "0" = "break" }} }}
[stages.learnings]
kind = "command"
needs = ["attempts"]
argv = ["echo", "{{{{ stages.attempts.output.outcome }}}} after {{{{ stages.attempts.output.iterations }}}}: {{{{ stages.attempts.output.history | map(attribute='outputs') | map(attribute='try') | map(attribute='stdout') | map('trim') | join(', ') }}}} / {{{{ stages.attempts.output.history | map(attribute='feedback') | join(', ') }}}}"]
"#,
            break_on = if end.is_empty() { "true" } else { "false" }
        )
    };
    p.workflow(
        "w.toml",
        &flow("until = \"stages.try.output.exit_code == 0\""),
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.json["outputs"]["learnings"]["stdout"],
        "until after 3: try 1, try 2, try 3 / try: exit 1, try: exit 1, try: exit 0\n"
    );
    // Ended by a route to `break` in its last iteration.
    p.workflow("w.toml", &flow(""));
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.json["outputs"]["learnings"]["stdout"],
        "break after 3: try 1, try 2, try 3 / try: exit 1, try: exit 1, try: exit 0\n"
    );
}

#[test]
fn an_optional_stage_skipped_counts_as_done_for_what_needs_it() {
    let p = Project::new();
    let flow = |optional: bool| {
        format!(
            r#"name = "optional"
[params.sign_off]
type = "bool"
default = false
[stages.build]
kind = "command"
argv = ["echo", "built"]
[stages.sign_off]
kind = "gate"
needs = ["build"]
when = "params.sign_off"
optional = {optional}
message = "Ship?"
timeout = "1h"
on_timeout = "reject"
[stages.deploy]
kind = "command"
needs = ["sign_off"]
argv = ["echo", "deployed{}"]
[stages.announce]
kind = "command"
needs = ["deploy"]
argv = ["echo", "announced"]
"#,
            if optional {
                "; sign-off ran: {{ stages.sign_off.ran }}"
            } else {
                ""
            }
        )
    };
    p.workflow("w.toml", &flow(true));
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.json["outputs"]["deploy"]["stdout"],
        "deployed; sign-off ran: False\n"
    );
    assert_eq!(out.json["outputs"]["announce"]["stdout"], "announced\n");
    // Without `optional`, the skip spreads: check warns, and the deploy does not run.
    p.workflow("w.toml", &flow(false));
    let check = p.run(&["check", "w.toml"]);
    assert!(check.stderr.contains("RF026"), "{}", check.stderr);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for skipped in ["deploy", "announce"] {
        assert!(
            out.json["outputs"]
                .get(skipped)
                .is_none_or(serde_json::Value::is_null),
            "{}",
            out.json
        );
    }
}

#[test]
fn fan_out_items_see_the_items_that_settled_before_them() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "siblings"
[stages.items]
kind = "for_each"
over = "['a', 'b', 'c']"
as = "t"
key = "t"
max_concurrency = 1

[stages.items.stages.work]
kind = "command"
argv = ["sh", "-c", "echo {{ t }} saw [{{ stages.items.settled | map(attribute='key') | join(',') }}]; test {{ t }} != b"]
"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 1, "b fails: {}", out.stderr);
    let results = p.store_text();
    assert!(results.contains("a saw []"), "{results}");
    assert!(results.contains("b saw [a]"), "{results}");
    assert!(results.contains("c saw [a,b]"), "{results}");
    // Outside its body, `settled` is a check error.
    p.workflow(
        "w.toml",
        r#"name = "siblings"
[stages.items]
kind = "for_each"
over = "['a']"
as = "t"
[stages.items.stages.work]
kind = "command"
argv = ["echo", "{{ t }}"]
[stages.after]
kind = "command"
needs = ["items"]
argv = ["echo", "{{ stages.items.settled | length }}"]
"#,
    );
    let out = p.run(&["check", "w.toml"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains(
            "`stages.items.settled` is only read inside the body of the for_each `items`"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn a_list_of_whole_numbers_is_set_on_the_command_line_and_spread() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "sizes"
[params.sizes]
type = "list"
items = "int"
default = [1, 2]

[stages.sum]
kind = "command"
argv = ["sh", "-c", "echo $(( $1 + $2 + $3 )) {{ params.sizes | sum }}", "sum", "{{ params.sizes | spread }}"]
"#,
    );
    let out = p.run(&["run", "w.toml", "--set", "sizes=4, 5,6", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json["outputs"]["sum"]["stdout"], "15 15\n");
    // A value that is not a whole number is refused before anything runs.
    let out = p.run(&["run", "w.toml", "--set", "sizes=4,five"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("sizes"), "{}", out.stderr);
}

/// A loop that gives up says that its agents were denied actions: a reviewer that could
/// not commit its fixes is why a Wiggum loop never ends clean.
#[test]
fn a_loop_that_gives_up_names_its_agents_denied_actions() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"
name = "w"

[agents.a]
kind = "claude"

[stages.fix]
kind = "loop"
max_iterations = 2
until = "stages.work.output.text == 'DONE'"

[stages.fix.stages.work]
kind = "agent"
agent = "a"
prompt = "Fix and commit."
"#,
    );
    let out = p.run_env(&["run", "w.toml"], &[("FAKE_MODE", "denied")]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let end = out
        .stderr
        .lines()
        .find(|l| l.contains("stage `fix`") && l.contains("failed: no success after 2 iterations"))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(
        end.contains("its agents were denied actions")
            && end.contains("stage `work`: agent `a` was denied 1 action (its `permissions` is `read-only`): Write: "),
        "{end}"
    );
    assert_eq!(
        end.matches("was denied").count(),
        1,
        "each denial once: {end}"
    );
}

/// Subflows: one whose params are written out is compiled with the run's plan, and one that
/// does not check for its params stops the run before any stage starts; one whose params
/// come from an output is prepared during the run, once per file and params.
#[test]
fn subflows_are_compiled_ahead_or_prepared_during_the_run() {
    let p = Project::new();
    p.workflow(
        "child.toml",
        r#"name = "child"
[params.n]
type = "int"

[stages.say]
kind = "command"
argv = ["sh", "-c", "echo child $0 >> said.txt", "{{ params.n }}"]
"#,
    );
    p.workflow(
        "w.toml",
        r#"name = "parent"
[stages.first]
kind = "command"
argv = ["sh", "-c", "echo 7"]

[stages.written]
kind = "subflow"
needs = ["first"]
workflow = "child.toml"
params = { n = "3" }

[stages.again]
kind = "subflow"
needs = ["written"]
workflow = "child.toml"
params = { n = "3" }

[stages.from_output]
kind = "subflow"
needs = ["again"]
workflow = "child.toml"
params = { n = "{{ stages.first.output.stdout | trim }}" }
"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(p.read("said.txt"), "child 3\nchild 3\nchild 7\n");
    assert_eq!(out.json["outputs"]["from_output"]["exit"], json!("success"));

    // Written-out params the child refuses: nothing starts, and the run says why.
    p.write("said.txt", "");
    p.workflow(
        "bad.toml",
        r#"name = "bad"
[stages.first]
kind = "command"
argv = ["sh", "-c", "echo started >> said.txt"]

[stages.sub]
kind = "subflow"
needs = ["first"]
workflow = "child.toml"
params = { n = "many" }
"#,
    );
    let out = p.run(&["run", "bad.toml"]);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("subflow `sub`") && out.stderr.contains("child.toml is not valid"),
        "{}",
        out.stderr
    );
    assert_eq!(p.read("said.txt"), "", "no stage started");
}

//! The executor's cost per stage does not grow with the run. Checked by counting its work
//! (template contexts and what they copy, nodes the scheduler looks at, commits), never by
//! timing: a chain of 400 stages must cost per stage what a chain of 100 costs.
#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::path::Path;

use ralph_flow::prepare::prepare;
use ralph_flow::run::progress::Mode;
use ralph_flow::run::{RunOptions, RunResult, WorkCounts, execute};
use ralph_flow::store::Store;
use ralph_flow::store::sqlite::{SqliteStore, default_path};

/// A recorded answer, as `--record` writes it: with the length of the prompt it answered
/// (the exact prompt each stage renders, so the replay warns of no changed prompt).
fn reply(scope: &str, stage: &str, prompt: &str, text: &str) -> String {
    let usage = serde_json::json!({"input_tokens": 1, "output_tokens": 1, "cached_tokens": 0, "cost_usd": null});
    let line = serde_json::json!({
        "scope": scope, "stage": stage, "attempt": 1, "agent": "bot",
        "prompt_bytes": prompt.len(),
        "reply": {"text": text, "raw": text, "usage": usage, "session_id": null, "model": null},
    });
    format!("{line}\n")
}

/// A chain of `n` agent stages, each reading the output of the one before.
fn chain(n: usize) -> (String, String) {
    let mut wf = String::from("name = \"chain\"\n[agents.bot]\nkind = \"claude\"\n");
    let mut rec = String::new();
    for i in 0..n {
        let _ = writeln!(wf, "[stages.s{i}]\nkind = \"agent\"\nagent = \"bot\"");
        if i == 0 {
            let _ = writeln!(wf, "prompt = \"start\"");
        } else {
            let _ = writeln!(
                wf,
                "needs = [\"s{}\"]\nprompt = \"after {{{{ stages.s{}.output.text }}}}\"",
                i - 1,
                i - 1
            );
        }
        let prompt = if i == 0 {
            "start".to_string()
        } else {
            format!("after ok {}", i - 1)
        };
        rec.push_str(&reply("", &format!("s{i}"), &prompt, &format!("ok {i}")));
    }
    (wf, rec)
}

/// A chain of `n` agent stages whose answers are long (over the length a view keeps in
/// memory), each prompt quoting the end of the answer two stages before (committed by then).
fn long_chain(n: usize) -> (String, String) {
    let answer = |i: usize| format!("{}{i:012}", "x".repeat(2000));
    let mut wf = String::from("name = \"long\"\n[agents.bot]\nkind = \"claude\"\n");
    let mut rec = String::new();
    for i in 0..n {
        let _ = writeln!(wf, "[stages.s{i}]\nkind = \"agent\"\nagent = \"bot\"");
        if i > 0 {
            let _ = writeln!(wf, "needs = [\"s{}\"]", i - 1);
        }
        let prompt = if i < 2 {
            let _ = writeln!(wf, "prompt = \"start\"");
            "start".to_string()
        } else {
            let _ = writeln!(
                wf,
                "prompt = \"after {{{{ stages.s{}.output.text[-12:] }}}}\"",
                i - 2
            );
            format!("after {:012}", i - 2)
        };
        rec.push_str(&reply("", &format!("s{i}"), &prompt, &answer(i)));
    }
    (wf, rec)
}

/// A loop of `n` iterations of two stages (`until` never holds; the loop breaks at `n`).
fn looped(n: usize) -> (String, String) {
    let wf = format!(
        r#"name = "looped"
[agents.bot]
kind = "claude"
[stages.work]
kind = "loop"
max_iterations = {n}
until = "iteration >= {n}"
[stages.work.stages.a]
kind = "agent"
agent = "bot"
prompt = "a {{{{ iteration }}}} {{{{ stages.b.last.text if stages.b.last is defined else '' }}}}"
[stages.work.stages.b]
kind = "agent"
agent = "bot"
needs = ["a"]
prompt = "b {{{{ stages.a.output.text }}}}"
"#
    );
    let mut rec = String::new();
    for it in 1..=n {
        let last = if it == 1 { "" } else { "y" };
        rec.push_str(&reply(
            &format!("work#{it}"),
            "a",
            &format!("a {it} {last}"),
            "x",
        ));
        rec.push_str(&reply(&format!("work#{it}"), "b", "b x", "y"));
    }
    (wf, rec)
}

/// A for_each of `n` items, 8 at a time.
fn fan_out(n: usize) -> (String, String) {
    let wf = format!(
        r#"name = "fan"
[agents.bot]
kind = "claude"
[params.items]
type = "list"
items = "int"
default = [{}]
[stages.each]
kind = "for_each"
over = "params.items"
max_concurrency = 8
[stages.each.stages.one]
kind = "agent"
agent = "bot"
prompt = "item {{{{ item }}}}"
"#,
        (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
    );
    let mut rec = String::new();
    for i in 0..n {
        rec.push_str(&reply(
            &format!("each#{i}"),
            "one",
            &format!("item {i}"),
            "done",
        ));
    }
    (wf, rec)
}

fn run(dir: &Path, wf: &str, rec: &str, resume: Option<String>) -> RunResult {
    run_with(dir, wf, rec, resume, true)
}

fn run_with(dir: &Path, wf: &str, rec: &str, resume: Option<String>, wait: bool) -> RunResult {
    let path = dir.join("w.toml");
    std::fs::write(&path, wf).unwrap();
    let rec_path = dir.join("rec.jsonl");
    std::fs::write(&rec_path, rec).unwrap();
    let prepared = prepare(&path, &[]).map_err(|e| e.render()).unwrap();
    let mut opts = RunOptions::new(dir.to_path_buf());
    opts.progress = Mode::Quiet;
    opts.replay = Some(rec_path);
    opts.resume = resume;
    opts.wait = wait;
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(execute(&prepared, opts))
        .unwrap();
    // The recordings answer the prompts the stages render: no warning, no work for one.
    let store = SqliteStore::open(&default_path(&dir.join(".ralph-flow"))).unwrap();
    let warnings: Vec<String> = store
        .events(&result.run_id, None)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "warning")
        .map(|e| e.message)
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
    result
}

fn counts(wf: &(String, String)) -> WorkCounts {
    let dir = tempfile::tempdir().unwrap();
    let r = run(dir.path(), &wf.0, &wf.1, None);
    assert_eq!(r.end.code(), 0, "{:?}", r.end);
    r.work
}

/// Work per settlement must not grow: `big` (4x the stages) costs per stage what `small`
/// costs, within a small allowance for fixed costs.
fn assert_flat(what: &str, small: WorkCounts, big: WorkCounts) {
    let per = |x: u64, w: &WorkCounts| x as f64 / w.settled as f64;
    assert!(
        big.settled >= 3 * small.settled,
        "{what}: {small:?} {big:?}"
    );
    for (name, s, b) in [
        ("contexts", small.contexts, big.contexts),
        ("context items", small.context_items, big.context_items),
        ("scheduled", small.scheduled, big.scheduled),
        ("commits", small.commits, big.commits),
    ] {
        assert!(
            per(b, &big) <= per(s, &small) * 1.1 + 0.05,
            "{what}: {name} per settlement grew from {:.2} ({small:?}) to {:.2} ({big:?})",
            per(s, &small),
            per(b, &big)
        );
    }
}

#[test]
fn a_chain_costs_the_same_per_stage_at_any_length() {
    let small = counts(&chain(100));
    let big = counts(&chain(400));
    assert_flat("chain", small, big);
    // One commit per stage: the settlement of a stage and the start of the next go together.
    assert!(big.commits <= big.settled + 3, "{big:?}");
    // The scheduler looks at each node once.
    assert_eq!(big.scheduled, 400, "{big:?}");
    // A context copies the frames of its chain and their variables, never the settled stages.
    assert!(big.context_items <= 2 * big.contexts, "{big:?}");
}

#[test]
fn a_loop_costs_the_same_per_iteration_at_any_length() {
    let small = counts(&looped(25));
    let big = counts(&looped(100));
    assert_flat("loop", small, big);
}

#[test]
fn a_fan_out_costs_the_same_per_item_and_groups_its_commits() {
    let small = counts(&fan_out(50));
    let big = counts(&fan_out(200));
    assert_flat("for_each", small, big);
    // Items that settle together commit together: fewer commits than items.
    assert!(big.commits < big.settled, "{big:?}");
}

/// A person approves a gate at the top level of a run.
fn approve(dir: &Path, run: &str, gate: &str) {
    let mut store = SqliteStore::open(&default_path(&dir.join(".ralph-flow"))).unwrap();
    store
        .answer(&ralph_flow::store::Approval {
            run: run.to_string(),
            scope: String::new(),
            gate: gate.into(),
            approved: true,
            comment: None,
            by: "test".into(),
            at: 0,
        })
        .unwrap();
}

/// A gate after the last of a chain's `n` stages.
const LAST_GATE: &str = "[stages.last]\nkind = \"gate\"\nmessage = \"ok?\"\ntimeout = \"24h\"\non_timeout = \"reject\"\n";

#[test]
fn resume_replays_a_long_run_looking_at_each_node_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wf, rec) = chain(300);
    wf.push_str(LAST_GATE);
    wf.push_str("needs = [\"s299\"]\n");
    // The first run settles the chain and stops at the gate; a person approves.
    let first = run_with(dir.path(), &wf, &rec, None, false);
    assert_eq!(first.end.code(), 75, "{:?}", first.end);
    approve(dir.path(), &first.run_id, "last");
    let second = run(dir.path(), &wf, &rec, Some(first.run_id.clone()));
    assert_eq!(second.end.code(), 0, "{:?}", second.end);
    // Each node is looked at once; replayed stages make no context and write nothing.
    assert_eq!(second.work.scheduled, 301, "{:?}", second.work);
    assert!(second.work.contexts <= 2, "{:?}", second.work);
    assert!(second.work.commits <= 3, "{:?}", second.work);
}

/// Long outputs are not kept in memory once committed: each view leaves its output to the
/// store and reads it back when a template asks (the replay checks every prompt rendered
/// from them: a wrong read would render another prompt, and warn), and so do the run's
/// outputs. A resume leaves the long outputs it settles from to the store at once.
#[test]
fn long_outputs_are_left_to_the_store_and_read_back_when_asked() {
    let n = 30;
    let (mut wf, rec) = long_chain(n);
    wf.push_str(LAST_GATE);
    let _ = writeln!(wf, "needs = [\"s{}\"]", n - 1);
    let dir = tempfile::tempdir().unwrap();
    let first = run_with(dir.path(), &wf, &rec, None, false);
    assert_eq!(first.end.code(), 75, "{:?}", first.end);
    assert_eq!(first.work.outputs_in_store, n as u64);
    assert_eq!(first.work.outputs_read, n as u64 - 2);
    let text = |i: usize| serde_json::json!(format!("{}{i:012}", "x".repeat(2000)));
    let outputs = serde_json::to_value(&first.outputs).unwrap();
    assert_eq!(outputs["s29"]["text"], text(29));

    approve(dir.path(), &first.run_id, "last");
    let second = run(dir.path(), &wf, &rec, Some(first.run_id.clone()));
    assert_eq!(second.end.code(), 0, "{:?}", second.end);
    assert_eq!(second.work.outputs_in_store, n as u64);
    assert_eq!(second.work.outputs_read, 0);
    let outputs = serde_json::to_value(&second.outputs).unwrap();
    assert_eq!(outputs["s0"]["text"], text(0));
}

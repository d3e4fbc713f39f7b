//! `ralph-flow runs`, `status` and `logs` over a store written through the library.

use std::path::Path;

use assert_cmd::Command;
use ralph_flow::backend::Usage;
use ralph_flow::store::sqlite::SqliteStore;
use ralph_flow::store::{
    AttemptRecord, Event, GateRequest, NodeRecord, NodeState, RunRecord, RunStatus, Store, Write,
};
use serde_json::{Value, json};

const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

fn usage(input: u64, cost: f64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: input / 10,
        cached_tokens: input / 2,
        cost_usd: Some(cost),
        unreported: 0,
    }
}

fn node(scope: &str, name: &str, state: NodeState, input: u64) -> NodeRecord {
    NodeRecord {
        run: "r2".to_string(),
        scope: scope.to_string(),
        node: name.to_string(),
        state,
        output: json!({"ok": true}),
        action: None,
        feedback: None,
        attempts: 1,
        usage: usage(input, input as f64 / 100_000.0),
        started_at: T0,
        finished_at: T0 + 1_000,
    }
}

fn event(scope: &str, name: &str, kind: &str, offset: i64, message: &str) -> Write {
    Write::Event(Event {
        run: "r2".to_string(),
        at: T0 + offset,
        scope: scope.to_string(),
        node: name.to_string(),
        kind: kind.to_string(),
        message: message.to_string(),
    })
}

fn attempt(scope: &str, name: &str, n: u32, state: &str) -> Write {
    Write::Attempt(AttemptRecord {
        run: "r2".to_string(),
        scope: scope.to_string(),
        node: name.to_string(),
        attempt: n,
        state: ralph_flow::store::AttemptState::parse(state).expect("an attempt state"),
        agent: Some("claude".to_string()),
        dir: format!(".ralph-flow/runs/r2/{name}/{n}"),
        error: None,
        usage: Usage::default(),
        started_at: T0,
        finished_at: Some(T0 + 1_000),
    })
}

/// A state directory with a finished run `r1` and a run `r2` waiting on a gate.
fn fixture(state: &Path) {
    let mut s = SqliteStore::open(&state.join("state.db")).expect("open");
    let run = |id: &str, started_at: i64, status: RunStatus| RunRecord {
        id: id.to_string(),
        workflow: "fix-ticket".to_string(),
        file: "workflows/fix.toml".to_string(),
        workflow_hash: "0".repeat(64),
        params: json!({"ticket": "T-1"}),
        status,
        exit: None,
        started_at,
        updated_at: started_at + 72_000,
        dir: format!(".ralph-flow/runs/{id}"),
        options: serde_json::json!({}),
    };
    s.create_run(&run("r1", T0 - 3_600_000, RunStatus::Running))
        .expect("create");
    s.set_status("r1", RunStatus::Finished, Some(("done", 0)))
        .expect("status");
    s.create_run(&run("r2", T0, RunStatus::Waiting))
        .expect("create");
    s.commit(&[
        event("", "", "started", 0, "run started"),
        event("", "plan", "started", 10, "plan started"),
        attempt("", "plan", 1, "ok"),
        Write::Node(node("", "plan", NodeState::Done, 10_000)),
        event("", "plan", "done", 1_000, "plan done"),
        event(
            "attempts#1",
            "implement",
            "started",
            2_000,
            "implement started",
        ),
        attempt("attempts#1", "implement", 1, "failed"),
        attempt("attempts#1", "implement", 2, "ok"),
        Write::Node(node("attempts#1", "implement", NodeState::Done, 20_000)),
        Write::Node(node("attempts#1", "@end", NodeState::Done, 0)),
        // The loop itself: its row shows what its iterations did.
        Write::Node(node("", "attempts", NodeState::Done, 0)),
        event(
            "attempts#1",
            "implement",
            "retry",
            3_000,
            "implement retry 2",
        ),
        Write::Gate(GateRequest {
            run: "r2".to_string(),
            scope: String::new(),
            gate: "approve_spec".to_string(),
            message: "Approve the spec in spec.md?".to_string(),
            show: vec!["spec.md".to_string()],
            requested_at: T0 + 4_000,
            deadline: None,
        }),
        event(
            "",
            "approve_spec",
            "waiting",
            4_000,
            "waiting for approve_spec",
        ),
    ])
    .expect("commit");
}

fn cli(state: &Path, args: &[&str]) -> assert_cmd::assert::Assert {
    Command::cargo_bin("ralph-flow")
        .expect("binary")
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .assert()
}

fn stdout(assert: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(assert.get_output().stdout.clone()).expect("utf-8")
}

fn json_out(assert: &assert_cmd::assert::Assert) -> Value {
    serde_json::from_slice(&assert.get_output().stdout).expect("one JSON document")
}

#[test]
fn runs_lists_newest_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    let out = stdout(&cli(dir.path(), &["runs"]).success());
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("DURATION"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("r2") && lines[1].contains("waiting"),
        "{out}"
    );
    assert!(
        lines[1].contains("2026-01-01T00:00:00Z") && lines[1].contains("1m 12s  "),
        "{out}"
    );
    assert!(
        lines[2].starts_with("r1") && lines[2].contains("done (0)"),
        "{out}"
    );
    assert!(
        lines[2].contains("fix-ticket") && lines[2].contains("finished"),
        "{out}"
    );

    let doc = json_out(&cli(dir.path(), &["runs", "--json", "--limit", "1"]).success());
    let runs = doc.as_array().expect("array");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["id"], "r2");
    assert_eq!(runs[0]["status"], "waiting");
    assert_eq!(runs[0]["duration_ms"], 72_000);
}

#[test]
fn runs_in_an_empty_state_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = stdout(&cli(dir.path(), &["runs"]).success());
    assert!(out.contains("no runs in"), "{out}");
    assert!(
        !dir.path().join("state.db").exists(),
        "reading created no store"
    );
    let doc = json_out(&cli(dir.path(), &["runs", "--json"]).success());
    assert_eq!(doc, json!([]));
}

#[test]
fn status_shows_nodes_gates_and_totals() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    // The newest run by default.
    let out = stdout(&cli(dir.path(), &["status"]).success());
    assert!(
        out.starts_with("run r2: fix-ticket (workflows/fix.toml)"),
        "{out}"
    );
    assert!(out.contains("status: waiting"), "{out}");
    assert!(
        out.contains("top level:") && out.contains("attempts#1:"),
        "{out}"
    );
    let plan = out.lines().find(|l| l.contains("plan")).expect("plan row");
    assert!(
        plan.contains("done") && plan.contains("10000/1000/5000"),
        "{plan}"
    );
    assert!(plan.contains("$0.1000"), "{plan}");
    assert!(!out.contains("@end"), "executor nodes are hidden: {out}");
    assert!(
        out.contains("approve_spec: Approve the spec in spec.md?"),
        "{out}"
    );
    let state = dir.path().display().to_string();
    assert!(
        out.contains(&format!(
            "ralph-flow approve r2 approve_spec --state-dir {state}"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "ralph-flow reject r2 approve_spec --state-dir {state} --comment"
        )),
        "{out}"
    );
    assert!(out.contains("total: 30000/3000/15000"), "{out}");
    assert!(out.contains("cost $0.3000"), "{out}");

    let out = stdout(&cli(dir.path(), &["status", "r1"]).success());
    assert!(
        out.contains("exit done (0)") && out.contains("no settled stages"),
        "{out}"
    );

    let doc = json_out(&cli(dir.path(), &["status", "r2", "--json"]).success());
    assert_eq!(doc["id"], "r2");
    assert_eq!(doc["nodes"].as_array().expect("nodes").len(), 4);
    let attempts = doc["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["node"] == "attempts")
        .expect("the loop's row");
    assert_eq!(attempts["attempts"], 1, "one iteration ran");
    assert_eq!(
        attempts["usage"]["input_tokens"], 20_000,
        "its iteration's usage"
    );
    assert_eq!(doc["pending_gates"][0]["gate"], "approve_spec");
    assert!(
        doc["pending_gates"][0]["approve"]
            .as_str()
            .expect("command")
            .starts_with("ralph-flow approve r2 approve_spec")
    );
    assert_eq!(doc["total"]["input_tokens"], 30_000);
}

#[test]
fn logs_show_events_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    let out = stdout(&cli(dir.path(), &["logs", "r2"]).success());
    let kinds: Vec<&str> = out
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().nth(2).expect("kind"))
        .collect();
    assert_eq!(
        kinds,
        ["started", "started", "done", "started", "retry", "waiting"],
        "{out}"
    );
    // A settled stage's row shows what it used, and the run's total closes the table.
    let done = out
        .lines()
        .find(|l| l.contains(" done "))
        .expect("a done row");
    assert!(done.contains("10000/1000/5000 $0.1000"), "{done}");
    assert!(out.contains("total: 30000/3000/15000"), "{out}");
    assert!(
        out.contains("2026-01-01T00:00:02Z  attempts#1/implement  started"),
        "{out}"
    );

    let out = stdout(&cli(dir.path(), &["logs", "r2", "--stage", "implement"]).success());
    assert!(
        out.contains("implement started") && out.contains("implement retry 2"),
        "{out}"
    );
    assert!(!out.contains("plan"), "{out}");
    assert!(out.contains("attempts:"), "{out}");
    assert!(out.contains(".ralph-flow/runs/r2/implement/1"), "{out}");
    assert!(out.contains(".ralph-flow/runs/r2/implement/2"), "{out}");

    let doc = json_out(&cli(dir.path(), &["logs", "r2", "--stage", "plan", "--json"]).success());
    assert_eq!(doc["run"], "r2");
    assert_eq!(doc["events"].as_array().expect("events").len(), 2);
    assert_eq!(doc["attempts"][0]["dir"], ".ralph-flow/runs/r2/plan/1");
    let doc = json_out(&cli(dir.path(), &["logs", "r2", "--json"]).success());
    assert_eq!(doc["events"].as_array().expect("events").len(), 6);
    assert!(doc.get("attempts").is_none());
}

#[test]
fn unknown_run_is_a_config_error_listing_recent_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    for args in [&["status", "nope"][..], &["logs", "nope"][..]] {
        let assert = cli(dir.path(), args).code(3);
        let err = String::from_utf8(assert.get_output().stderr.clone()).expect("utf-8");
        assert!(err.contains("no run nope in"), "{err}");
        assert!(err.contains("recent runs: r2, r1"), "{err}");
    }
    let empty = tempfile::tempdir().expect("tempdir");
    let assert = cli(empty.path(), &["status"]).code(3);
    let err = String::from_utf8(assert.get_output().stderr.clone()).expect("utf-8");
    assert!(err.contains("there are no runs yet"), "{err}");
}

/// A run whose agent reported no usage for some calls: `status` and `logs` say `unknown`
/// where no call of a stage reported any, a lower bound where some did not, and never 0.
#[test]
fn usage_that_no_call_reported_shows_as_unknown_not_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = SqliteStore::open(&dir.path().join("state.db")).expect("open");
    s.create_run(&RunRecord {
        id: "r3".to_string(),
        workflow: "local".to_string(),
        file: "w.toml".to_string(),
        workflow_hash: "0".repeat(64),
        params: json!({}),
        status: RunStatus::Finished,
        exit: Some(("success".to_string(), 0)),
        started_at: T0,
        updated_at: T0 + 5_000,
        dir: ".ralph-flow/runs/r3".to_string(),
        options: json!({}),
    })
    .expect("create");
    let unknown = Usage {
        unreported: 2,
        ..Usage::default()
    };
    let partial = Usage {
        input_tokens: 100,
        output_tokens: 10,
        cached_tokens: 0,
        cost_usd: None,
        unreported: 1,
    };
    let mut ask = node("", "ask", NodeState::Done, 0);
    ask.run = "r3".to_string();
    ask.usage = unknown;
    let mut mixed = node("", "mixed", NodeState::Done, 0);
    mixed.run = "r3".to_string();
    mixed.usage = partial;
    let attempt = |n: u32| {
        Write::Attempt(AttemptRecord {
            run: "r3".to_string(),
            scope: String::new(),
            node: "ask".to_string(),
            attempt: n,
            state: ralph_flow::store::AttemptState::Ok,
            agent: Some("llama".to_string()),
            dir: format!(".ralph-flow/runs/r3/ask/{n}"),
            error: None,
            usage: Usage::unreported_call(),
            started_at: T0,
            finished_at: Some(T0 + 1_000),
        })
    };
    let settled = |name: &str| {
        Write::Event(Event {
            run: "r3".to_string(),
            at: T0 + 1_000,
            scope: String::new(),
            node: name.to_string(),
            kind: "done".to_string(),
            message: format!("{name} done"),
        })
    };
    s.commit(&[
        attempt(1),
        attempt(2),
        settled("ask"),
        Write::Node(ask),
        settled("mixed"),
        Write::Node(mixed),
    ])
    .expect("commit");
    drop(s);

    let out = stdout(&cli(dir.path(), &["status", "r3"]).success());
    let row = |name: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("a row of {name}: {out}"))
            .to_string()
    };
    assert!(row("ask").contains("unknown"), "{out}");
    assert!(!row("ask").contains("0/0/0"), "{out}");
    assert!(
        row("mixed").contains("≥ 100/10/0 (1 call reported no usage)"),
        "{out}"
    );
    assert!(
        out.contains("total: ≥ 100/10/0 tokens (in/out/cached; 3 calls reported no usage)"),
        "{out}"
    );

    let doc = json_out(&cli(dir.path(), &["status", "r3", "--json"]).success());
    assert_eq!(doc["usage_unknown_calls"], 3, "{doc}");
    assert_eq!(doc["total"]["input_tokens"], 100, "a lower bound: {doc}");
    assert_eq!(doc["total"]["unreported"], 3, "{doc}");
    let ask = &doc["nodes"][0];
    assert_eq!(ask["node"], "ask");
    assert!(ask["usage"]["input_tokens"].is_null(), "{ask}");
    assert!(ask["usage"]["output_tokens"].is_null(), "{ask}");
    assert_eq!(ask["usage"]["unreported"], 2, "{ask}");

    let out = stdout(&cli(dir.path(), &["logs", "r3"]).success());
    let done = out
        .lines()
        .find(|l| l.contains("ask") && l.contains(" done "))
        .expect("ask's row");
    assert!(done.contains("unknown -"), "{done}");
    let out = stdout(&cli(dir.path(), &["logs", "r3", "--stage", "ask"]).success());
    assert!(
        out.contains("total: ≥ 100/10/0 tokens (in/out/cached; 3 calls reported no usage)"),
        "the run's total: {out}"
    );
    let attempts: Vec<&str> = out.lines().filter(|l| l.contains("llama")).collect();
    assert_eq!(attempts.len(), 2, "{out}");
    assert!(attempts.iter().all(|l| l.contains("unknown")), "{out}");
    let doc = json_out(&cli(dir.path(), &["logs", "r3", "--stage", "ask", "--json"]).success());
    assert!(
        doc["attempts"][0]["usage"]["input_tokens"].is_null(),
        "{doc}"
    );
    assert_eq!(doc["attempts"][0]["usage"]["unreported"], 1, "{doc}");
}

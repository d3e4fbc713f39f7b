//! The stores: round trips, group commits, locks, gates and history, each test run against
//! the SQLite store and against the PostgreSQL store on a real server (tests/pg); then what
//! only the SQLite store does (spilling large outputs to files, its file and schema).

use std::path::Path;

use ralph_flow::backend::Usage;
use ralph_flow::store::postgres::PgStore;
use ralph_flow::store::sqlite::{Durability, SPILL_BYTES, SqliteStore};
use ralph_flow::store::{
    Approval, AttemptRecord, Event, GateRequest, LockOwner, NodeRecord, NodeState, RunRecord,
    RunStatus, Store, Write,
};
use serde_json::json;

mod pg;

fn store(dir: &Path) -> SqliteStore {
    SqliteStore::open(&dir.join("state.db")).expect("open store")
}

/// A store to test: how to open it (twice, as two processes would) and how to make it
/// refuse a write.
trait Db {
    fn open(&self) -> Box<dyn Store>;
    fn open_second(&self) -> Box<dyn Store>;
    /// Makes the store refuse events of kind `boom` from now on ("boom refused").
    fn refuse_boom_events(&self);
}

struct Sqlite(tempfile::TempDir);

impl Db for Sqlite {
    fn open(&self) -> Box<dyn Store> {
        Box::new(store(self.0.path()))
    }
    fn open_second(&self) -> Box<dyn Store> {
        Box::new(
            SqliteStore::open_with(&self.0.path().join("state.db"), Durability::Full)
                .expect("open"),
        )
    }
    fn refuse_boom_events(&self) {
        rusqlite::Connection::open(self.0.path().join("state.db"))
            .expect("open")
            .execute_batch(
                "CREATE TRIGGER no_boom BEFORE INSERT ON events WHEN NEW.kind = 'boom' \
                 BEGIN SELECT RAISE(ABORT, 'boom refused'); END;",
            )
            .expect("trigger");
    }
}

struct Postgres(String);

impl Db for Postgres {
    fn open(&self) -> Box<dyn Store> {
        Box::new(PgStore::connect(&self.0).expect("connect"))
    }
    fn open_second(&self) -> Box<dyn Store> {
        self.open()
    }
    fn refuse_boom_events(&self) {
        postgres::Client::connect(&self.0, postgres::NoTls)
            .expect("connect")
            .batch_execute(
                "CREATE FUNCTION no_boom() RETURNS trigger AS $$ BEGIN \
                 IF NEW.kind = 'boom' THEN RAISE EXCEPTION 'boom refused'; END IF; \
                 RETURN NEW; END $$ LANGUAGE plpgsql; \
                 CREATE TRIGGER no_boom BEFORE INSERT ON events \
                 FOR EACH ROW EXECUTE FUNCTION no_boom();",
            )
            .expect("trigger");
    }
}

fn pending_named(s: &dyn Store, gate: &str) -> usize {
    s.pending_gates("r")
        .expect("gates")
        .iter()
        .filter(|g| g.gate == gate)
        .count()
}

/// Each test, once per store.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[test]
                fn $name() {
                    super::$name(&super::Sqlite(tempfile::tempdir().expect("tempdir")));
                }
            )*
        }
        mod on_postgres {
            $(
                #[test]
                fn $name() {
                    let Some(url) = super::pg::database() else {
                        return;
                    };
                    super::$name(&super::Postgres(url));
                }
            )*
        }
    };
}

on_both_stores!(
    events_of_two_writers_interleave_in_order,
    outputs_are_read_back_by_key,
    settlement_events_read_back_in_order,
    runs_round_trip_newest_first,
    records_round_trip,
    events_filter_by_stage_in_order,
    group_commit_is_atomic,
    lock_conflict_with_a_live_process,
    stale_lock_is_taken_over,
    lock_is_reentrant_and_unlock_releases,
    a_live_lease_holds_against_every_host,
    an_expired_lease_is_taken_over_from_any_host,
    two_tenures_of_one_process_are_fenced_from_each_other,
    answering_a_gate,
    history_across_runs_newest_first,
    two_connections_see_each_others_writes,
    unreported_usage_round_trips,
    a_cancelled_run_stays_cancelled_and_its_gates_are_withdrawn,
);

/// `Store::cancel`: the status, who and why, and the gates withdrawn, at once; a cancelled
/// run's status is kept whatever is written after (an executor that has not noticed); a
/// finished or cancelled run, and no run, are refused.
fn a_cancelled_run_stays_cancelled_and_its_gates_are_withdrawn(db: &dyn Db) {
    let mut s = db.open();
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    s.commit(&[Write::Gate(gate("r", "", "approve_spec"))])
        .expect("gate");
    let c = ralph_flow::store::Cancellation {
        by: "alice".into(),
        at: 7_000,
        reason: Some("wrong spec".into()),
    };
    assert_eq!(s.cancel("r", &c).expect("cancel"), RunStatus::Running);
    assert!(s.pending_gates("r").expect("gates").is_empty());
    let run = s.run("r").expect("read").expect("run");
    assert_eq!(run.status, RunStatus::Cancelled);
    assert_eq!(run.cancellation(), Some(c.clone()));
    s.set_status("r", RunStatus::Interrupted, None)
        .expect("kept, not refused");
    s.set_status("r", RunStatus::Finished, Some(("success", 0)))
        .expect("kept, not refused");
    let run = s.run("r").expect("read").expect("run");
    assert_eq!(run.status, RunStatus::Cancelled);
    assert_eq!(run.exit, None);
    let again = s.cancel("r", &c).expect_err("cancelled already");
    assert!(
        again.to_string().contains("was cancelled already by alice"),
        "{again}"
    );
    s.create_run(&run_record("f", "fix", 2)).expect("create");
    s.set_status("f", RunStatus::Finished, Some(("success", 0)))
        .expect("finish");
    let done = s.cancel("f", &c).expect_err("finished");
    assert!(
        done.to_string()
            .contains("has already finished with `success` (0)"),
        "{done}"
    );
    assert!(s.cancel("nope", &c).is_err());
    assert!(s.set_status("nope", RunStatus::Running, None).is_err());
}

fn run_record(id: &str, workflow: &str, started_at: i64) -> RunRecord {
    RunRecord {
        id: id.to_string(),
        workflow: workflow.to_string(),
        file: "flow.toml".to_string(),
        workflow_hash: "abc123".to_string(),
        params: json!({"max_attempts": 3, "ticket": "T-1"}),
        status: RunStatus::Running,
        exit: None,
        started_at,
        updated_at: started_at,
        dir: format!(".ralph-flow/runs/{id}"),
        options: serde_json::json!({}),
    }
}

fn usage(n: u64) -> Usage {
    Usage {
        input_tokens: n,
        output_tokens: n / 2,
        cached_tokens: n / 4,
        cost_usd: Some(n as f64 / 1000.0),
        unreported: 0,
    }
}

fn node(run: &str, scope: &str, name: &str, output: serde_json::Value) -> NodeRecord {
    NodeRecord {
        run: run.to_string(),
        scope: scope.to_string(),
        node: name.to_string(),
        state: NodeState::Done,
        output,
        action: Some("continue".to_string()),
        feedback: Some("fix the tests".to_string()),
        attempts: 2,
        usage: usage(1200),
        started_at: 1_000,
        finished_at: 2_000,
    }
}

fn attempt(run: &str, scope: &str, name: &str, n: u32) -> AttemptRecord {
    AttemptRecord {
        run: run.to_string(),
        scope: scope.to_string(),
        node: name.to_string(),
        attempt: n,
        state: ralph_flow::store::AttemptState::Running,
        agent: Some("claude".to_string()),
        dir: format!("runs/r/{name}/{n}"),
        error: None,
        usage: Usage::default(),
        started_at: 1_000,
        finished_at: None,
    }
}

fn event(run: &str, name: &str, kind: &str, at: i64) -> Event {
    Event {
        run: run.to_string(),
        at,
        scope: String::new(),
        node: name.to_string(),
        kind: kind.to_string(),
        message: format!("{name} {kind}"),
    }
}

/// A stage's settlement as the executor writes it: its event, then its node, settled at the
/// event's time (the SQLite store keeps the two in one row).
fn settlement(scope: &str, name: &str, state: NodeState, at: i64, message: &str) -> [Write; 2] {
    let mut n = node("r", scope, name, json!(at));
    n.state = state;
    n.finished_at = at;
    let e = Event {
        run: "r".to_string(),
        at,
        scope: scope.to_string(),
        node: name.to_string(),
        kind: state.as_str().to_string(),
        message: message.to_string(),
    };
    [Write::Event(e), Write::Node(n)]
}

/// (time, scope, stage, kind, message) of a run's events, in order.
fn event_rows(s: &dyn Store, node: Option<&str>) -> Vec<(i64, String, String, String, String)> {
    s.events("r", node)
        .expect("events")
        .into_iter()
        .map(|e| (e.at, e.scope, e.node, e.kind, e.message))
        .collect()
}

fn gate(run: &str, scope: &str, name: &str) -> GateRequest {
    GateRequest {
        run: run.to_string(),
        scope: scope.to_string(),
        gate: name.to_string(),
        message: "Approve the spec?".to_string(),
        show: vec!["spec.md".to_string()],
        requested_at: 5_000,
        deadline: Some(9_000),
    }
}

fn approval(run: &str, scope: &str, name: &str, approved: bool) -> Approval {
    Approval {
        run: run.to_string(),
        scope: scope.to_string(),
        gate: name.to_string(),
        approved,
        comment: Some("looks good".to_string()),
        by: "alice".to_string(),
        at: 6_000,
    }
}

fn owner(pid: u32) -> LockOwner {
    LockOwner {
        pid,
        host: "test-host".to_string(),
        since: 1_700_000_000_000,
        holder: String::new(),
        expires: None,
        ..LockOwner::default()
    }
}

/// A holder with a lease from `since` (ms from now) to `until` (ms from now), on a host of
/// its own.
fn leased(holder: &str, since: i64, until: i64) -> LockOwner {
    let now = ralph_flow::store::now_ms();
    LockOwner {
        pid: std::process::id(),
        host: format!("{holder}-host"),
        since: now + since,
        holder: holder.to_string(),
        expires: Some(now + until),
        ..LockOwner::default()
    }
}

fn runs_round_trip_newest_first(db: &dyn Db) {
    let mut s = db.open();
    let first = run_record("r1", "fix", 1_000);
    let second = run_record("r2", "fix", 2_000);
    s.create_run(&first).expect("create");
    s.create_run(&second).expect("create");
    assert_eq!(s.run("r1").expect("read"), Some(first.clone()));
    assert_eq!(s.run("nope").expect("read"), None);
    let ids: Vec<String> = s
        .runs(10)
        .expect("runs")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["r2", "r1"]);
    assert_eq!(s.runs(1).expect("runs").len(), 1);

    let err = s.create_run(&first).expect_err("duplicate");
    assert!(err.to_string().contains("run r1 already exists"), "{err}");
    // Told apart from other refusals, so that a new run draws another id.
    assert!(
        matches!(&err, ralph_flow::store::StoreError::RunExists(id) if id == "r1"),
        "{err:?}"
    );

    s.set_status("r1", RunStatus::Finished, Some(("done", 0)))
        .expect("status");
    let r1 = s.run("r1").expect("read").expect("present");
    assert_eq!(r1.status, RunStatus::Finished);
    assert_eq!(r1.exit, Some(("done".to_string(), 0)));
    assert!(r1.updated_at > first.updated_at);
    assert!(s.set_status("nope", RunStatus::Waiting, None).is_err());
}

fn records_round_trip(db: &dyn Db) {
    let mut s = db.open();
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    let n1 = node("r", "", "plan", json!({"steps": ["a", "b"], "ok": true}));
    let mut n2 = node("r", "attempts#1", "implement", json!("text"));
    n2.state = NodeState::TimedOut;
    n2.action = None;
    n2.feedback = None;
    n2.usage.cost_usd = None;
    let mut skipped = node("r", "attempts#1", "@end", serde_json::Value::Null);
    skipped.state = NodeState::Skipped;
    let a1 = attempt("r", "", "plan", 1);
    let ev = event("r", "plan", "done", 10);
    let g = gate("r", "", "approve_spec");
    s.commit(&[
        Write::Node(n1.clone()),
        Write::Node(n2.clone()),
        Write::Node(skipped.clone()),
        Write::Attempt(a1.clone()),
        Write::Event(ev.clone()),
        Write::Gate(g.clone()),
    ])
    .expect("commit");

    assert_eq!(s.nodes("r").expect("nodes"), [n1.clone(), n2, skipped]);
    assert_eq!(
        s.attempts("r", None).expect("attempts"),
        std::slice::from_ref(&a1)
    );
    assert_eq!(s.events("r", None).expect("events"), [ev]);
    assert_eq!(s.pending_gates("r").expect("gates"), [g]);

    // An attempt is updated in place when it ends and keeps its place.
    let a2 = attempt("r", "", "review", 1);
    let mut a1_end = a1;
    a1_end.state = ralph_flow::store::AttemptState::Ok;
    a1_end.usage = usage(500);
    a1_end.finished_at = Some(3_000);
    a1_end.error = Some("none".to_string());
    s.commit(&[Write::Attempt(a2.clone()), Write::Attempt(a1_end.clone())])
        .expect("commit");
    assert_eq!(
        s.attempts("r", None).expect("attempts"),
        [a1_end.clone(), a2.clone()]
    );
    assert_eq!(s.attempts("r", Some("review")).expect("attempts"), [a2]);

    // A re-settled node replaces the old record.
    let mut again = n1;
    again.output = json!({"steps": []});
    s.commit(&[Write::Node(again.clone())]).expect("commit");
    let nodes = s.nodes("r").expect("nodes");
    assert_eq!(nodes.len(), 3);
    assert_eq!(nodes.last(), Some(&again));

    // Approvals written by the executor (a timeout) end the wait.
    let mut timeout = approval("r", "", "approve_spec", false);
    timeout.by = "timeout".to_string();
    timeout.comment = None;
    s.commit(&[Write::Approval(timeout.clone())])
        .expect("commit");
    assert_eq!(
        s.approval("r", "", "approve_spec").expect("approval"),
        Some(timeout)
    );
    assert!(s.pending_gates("r").expect("gates").is_empty());
    assert_eq!(s.approval("r", "", "other").expect("approval"), None);
}

/// The calls that reported no usage are kept with a node's and an attempt's usage, apart
/// from the counts (0 of them is "all reported", not "none reported"), and read back as
/// written, through every read.
fn unreported_usage_round_trips(db: &dyn Db) {
    let mut s = db.open();
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    let mut unknown = node("r", "", "ask", json!({"text": "hi"}));
    unknown.usage = Usage {
        unreported: 2,
        ..Usage::default()
    };
    let mut partial = node("r", "loop#1", "ask", json!("x"));
    partial.usage.unreported = 1;
    let mut a = attempt("r", "", "ask", 1);
    a.state = ralph_flow::store::AttemptState::Ok;
    a.usage = Usage::unreported_call();
    a.finished_at = Some(2_000);
    s.commit(&[
        Write::Attempt(a.clone()),
        Write::Node(unknown.clone()),
        Write::Node(partial.clone()),
    ])
    .expect("commit");
    let nodes = s.nodes("r").expect("nodes");
    assert_eq!(nodes, [unknown.clone(), partial.clone()]);
    assert!(nodes[0].usage.is_unknown());
    assert!(!nodes[1].usage.is_unknown() && nodes[1].usage.unreported == 1);
    assert_eq!(s.attempts("r", Some("ask")).expect("attempts"), [a.clone()]);
    let mut streamed = Vec::new();
    s.each_node("r", &mut |n| streamed.push(n)).expect("each");
    assert_eq!(streamed, [unknown.clone(), partial]);
    s.create_run(&run_record("r2", "fix", 2)).expect("create");
    let history = s.history("fix", "ask", "r2", 1).expect("history");
    assert_eq!(history[0].1.usage.unreported, 1, "{history:?}");

    // Settled again with every call reported: 0 again. And an attempt still running, its
    // count read back by the read of running attempts too.
    let mut again = unknown;
    again.usage = usage(10);
    let mut running = a;
    running.attempt = 2;
    running.state = ralph_flow::store::AttemptState::Running;
    running.usage = Usage::unreported_call();
    running.finished_at = None;
    s.commit(&[Write::Node(again.clone()), Write::Attempt(running.clone())])
        .expect("commit");
    assert_eq!(s.nodes("r").expect("nodes").last(), Some(&again));
    assert_eq!(s.running_attempts("r").expect("running"), [running.clone()]);
    assert_eq!(s.attempts("r", Some("ask")).expect("attempts")[1], running);
}

fn events_filter_by_stage_in_order(db: &dyn Db) {
    let mut s = db.open();
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    for (i, name) in ["plan", "code", "plan", "code", "plan"].iter().enumerate() {
        s.commit(&[Write::Event(event("r", name, "started", i as i64))])
            .expect("commit");
    }
    let plan: Vec<i64> = s
        .events("r", Some("plan"))
        .expect("events")
        .iter()
        .map(|e| e.at)
        .collect();
    assert_eq!(plan, [0, 2, 4]);
    assert_eq!(s.events("r", None).expect("events").len(), 5);
    assert!(s.events("other", None).expect("events").is_empty());
}

/// Settlement events read back like any other, in the order written, with their time, kind
/// and message. A stage settled again keeps the event of its earlier settlement; an event
/// that is not its node's settlement (another kind, another time) stays an event of its own.
fn settlement_events_read_back_in_order(db: &dyn Db) {
    let mut s = db.open();
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    let mut first = vec![Write::Event(event("r", "a", "started", 10))];
    first.extend(settlement("", "a", NodeState::Done, 11, ""));
    s.commit(&first).expect("commit");
    s.commit(&settlement(
        "l#1",
        "b",
        NodeState::Failed,
        12,
        "tests failed",
    ))
    .expect("commit");
    let mut c = node("r", "", "c", json!(13));
    c.finished_at = 13;
    s.commit(&[Write::Event(event("r", "c", "retry", 13)), Write::Node(c)])
        .expect("commit");
    let [Write::Event(mut late), d] = settlement("", "d", NodeState::Done, 14, "") else {
        unreachable!("a settlement is an event and a node")
    };
    late.at = 15;
    s.commit(&[Write::Event(late), d]).expect("commit");
    s.commit(&settlement("", "a", NodeState::Skipped, 16, "then stop"))
        .expect("commit");
    let row = |at, scope: &str, node: &str, kind: &str, message: &str| {
        (at, scope.into(), node.into(), kind.into(), message.into())
    };
    let expected = vec![
        row(10, "", "a", "started", "a started"),
        row(11, "", "a", "done", ""),
        row(12, "l#1", "b", "failed", "tests failed"),
        row(13, "", "c", "retry", "c retry"),
        row(15, "", "d", "done", ""),
        row(16, "", "a", "skipped", "then stop"),
    ];
    let second = db.open_second();
    for reader in [&*s, &*second] {
        assert_eq!(event_rows(reader, None), expected);
        let of_a: Vec<String> = event_rows(reader, Some("a"))
            .into_iter()
            .map(|(_, _, _, kind, _)| kind)
            .collect();
        assert_eq!(of_a, ["started", "done", "skipped"]);
    }
    // The nodes are the latest settlements, in the order written.
    let nodes: Vec<(String, NodeState, i64)> = s
        .nodes("r")
        .expect("nodes")
        .into_iter()
        .map(|n| (n.node, n.state, n.finished_at))
        .collect();
    assert_eq!(
        nodes,
        [
            ("b".to_string(), NodeState::Failed, 12),
            ("c".to_string(), NodeState::Done, 13),
            ("d".to_string(), NodeState::Done, 14),
            ("a".to_string(), NodeState::Skipped, 16),
        ]
    );
}

/// A node's output found by its key, as an executor reads back the long outputs it does
/// not keep in memory: the latest settlement's, from another connection too.
fn outputs_are_read_back_by_key(db: &dyn Db) {
    let mut s = db.open();
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    let long = json!({"text": "x".repeat(5000)});
    s.commit(&[
        Write::Node(node("r", "loop#2", "a", json!("first"))),
        Write::Node(node("r", "", "a", json!(1))),
    ])
    .expect("commit");
    s.commit(&[Write::Node(node("r", "loop#2", "a", long.clone()))])
        .expect("commit");
    let other = db.open_second();
    for reader in [&*s, &*other] {
        assert_eq!(
            reader.output("r", "loop#2", "a").expect("read"),
            Some(long.clone())
        );
        assert_eq!(reader.output("r", "", "a").expect("read"), Some(json!(1)));
        assert_eq!(reader.output("r", "", "b").expect("read"), None);
        assert_eq!(reader.output("other", "loop#2", "a").expect("read"), None);
    }
}

fn group_commit_is_atomic(db: &dyn Db) {
    let mut s = db.open();
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    let writes: Vec<Write> = (0..8)
        .flat_map(|i| {
            let name = format!("s{i}");
            [
                Write::Node(node("r", "", &name, json!({"i": i}))),
                Write::Event(event("r", &name, "done", i)),
            ]
        })
        .collect();
    s.commit(&writes).expect("commit");
    assert_eq!(s.nodes("r").expect("nodes").len(), 8);
    assert_eq!(s.events("r", None).expect("events").len(), 8);

    // A write that fails inside the transaction rolls back the ones before it. Another
    // connection adds a trigger that refuses one kind of event.
    db.refuse_boom_events();
    let failing = vec![
        Write::Node(node("r", "", "c", json!(3))),
        Write::Attempt(attempt("r", "", "c", 1)),
        Write::Event(event("r", "c", "boom", 2)),
    ];
    let err = s.commit(&failing).expect_err("the trigger refuses");
    let err = ralph_flow::diag::error_chain(&err);
    assert!(err.contains("boom refused"), "{err}");
    assert_eq!(s.nodes("r").expect("nodes").len(), 8);
    assert!(s.attempts("r", Some("c")).expect("attempts").is_empty());
    assert_eq!(s.events("r", None).expect("events").len(), 8);

    // The store still works after a failed group.
    s.commit(&[Write::Event(event("r", "c", "started", 3))])
        .expect("commit");
    assert_eq!(s.events("r", None).expect("events").len(), 9);
}

#[test]
fn large_outputs_spill_to_files_and_load_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = store(dir.path());
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    let big = json!({"diff": "x".repeat(1024 * 1024), "files": ["a.rs", "b.rs"]});
    let small = json!({"text": "y".repeat(SPILL_BYTES - 100)});
    s.commit(&[
        Write::Node(node("r", "", "big", big.clone())),
        Write::Node(node("r", "", "small", small.clone())),
    ])
    .expect("commit");

    let blobs: Vec<_> = std::fs::read_dir(dir.path().join("blobs"))
        .expect("blobs dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    assert_eq!(blobs.len(), 1, "{blobs:?}");
    assert!(
        blobs[0].ends_with(".json") && blobs[0].len() == 64 + 5,
        "{blobs:?}"
    );
    let db_size = std::fs::metadata(dir.path().join("state.db"))
        .expect("db")
        .len()
        + std::fs::metadata(dir.path().join("state.db-wal"))
            .map(|m| m.len())
            .unwrap_or(0);
    assert!(
        db_size < 512 * 1024,
        "the big output stayed out of the db: {db_size}"
    );

    let nodes = s.nodes("r").expect("nodes");
    assert_eq!(nodes[0].output, big);
    assert_eq!(nodes[1].output, small);
    // Another connection reads it back too, and history loads it.
    let other = store(dir.path());
    assert_eq!(other.nodes("r").expect("nodes")[0].output, big);
    assert_eq!(
        other.output("r", "", "big").expect("output"),
        Some(big.clone())
    );
    assert_eq!(
        other.history("fix", "big", "", 1).expect("history")[0]
            .1
            .output,
        big
    );

    // The same output again reuses the file.
    s.commit(&[Write::Node(node("r", "#2", "big", big))])
        .expect("commit");
    assert_eq!(
        std::fs::read_dir(dir.path().join("blobs"))
            .expect("blobs dir")
            .count(),
        1
    );
}

fn lock_conflict_with_a_live_process(db: &dyn Db) {
    let mut s = db.open();
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    let parent = std::os::unix::process::parent_id();
    s.lock("r", &owner(parent)).expect("first lock");
    let err = s
        .lock("r", &owner(std::process::id()))
        .expect_err("held by a live process");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "run r is held by pid {parent} on test-host since 2023-11-14T22:13:20Z"
        )),
        "{msg}"
    );
    assert!(
        msg.ends_with(&format!(
            "for as long as that process lives (a lock without a lease, from an older \
             ralph-flow); stop it (`kill {parent}` on test-host) and try again"
        )),
        "{msg}"
    );
    assert_eq!(s.lock_holder("r").expect("holder"), Some(owner(parent)));

    // Unlocking with another pid leaves the holder's row.
    s.unlock("r", &owner(std::process::id())).expect("unlock");
    assert_eq!(s.lock_holder("r").expect("holder"), Some(owner(parent)));

    // A holder on another host cannot be checked: it holds.
    let mut elsewhere = owner(std::process::id());
    elsewhere.host = "other-host".to_string();
    s.lock("r2", &elsewhere).expect("lock r2");
    let err = s
        .lock("r2", &owner(std::process::id()))
        .expect_err("other host");
    assert!(err.to_string().contains("on other-host"), "{err}");
}

fn stale_lock_is_taken_over(db: &dyn Db) {
    let mut s = db.open();
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let dead = child.id();
    child.wait().expect("wait");
    s.lock("r", &owner(dead))
        .expect("lock for the dead process");
    let me = owner(std::process::id());
    s.lock("r", &me).expect("take over a stale lock");
    assert_eq!(s.lock_holder("r").expect("holder"), Some(me));
}

fn lock_is_reentrant_and_unlock_releases(db: &dyn Db) {
    let mut s = db.open();
    let me = owner(std::process::id());
    s.lock("r", &me).expect("lock");
    s.lock("r", &me).expect("lock again");
    s.unlock("r", &me).expect("unlock");
    assert_eq!(s.lock_holder("r").expect("holder"), None);
    // Once released, a live other process may take it.
    let parent = owner(std::os::unix::process::parent_id());
    s.lock("r", &parent).expect("lock by another");
}

fn a_live_lease_holds_against_every_host(db: &dyn Db) {
    let mut a = db.open();
    let mut b = db.open_second();
    let ana = leased("ana", 0, 60_000);
    a.lock("r", &ana).expect("lock with a lease");
    // Another holder waits: on another host, or on the holder's host while its process
    // lives.
    let err = b
        .lock("r", &leased("bob", 0, 60_000))
        .expect_err("live lease");
    let msg = err.to_string();
    assert!(msg.contains("on ana-host"), "{msg}");
    assert!(msg.contains("its lease runs until"), "{msg}");
    let mut same_host = leased("bob", 0, 60_000);
    same_host.host = "ana-host".into();
    b.lock("r", &same_host)
        .expect_err("same host, live process, live lease");
    // A holder provably gone (its pid free, on this boot and in this PID namespace) has its
    // live lease taken over at once (`kill -9`, then `resume` on the same machine); one
    // whose identity is unknown (a lock of an older ralph-flow) holds until its lease ends.
    let mut child = std::process::Command::new("true").spawn().expect("spawn");
    let dead = child.id();
    child.wait().expect("wait");
    let mut unknown = leased("unknown", 0, 60_000);
    unknown.pid = dead;
    a.lock("r2", &unknown).expect("lock r2");
    let mut here = leased("here", 0, 60_000);
    here.host = unknown.host.clone();
    b.lock("r2", &here)
        .expect_err("an unknown holder's live lease holds");
    let mut gone =
        ralph_flow::store::current_owner().with_lease(std::time::Duration::from_secs(60));
    gone.pid = dead;
    a.lock("r3", &gone).expect("lock r3");
    let kept = a.lock_holder("r3").expect("read").expect("held");
    assert_eq!(kept.identity(), gone.identity(), "who the holder is, kept");
    assert!(kept.identity().is_some());
    b.lock("r3", &here).expect("a holder provably gone");
    // The holder renews it: the expiry moves on.
    let before = a.lock_holder("r").expect("read").expect("held").expires;
    std::thread::sleep(std::time::Duration::from_millis(20));
    a.renew("r", &ana).expect("renew");
    let after = b.lock_holder("r").expect("read").expect("held");
    assert_eq!(after.holder, "ana");
    assert!(after.expires > before, "{before:?} -> {:?}", after.expires);
    // Its own lock again is fine; releasing it frees the run for anyone.
    a.lock("r", &ana).expect("reentrant");
    b.unlock("r", &leased("bob", 0, 1))
        .expect("unlock by another: no effect");
    assert!(a.lock_holder("r").expect("read").is_some());
    a.unlock("r", &ana).expect("unlock");
    assert_eq!(a.lock_holder("r").expect("read"), None);
    b.lock("r", &leased("bob", 0, 60_000)).expect("free now");
}

fn an_expired_lease_is_taken_over_from_any_host(db: &dyn Db) {
    let mut a = db.open();
    let mut b = db.open_second();
    // A short lease that its holder does not renew.
    let ana = leased("ana", 0, 200);
    a.lock("r", &ana).expect("lock");
    b.lock("r", &leased("bob", 0, 60_000))
        .expect_err("not expired yet");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Its process lives (it is this one), on this host too: that keeps nothing past the
    // lease.
    let mut bob = leased("bob", 0, 60_000);
    bob.host = ana.host.clone();
    b.lock("r", &bob)
        .expect("take over an expired lease, its holder alive");
    assert_eq!(
        a.lock_holder("r").expect("read").expect("held").holder,
        "bob"
    );
    // The old holder's heartbeat learns it, and its unlock leaves the new holder's lock.
    let err = a.renew("r", &ana).expect_err("lost");
    assert!(
        matches!(err, ralph_flow::store::StoreError::LeaseLost { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains(&format!("pid {} on ana-host holds it now", bob.pid)),
        "{err}"
    );
    a.unlock("r", &ana).expect("unlock");
    assert_eq!(
        b.lock_holder("r").expect("read").expect("held").holder,
        "bob"
    );
    b.renew("r", &bob).expect("the new holder renews");
}

/// Two coordinators in one process (a worker that takes back a run it lost) are two tenures:
/// once the second took the run over, every write of the first is refused (a commit, a
/// status change, a renewal), nothing of it is applied, and a lapsed lease is lost even
/// before anyone takes it.
fn two_tenures_of_one_process_are_fenced_from_each_other(db: &dyn Db) {
    use ralph_flow::store::{StoreError, current_owner};
    use std::time::Duration;
    let mut first = db.open();
    first
        .create_run(&run_record("r", "fix", 1))
        .expect("create");
    let t1 = current_owner().with_lease(Duration::from_millis(300));
    first.lock("r", &t1).expect("lock");
    first
        .commit(&[Write::Event(event("r", "a", "started", 1))])
        .expect("a fenced commit while the lease holds");
    std::thread::sleep(Duration::from_millis(400));
    // The lease lapsed, and nobody took it yet: the first tenure's writes are refused all
    // the same (any worker may take the run from now on).
    let err = first
        .commit(&[Write::Event(event("r", "a", "late", 2))])
        .expect_err("a lapsed lease fences");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    assert!(err.to_string().contains("its lease ended at"), "{err}");
    let mut second = db.open_second();
    let t2 = current_owner().with_lease(Duration::from_secs(60));
    assert_eq!((t1.pid, &t1.host), (t2.pid, &t2.host), "one process");
    assert_ne!(t1.holder, t2.holder, "two tenures");
    second
        .lock("r", &t2)
        .expect("the second tenure takes the run over");
    let err = first
        .commit(&[
            Write::Node(node("r", "", "a", json!({"x": 1}))),
            Write::Event(event("r", "a", "failed", 3)),
        ])
        .expect_err("the old tenure is fenced");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains(&format!("pid {} on {} holds it now", t2.pid, t2.host)),
        "{err}"
    );
    let err = first
        .set_status("r", RunStatus::Interrupted, None)
        .expect_err("the old tenure's status change is fenced");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    let err = first.renew("r", &t1).expect_err("and its renewal");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    // A gate's timeout answered by the old tenure: refused too; the new one answers.
    second
        .commit(&[Write::Gate(gate("r", "", "approve_spec"))])
        .expect("a gate waits");
    let err = first
        .answer(&approval("r", "", "approve_spec", false))
        .expect_err("the old tenure's answer is fenced");
    assert!(matches!(err, StoreError::LeaseLost { .. }), "{err:?}");
    assert_eq!(pending_named(second.as_ref(), "approve_spec"), 1);
    second
        .answer(&approval("r", "", "approve_spec", true))
        .expect("the new tenure answers");
    // Nothing of the refused writes is there; the new tenure writes and finishes the run,
    // whose status the old one cannot turn back.
    assert!(second.nodes("r").expect("nodes").is_empty());
    assert_eq!(second.events("r", None).expect("events").len(), 1);
    second
        .commit(&[Write::Node(node("r", "", "a", json!({"x": 2})))])
        .expect("the new tenure commits");
    second
        .set_status("r", RunStatus::Finished, Some(("success", 0)))
        .expect("status");
    first
        .set_status("r", RunStatus::Interrupted, None)
        .expect_err("a finished run stays finished");
    let run = second.run("r").expect("run").expect("r");
    assert_eq!(run.status, RunStatus::Finished);
    assert_eq!(second.nodes("r").expect("nodes")[0].output, json!({"x": 2}));
    first.unlock("r", &t1).expect("unlock: no effect");
    assert_eq!(
        second.lock_holder("r").expect("read").expect("held").holder,
        t2.holder
    );
}

fn answering_a_gate(db: &dyn Db) {
    let mut s = db.open();
    s.create_run(&run_record("r", "fix", 1)).expect("create");

    let err = s
        .answer(&approval("r", "", "approve_spec", true))
        .expect_err("nothing pending");
    assert!(
        err.to_string().contains("not waiting for an answer"),
        "{err}"
    );
    let err = s
        .answer(&approval("nope", "", "approve_spec", true))
        .expect_err("no run");
    assert!(err.to_string().contains("no run nope"), "{err}");

    s.commit(&[
        Write::Gate(gate("r", "attempts#2", "approve_spec")),
        Write::Gate(gate("r", "", "deploy")),
    ])
    .expect("commit");
    let err = s
        .answer(&approval("r", "", "merge", true))
        .expect_err("not pending");
    let msg = err.to_string();
    assert!(
        msg.contains("gate merge of run r is not waiting for an answer")
            && msg.contains("approve_spec (scope attempts#2)")
            && msg.contains("deploy (top level)"),
        "{msg}"
    );
    let err = s
        .answer(&approval("r", "attempts#1", "approve_spec", true))
        .expect_err("wrong scope");
    assert!(err.to_string().contains("in scope attempts#1"), "{err}");

    assert_eq!(pending_named(&*s, "approve_spec"), 1);
    // An empty scope finds the single pending gate of that name.
    s.answer(&approval("r", "", "approve_spec", true))
        .expect("answer");
    let answer = s
        .approval("r", "attempts#2", "approve_spec")
        .expect("approval")
        .expect("answered");
    assert!(answer.approved);
    assert_eq!(answer.scope, "attempts#2");
    assert_eq!(
        s.pending_gates("r").expect("gates"),
        [gate("r", "", "deploy")]
    );
    assert!(s.answer(&approval("r", "", "approve_spec", false)).is_err());

    // Two scopes waiting on the same gate name: the scope must be given.
    s.commit(&[
        Write::Gate(gate("r", "t#1", "review")),
        Write::Gate(gate("r", "t#2", "review")),
    ])
    .expect("commit");
    let err = s
        .answer(&approval("r", "", "review", true))
        .expect_err("ambiguous");
    assert!(err.to_string().contains("scope t#1, scope t#2"), "{err}");
    s.answer(&approval("r", "t#2", "review", false))
        .expect("answer");
    assert_eq!(pending_named(&*s, "review"), 1);
}

fn history_across_runs_newest_first(db: &dyn Db) {
    let mut s = db.open();
    for (i, id) in ["r1", "r2", "r3"].iter().enumerate() {
        s.create_run(&run_record(id, "fix", i as i64 * 100))
            .expect("create");
        s.commit(&[Write::Node(node(id, "", "review", json!({"run": id})))])
            .expect("commit");
    }
    s.create_run(&run_record("o1", "other", 1_000))
        .expect("create");
    s.commit(&[Write::Node(node("o1", "", "review", json!({"run": "o1"})))])
        .expect("commit");
    s.commit(&[Write::Node(node(
        "r3",
        "loop#2",
        "review",
        json!({"run": "r3b"}),
    ))])
    .expect("commit");

    let history = s.history("fix", "review", "", 10).expect("history");
    let got: Vec<(&str, serde_json::Value)> = history
        .iter()
        .map(|(run, n)| (run.as_str(), n.output.clone()))
        .collect();
    assert_eq!(
        got,
        [
            ("r3", json!({"run": "r3b"})),
            ("r3", json!({"run": "r3"})),
            ("r2", json!({"run": "r2"})),
            ("r1", json!({"run": "r1"})),
        ]
    );
    assert_eq!(s.history("fix", "review", "", 2).expect("history").len(), 2);
    assert!(
        s.history("fix", "plan", "", 10)
            .expect("history")
            .is_empty()
    );
    // The current run is left out, however many records it has.
    let earlier: Vec<String> = s
        .history("fix", "review", "r3", 2)
        .expect("history")
        .into_iter()
        .map(|(run, _)| run)
        .collect();
    assert_eq!(earlier, ["r2", "r1"]);
}

/// The executor and another process (an answer to a gate) add events to one run in turn:
/// each is kept, in the order written, whichever counted the numbers.
fn events_of_two_writers_interleave_in_order(db: &dyn Db) {
    let mut executor = db.open();
    executor
        .create_run(&run_record("r", "fix", 1))
        .expect("create");
    let mut other = db.open_second();
    let mut kinds = Vec::new();
    for i in 0..3 {
        let mine = format!("mine{i}");
        executor
            .commit(&[Write::Event(event("r", "a", &mine, i))])
            .expect("commit");
        let theirs = format!("theirs{i}");
        other
            .commit(&[Write::Event(event("r", "", &theirs, i))])
            .expect("commit");
        kinds.push(mine);
        kinds.push(theirs);
    }
    // Two in one commit after the other's, and a node beside them.
    executor
        .commit(&[
            Write::Event(event("r", "a", "last1", 9)),
            Write::Node(node("r", "", "a", json!(1))),
            Write::Event(event("r", "a", "last2", 9)),
        ])
        .expect("commit");
    kinds.extend(["last1".to_string(), "last2".to_string()]);
    for reader in [&executor, &other] {
        let seen: Vec<String> = reader
            .events("r", None)
            .expect("events")
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(seen, kinds);
    }
}

fn two_connections_see_each_others_writes(db: &dyn Db) {
    let mut executor = db.open();
    executor
        .create_run(&run_record("r", "fix", 1))
        .expect("create");
    executor
        .commit(&[Write::Gate(gate("r", "", "approve_spec"))])
        .expect("commit");

    // `ralph-flow approve` from another terminal: its own connection (Full durability).
    let mut approver = db.open_second();
    let seen = executor.changes().expect("changes");
    assert_eq!(approver.pending_gates("r").expect("gates").len(), 1);
    approver
        .answer(&approval("r", "", "approve_spec", true))
        .expect("answer");

    assert_ne!(
        executor.changes().expect("changes"),
        seen,
        "another connection's commit is a change"
    );
    assert!(executor.pending_gates("r").expect("gates").is_empty());
    assert!(
        executor
            .approval("r", "", "approve_spec")
            .expect("approval")
            .is_some_and(|a| a.approved)
    );
    executor
        .set_status("r", RunStatus::Finished, Some(("done", 0)))
        .expect("status");
    assert_eq!(
        approver.run("r").expect("run").map(|r| r.status),
        Some(RunStatus::Finished)
    );
}

#[test]
fn open_creates_directories_and_reopens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("a/b/.ralph-flow");
    {
        let mut s = ralph_flow::store::open_default(&state).expect("open");
        s.create_run(&run_record("r", "fix", 1)).expect("create");
    }
    assert_eq!(
        ralph_flow::store::default_path(&state),
        state.join("state.db")
    );
    let s = ralph_flow::store::open_default(&state).expect("reopen");
    assert!(s.run("r").expect("run").is_some());
    let version: i64 = rusqlite::Connection::open(state.join("state.db"))
        .expect("open")
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, ralph_flow::store::sqlite::SCHEMA_VERSION);
}

/// A new store has small pages (a commit writes each page it touches whole); a store made
/// with other pages keeps them and works as before.
#[test]
fn new_stores_have_small_pages_and_old_ones_keep_theirs() {
    let page_size = |path: &Path| -> i64 {
        rusqlite::Connection::open(path)
            .expect("open")
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .expect("page size")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let fresh = dir.path().join("fresh").join("state.db");
    {
        let mut s = SqliteStore::open(&fresh).expect("open");
        s.create_run(&run_record("r", "fix", 1)).expect("create");
    }
    assert_eq!(page_size(&fresh), ralph_flow::store::sqlite::PAGE_SIZE);
    let old = dir.path().join("old").join("state.db");
    std::fs::create_dir_all(old.parent().expect("dir")).expect("mkdir");
    rusqlite::Connection::open(&old)
        .expect("open")
        .execute_batch("PRAGMA page_size = 4096; VACUUM;")
        .expect("page size");
    {
        let mut s = SqliteStore::open(&old).expect("open");
        s.create_run(&run_record("r", "fix", 1)).expect("create");
        s.commit(&[Write::Node(node("r", "", "a", serde_json::json!({"x": 1})))])
            .expect("commit");
    }
    assert_eq!(page_size(&old), 4096);
    let s = SqliteStore::open(&old).expect("reopen");
    assert_eq!(s.nodes("r").expect("nodes").len(), 1);
}

/// A store written by version 2 (nodes in a rowid table, their write order the rowid) is
/// brought up to the current version on open, keeping every node, every event and their
/// order.
#[test]
fn a_version_2_store_is_migrated_keeping_the_order_of_nodes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let conn = rusqlite::Connection::open(&path).expect("open");
        conn.execute_batch(
            "CREATE TABLE runs (id TEXT PRIMARY KEY, workflow TEXT NOT NULL, file TEXT NOT NULL,
                 workflow_hash TEXT NOT NULL, params TEXT NOT NULL, status TEXT NOT NULL,
                 exit_name TEXT, exit_code INTEGER, started_at INTEGER NOT NULL,
                 updated_at INTEGER NOT NULL, dir TEXT NOT NULL,
                 options TEXT NOT NULL DEFAULT '{}');
             CREATE TABLE nodes (run TEXT NOT NULL, scope TEXT NOT NULL, node TEXT NOT NULL,
                 state TEXT NOT NULL, output TEXT, output_blob TEXT, action TEXT, feedback TEXT,
                 attempts INTEGER NOT NULL, input_tokens INTEGER NOT NULL,
                 output_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL, cost_usd REAL,
                 started_at INTEGER NOT NULL, finished_at INTEGER NOT NULL,
                 PRIMARY KEY (run, scope, node));
             INSERT INTO runs VALUES ('r', 'fix', 'w.toml', 'h', '{}', 'running', NULL, NULL,
                 1, 1, 'd', '{}');
             -- Written in the order b, a, c; then b again (a re-settled node goes last).
             INSERT INTO nodes VALUES ('r', '', 'b', 'done', '1', NULL, NULL, NULL, 1, 0, 0, 0,
                 NULL, 1, 1);
             INSERT INTO nodes VALUES ('r', '', 'a', 'done', '2', NULL, NULL, NULL, 1, 0, 0, 0,
                 NULL, 1, 1);
             INSERT INTO nodes VALUES ('r', '', 'c', 'done', '3', NULL, NULL, NULL, 1, 0, 0, 0,
                 NULL, 1, 1);
             INSERT OR REPLACE INTO nodes VALUES ('r', '', 'b', 'done', '4', NULL, NULL, NULL,
                 2, 0, 0, 0, NULL, 1, 1);
             CREATE TABLE attempts (run TEXT NOT NULL, scope TEXT NOT NULL, node TEXT NOT NULL,
                 attempt INTEGER NOT NULL, state TEXT NOT NULL, agent TEXT, dir TEXT NOT NULL,
                 error TEXT, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
                 cached_tokens INTEGER NOT NULL, cost_usd REAL, started_at INTEGER NOT NULL,
                 finished_at INTEGER, PRIMARY KEY (run, scope, node, attempt)) WITHOUT ROWID;
             CREATE TABLE events (run TEXT NOT NULL, seq INTEGER NOT NULL, at INTEGER NOT NULL,
                 scope TEXT NOT NULL, node TEXT NOT NULL, kind TEXT NOT NULL,
                 message TEXT NOT NULL, PRIMARY KEY (run, seq)) WITHOUT ROWID;
             INSERT INTO events VALUES ('r', 1, 1, '', 'b', 'started', 'b started');
             INSERT INTO events VALUES ('r', 7, 2, '', 'c', 'done', '');
             CREATE TABLE gates (run TEXT NOT NULL, scope TEXT NOT NULL, gate TEXT NOT NULL,
                 message TEXT NOT NULL, show TEXT NOT NULL, requested_at INTEGER NOT NULL,
                 deadline INTEGER, PRIMARY KEY (run, scope, gate));
             CREATE TABLE approvals (run TEXT NOT NULL, scope TEXT NOT NULL,
                 gate TEXT NOT NULL, approved INTEGER NOT NULL, comment TEXT, by TEXT NOT NULL,
                 at INTEGER NOT NULL, PRIMARY KEY (run, scope, gate));
             CREATE TABLE locks (run TEXT PRIMARY KEY, pid INTEGER NOT NULL,
                 host TEXT NOT NULL, since INTEGER NOT NULL);
             PRAGMA user_version = 2;",
        )
        .expect("a version 2 store");
    }
    let order = |s: &SqliteStore| -> Vec<(String, serde_json::Value)> {
        s.nodes("r")
            .expect("nodes")
            .into_iter()
            .map(|n| (n.node, n.output))
            .collect()
    };
    let mut s = store(dir.path());
    assert_eq!(
        order(&s),
        [
            ("a".to_string(), json!(2)),
            ("c".to_string(), json!(3)),
            ("b".to_string(), json!(4))
        ]
    );
    // A node written now comes after them, and so does `a` settled again.
    s.commit(&[Write::Node(node("r", "", "d", json!(5)))])
        .expect("commit");
    s.commit(&[Write::Node(node("r", "", "a", json!(6)))])
        .expect("commit");
    drop(s);
    // Another process (a resume) goes on counting from the file.
    let mut s = store(dir.path());
    s.commit(&[Write::Node(node("r", "", "c", json!(7)))])
        .expect("commit");
    let names: Vec<String> = order(&s).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["b", "d", "a", "c"]);
    // The events written before version 5 come first, then a settlement's, kept in its row.
    s.commit(&settlement("", "e", NodeState::Done, 3, ""))
        .expect("commit");
    let kinds: Vec<(i64, String, String)> = event_rows(&s, None)
        .into_iter()
        .map(|(at, _, node, kind, _)| (at, node, kind))
        .collect();
    assert_eq!(
        kinds,
        [
            (1, "b".to_string(), "started".to_string()),
            (2, "c".to_string(), "done".to_string()),
            (3, "e".to_string(), "done".to_string()),
        ]
    );
    let version: i64 = rusqlite::Connection::open(&path)
        .expect("open")
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, ralph_flow::store::sqlite::SCHEMA_VERSION);
}

/// The executor keeps a settlement's event in its node's row, and the rows of both tables
/// share one count: another writer's events (answers to gates) between settlements get
/// numbers of their own, even though the executor counted without reading the file.
#[test]
fn settlements_and_another_writers_events_share_one_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut executor = store(dir.path());
    executor
        .create_run(&run_record("r", "fix", 1))
        .expect("create");
    let mut other = store(dir.path());
    let mut expected = Vec::new();
    for i in 0..3 {
        let name = format!("s{i}");
        executor
            .commit(&settlement("", &name, NodeState::Done, i * 2, ""))
            .expect("commit");
        other
            .commit(&[Write::Event(event("r", "", "approved", i * 2 + 1))])
            .expect("commit");
        expected.push(format!("s{i} done"));
        expected.push(" approved".to_string());
    }
    executor
        .commit(&settlement("", "s3", NodeState::Done, 6, ""))
        .expect("commit");
    expected.push("s3 done".to_string());
    for reader in [&executor, &other] {
        let seen: Vec<String> = reader
            .events("r", None)
            .expect("events")
            .into_iter()
            .map(|e| format!("{} {}", e.node, e.kind))
            .collect();
        assert_eq!(seen, expected);
    }
    let conn = rusqlite::Connection::open(dir.path().join("state.db")).expect("open");
    let numbers: Vec<i64> = conn
        .prepare(
            "SELECT seq FROM events WHERE run = 'r' \
             UNION ALL SELECT seq FROM nodes WHERE run = 'r' AND event IS NOT NULL ORDER BY 1",
        )
        .and_then(|mut stmt| stmt.query_map([], |r| r.get(0))?.collect())
        .expect("numbers");
    assert_eq!(numbers, [1, 2, 3, 4, 5, 6, 7], "every number once");
    // The settlements' events are in the node rows, not in `events`.
    let in_events: i64 = conn
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .expect("count");
    assert_eq!(in_events, 3);
}

/// After a crash, the store checks that the number a killed writer last committed is in the
/// file (else its write-ahead log was lost). A settlement's number is in its node's row, not
/// in `events`, and is found there.
#[test]
fn a_killed_writers_last_settlement_is_found_in_its_node_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = store(dir.path());
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    s.commit(&settlement("", "a", NodeState::Done, 1, ""))
        .expect("commit");
    drop(s);
    // The open-marker a killed process would leave: a process that is gone, and the run and
    // number it committed last.
    let mut gone = std::process::Command::new("true").spawn().expect("spawn");
    let pid = gone.id();
    gone.wait().expect("wait");
    let marker = |last: &str| {
        std::fs::write(dir.path().join(format!("state.db.open-{pid}-0")), last).expect("marker")
    };
    marker("r 1\n");
    drop(store(dir.path()));
    // A number the file does not hold: the log was lost.
    marker("r 2\n");
    let Err(err) = SqliteStore::open(&dir.path().join("state.db")) else {
        panic!("a store that lost its log opened")
    };
    assert!(
        err.to_string().contains("lost its write-ahead log"),
        "{err}"
    );
}

/// A store written by version 5 (no count of unreported calls): a read-only open reads it
/// as it is, with nothing unreported, and changes nothing; an open that can write brings it
/// to the current version, with the count before the output in `nodes`, the settlement
/// events kept in node rows still read and still moved out by the triggers.
#[test]
fn a_version_5_store_is_read_as_it_is_and_migrated_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let conn = rusqlite::Connection::open(&path).expect("open");
        conn.execute_batch(
            "CREATE TABLE runs (id TEXT PRIMARY KEY, workflow TEXT NOT NULL, file TEXT NOT NULL,
                 workflow_hash TEXT NOT NULL, params TEXT NOT NULL, status TEXT NOT NULL,
                 exit_name TEXT, exit_code INTEGER, started_at INTEGER NOT NULL,
                 updated_at INTEGER NOT NULL, dir TEXT NOT NULL,
                 options TEXT NOT NULL DEFAULT '{}');
             CREATE INDEX runs_started ON runs (started_at);
             CREATE INDEX runs_workflow ON runs (workflow, started_at);
             CREATE TABLE nodes (run TEXT NOT NULL, scope TEXT NOT NULL, node TEXT NOT NULL,
                 seq INTEGER NOT NULL, state TEXT NOT NULL, finished_at INTEGER NOT NULL,
                 event TEXT, output TEXT, output_blob TEXT, action TEXT, feedback TEXT,
                 attempts INTEGER NOT NULL, input_tokens INTEGER NOT NULL,
                 output_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL, cost_usd REAL,
                 started_at INTEGER NOT NULL, PRIMARY KEY (run, scope, node)) WITHOUT ROWID;
             CREATE TABLE attempts (run TEXT NOT NULL, scope TEXT NOT NULL, node TEXT NOT NULL,
                 attempt INTEGER NOT NULL, state TEXT NOT NULL, agent TEXT, dir TEXT NOT NULL,
                 error TEXT, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
                 cached_tokens INTEGER NOT NULL, cost_usd REAL, started_at INTEGER NOT NULL,
                 finished_at INTEGER, PRIMARY KEY (run, scope, node, attempt)) WITHOUT ROWID;
             CREATE TABLE events (run TEXT NOT NULL, seq INTEGER NOT NULL, at INTEGER NOT NULL,
                 scope TEXT NOT NULL, node TEXT NOT NULL, kind TEXT NOT NULL,
                 message TEXT NOT NULL, PRIMARY KEY (run, seq)) WITHOUT ROWID;
             CREATE TABLE gates (run TEXT NOT NULL, scope TEXT NOT NULL, gate TEXT NOT NULL,
                 message TEXT NOT NULL, show TEXT NOT NULL, requested_at INTEGER NOT NULL,
                 deadline INTEGER, PRIMARY KEY (run, scope, gate));
             CREATE TABLE approvals (run TEXT NOT NULL, scope TEXT NOT NULL,
                 gate TEXT NOT NULL, approved INTEGER NOT NULL, comment TEXT, by TEXT NOT NULL,
                 at INTEGER NOT NULL, PRIMARY KEY (run, scope, gate));
             CREATE TABLE locks (run TEXT PRIMARY KEY, pid INTEGER NOT NULL,
                 host TEXT NOT NULL, since INTEGER NOT NULL, holder TEXT NOT NULL DEFAULT '',
                 expires INTEGER);
             CREATE TRIGGER nodes_keep_event_on_update BEFORE UPDATE ON nodes
                 WHEN OLD.event IS NOT NULL
             BEGIN
                 INSERT INTO events (run, seq, at, scope, node, kind, message)
                 VALUES (OLD.run, OLD.seq, OLD.finished_at, OLD.scope, OLD.node, OLD.state,
                     OLD.event);
             END;
             CREATE TRIGGER nodes_keep_event_on_delete BEFORE DELETE ON nodes
                 WHEN OLD.event IS NOT NULL
             BEGIN
                 INSERT INTO events (run, seq, at, scope, node, kind, message)
                 VALUES (OLD.run, OLD.seq, OLD.finished_at, OLD.scope, OLD.node, OLD.state,
                     OLD.event);
             END;
             -- A run whose executor was killed: stage `a` settled, `b`'s attempt running.
             INSERT INTO runs VALUES ('r', 'fix', 'w.toml', 'h', '{}', 'running', NULL, NULL, 1,
                 2, 'd', '{}');
             INSERT INTO events VALUES ('r', 1, 5, '', 'a', 'started', 'a started');
             INSERT INTO nodes VALUES ('r', '', 'a', 2, 'done', 9, 'a done', '{\"ok\":true}',
                 NULL, NULL, NULL, 1, 120, 30, 0, 0.5, 5);
             INSERT INTO attempts VALUES ('r', '', 'a', 1, 'ok', 'claude', 'd/a/1', NULL, 120,
                 30, 0, 0.5, 5, 9);
             INSERT INTO attempts VALUES ('r', '', 'b', 1, 'running', 'claude', 'd/b/1', NULL,
                 0, 0, 0, NULL, 10, NULL);
             INSERT INTO locks VALUES ('r', 4242, 'h', 1, 'h:4242:tenure', 99);
             PRAGMA user_version = 5;",
        )
        .expect("a version 5 store");
    }
    let version = || -> i64 {
        rusqlite::Connection::open(&path)
            .expect("open")
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version")
    };
    let expected_usage = Usage {
        input_tokens: 120,
        output_tokens: 30,
        cached_tokens: 0,
        cost_usd: Some(0.5),
        unreported: 0,
    };
    let running = AttemptRecord {
        run: "r".to_string(),
        scope: String::new(),
        node: "b".to_string(),
        attempt: 1,
        state: ralph_flow::store::AttemptState::Running,
        agent: Some("claude".to_string()),
        dir: "d/b/1".to_string(),
        error: None,
        usage: Usage::default(),
        started_at: 10,
        finished_at: None,
    };
    let check = |s: &dyn Store| {
        let nodes = s.nodes("r").expect("nodes");
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].output, json!({"ok": true}));
        assert_eq!(nodes[0].usage, expected_usage);
        let attempts = s.attempts("r", None).expect("attempts");
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[0].usage, expected_usage);
        assert_eq!(attempts[0].finished_at, Some(9));
        assert_eq!(attempts[1], running);
        assert_eq!(
            s.running_attempts("r").expect("running"),
            std::slice::from_ref(&running)
        );
        let kinds: Vec<String> = s
            .events("r", None)
            .expect("events")
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, ["started", "done"]);
        // A lock without its holder's identity (version 7 added it): unknown.
        let lock = s.lock_holder("r").expect("lock").expect("held");
        assert_eq!((lock.pid, lock.expires), (4242, Some(99)));
        assert_eq!(lock.identity(), None);
    };
    // Read-only (`status` on a directory it cannot write): read as it is.
    let ro = SqliteStore::open_read_only(&path).expect("a version 5 store reads");
    check(&ro);
    drop(ro);
    assert_eq!(version(), 5, "reading changed nothing");
    let located = ralph_flow::store::Location::StateDir(dir.path().to_path_buf())
        .open_to_read()
        .expect("open to read")
        .expect("a store");
    check(located.as_ref());
    drop(located);
    assert_eq!(version(), 5);

    // Opened to write: brought up to date, every record kept.
    let mut s = store(dir.path());
    assert_eq!(version(), ralph_flow::store::sqlite::SCHEMA_VERSION);
    check(&s);
    let columns: Vec<String> = rusqlite::Connection::open(&path)
        .expect("open")
        .prepare("SELECT name FROM pragma_table_info('nodes')")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("columns")
        .collect::<Result<_, _>>()
        .expect("columns");
    let place = |c: &str| columns.iter().position(|x| x == c).expect(c);
    assert!(
        place("unreported") < place("output") && place("input_tokens") < place("output"),
        "nothing short behind the output: {columns:?}"
    );
    // It ends as a new store is: the same tables (their columns, with or without a rowid),
    // indexes and triggers.
    let fresh = tempfile::tempdir().expect("tempdir");
    drop(store(fresh.path()));
    assert_eq!(
        schema_of(&path),
        schema_of(&fresh.path().join("state.db")),
        "migrated from version 5, as new"
    );
    // Settled again in the same scope: the trigger (made again with the new table) moves
    // the row's event into `events`, and the new count is kept.
    let mut again = node("r", "", "a", json!(2));
    again.usage = Usage::unreported_call();
    s.commit(&[Write::Node(again.clone())]).expect("commit");
    assert_eq!(s.nodes("r").expect("nodes"), [again]);
    let kinds: Vec<String> = s
        .events("r", None)
        .expect("events")
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["started", "done"], "the event kept its place");
}

/// The schema of a SQLite store, to compare: each table's columns (name, type, not null,
/// default, key) and whether it has a rowid (the text that made it keeps how it was written,
/// and an added column), each index's and trigger's text.
fn schema_of(path: &Path) -> Vec<(String, String, Vec<String>)> {
    let conn = rusqlite::Connection::open(path).expect("open");
    let entries: Vec<(String, String, Option<String>)> = conn
        .prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        .and_then(|mut stmt| {
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .expect("schema");
    entries
        .into_iter()
        .map(|(kind, name, sql)| {
            let sql = sql.unwrap_or_default();
            let shape = if kind == "table" {
                let mut columns: Vec<String> = conn
                    .prepare(
                        "SELECT name, type, \"notnull\", dflt_value, pk \
                         FROM pragma_table_info(?1)",
                    )
                    .and_then(|mut stmt| {
                        stmt.query_map([&name], |r| {
                            Ok(format!(
                                "{} {} {} {:?} {}",
                                r.get::<_, String>(0)?,
                                r.get::<_, String>(1)?,
                                r.get::<_, i64>(2)?,
                                r.get::<_, Option<String>>(3)?,
                                r.get::<_, i64>(4)?
                            ))
                        })?
                        .collect()
                    })
                    .expect("columns");
                columns.push(format!("without rowid: {}", sql.contains("WITHOUT ROWID")));
                columns
            } else {
                vec![sql]
            };
            (kind, name, shape)
        })
        .collect()
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(store(dir.path()));
    rusqlite::Connection::open(dir.path().join("state.db"))
        .expect("open")
        .execute_batch("PRAGMA user_version = 99")
        .expect("bump");
    let err = SqliteStore::open(&dir.path().join("state.db"))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("schema version 99"), "{err}");
}

#[test]
fn large_outputs_round_trip_in_postgres() {
    let Some(url) = pg::database() else {
        return;
    };
    let mut s = PgStore::connect(&url).expect("connect");
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    let big = json!({"diff": "x".repeat(1024 * 1024), "files": ["a.rs", "b.rs"]});
    s.commit(&[Write::Node(node("r", "", "big", big.clone()))])
        .expect("commit");
    let other = PgStore::connect(&url).expect("connect");
    assert_eq!(other.nodes("r").expect("nodes")[0].output, big);
    assert_eq!(
        other.history("fix", "big", "", 1).expect("history")[0]
            .1
            .output,
        big
    );
}

/// A database at schema version 4 (before the count of unreported calls) is migrated when
/// a store connects, keeping its records: nothing unreported in them, and the count kept in
/// what is written from then on.
#[test]
fn postgres_migrates_a_version_4_schema_keeping_its_records() {
    let Some(url) = pg::database() else {
        return;
    };
    let mut s = PgStore::connect(&url).expect("connect");
    s.create_run(&run_record("r", "fix", 1)).expect("create");
    let mut a = attempt("r", "", "plan", 1);
    a.usage = usage(40);
    s.commit(&[
        Write::Node(node("r", "", "plan", json!(1))),
        Write::Attempt(a),
    ])
    .expect("commit");
    drop(s);
    // What version 4 had: the same tables without the count (nor the identity of a lock's
    // holder, which version 6 added, nor the workers, which version 7 added, nor the
    // attempts' records, which version 8 added, nor the writing transactions of rows,
    // which version 9 added).
    let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    c.batch_execute(
        "ALTER TABLE nodes DROP COLUMN unreported; \
         ALTER TABLE attempts DROP COLUMN unreported; \
         ALTER TABLE locks DROP COLUMN started, DROP COLUMN boot, DROP COLUMN pidns; \
         DROP TABLE workers; \
         DROP TABLE artifacts; \
         DROP FUNCTION ralph_flow_written_by() CASCADE; \
         ALTER TABLE nodes DROP COLUMN tx; \
         ALTER TABLE attempts DROP COLUMN tx; \
         ALTER TABLE events DROP COLUMN tx; \
         UPDATE ralph_flow_schema SET version = 4;",
    )
    .expect("back to version 4");
    let mut s = PgStore::connect(&url).expect("connect migrates");
    let version: i32 = c
        .query_one("SELECT version FROM ralph_flow_schema", &[])
        .expect("version")
        .get(0);
    assert_eq!(version, ralph_flow::store::postgres::SCHEMA_VERSION);
    assert_eq!(s.nodes("r").expect("nodes")[0].usage, usage(1200));
    assert_eq!(s.attempts("r", None).expect("attempts")[0].usage, usage(40));
    let mut n = node("r", "", "review", json!(2));
    n.usage = Usage::unreported_call();
    s.commit(&[Write::Node(n.clone())]).expect("commit");
    assert_eq!(s.nodes("r").expect("nodes")[1], n);
}

#[test]
fn postgres_refuses_a_newer_schema_and_names_the_server_without_its_password() {
    let Some(url) = pg::database() else {
        return;
    };
    drop(PgStore::connect(&url).expect("connect"));
    postgres::Client::connect(&url, postgres::NoTls)
        .expect("connect")
        .batch_execute("UPDATE ralph_flow_schema SET version = 99")
        .expect("bump");
    let err = PgStore::connect(&url).err().expect("refused");
    assert!(err.to_string().contains("schema version 99"), "{err}");
    let err = PgStore::connect("postgres://rf:hunter2-secret@127.0.0.1:1/none")
        .err()
        .expect("no server");
    let text = ralph_flow::diag::error_chain(&err);
    assert!(
        text.contains("cannot connect to postgres://rf@127.0.0.1:1/none"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
}

/// Fencing: once another process took the run over (the lease expired), every write of the
/// old holder is refused in its own transaction, and nothing of it is applied.
#[test]
fn postgres_fences_the_writes_of_a_coordinator_whose_lease_was_taken_over() {
    let Some(url) = pg::database() else {
        return;
    };
    let mut old = PgStore::connect(&url).expect("connect");
    old.create_run(&run_record("r", "fix", 1)).expect("create");
    let ana = leased("ana", 0, 300);
    old.lock("r", &ana).expect("lock");
    old.commit(&[Write::Event(event("r", "a", "started", 1))])
        .expect("a fenced commit while the lease holds (it renews it)");
    std::thread::sleep(std::time::Duration::from_millis(400));
    let mut new = PgStore::connect(&url).expect("connect");
    let bob = leased("bob", 0, 60_000);
    new.lock("r", &bob).expect("take over the expired lease");
    let err = old
        .commit(&[
            Write::Node(node("r", "", "a", json!({"x": 1}))),
            Write::Event(event("r", "a", "done", 2)),
        ])
        .expect_err("fenced");
    assert!(
        matches!(err, ralph_flow::store::StoreError::LeaseLost { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("no longer holds run r"), "{err}");
    let err = old
        .set_status("r", RunStatus::Finished, Some(("success", 0)))
        .expect_err("fenced status");
    assert!(matches!(
        err,
        ralph_flow::store::StoreError::LeaseLost { .. }
    ));
    // Nothing of the refused writes is there; the new holder writes as usual.
    assert!(new.nodes("r").expect("nodes").is_empty());
    assert_eq!(new.events("r", None).expect("events").len(), 1);
    assert_eq!(
        new.run("r").expect("run").expect("r").status,
        RunStatus::Running
    );
    new.commit(&[Write::Node(node("r", "", "a", json!({"x": 2})))])
        .expect("the new holder commits");
    new.set_status("r", RunStatus::Finished, Some(("success", 0)))
        .expect("status");
    assert_eq!(new.nodes("r").expect("nodes")[0].output, json!({"x": 2}));
}

/// The queue: detached runs are claimed once each (two workers claiming at once skip each
/// other's rows), only by workers with their labels and that accept them; an expired
/// running run is claimed again; an answered gate queues a waiting run again.
#[test]
fn postgres_queue_claims_each_run_once_by_labels_and_leases() {
    use ralph_flow::store::{Accept, RunQueue};
    use std::sync::Arc;
    let Some(url) = pg::database() else {
        return;
    };
    let mut submit = PgStore::connect(&url).expect("connect");
    let opts = |cwd: &str| json!({"workspace": {"cwd": cwd}});
    for i in 0..6 {
        let mut r = run_record(&format!("q{i}"), "fix", i);
        r.options = opts("/here");
        let labels: Vec<String> = if i == 5 { vec!["gpu".into()] } else { vec![] };
        submit
            .enqueue(
                &r,
                &[("/wf.toml".into(), format!("name = 'w{i}'"))],
                &labels,
            )
            .expect("enqueue");
    }
    let mut r = run_record("elsewhere", "fix", 10);
    r.options = opts("/not/here");
    submit.enqueue(&r, &[], &[]).expect("enqueue");
    assert_eq!(
        submit.run("q0").expect("run").expect("q0").status,
        RunStatus::Queued
    );
    assert_eq!(submit.sources("q3").expect("sources")[0].1, "name = 'w3'");
    assert_eq!(submit.labels("q5").expect("labels"), ["gpu"]);
    // A plain run (not detached) is never claimed.
    submit
        .create_run(&run_record("plain", "fix", 11))
        .expect("create");

    let accept: Accept = Arc::new(|r: &RunRecord| r.options["workspace"]["cwd"] == "/here");
    let dir = tempfile::tempdir().expect("tempdir");
    // Four workers claim at once, each until nothing is left.
    let claimed: Vec<Vec<String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|w| {
                let (url, accept, dir) = (url.clone(), accept.clone(), dir.path());
                scope.spawn(move || {
                    let mut s = PgStore::connect(&url).expect("connect");
                    let me = leased(&format!("w{w}"), 0, 60_000);
                    let mut got = Vec::new();
                    while let Some(r) = s.claim(&me, &[], dir, accept.clone()).expect("claim") {
                        assert_eq!(r.status, RunStatus::Running);
                        assert_eq!(r.dir, dir.join(&r.id).to_string_lossy());
                        got.push(r.id);
                    }
                    got
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("join"))
            .collect()
    });
    let mut all: Vec<String> = claimed.into_iter().flatten().collect();
    all.sort();
    assert_eq!(
        all,
        ["q0", "q1", "q2", "q3", "q4"],
        "each once; no gpu, no elsewhere"
    );
    // The labelled run goes to a worker with the label (and others).
    let mut gpu = PgStore::connect(&url).expect("connect");
    let labels = vec!["gpu".to_string(), "linux".to_string()];
    let cat = leased("cat", 0, 200);
    let got = gpu
        .claim(&cat, &labels, dir.path(), accept.clone())
        .expect("claim")
        .expect("the gpu run");
    assert_eq!(got.id, "q5");
    let dan = leased("dan", 0, 60_000);
    assert!(
        gpu.claim(&dan, &labels, dir.path(), accept.clone())
            .expect("claim")
            .is_none()
    );
    // Once its lease expired unrenewed (a worker that died), another claims it again, as
    // a running run with an expired lease.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let again = gpu
        .claim(&dan, &labels, dir.path(), accept.clone())
        .expect("claim")
        .expect("the dead worker's run");
    assert_eq!(again.id, "q5");
    assert_eq!(
        gpu.lock_holder("q5").expect("holder").expect("held").holder,
        "dan"
    );
    assert!(
        gpu.claim(&dan, &labels, dir.path(), accept.clone())
            .expect("claim")
            .is_none()
    );
    // A worker that stops hands its run back; a waiting run comes back once answered.
    gpu.requeue("q5", &dan).expect("requeue");
    assert_eq!(
        gpu.run("q5").expect("run").expect("q5").status,
        RunStatus::Queued
    );
    assert_eq!(gpu.lock_holder("q5").expect("holder"), None);
    submit
        .set_status("q0", RunStatus::Waiting, None)
        .expect("waiting");
    submit
        .commit(&[Write::Gate(gate("q0", "", "ok"))])
        .expect("gate");
    submit
        .answer(&approval("q0", "", "ok", true))
        .expect("answer");
    assert_eq!(
        submit.run("q0").expect("run").expect("q0").status,
        RunStatus::Queued
    );
    // A plain waiting run stays waiting when answered.
    submit
        .set_status("plain", RunStatus::Waiting, None)
        .expect("waiting");
    submit
        .commit(&[Write::Gate(gate("plain", "", "ok"))])
        .expect("gate");
    submit
        .answer(&approval("plain", "", "ok", true))
        .expect("answer");
    assert_eq!(
        submit.run("plain").expect("run").expect("plain").status,
        RunStatus::Waiting
    );
}

#[test]
fn postgres_units_are_claimed_once_by_labels_adopted_by_key_and_fenced_by_lease() {
    use ralph_flow::store::{AcceptUnit, UnitQueue, UnitRequest, UnitState};
    use std::sync::Arc;
    let Some(url) = pg::database() else {
        return;
    };
    let mut coord = PgStore::connect(&url).expect("connect");
    // Only the run's coordinator asks for units.
    let boss = leased("boss", 0, 600_000);
    assert!(matches!(
        coord.dispatch(&UnitRequest {
            coordinator: "boss",
            run: "r",
            key: "a#1.1@h",
            stage_prefix: "a#",
            kind: "command",
            payload: &json!({}),
            labels: &[],
            place: &json!({}),
            hold: None,
        }),
        Err(ralph_flow::store::StoreError::LeaseLost { .. })
    ));
    coord.lock("r", &boss).expect("lock");
    let here = json!({"dir": "/here"});
    let mut ids = Vec::new();
    for i in 0..8 {
        let labels: Vec<String> = if i == 7 { vec!["gpu".into()] } else { vec![] };
        let key = format!("items#{i}/work#1.1@h");
        let id = coord
            .dispatch(&UnitRequest {
                coordinator: "boss",
                run: "r",
                key: &key,
                stage_prefix: &format!("items#{i}/work#"),
                kind: "command",
                payload: &json!({"i": i}),
                labels: &labels,
                place: &here,
                hold: None,
            })
            .expect("dispatch");
        // Asking again for the same thing adopts the unit.
        let again = coord
            .dispatch(&UnitRequest {
                coordinator: "boss",
                run: "r",
                key: &key,
                stage_prefix: &format!("items#{i}/work#"),
                kind: "command",
                payload: &json!({"i": i}),
                labels: &labels,
                place: &here,
                hold: None,
            })
            .expect("dispatch");
        assert_eq!(id, again);
        ids.push(id);
    }
    let elsewhere = coord
        .dispatch(&UnitRequest {
            coordinator: "boss",
            run: "r",
            key: "far/work#1.1@h",
            stage_prefix: "far/work#",
            kind: "command",
            payload: &json!({}),
            labels: &[],
            place: &json!({"dir": "/not/here"}),
            hold: None,
        })
        .expect("dispatch");
    let accept: AcceptUnit = Arc::new(|place: &serde_json::Value| place["dir"] == "/here");
    // Four workers claim at once, each until nothing is left: each unit once, none with a
    // label they lack or a place they cannot reach.
    let claimed: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|w| {
                let (url, accept) = (url.clone(), accept.clone());
                scope.spawn(move || {
                    let mut s = PgStore::connect(&url).expect("connect");
                    let me = leased(&format!("w{w}"), 0, 60_000);
                    let mut got = Vec::new();
                    while let Some(u) = s.claim_unit(&me, &[], accept.clone()).expect("claim") {
                        assert_eq!(u.state, UnitState::Running);
                        got.push(u.id);
                    }
                    got
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("join"))
            .collect()
    });
    let mut all: Vec<i64> = claimed.into_iter().flatten().collect();
    all.sort_unstable();
    assert_eq!(all, ids[..7], "each once; not the gpu one, not the far one");
    assert_eq!(
        coord.unit(elsewhere).expect("unit").expect("there").state,
        UnitState::Queued
    );
    // The gpu unit, to a worker with the label; its lease lapses unrenewed, and another
    // takes it over: the first may neither renew nor finish it any more.
    let mut gpu = PgStore::connect(&url).expect("connect");
    let labels = vec!["gpu".to_string()];
    let cat = leased("cat", 0, 200);
    let u = gpu
        .claim_unit(&cat, &labels, accept.clone())
        .expect("claim")
        .expect("gpu unit");
    assert_eq!(u.id, ids[7]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let dan = leased("dan", 0, 60_000);
    let again = gpu
        .claim_unit(&dan, &labels, accept.clone())
        .expect("claim")
        .expect("taken over");
    assert_eq!(again.id, ids[7]);
    assert!(!gpu.renew_unit(ids[7], &cat).expect("renew"));
    assert!(
        !gpu.finish_unit(ids[7], &cat, &json!("late"))
            .expect("finish")
    );
    assert!(gpu.renew_unit(ids[7], &dan).expect("renew"));
    assert!(gpu.finish_unit(ids[7], &dan, &json!("ok")).expect("finish"));
    // A retried finish that was applied already counts as done.
    assert!(gpu.finish_unit(ids[7], &dan, &json!("ok")).expect("finish"));
    let done = coord.unit(ids[7]).expect("unit").expect("there");
    assert_eq!(
        (done.state, done.result),
        (UnitState::Done, Some(json!("ok")))
    );
    // Asking for something else for the same stage cancels what is unfinished of it; its
    // holder learns it when it renews, and a handed-back unit is queued again.
    let other = coord
        .dispatch(&UnitRequest {
            coordinator: "boss",
            run: "r",
            key: "items#0/work#2.1@h2",
            stage_prefix: "items#0/work#",
            kind: "command",
            payload: &json!({}),
            labels: &[],
            place: &here,
            hold: None,
        })
        .expect("dispatch");
    assert_ne!(other, ids[0]);
    let cancelled = coord.unit(ids[0]).expect("unit").expect("there");
    assert_eq!(cancelled.state, UnitState::Cancelled);
    // The new unit of that stage waits until the old one's holder has stopped its work:
    // two copies of a stage never run at once.
    let fay = leased("fay", 0, 60_000);
    assert!(
        gpu.claim_unit(&fay, &[], accept.clone())
            .expect("claim")
            .is_none(),
        "the stage's cancelled unit still runs"
    );
    let old = leased(&cancelled.holder.expect("held"), 0, 60_000);
    assert!(
        !gpu.renew_unit(ids[0], &old).expect("renew"),
        "its holder learns"
    );
    gpu.unit_stopped(ids[0], &old).expect("stopped");
    let next = gpu
        .claim_unit(&fay, &[], accept.clone())
        .expect("claim")
        .expect("now");
    assert_eq!(next.id, other);
    let mut mine = None;
    for w in 0..4 {
        let h = leased(&format!("w{w}"), 0, 60_000);
        if gpu.renew_unit(ids[1], &h).expect("renew") {
            mine = Some(h);
        }
    }
    let mine = mine.expect("one of the four holds unit 1");
    gpu.release_unit(ids[1], &mine).expect("release");
    assert_eq!(
        coord.unit(ids[1]).expect("unit").expect("there").state,
        UnitState::Queued
    );
    coord.forget_unit(ids[7], "boss").expect("forget");
    assert!(coord.unit(ids[7]).expect("unit").is_none());
    // A resource of capacity 1 (a merge queue): while one unit that holds it runs under a
    // live lease, no worker claims another; once it is done, the next goes.
    let lands: Vec<i64> = (0..2)
        .map(|i| {
            coord
                .dispatch(&UnitRequest {
                    coordinator: "boss",
                    run: "r",
                    key: &format!("t#{i}/land#1.1@h"),
                    stage_prefix: &format!("t#{i}/land#"),
                    kind: "command",
                    payload: &json!({}),
                    labels: &[],
                    place: &json!({"dir": "/land"}),
                    hold: Some(("/merge_queue", 1)),
                })
                .expect("dispatch")
        })
        .collect();
    let eve = leased("eve", 0, 60_000);
    let accept: AcceptUnit = Arc::new(|place: &serde_json::Value| place["dir"] == "/land");
    let first = gpu
        .claim_unit(&eve, &[], accept.clone())
        .expect("claim")
        .expect("a land");
    assert!(lands.contains(&first.id));
    assert!(
        gpu.claim_unit(&eve, &[], accept.clone())
            .expect("claim")
            .is_none(),
        "the queue is taken"
    );
    assert!(
        gpu.finish_unit(first.id, &eve, &json!("landed"))
            .expect("finish")
    );
    let second = gpu
        .claim_unit(&eve, &[], accept.clone())
        .expect("claim")
        .expect("the next land");
    assert!(lands.contains(&second.id) && second.id != first.id);
}

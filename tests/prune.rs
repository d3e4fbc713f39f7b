//! `ralph-flow runs prune` (and `gc`) and the sizes `runs` shows, over stores written through
//! the library: what goes (rows, spilled outputs no remaining run shares, the run's
//! directory, its units' directories, its git worktrees), what never goes (a run that may go
//! on, a run a live process holds, a workspace a remaining run works in), that --dry-run
//! lists the same runs and removes nothing, and that the freed figure is what was removed.
//! The same on PostgreSQL (tests/pg).
#![allow(clippy::unwrap_used)]

mod pg;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command as Std;

use assert_cmd::Command;
use ralph_flow::backend::Usage;
use ralph_flow::store::sqlite::SqliteStore;
use ralph_flow::store::{
    AttemptRecord, AttemptState, Event, GateRequest, NodeRecord, NodeState, RunRecord, RunStatus,
    Store, StoreError, Write, current_owner, now_ms,
};
use serde_json::{Value, json};

const DAY: i64 = 86_400_000;

/// The bytes of the files under `path` (lengths; links not followed), 0 for nothing.
fn bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .unwrap()
        .map(|e| bytes(&e.unwrap().path()))
        .sum()
}

/// Every file under `dir` with its length: what a --dry-run must leave as it is.
fn files(dir: &Path) -> BTreeMap<PathBuf, u64> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                stack.push(p);
            } else if !p.to_string_lossy().contains("state.db") {
                out.insert(p, meta.len());
            }
        }
    }
    out
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Std::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A git repository with one commit.
fn repo(at: &Path) -> PathBuf {
    let repo = at.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("a.txt"), "a\n").unwrap();
    std::fs::write(repo.join(".gitignore"), "*.out\n").unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "one"]);
    repo
}

/// A run of `workflow` that ended (or not) `ago` ms before now, its directory in `state`.
fn record(state: &Path, id: &str, workflow: &str, status: RunStatus, ago: i64) -> RunRecord {
    let at = now_ms() - ago;
    RunRecord {
        id: id.into(),
        workflow: workflow.into(),
        file: format!("workflows/{workflow}.toml"),
        workflow_hash: "0".repeat(64),
        params: json!({}),
        status,
        exit: (status == RunStatus::Finished).then(|| ("done".to_string(), 0)),
        started_at: at - 60_000,
        updated_at: at,
        dir: state.join("runs").join(id).to_string_lossy().into_owned(),
        options: json!({}),
    }
}

/// The rows of a run: an event, an attempt and a settled stage whose output is `output`.
fn rows(run: &str, output: Value) -> Vec<Write> {
    vec![
        Write::Event(Event {
            run: run.into(),
            at: now_ms(),
            scope: String::new(),
            node: "plan".into(),
            kind: "started".into(),
            message: "plan started".into(),
        }),
        Write::Attempt(AttemptRecord {
            run: run.into(),
            scope: String::new(),
            node: "plan".into(),
            attempt: 1,
            state: AttemptState::Ok,
            agent: Some("claude".into()),
            dir: format!("runs/{run}/plan/1"),
            error: None,
            usage: Usage::default(),
            started_at: now_ms(),
            finished_at: Some(now_ms()),
        }),
        node(run, "plan", output),
    ]
}

fn node(run: &str, name: &str, output: Value) -> Write {
    Write::Node(NodeRecord {
        run: run.into(),
        scope: String::new(),
        node: name.into(),
        state: NodeState::Done,
        output,
        action: None,
        feedback: None,
        attempts: 1,
        usage: Usage::default(),
        started_at: now_ms(),
        finished_at: now_ms(),
    })
}

/// The run's files: its directory (artifacts and an attempt) and a unit's directory.
fn run_files(state: &Path, id: &str, size: usize) {
    let dir = state.join("runs").join(id);
    std::fs::create_dir_all(dir.join("plan/1")).unwrap();
    std::fs::write(dir.join("artifacts.jsonl"), "x".repeat(size)).unwrap();
    std::fs::write(dir.join("plan/1/prompt.md"), "p".repeat(size / 2)).unwrap();
    let unit = state.join("units/attempts").join(id).join("7");
    std::fs::create_dir_all(&unit).unwrap();
    std::fs::write(unit.join("stdout"), "o".repeat(size / 3)).unwrap();
}

/// A large output, spilled by the SQLite store to a file of its own.
fn big(tag: &str) -> Value {
    json!({ "text": format!("{tag}{}", "y".repeat(70 * 1024)) })
}

fn cli(cwd: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::cargo_bin("ralph-flow")
        .unwrap()
        .current_dir(cwd)
        .args(args)
        .env_remove("RALPH_FLOW_STORE")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn ids(report: &Value) -> Vec<String> {
    report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

/// The scene both stores are tested on, in `state`: workflow `a` with runs that ended 10,
/// 9, 8 and 7 days ago (`a1`..`a3`, and `a6`, which this process holds), one that ended a
/// day ago (`a7`), one that waits on a gate and one that runs (`a4`, `a5`, 20 days old);
/// workflow `b` with two runs that ended a month ago. `a1` has a worktree of its own; `a2`
/// one that the waiting `a4` works in. Outputs: `a1` has one of its own and one it shares
/// with `a2` and `a7` (spilled files in SQLite).
fn scene(store: &mut dyn Store, state: &Path, repo: &Path) {
    let runs = [
        ("a1", "a", RunStatus::Finished, 10 * DAY),
        ("a2", "a", RunStatus::Finished, 9 * DAY),
        ("a3", "a", RunStatus::Cancelled, 8 * DAY),
        ("a4", "a", RunStatus::Waiting, 20 * DAY),
        ("a5", "a", RunStatus::Running, 20 * DAY),
        ("a6", "a", RunStatus::Finished, 7 * DAY),
        ("a7", "a", RunStatus::Finished, DAY),
        ("b1", "b", RunStatus::Finished, 31 * DAY),
        ("b2", "b", RunStatus::Finished, 30 * DAY),
    ];
    for (i, (id, workflow, status, ago)) in runs.iter().enumerate() {
        store
            .create_run(&record(state, id, workflow, *status, *ago))
            .unwrap();
        let output = match *id {
            "a2" | "a7" => big("shared"),
            _ => json!({"ok": true}),
        };
        store.commit(&rows(id, output)).unwrap();
        run_files(state, id, 1000 + i * 100);
    }
    store.commit(&[node("a1", "own", big("a1 only"))]).unwrap();
    store
        .commit(&[node("a1", "shared", big("shared"))])
        .unwrap();
    store
        .commit(&[Write::Gate(GateRequest {
            run: "a4".into(),
            scope: String::new(),
            gate: "approve".into(),
            message: "Approve?".into(),
            show: vec![],
            requested_at: now_ms(),
            deadline: None,
        })])
        .unwrap();
    // a6 ended, but this process holds it (as an executor finishing up would).
    store
        .lock(
            "a6",
            &current_owner().with_lease(std::time::Duration::from_secs(600)),
        )
        .unwrap();
    // a1's own worktree, its build output ignored by git; a2's, which the waiting a4 works
    // in; a3's, with a change nobody committed.
    let own = state.join("worktrees/a1/@run");
    let used = state.join("worktrees/a2/tickets#T-1");
    let dirty = state.join("worktrees/a3/@run");
    for (path, branch) in [(&own, "a1"), (&used, "t1"), (&dirty, "a3")] {
        git(
            repo,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                branch,
                &path.to_string_lossy(),
            ],
        );
        std::fs::write(path.join("build.out"), "b".repeat(5000)).unwrap();
    }
    std::fs::write(dirty.join("a.txt"), "changed\n").unwrap();
    store
        .commit(&[node(
            "a4",
            "@worktree:tickets",
            json!({"path": used.to_string_lossy(), "branch": "t1"}),
        )])
        .unwrap();
}

/// Prunes the scene with `store_args` and checks everything; `blobs` is the directory of
/// the store's spilled outputs, if it has one.
fn prune_the_scene(
    tmp: &Path,
    state: &Path,
    repo: &Path,
    store_args: &[&str],
    blobs: Option<&Path>,
    reopen: &dyn Fn() -> Box<dyn Store>,
) {
    let going = ["a1", "a2", "a3", "b1", "b2"];
    let staying = ["a4", "a5", "a6", "a7"];
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["runs", "prune", "--older-than", "5d", "--json"]
            .iter()
            .chain(extra)
            .chain(store_args)
            .map(|s| s.to_string())
            .collect();
        v.extend([
            "--state-dir".to_string(),
            state.to_string_lossy().into_owned(),
        ]);
        v
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        cli(tmp, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };

    // --dry-run: the runs that would go (a6 too: only the store's deletion finds it held),
    // and nothing removed.
    let before = files(tmp);
    let (code, out, err) = run(&["--dry-run"]);
    assert_eq!(code, 0, "{err}");
    let dry = json_of(&out);
    assert_eq!(dry["dry_run"], true);
    let mut listed = ids(&dry);
    listed.sort();
    assert_eq!(listed, ["a1", "a2", "a3", "a6", "b1", "b2"], "{out}");
    assert_eq!(files(tmp), before, "a dry run removes nothing");
    for r in dry["runs"].as_array().unwrap() {
        assert!(r["store"]["row_bytes"].as_u64().unwrap() > 100, "{r}");
        assert!(r["dir_bytes"].as_u64().unwrap() > 1000, "{r}");
    }
    for id in listed.iter() {
        assert!(reopen().run(id).unwrap().is_some(), "{id} is still there");
    }
    let a2 = dry["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "a2")
        .unwrap();
    assert!(
        a2["kept"][0]["why"].as_str().unwrap().contains("run a4"),
        "{a2}"
    );
    let a3 = dry["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "a3")
        .unwrap();
    assert!(
        a3["kept"][0]["why"]
            .as_str()
            .unwrap()
            .contains("1 uncommitted change"),
        "{a3}"
    );

    // What should go, measured here: the directories of the runs that go (but the
    // worktree a4 uses), and the spilled output only a1 had.
    let used = state.join("worktrees/a2/tickets#T-1");
    let mut expected: u64 = going
        .iter()
        .map(|id| {
            bytes(&state.join("runs").join(id))
                + bytes(&state.join("units/attempts").join(id))
                + bytes(&state.join("worktrees").join(id))
        })
        .sum::<u64>()
        - bytes(&used)
        - bytes(&state.join("worktrees/a3"));
    let blob_files = |dir: &Path| -> BTreeMap<PathBuf, u64> {
        files(dir)
            .into_iter()
            .filter(|(p, _)| p.extension().is_some_and(|e| e == "json"))
            .collect()
    };
    let blobs_before = blobs.map(blob_files).unwrap_or_default();
    if blobs.is_some() {
        assert_eq!(blobs_before.len(), 2, "a1's own output and the shared one");
    }

    let (code, out, err) = run(&[]);
    assert_eq!(code, 0, "{err}\n{out}");
    let real = json_of(&out);
    let mut listed_real = ids(&real);
    listed_real.sort();
    assert_eq!(
        listed_real, listed,
        "the real prune lists what the dry run did"
    );
    let a6 = real["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "a6")
        .unwrap();
    assert!(
        a6["skipped"].as_str().unwrap().contains("still holds it"),
        "{a6}"
    );
    assert!(a6.get("removed").is_none());

    let store = reopen();
    for id in going {
        assert!(store.run(id).unwrap().is_none(), "{id} is gone");
        assert!(store.events(id, None).unwrap().is_empty());
        assert!(store.attempts(id, None).unwrap().is_empty());
        assert!(store.nodes(id).unwrap().is_empty());
        assert!(!state.join("runs").join(id).exists());
        assert!(!state.join("units/attempts").join(id).exists());
    }
    for id in staying {
        assert!(store.run(id).unwrap().is_some(), "{id} stays");
        assert!(!store.nodes(id).unwrap().is_empty());
        assert!(state.join("runs").join(id).join("artifacts.jsonl").exists());
    }
    assert_eq!(store.pending_gates("a4").unwrap().len(), 1);
    // a1's worktree went the way git removes one; the one a4 works in stays.
    assert!(!state.join("worktrees/a1").exists());
    let list = git(repo, &["worktree", "list", "--porcelain"]);
    assert!(!list.contains("worktrees/a1/"), "{list}");
    assert!(used.join("build.out").exists());
    assert!(list.contains("tickets#T-1"), "{list}");
    assert_eq!(
        std::fs::read_to_string(state.join("worktrees/a3/@run/a.txt")).unwrap(),
        "changed\n"
    );
    // The shared output stays (a7 has it); a1's own went.
    if let Some(dir) = blobs {
        let after = blob_files(dir);
        assert_eq!(after.len(), 1, "{after:?}");
        let (gone, len) = blobs_before
            .iter()
            .find(|(p, _)| !after.contains_key(*p))
            .unwrap();
        assert!(!gone.exists());
        expected += len;
        assert!(
            store.output("a7", "", "plan").unwrap().unwrap()["text"]
                .as_str()
                .unwrap()
                .starts_with("shared")
        );
    }
    assert_eq!(
        real["freed_bytes"].as_u64().unwrap(),
        expected,
        "freed is what was removed: {out}"
    );
    assert!(real["store_row_bytes"].as_u64().unwrap() > 0);

    // Again: nothing more goes (a6 is still held), and `gc` is the same command.
    let mut again = vec!["gc", "--older-than", "5d", "--dry-run", "--json"];
    again.extend(store_args);
    let state_arg = state.to_string_lossy();
    again.extend(["--state-dir", &state_arg]);
    let (code, out, err) = cli(tmp, &again);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ids(&json_of(&out)), ["a6"]);
}

#[test]
fn prune_removes_ended_runs_with_their_files_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let repo = repo(tmp.path());
    let db = state.join("state.db");
    {
        let mut store = SqliteStore::open(&db).unwrap();
        // The lock of a6 stays with this process when the handle is dropped.
        scene(&mut store, &state, &repo);
    }
    let reopen = || -> Box<dyn Store> { Box::new(SqliteStore::open_read_only(&db).unwrap()) };
    prune_the_scene(
        tmp.path(),
        &state,
        &repo,
        &[],
        Some(&state.join("blobs")),
        &reopen,
    );
}

#[test]
fn prune_on_postgres_removes_the_same() {
    let Some(url) = pg::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let repo = repo(tmp.path());
    let mut store = ralph_flow::store::postgres::PgStore::connect(&url).unwrap();
    scene(&mut store, &state, &repo);
    // PostgreSQL keeps the attempts' records in the store: they go with their run.
    let record = |run: &str| ralph_flow::store::ArtifactRecord {
        run: run.into(),
        path: "@run/a/attempt-1/prompt.md".into(),
        text: format!("the prompt of {run}"),
    };
    store
        .commit_with_records(&[], &[record("a1"), record("a4")])
        .unwrap();
    let reopen = || -> Box<dyn Store> {
        Box::new(ralph_flow::store::postgres::PgStore::connect(&url).unwrap())
    };
    prune_the_scene(tmp.path(), &state, &repo, &["--store", &url], None, &reopen);
    assert!(!state.join("state.db").exists(), "no SQLite store was made");
    let after = reopen();
    assert_eq!(after.records("a1", "").unwrap().unwrap_or_default(), vec![]);
    assert_eq!(
        after.records("a4", "").unwrap(),
        Some(vec![(
            "@run/a/attempt-1/prompt.md".to_string(),
            "the prompt of a4".to_string()
        )])
    );
    drop(store);
}

/// The store's own check, in the transaction that deletes: a run that has not ended, or
/// that a live process holds, is refused with all its rows, whatever a listing said before
/// (a run that resumed between the listing and the deletion is such a run).
fn refuses_what_may_go_on(store: &mut dyn Store, state: &Path) {
    for status in [
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Queued,
        RunStatus::Interrupted,
    ] {
        let id = format!("r-{}", status.as_str());
        store
            .create_run(&record(state, &id, "w", status, 30 * DAY))
            .unwrap();
        store.commit(&rows(&id, json!(1))).unwrap();
        match store.delete_run(&id) {
            Err(StoreError::Refused(why)) => {
                assert!(why.contains(status.as_str()), "{why}");
                assert!(why.contains("ralph-flow cancel"), "{why}");
            }
            other => panic!("{id}: {other:?}"),
        }
        assert!(store.run(&id).unwrap().is_some());
        assert_eq!(store.nodes(&id).unwrap().len(), 1);
    }
    // Listed as finished, then resumed: the deletion finds it running.
    store
        .create_run(&record(
            state,
            "resumed",
            "w",
            RunStatus::Finished,
            30 * DAY,
        ))
        .unwrap();
    store
        .set_status("resumed", RunStatus::Running, None)
        .unwrap();
    assert!(matches!(
        store.delete_run("resumed"),
        Err(StoreError::Refused(_))
    ));
    // Ended, held by a live process, then released.
    store
        .create_run(&record(state, "held", "w", RunStatus::Finished, 30 * DAY))
        .unwrap();
    store.commit(&rows("held", json!(1))).unwrap();
    let owner = current_owner().with_lease(std::time::Duration::from_secs(600));
    store.lock("held", &owner).unwrap();
    let refused = store.delete_run("held");
    assert!(
        matches!(&refused, Err(StoreError::Refused(w)) if w.contains("still holds it")),
        "{refused:?}"
    );
    store.unlock("held", &owner).unwrap();
    let removed = store.delete_run("held").unwrap();
    assert_eq!(
        removed.rows, 4,
        "the run, an event, an attempt, a node: {removed:?}"
    );
    assert!(removed.row_bytes > 0);
    assert!(store.run("held").unwrap().is_none());
    assert!(matches!(
        store.delete_run("held"),
        Err(StoreError::Refused(w)) if w.contains("no run")
    ));
}

#[test]
fn the_store_refuses_a_run_that_may_go_on_in_its_own_transaction() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(&tmp.path().join("state.db")).unwrap();
    refuses_what_may_go_on(&mut store, tmp.path());
}

#[test]
fn the_postgres_store_refuses_a_run_that_may_go_on_in_its_own_transaction() {
    let Some(url) = pg::database() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut store = ralph_flow::store::postgres::PgStore::connect(&url).unwrap();
    refuses_what_may_go_on(&mut store, tmp.path());
}

#[test]
fn keep_leaves_the_newest_ended_runs_of_each_workflow() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    {
        let mut store = SqliteStore::open(&state.join("state.db")).unwrap();
        for (id, workflow, ago) in [
            ("a1", "a", 5),
            ("a2", "a", 4),
            ("a3", "a", 3),
            ("b1", "b", 2),
            ("b2", "b", 1),
        ] {
            store
                .create_run(&record(
                    &state,
                    id,
                    workflow,
                    RunStatus::Finished,
                    ago * DAY,
                ))
                .unwrap();
            run_files(&state, id, 100);
        }
    }
    let state_arg = state.to_string_lossy().into_owned();
    let (code, out, err) = cli(
        tmp.path(),
        &["runs", "prune", "--keep", "1", "--state-dir", &state_arg],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("removed 3 runs"), "{out}");
    assert!(out.contains("file does not shrink"), "{out}");
    let (_, out, _) = cli(tmp.path(), &["runs", "--json", "--state-dir", &state_arg]);
    let left: Vec<String> = json_of(&out)
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(left, ["b2", "a3"]);
    assert!(!state.join("runs/a1").exists() && !state.join("runs/b1").exists());
    assert!(state.join("runs/a3").exists() && state.join("runs/b2").exists());
}

#[test]
fn runs_shows_each_runs_size_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    {
        let mut store = SqliteStore::open(&state.join("state.db")).unwrap();
        store
            .create_run(&record(&state, "r1", "w", RunStatus::Finished, DAY))
            .unwrap();
        store.commit(&rows("r1", big("r1"))).unwrap();
        run_files(&state, "r1", 3000);
    }
    let state_arg = state.to_string_lossy().into_owned();
    let (code, out, err) = cli(tmp.path(), &["runs", "--json", "--state-dir", &state_arg]);
    assert_eq!(code, 0, "{err}");
    let size = json_of(&out)[0]["size_bytes"].as_u64().unwrap();
    let dirs = bytes(&state.join("runs/r1")) + bytes(&state.join("units/attempts/r1"));
    let blob = bytes(&state.join("blobs"));
    assert!(blob > 70 * 1024, "the output was spilled");
    // Its files, its spilled output, and an estimate of its rows (a few hundred bytes).
    assert!(size > dirs + blob, "{size} vs {dirs} + {blob}");
    assert!(size < dirs + blob + 4096, "{size} vs {dirs} + {blob}");
    let (_, out, _) = cli(tmp.path(), &["runs", "--state-dir", &state_arg]);
    assert!(out.lines().next().unwrap().ends_with("SIZE"), "{out}");
    assert!(out.contains("KiB"), "{out}");
}

#[test]
fn prune_needs_an_age_or_a_count() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, _, err) = cli(tmp.path(), &["runs", "prune", "--dry-run"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("--older-than DURATION") && err.contains("--keep N"),
        "{err}"
    );
    let (code, _, err) = cli(tmp.path(), &["gc", "--older-than", "soon"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("--older-than"), "{err}");
    // No store yet: nothing to remove, and no store made.
    let (code, out, err) = cli(tmp.path(), &["gc", "--keep", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("nothing to remove"), "{out}");
    assert!(!tmp.path().join(".ralph-flow").exists());
}

/// A worktree is removed under the lock its repository's worktrees are made under by every
/// ralph-flow process (`ralph-flow-worktrees.lock` in the git directory): while a run holds
/// it (adding a worktree of its own), prune waits, then removes.
#[test]
fn prune_removes_a_worktree_under_the_lock_runs_take() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let repo = repo(tmp.path());
    let mut store = SqliteStore::open(&state.join("state.db")).unwrap();
    store
        .create_run(&record(&state, "old", "a", RunStatus::Finished, 10 * DAY))
        .unwrap();
    let tree = state.join("worktrees/old/@run");
    git(
        &repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "old",
            &tree.to_string_lossy(),
        ],
    );
    drop(store);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(repo.join(".git/ralph-flow-worktrees.lock"))
        .unwrap();
    let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).unwrap();
    let mut prune = Std::new(assert_cmd::cargo::cargo_bin("ralph-flow"))
        .current_dir(tmp.path())
        .args(["runs", "prune", "--older-than", "1d", "--state-dir"])
        .arg(&state)
        .env_remove("RALPH_FLOW_STORE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        prune.try_wait().unwrap().is_none() && tree.exists(),
        "prune waits for the lock"
    );
    drop(held);
    assert!(prune.wait().unwrap().success());
    assert!(!tree.exists());
    assert!(!git(&repo, &["worktree", "list"]).contains("@run"));
}

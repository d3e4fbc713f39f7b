//! Who owns a run on a SQLite store: a lease, renewed by the executor's heartbeat, and
//! fenced by the tenure that took it; a pid never keeps a run past its lease, and a holder
//! provably gone is taken over at once.
//!
//! - `kill -9`, then the recorded pid given to a live, unrelated process (as after a
//!   container restart): `resume` takes the run over once the lease ended;
//! - `kill -9`, the killed executor not reaped yet (a zombie): `resume` takes it at once,
//!   long before its lease ends;
//! - a live run whose lease is renewed is not taken over by a concurrent `resume`, long
//!   after the first lease would have ended, and the refusal says by whom it is held and
//!   what to do.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Project;
use ralph_flow::store::{RunStatus, Store};

/// One stage that sleeps the first time (leaving a marker) and ends at once when run again.
const WORKFLOW: &str = r#"name = "owned"

[stages.slow]
kind = "command"
argv = ["sh", "-c", "if [ -f ran ]; then echo again; exit 0; fi; touch ran; sleep 30"]

[stages.after]
kind = "command"
needs = ["slow"]
argv = ["echo", "after"]
"#;

/// A short sleep for the live run of the last test: longer than a few leases.
const LIVE: &str = r#"name = "live"

[stages.slow]
kind = "command"
argv = ["sleep", "6"]
"#;

/// Starts the run, waits until its stage's program runs, and kills the executor with
/// SIGKILL; returns the run's id and the killed child (not reaped: a zombie until waited).
fn killed_in_its_stage(p: &Project, lease: &str) -> (String, common::Running) {
    let child = p.spawn_env(&["run", "w.toml"], &[("RALPH_FLOW_LEASE", lease)]);
    let id = p.wait_for_run();
    p.wait_for(|| p.dir().join("ran").exists());
    p.wait_for(|| {
        p.store()
            .and_then(|s| s.lock_holder(&id).unwrap())
            .is_some()
    });
    child.signal(nix::sys::signal::Signal::SIGKILL);
    (id, child)
}

/// The start time of a process (`/proc/PID/stat`, field 22).
fn start_ticks(pid: u32) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

fn assert_finished(p: &Project, id: &str) {
    let store = p.store().unwrap();
    let run = store.run(id).unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Finished);
    assert_eq!(run.exit, Some(("success".into(), 0)));
    let nodes: Vec<String> = store
        .nodes(id)
        .unwrap()
        .into_iter()
        .map(|n| n.node)
        .collect();
    assert_eq!(nodes, ["slow", "after"], "each stage settled once");
}

#[test]
fn resume_after_kill_9_takes_over_once_the_lease_ended_whatever_lives_at_the_pid() {
    let p = Project::new();
    p.workflow("w.toml", WORKFLOW);
    let (id, child) = killed_in_its_stage(&p, "1s");
    let _ = child.finish();
    // An unrelated live process now has the recorded pid (and its start time: nothing
    // tells it from the holder), as after a container restart; the lease stays as the dead
    // executor left it.
    let mut unrelated = Command::new("sleep")
        .arg("60")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let db = rusqlite::Connection::open(p.dir().join(".ralph-flow/state.db")).unwrap();
    let changed = db
        .execute(
            "UPDATE locks SET pid = ?2 WHERE run = ?1",
            rusqlite::params![id, unrelated.id()],
        )
        .unwrap();
    assert_eq!(changed, 1);
    // (A store without the holder's start time, written before it was recorded, keeps only
    // the pid: the same case for the lease.)
    let changed = db
        .execute(
            "UPDATE locks SET started = ?2 WHERE run = ?1",
            rusqlite::params![id, start_ticks(unrelated.id())],
        )
        .unwrap();
    assert_eq!(
        changed, 1,
        "the holder's start time is the unrelated process's"
    );
    drop(db);
    // Past the lease (1 s from the executor's last renewal).
    let expires = p
        .store()
        .unwrap()
        .lock_holder(&id)
        .unwrap()
        .unwrap()
        .expires;
    let expires = expires.expect("a lease");
    while ralph_flow::store::now_ms() <= expires {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = p.run_env(&["resume", &id], &[("RALPH_FLOW_LEASE", "1s")]);
    let _ = unrelated.kill();
    let _ = unrelated.wait();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_finished(&p, &id);
    assert_eq!(p.store().unwrap().lock_holder(&id).unwrap(), None);
}

#[test]
fn resume_after_kill_9_takes_a_zombie_holders_run_at_once() {
    let p = Project::new();
    p.workflow("w.toml", WORKFLOW);
    // A lease of ten minutes: only the proof that its holder is gone lets `resume` in.
    let (id, child) = killed_in_its_stage(&p, "10m");
    let pid = child.pid();
    let t = Instant::now();
    while common::alive(pid) {
        assert!(t.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "not reaped yet: a zombie"
    );
    let out = p.run_env(&["resume", &id], &[("RALPH_FLOW_LEASE", "10m")]);
    let _ = child.finish();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_finished(&p, &id);
}

#[test]
fn a_live_run_renews_its_lease_and_is_not_taken_over() {
    let p = Project::new();
    p.workflow("w.toml", LIVE);
    let child = p.spawn_env(&["run", "w.toml"], &[("RALPH_FLOW_LEASE", "1s")]);
    let id = p.wait_for_run();
    p.wait_for(|| {
        p.store()
            .and_then(|s| s.lock_holder(&id).unwrap())
            .is_some()
    });
    // Several leases later, the executor's heartbeat keeps the run.
    std::thread::sleep(Duration::from_millis(3000));
    let held = p.store().unwrap().lock_holder(&id).unwrap().unwrap();
    assert!(
        held.expires.unwrap() > ralph_flow::store::now_ms(),
        "renewed: {held:?}"
    );
    let out = p.run_env(&["resume", &id], &[("RALPH_FLOW_LEASE", "1s")]);
    assert_ne!(out.code, 0, "{}", out.stderr);
    let said = &out.stderr;
    assert!(
        said.contains(&format!(
            "run {id} is held by pid {} on {}",
            child.pid(),
            held.host
        )),
        "{said}"
    );
    assert!(said.contains("its lease runs until"), "{said}");
    assert!(said.contains(&format!("kill {}", child.pid())), "{said}");
    let first = child.finish();
    assert_eq!(first.code, 0, "{}", first.stderr);
    let store = p.store().unwrap();
    let run = store.run(&id).unwrap().unwrap();
    assert_eq!(run.exit, Some(("success".into(), 0)));
    let events = store.events(&id, None).unwrap();
    assert!(
        !events.iter().any(|e| e.kind == "resumed"),
        "nobody took the run over: {events:?}"
    );
}

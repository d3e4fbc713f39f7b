//! A PostgreSQL outage longer than the lease (tests/pg) under a run whose units of work are
//! spread over two workers: the coordinator that could not renew its lease steps down
//! without settling anything, the run is taken over once the server is back, and it ends
//! `success` with every stage settled once: no stage both failed and done, no run marked
//! failed or interrupted because of the store. (Its own test binary: the outage cuts every
//! connection to the shared server.)
#![allow(clippy::unwrap_used)]

mod pg;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ralph_flow::store::postgres::PgStore;
use ralph_flow::store::{RunStatus, Store};

/// The lease of the test: short, so that an outage of three leases takes seconds.
const LEASE: &str = "2s";

/// Four items that each sleep a second, as units on whichever worker claims them, then one
/// stage after them.
const WORKFLOW: &str = r#"name = "outage"

[stages.items]
kind = "for_each"
over = "[1, 2, 3, 4]"
as = "n"

[stages.items.stages.work]
kind = "command"
argv = ["sh", "-c", "sleep 1; echo item $0", "{{ n }}"]

[stages.after]
kind = "command"
needs = ["items"]
argv = ["echo", "after"]
"#;

struct Workers {
    dir: tempfile::TempDir,
    url: String,
    children: Vec<Child>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Workers {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ralph-flow"));
        c.args(args)
            .current_dir(self.dir.path())
            .env("RALPH_FLOW_STORE", &self.url)
            .env("RALPH_FLOW_LEASE", LEASE)
            .stdin(Stdio::null());
        c
    }

    fn logs(&self) -> String {
        (0..self.children.len())
            .map(|n| {
                std::fs::read_to_string(self.dir.path().join(format!("w{n}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[test]
fn an_outage_longer_than_the_lease_settles_every_stage_once_and_the_run_succeeds() {
    let Some(url) = pg::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wf.toml"), WORKFLOW).unwrap();
    let mut w = Workers {
        dir,
        url: url.clone(),
        children: Vec::new(),
    };
    let out = w.command(&["run", "wf.toml", "--detach"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    for n in 0..2 {
        let log = std::fs::File::create(w.dir.path().join(format!("w{n}.log"))).unwrap();
        let state = w.dir.path().join(format!("w{n}"));
        let child = w
            .command(&["worker", "--max-concurrency", "2", "--poll", "300ms"])
            .arg("--state-dir")
            .arg(&state)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        w.children.push(child);
    }
    // Once units of the run are under way, the server goes away for three leases.
    let t = Instant::now();
    while !w.logs().contains("claimed unit") {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", w.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    pg::stop();
    std::thread::sleep(Duration::from_secs(6));
    pg::start_again();
    let store = PgStore::connect(&url).unwrap();
    let t = Instant::now();
    loop {
        let run = store.run(&id).unwrap().unwrap();
        if run.status == RunStatus::Finished {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "unfinished ({:?}); workers said:\n{}",
            run.status,
            w.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The workers stop as told; the finished run stays finished.
    for c in &w.children {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    }
    for c in &mut w.children {
        assert_eq!(c.wait().unwrap().code(), Some(0), "{}", w.logs());
    }
    let said = w.logs();
    assert!(said.contains("lost the connection"), "an outage: {said}");
    assert!(!said.contains("vanished"), "{said}");
    let run = store.run(&id).unwrap().unwrap();
    let events = store.events(&id, None).unwrap();
    let history: Vec<String> = events
        .iter()
        .map(|e| format!("{} {} {}: {}", e.scope, e.node, e.kind, e.message))
        .collect();
    assert_eq!(run.status, RunStatus::Finished, "{history:#?}\n{said}");
    assert_eq!(
        run.exit,
        Some(("success".into(), 0)),
        "{history:#?}\n{said}"
    );
    // Every stage settled once, done: its settlement event once, no failure anywhere.
    let nodes = store.nodes(&id).unwrap();
    let mut settled: BTreeMap<(String, String), usize> = BTreeMap::new();
    for n in &nodes {
        *settled
            .entry((n.scope.clone(), n.node.clone()))
            .or_default() += 1;
        assert_eq!(
            n.state,
            ralph_flow::store::NodeState::Done,
            "{n:?}\n{history:#?}"
        );
    }
    for item in 0..4 {
        let scope = format!("items#{item}");
        assert_eq!(
            settled.get(&(scope.clone(), "work".into())),
            Some(&1),
            "{history:#?}"
        );
        let done = events
            .iter()
            .filter(|e| e.scope == scope && e.node == "work" && e.kind == "done")
            .count();
        assert_eq!(done, 1, "item {item} said done once: {history:#?}");
    }
    for stage in ["items", "after"] {
        assert_eq!(
            settled.get(&(String::new(), stage.into())),
            Some(&1),
            "{history:#?}"
        );
        let done = events
            .iter()
            .filter(|e| e.scope.is_empty() && e.node == stage && e.kind == "done")
            .count();
        assert_eq!(done, 1, "{stage} said done once: {history:#?}");
    }
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind.as_str(), "failed" | "error" | "interrupted")),
        "nothing failed or was marked interrupted because of the store: {history:#?}"
    );
    // The run ended once: one `finished` event, the last one.
    let ends: Vec<&String> = events
        .iter()
        .filter(|e| e.scope.is_empty() && e.node.is_empty() && e.kind == "finished")
        .map(|e| &e.message)
        .collect();
    assert_eq!(ends.len(), 1, "{history:#?}");
    assert_eq!(events.last().map(|e| e.kind.as_str()), Some("finished"));
    assert_eq!(store.lock_holder(&id).unwrap(), None, "released at the end");
}

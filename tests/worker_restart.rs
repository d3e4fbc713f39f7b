//! Workers live through a restart of the PostgreSQL server (tests/pg): every connection is
//! cut under running runs (the executors', the workers' claims, their listening
//! connections); they connect again and every run finishes, each stage settled once. (Its
//! own test binary: the restart cuts every connection to the shared server.)
#![allow(clippy::unwrap_used)]

mod pg;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ralph_flow::store::postgres::PgStore;
use ralph_flow::store::{RunStatus, Store};

const WORKFLOW: &str = r#"name = "sleepy"

[stages.a]
kind = "command"
argv = ["sleep", "0.5"]

[stages.b]
kind = "command"
needs = ["a"]
argv = ["sleep", "0.5"]
"#;

#[test]
fn workers_finish_their_runs_across_a_restart_of_the_server() {
    let Some(url) = pg::database() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wf.toml"), WORKFLOW).unwrap();
    let command = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ralph-flow"));
        c.args(args)
            .current_dir(dir.path())
            .env("RALPH_FLOW_STORE", &url)
            .stdin(Stdio::null());
        c
    };
    let ids: Vec<String> = (0..6)
        .map(|_| {
            let out = command(&["run", "wf.toml", "--detach"]).output().unwrap();
            assert_eq!(out.status.code(), Some(0));
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        })
        .collect();
    let mut workers: Vec<Child> = (0..2)
        .map(|n| {
            let log = std::fs::File::create(dir.path().join(format!("w{n}.log"))).unwrap();
            command(&[
                "worker",
                "--max-concurrency",
                "2",
                "--poll",
                "500ms",
                "--lease",
                "15s",
            ])
            .arg("--state-dir")
            .arg(dir.path().join(format!("w{n}")))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
        })
        .collect();
    let logs = || {
        (0..2)
            .map(|n| std::fs::read_to_string(dir.path().join(format!("w{n}.log"))).unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    };
    // Once runs are under way, the server restarts under them.
    let t = Instant::now();
    while !logs().contains("claimed run") {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    pg::restart();
    let t = Instant::now();
    let finished = |store: &PgStore| {
        ids.iter()
            .filter(|id| store.run(id).unwrap().unwrap().status == RunStatus::Finished)
            .count()
    };
    let store = PgStore::connect(&url).unwrap();
    while finished(&store) < ids.len() {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "unfinished; workers said:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for w in &workers {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(w.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    }
    for w in &mut workers {
        assert_eq!(w.wait().unwrap().code(), Some(0), "{}", logs());
    }
    let said = logs();
    assert!(said.contains("lost the connection"), "{said}");
    for id in &ids {
        let run = store.run(id).unwrap().unwrap();
        assert_eq!(run.exit, Some(("success".into(), 0)), "{id}");
        let events = store.events(id, None).unwrap();
        for s in ["a", "b"] {
            let done = events
                .iter()
                .filter(|e| e.node == s && e.kind == "done")
                .count();
            assert_eq!(done, 1, "{id} {s}");
        }
    }
}

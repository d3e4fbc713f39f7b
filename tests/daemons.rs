//! Programs that leave their stage's process group and session (`setsid` daemons, double
//! forks) do not outlive the run: they carry the run's id and their program's tag in their
//! environment, and are stopped when their program ends and, at the latest, when the run
//! ends.
#![allow(clippy::unwrap_used)]

mod common;

use common::Project;
use ralph_flow::backend::process::processes_with_env;

/// Two command stages: one starts `sleep` under `setsid` (a new session, so outside its
/// process group), keeping the stage's output open; the other double-forks a daemon under
/// `setsid` with its output closed, and waits until the daemon's pid is written. Each
/// writes its daemon's pid to a file.
const WORKFLOW: &str = r#"name = "daemons"
[stages.setsid]
kind = "command"
argv = ["sh", "-c", "setsid sleep 300 & echo $! > setsid.pid; echo started"]
[stages.double]
kind = "command"
argv = ["sh", "-c", "setsid sh -c 'sleep 300 & echo $! > double.pid' >/dev/null 2>&1 </dev/null & while [ ! -s double.pid ]; do sleep 0.05; done; echo started"]
"#;

#[test]
fn setsid_daemons_do_not_outlive_the_run() {
    let p = Project::new();
    p.workflow("w.toml", WORKFLOW);
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = out.json["run"].as_str().unwrap().to_string();
    let pids: Vec<i32> = ["setsid.pid", "double.pid"]
        .iter()
        .map(|f| p.read(f).trim().parse().unwrap())
        .collect();
    // Checked as soon as `run` returned: the run waits until they are gone.
    let survivors: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|&pid| common::alive(pid))
        .collect();
    let tagged = processes_with_env("RALPH_FLOW_RUN", &run);
    for &pid in survivors.iter().chain(&tagged) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        survivors.is_empty(),
        "daemons {survivors:?} (of {pids:?}) outlived the run"
    );
    assert!(
        tagged.is_empty(),
        "processes {tagged:?} still carry RALPH_FLOW_RUN={run}"
    );
}

/// A run stopped with SIGTERM while its stage's daemon runs: the daemon, outside the stage's
/// group, is stopped before the run ends, as the group is.
#[test]
fn an_interrupted_run_stops_the_daemons_of_its_running_stage() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "interrupted"
[stages.work]
kind = "command"
argv = ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 </dev/null & echo $! > daemon.pid; sleep 300"]
"#,
    );
    let child = p.spawn(&["run", "w.toml"]);
    let file = p.dir().join("daemon.pid");
    p.wait_for(|| std::fs::read_to_string(&file).is_ok_and(|t| t.ends_with('\n')));
    let pid: i32 = p.read("daemon.pid").trim().parse().unwrap();
    // The daemon has left the stage's session before the run is told to stop.
    p.wait_for(|| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    });
    child.signal(nix::sys::signal::Signal::SIGTERM);
    let out = child.finish();
    assert_eq!(out.code, 143, "{}", out.stderr);
    let alive = common::alive(pid);
    if alive {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(!alive, "the daemon {pid} outlived the interrupted run");
}

//! Work that no live worker can take is named (tests/pg, with real workers): `status`,
//! `runs` and the monitor's API say which labels no live worker has, and the last worker seen
//! that had them, for a run queued with `--labels` and for a stage with `labels = [...]`
//! whose unit waits.
#![allow(clippy::unwrap_used)]

mod common;
mod monitor_support;
mod pg;

use std::time::{Duration, Instant};

use common::{Project, Running};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Kills a background process when the test ends, passed or not.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

const QUICK: &str = r#"name = "quick"

[stages.hello]
kind = "command"
argv = ["true"]
"#;

const TPU: &str = r#"name = "tpu"

[stages.train]
kind = "command"
labels = ["tpu"]
argv = ["true"]
"#;

/// A worker on `url` with `labels`, a state directory of its own and a short poll.
fn worker(p: &Project, url: &str, dir: &str, labels: &str) -> Running {
    let mut args = vec![
        "worker",
        "--store",
        url,
        "--state-dir",
        dir,
        "--poll",
        "300ms",
    ];
    if !labels.is_empty() {
        args.extend(["--labels", labels]);
    }
    p.spawn_env(&args, &[("RALPH_FLOW_LEASE", "3s")])
}

/// `status RUN` once it holds `text` (up to 20 s).
fn status_saying(p: &Project, url: &str, id: &str, text: &str) -> String {
    let t = Instant::now();
    loop {
        let out = p.run(&["status", id, "--store", url]);
        if out.stdout.contains(text) {
            return out.stdout;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "status never said {text:?}:\n{}{}",
            out.stdout,
            out.stderr
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_run_queued_with_labels_no_live_worker_has_says_so() {
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new();
    p.workflow("wf.toml", QUICK);
    // A worker with `arm` comes and goes before anything is queued; one without stays.
    let gone = worker(&p, &url, "w-arm", "arm");
    let _g1 = KillOnDrop(gone.pid());
    let gone_pid = gone.pid();
    std::thread::sleep(Duration::from_millis(800));
    gone.signal(Signal::SIGTERM);
    assert_eq!(gone.finish().code, 0);
    let live = worker(&p, &url, "w-x86", "x86");
    let _g2 = KillOnDrop(live.pid());

    let out = p.run(&[
        "run", "wf.toml", "--detach", "--labels", "arm", "--store", &url,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let arm = out.stdout.trim().to_string();
    let text = status_saying(&p, &url, &arm, "queued: no live worker has the label `arm`");
    assert!(
        text.contains(&format!(":{gone_pid} ")) && text.contains("ago)"),
        "the last worker seen with `arm`: {text}"
    );
    let out = p.run(&[
        "run", "wf.toml", "--detach", "--labels", "tpu", "--store", &url,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let tpu = out.stdout.trim().to_string();
    status_saying(
        &p,
        &url,
        &tpu,
        "queued: no live worker has the label `tpu` (never seen)",
    );
    // `runs` says it too, and its JSON names the labels missing.
    let out = p.run(&["runs", "--store", &url]);
    let row = out.stdout.lines().find(|l| l.contains(&tpu)).unwrap();
    assert!(
        row.contains("queued (no live worker has the label `tpu`"),
        "{row}"
    );
    let out = p.run(&["runs", "--json", "--store", &url]);
    let runs = out.json.as_array().unwrap();
    let r = runs.iter().find(|r| r["id"] == tpu.as_str()).unwrap();
    assert_eq!(r["unplaced"][0]["missing"][0], "tpu", "{r}");
    assert!(r["unplaced"][0]["last_seen"].is_null(), "{r}");
    // The monitor says it in the run's state.
    let monitor = monitor_support::Server::start(p.dir(), &[("RALPH_FLOW_STORE", &url)]);
    let summary = &monitor.json(&format!("/api/runs/{tpu}"))["summary"];
    assert_eq!(
        summary["state_text"], "queued: no live worker has the label `tpu` (never seen)",
        "{summary}"
    );
    let listed = monitor.json("/api/runs");
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == arm.as_str())
        .unwrap();
    assert!(
        row["state_text"]
            .as_str()
            .unwrap()
            .starts_with("queued: no live worker has the label `arm` (last seen: worker "),
        "{row}"
    );
    drop(monitor);
    // A run the live worker can take is not named: it finishes.
    let out = p.run(&[
        "run", "wf.toml", "--detach", "--labels", "x86", "--store", &url,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let x86 = out.stdout.trim().to_string();
    let t = Instant::now();
    loop {
        let out = p.run(&["status", &x86, "--store", &url, "--json"]);
        assert!(out.json.get("unplaced").is_none(), "{}", out.stdout);
        if out.json["status"] == "finished" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{}", out.stdout);
        std::thread::sleep(Duration::from_millis(100));
    }
    // Once a worker with `tpu` comes, it takes its run.
    let tpu_worker = worker(&p, &url, "w-tpu", "tpu");
    let _g3 = KillOnDrop(tpu_worker.pid());
    let t = Instant::now();
    while p.run(&["status", &tpu, "--store", &url, "--json"]).json["status"] != "finished" {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the tpu run never ran"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for w in [live, tpu_worker] {
        w.signal(Signal::SIGTERM);
        w.finish();
    }
}

#[test]
fn a_stage_whose_labels_no_live_worker_has_says_so() {
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new();
    p.workflow("wf.toml", TPU);
    let w = worker(&p, &url, "w", "");
    let _g = KillOnDrop(w.pid());
    let out = p.run(&["run", "wf.toml", "--detach", "--store", &url]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let id = out.stdout.trim().to_string();
    let text = status_saying(
        &p,
        &url,
        &id,
        "stage train waits for a worker: no live worker has the label `tpu` (never seen)",
    );
    assert!(text.contains("status: running"), "{text}");
    let out = p.run(&["status", &id, "--store", &url, "--json"]);
    assert_eq!(out.json["unplaced"][0]["stage"], "train", "{}", out.stdout);
    // The run is cancelled: its waiting unit is withdrawn with it.
    let out = p.run(&["cancel", &id, "--store", &url, "--reason", "no tpu here"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let t = Instant::now();
    loop {
        let out = p.run(&["status", &id, "--store", &url, "--json"]);
        if out.json["status"] == "cancelled" && out.json["lock"].is_null() {
            assert!(out.json.get("unplaced").is_none(), "{}", out.stdout);
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{}", out.stdout);
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let left: i64 = c
        .query_one(
            "SELECT count(*) FROM units WHERE run = $1 AND state IN ('queued', 'running')",
            &[&id],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the cancelled run's unit still waits");
    w.signal(Signal::SIGTERM);
    w.finish();
}

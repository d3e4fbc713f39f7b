//! `ralph-flow cancel` on both stores, end to end with the real binary: a running run's
//! stages (and their descendants) are stopped and it ends with exit code 125, saying why; a
//! waiting run's gates are withdrawn (`approve` says it was cancelled); a queued run is
//! never claimed by a worker; a finished or cancelled run is refused; `resume` refuses a
//! cancelled run; the cancel is in `status`, `logs`, `logs --json` and `runs`. The
//! monitor's Cancel run button and API route follow the CSRF rules of its gate buttons.
#![allow(clippy::unwrap_used)]

mod common;
mod monitor_support;
mod pg;

use std::time::{Duration, Instant};

use common::{Out, Project, alive};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A command stage that records its shell's pid and a child's, then waits 30 s on the
/// child: both must be gone soon after a cancel.
const SLOW: &str = r#"name = "slow"

[stages.work]
kind = "command"
argv = ["sh", "-c", "sleep 30 & echo $! > child.pid; echo $$ > work.pid; wait"]
"#;

/// A gate and nothing else: `run --no-wait` stops on it with 75.
const GATED: &str = r#"name = "gated"

[stages.go_ahead]
kind = "gate"
message = "Go on?"
timeout = "1h"
on_timeout = "reject"
"#;

const QUICK: &str = r#"name = "quick"

[stages.hello]
kind = "command"
argv = ["true"]
"#;

/// Kills a background process when the test ends, passed or not.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

/// Waits up to `limit` for `f`.
fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid written in a file of the project, once there is one.
fn pid_in(p: &Project, file: &str) -> i32 {
    let mut pid = 0;
    wait_until(Duration::from_secs(30), file, || {
        pid = p.read(file).trim().parse().unwrap_or(0);
        pid > 0
    });
    pid
}

/// `args` with `--store URL` when there is one.
fn with_store<'a>(args: &[&'a str], store: Option<&'a str>) -> Vec<&'a str> {
    let mut v = args.to_vec();
    if let Some(url) = store {
        v.extend(["--store", url]);
    }
    v
}

/// The run's status as `status --json` says it.
fn status_json(p: &Project, id: &str, store: Option<&str>) -> serde_json::Value {
    let out = p.run(&with_store(&["status", id, "--json"], store));
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.json
}

/// Checks what every command says of a cancelled run: `status` (text and JSON), `runs`,
/// `logs` (text and JSON), and that `resume` and a second cancel are refused.
fn shows_cancelled(p: &Project, id: &str, store: Option<&str>, reason: &str) {
    let json = status_json(p, id, store);
    assert_eq!(json["status"], "cancelled", "{json}");
    assert_eq!(json["options"]["cancelled"]["reason"], reason, "{json}");
    assert_eq!(json["options"]["cancelled"]["by"], "ana", "{json}");
    let out = p.run(&with_store(&["status", id], store));
    assert!(out.stdout.contains("status: cancelled"), "{}", out.stdout);
    assert!(
        out.stdout.contains("cancelled by ana at ") && out.stdout.contains(reason),
        "{}",
        out.stdout
    );
    let out = p.run(&with_store(&["runs"], store));
    let row = out.stdout.lines().find(|l| l.contains(id)).unwrap();
    assert!(row.contains("cancelled"), "{}", out.stdout);
    let out = p.run(&with_store(&["logs", id], store));
    assert!(
        out.stdout.contains("cancelled by ana") && out.stdout.contains(reason),
        "{}",
        out.stdout
    );
    let out = p.run(&with_store(&["logs", id, "--json"], store));
    let events = out.json["events"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "cancelled" && e["message"].as_str().unwrap().contains(reason)),
        "{}",
        out.stdout
    );
    let out = p.run(&with_store(&["resume", id], store));
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("was cancelled by ana") && out.stderr.contains(reason),
        "resume says who cancelled it and why: {}",
        out.stderr
    );
    let out = p.run(&with_store(&["cancel", id, "--by", "bo"], store));
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("was cancelled already by ana"),
        "{}",
        out.stderr
    );
}

/// Cancels a running `run` (in the foreground, in another process): its stage's shell and
/// the child it waits on are stopped within a few seconds, and `run` ends with 125 saying
/// why.
fn cancel_running(store: Option<&str>) {
    let p = Project::new();
    p.workflow("wf.toml", SLOW);
    let run = p.spawn(&with_store(&["run", "wf.toml"], store));
    let _guard = KillOnDrop(run.pid());
    let (shell, child) = (pid_in(&p, "work.pid"), pid_in(&p, "child.pid"));
    let _shell_guard = KillOnDrop(shell);
    let _child_guard = KillOnDrop(child);
    let id = p.run(&with_store(&["runs", "--json"], store)).json[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let t = Instant::now();
    let out = p.run(&with_store(
        &["cancel", &id, "--reason", "too slow", "--by", "ana"],
        store,
    ));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("cancelled run {id} as ana")),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("stops its stages"), "{}", out.stderr);
    let ended: Out = run.finish();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the run ended {:?} after the cancel",
        t.elapsed()
    );
    assert_eq!(ended.code, 125, "{}", ended.stderr);
    assert!(
        ended
            .stderr
            .contains(&format!("run {id} was cancelled: too slow")),
        "{}",
        ended.stderr
    );
    wait_until(
        Duration::from_secs(5),
        "the stage's programs to end",
        || !alive(shell) && !alive(child),
    );
    shows_cancelled(&p, &id, store, "too slow");
    // The run's end is in its log, as its executor wrote it.
    let logs = p.run(&with_store(&["logs", &id], store)).stdout;
    assert!(logs.contains("the run was cancelled by ana"), "{logs}");
}

/// Cancels a run that waits on a gate (`--no-wait`): the gate is withdrawn, and `approve`
/// says the run was cancelled.
fn cancel_waiting(store: Option<&str>) {
    let p = Project::new();
    p.workflow("wf.toml", GATED);
    let out = p.run(&with_store(&["run", "wf.toml", "--no-wait"], store));
    assert_eq!(out.code, 75, "{}", out.stderr);
    let id = p.run(&with_store(&["runs", "--json"], store)).json[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(status_json(&p, &id, store)["status"], "waiting");
    let out = p.run(&with_store(
        &["cancel", &id, "--reason", "not needed", "--by", "ana"],
        store,
    ));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("it was waiting on go_ahead"),
        "{}",
        out.stderr
    );
    let json = status_json(&p, &id, store);
    assert_eq!(json["pending_gates"].as_array().unwrap().len(), 0, "{json}");
    let out = p.run(&with_store(&["approve", &id, "go_ahead"], store));
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("run `{id}` was cancelled by ana"))
            && out.stderr.contains("not needed"),
        "{}",
        out.stderr
    );
    shows_cancelled(&p, &id, store, "not needed");
}

/// A finished run cannot be cancelled: exit 3, saying it finished.
fn cancel_finished(store: Option<&str>) {
    let p = Project::new();
    p.workflow("wf.toml", QUICK);
    let out = p.run(&with_store(&["run", "wf.toml"], store));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let id = p.run(&with_store(&["runs", "--json"], store)).json[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = p.run(&with_store(&["cancel", &id], store));
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("has already finished with `success` (0)")
            && out.stderr.contains("nothing to cancel"),
        "{}",
        out.stderr
    );
    assert_eq!(status_json(&p, &id, store)["status"], "finished");
    let out = p.run(&with_store(&["cancel", "no-such-run"], store));
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("there is no run `no-such-run`"),
        "{}",
        out.stderr
    );
}

#[test]
fn cancelling_a_running_run_stops_its_stages_and_ends_it_with_125() {
    cancel_running(None);
}

#[test]
fn cancelling_a_waiting_run_withdraws_its_gates() {
    cancel_waiting(None);
}

#[test]
fn a_finished_run_cannot_be_cancelled() {
    cancel_finished(None);
}

#[test]
fn cancelling_a_running_run_on_postgres_stops_it() {
    let Some(url) = pg::database() else {
        return;
    };
    cancel_running(Some(&url));
}

#[test]
fn cancelling_a_waiting_run_on_postgres_withdraws_its_gates() {
    let Some(url) = pg::database() else {
        return;
    };
    cancel_waiting(Some(&url));
}

#[test]
fn a_finished_run_on_postgres_cannot_be_cancelled() {
    let Some(url) = pg::database() else {
        return;
    };
    cancel_finished(Some(&url));
}

/// Starts a worker on `url` with a state directory of its own, a short lease and poll; its
/// output goes to `worker.log`.
fn worker(p: &Project, url: &str) -> common::Running {
    p.spawn_env(
        &[
            "worker",
            "--store",
            url,
            "--state-dir",
            "worker",
            "--poll",
            "300ms",
        ],
        &[("RALPH_FLOW_LEASE", "3s")],
    )
}

/// Queues the `SLOW` workflow on the store at `url` for a worker: the run's id.
fn queue_slow(p: &Project, url: &str) -> String {
    p.workflow("wf.toml", SLOW);
    let out = p.run(&["run", "wf.toml", "--detach", "--store", url]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.stdout.trim().to_string()
}

#[test]
fn a_cancelled_queued_run_is_never_claimed() {
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new();
    let id = queue_slow(&p, &url);
    let out = p.run(&[
        "cancel",
        &id,
        "--store",
        &url,
        "--reason",
        "wrong branch",
        "--by",
        "ana",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("it was queued: no worker takes it now"),
        "{}",
        out.stderr
    );
    // A worker comes; it never takes the run, though it takes a run queued after it.
    let w = worker(&p, &url);
    let _guard = KillOnDrop(w.pid());
    std::thread::sleep(Duration::from_secs(3));
    p.workflow("quick.toml", QUICK);
    let out = p.run(&["run", "quick.toml", "--detach", "--store", &url]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let quick = out.stdout.trim().to_string();
    wait_until(
        Duration::from_secs(20),
        "the worker to run a live run",
        || status_json(&p, &quick, Some(&url))["status"] == "finished",
    );
    assert!(
        !p.dir().join("work.pid").exists(),
        "the cancelled run's stage ran"
    );
    assert_eq!(status_json(&p, &id, Some(&url))["status"], "cancelled");
    w.signal(Signal::SIGTERM);
    let out = w.finish();
    assert_eq!(out.code, 0, "the worker stopped as told: {}", out.stderr);
    assert!(
        !out.stderr.contains(&id),
        "the worker took it: {}",
        out.stderr
    );
    shows_cancelled(&p, &id, Some(&url), "wrong branch");
}

/// A run on a worker: its coordinator reads the cancel, its unit's program (run by the
/// worker) is stopped, and the run is left cancelled and unlocked.
#[test]
fn cancelling_a_run_on_a_worker_stops_its_units() {
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new();
    let id = queue_slow(&p, &url);
    let w = worker(&p, &url);
    let _guard = KillOnDrop(w.pid());
    let (shell, child) = (pid_in(&p, "work.pid"), pid_in(&p, "child.pid"));
    let _shell_guard = KillOnDrop(shell);
    let _child_guard = KillOnDrop(child);
    let out = p.run(&[
        "cancel", &id, "--store", &url, "--reason", "too slow", "--by", "ana",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("stops its stages"), "{}", out.stderr);
    wait_until(
        Duration::from_secs(10),
        "the unit's programs to end",
        || !alive(shell) && !alive(child),
    );
    let store = ralph_flow::store::postgres::PgStore::connect(&url).unwrap();
    use ralph_flow::store::Store;
    wait_until(Duration::from_secs(10), "the coordinator to let go", || {
        store.lock_holder(&id).unwrap().is_none()
    });
    shows_cancelled(&p, &id, Some(&url), "too slow");
    let logs = p.run(&["logs", &id, "--store", &url]).stdout;
    assert!(logs.contains("the run was cancelled by ana"), "{logs}");
    w.signal(Signal::SIGTERM);
    let out = w.finish();
    assert!(
        out.stderr.contains(&format!("run {id} was cancelled")),
        "{}",
        out.stderr
    );
}

/// The monitor's Cancel run button needs the page's CSRF token (as its gate buttons do),
/// and writes what `ralph-flow cancel` writes; the API route needs the token or the header.
#[test]
fn the_monitor_cancels_a_run_behind_its_csrf_rules() {
    use monitor_support::{Checkout, Server};
    let c = Checkout::new();
    let (code, _, err) = c.run(&Checkout::spider_args(&["--no-wait"]));
    assert_eq!(code, 75, "{err}");
    let id = c.newest_run();
    let s = Server::start(c.path(), &[]);
    let cookie = format!("ralph_flow_token={}", s.token);
    let page = s.get_with_cookie(&format!("/runs/{id}"));
    assert!(page.body.contains("Cancel run"), "{}", page.body);
    assert!(page.body.contains(&format!("/runs/{id}/cancel")));
    let at = page.body.find(r#"name="csrf" value=""#).unwrap() + 19;
    let csrf = page.body[at..].split('"').next().unwrap().to_string();
    let post = |body: &str, extra: &[(&str, &str)]| {
        let mut h = vec![
            ("Cookie", cookie.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ];
        h.extend_from_slice(extra);
        s.request("POST", &format!("/runs/{id}/cancel"), &h, body)
    };
    assert_eq!(post("reason=x", &[]).status, 403, "no CSRF token");
    assert_eq!(post("reason=x&csrf=0000", &[]).status, 403, "a wrong one");
    assert_eq!(
        post(
            &format!("reason=x&csrf={csrf}"),
            &[("Origin", "http://evil.example")]
        )
        .status,
        403,
        "another site"
    );
    assert_eq!(
        s.json(&format!("/api/runs/{id}"))["summary"]["state"],
        "waiting"
    );
    let ok = post(
        &format!("reason=spec+is+wrong&csrf={csrf}"),
        &[("Origin", &s.base.clone())],
    );
    assert_eq!(ok.status, 303, "{}", ok.body);
    // The redirect names the monitor's own message; the page it leads to shows it.
    let location = ok.header("location").unwrap().to_string();
    let shown = s.get_with_cookie(&location);
    assert!(
        shown.body.contains(r#"id="flash">Cancelled run"#),
        "{location}: {}",
        shown.body
    );
    let summary = &s.json(&format!("/api/runs/{id}"))["summary"];
    assert_eq!(summary["state"], "cancelled", "{summary}");
    assert!(
        summary["state_text"]
            .as_str()
            .unwrap()
            .contains("spec is wrong"),
        "{summary}"
    );
    let page = s.get_with_cookie(&format!("/runs/{id}"));
    assert!(
        !page.body.contains("Cancel run"),
        "no button on a cancelled run"
    );
    let (_, logs, _) = c.run(&["logs", &id]);
    assert!(
        logs.contains("@monitor") && logs.contains("spec is wrong"),
        "{logs}"
    );
    let (code, _, err) = c.run(&["approve", &id, "approve_spec"]);
    assert_eq!(code, 3);
    assert!(err.contains("was cancelled"), "{err}");

    // The API: with the cookie it needs the header; with the bearer token it does not.
    let (code, _, err) = c.run(&Checkout::spider_args(&["--no-wait"]));
    assert_eq!(code, 75, "{err}");
    let second = c.new_run(&[&id]);
    let path = format!("/api/runs/{second}/cancel");
    let r = s.request(
        "POST",
        &path,
        &[("Cookie", &cookie), ("Content-Type", "application/json")],
        "{}",
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let auth = format!("Bearer {}", s.token);
    let api = |body: &str| {
        s.request(
            "POST",
            &path,
            &[
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/json"),
            ],
            body,
        )
    };
    let r = api(r#"{"reason": "duplicate", "by": "ana"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    let done: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(done["was"], "waiting", "{done}");
    assert_eq!(done["cancellation"]["by"], "ana", "{done}");
    let r = api("{}");
    assert_eq!(r.status, 409, "cancelled already: {}", r.body);
    assert!(r.body.contains("cancelled already"), "{}", r.body);
}

/// A run that polls its gate in the foreground (without `--no-wait`) is running: its
/// executor reads the cancel and ends with 125, and the gate is withdrawn.
#[test]
fn cancelling_a_run_that_polls_its_gate_ends_it() {
    let p = Project::new();
    p.workflow("wf.toml", GATED);
    let run = p.spawn(&["run", "wf.toml"]);
    let _guard = KillOnDrop(run.pid());
    let id = p.wait_for_run();
    wait_until(Duration::from_secs(30), "the gate to wait", || {
        status_json(&p, &id, None)["pending_gates"]
            .as_array()
            .is_some_and(|g| g.len() == 1)
    });
    let out = p.run(&["cancel", &id, "--reason", "not needed", "--by", "ana"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let ended = run.finish();
    assert_eq!(ended.code, 125, "{}", ended.stderr);
    assert!(
        ended
            .stderr
            .contains(&format!("run {id} was cancelled: not needed")),
        "{}",
        ended.stderr
    );
    let out = p.run(&["approve", &id, "go_ahead"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("was cancelled by ana"),
        "{}",
        out.stderr
    );
    shows_cancelled(&p, &id, None, "not needed");
}

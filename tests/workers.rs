//! Many workers on one PostgreSQL store (tests/pg): `run --detach` queues runs and
//! `ralph-flow worker` processes, each with a state directory of its own, carry them out.
//! Every stage is a command that appends `start`/`end` lines (run, stage, worker pid, time)
//! to a log, so the tests count executions and check that no two overlap.
//!
//! - 1, 2, 4 and 8 workers finish 16 runs, each run and stage once, 8 much faster than 1;
//! - workers killed with SIGKILL in the middle of stages, 20 times: every run finishes,
//!   every stage settles once, an interrupted stage runs again (twice at most here), and no
//!   two executions of a stage overlap;
//! - a run that waits on a gate is released, approved from another process, and carried on
//!   by a worker.
#![allow(clippy::unwrap_used)]

mod pg;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ralph_flow::store::postgres::PgStore;
use ralph_flow::store::{RunStatus, Store};

/// The tests here measure time and kill processes: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ralph-flow")
}

/// A stage that logs its start, sleeps, and logs its end (a fixed script; the values come
/// as arguments).
fn stage(name: &str, needs: &[&str], sleep: &str) -> String {
    let needs = if needs.is_empty() {
        String::new()
    } else {
        format!(
            "needs = [{}]\n",
            needs
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    format!(
        r#"
[stages.{name}]
kind = "command"
{needs}argv = ["sh", "-c", "echo \"start $1 $2 $PPID $(date +%s%N)\" >> \"$3\"; sleep $4; echo \"end $1 $2 $PPID $(date +%s%N)\" >> \"$3\"", "sh", "{{{{ run.id }}}}", "{name}", "{{{{ params.log }}}}", "{sleep}"]
"#
    )
}

fn workflow(stages: &[String]) -> String {
    format!(
        "name = \"sleepy\"\n\n[params.log]\ntype = \"string\"\n{}",
        stages.concat()
    )
}

struct Project {
    dir: tempfile::TempDir,
    url: String,
    /// The workers started, killed when the project goes (a test that fails half-way
    /// leaves none running).
    started: std::cell::RefCell<Vec<u32>>,
}

impl Drop for Project {
    fn drop(&mut self) {
        let dir = self.dir.path().to_string_lossy().into_owned();
        for pid in self.started.borrow().iter() {
            // Only a worker of this project still running (a pid may have been reused).
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if !String::from_utf8_lossy(&cmdline).contains(&dir) {
                continue;
            }
            if let Ok(pid) = i32::try_from(*pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

impl Project {
    fn new(url: String, workflow: &str) -> Project {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("wf.toml"), workflow).unwrap();
        Project {
            dir,
            url,
            started: std::cell::RefCell::default(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> PathBuf {
        self.path().join("stages.log")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args)
            .current_dir(self.path())
            .env("RALPH_FLOW_STORE", &self.url)
            .env_remove("RALPH_FLOW_LEASE")
            .stdin(Stdio::null());
        c
    }

    /// Queues a run with `run --detach`; returns its id.
    fn detach(&self) -> String {
        let log = format!("log={}", self.log().display());
        let out = self
            .command(&["run", "wf.toml", "--detach", "--set", &log])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(err.contains("queued run"), "{err}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Starts a worker with a state directory of its own (`workers/N`); its output goes to
    /// `workers/N.log`.
    fn worker(&self, n: usize, lease: &str, extra: &[&str]) -> Child {
        let state = self.path().join(format!("workers/{n}"));
        std::fs::create_dir_all(&state).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path().join(format!("workers/{n}.log")))
            .unwrap();
        let mut c = self.command(&["worker", "--poll", "500ms"]);
        // Elsewhere than the submitter: the worker reads the workflow from the store.
        c.current_dir(&state)
            .arg("--state-dir")
            .arg(&state)
            .args(extra)
            .env("RALPH_FLOW_LEASE", lease)
            .stdout(Stdio::null())
            .stderr(log);
        let child = c.spawn().unwrap();
        self.started.borrow_mut().push(child.id());
        child
    }

    fn worker_logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.path().join("workers"))
            .unwrap()
            .flatten()
        {
            if e.path().extension().is_some_and(|x| x == "log") {
                out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        out
    }

    fn store(&self) -> PgStore {
        PgStore::connect(&self.url).unwrap()
    }

    /// Waits until every run in `ids` is finished (or the time is up, failing with the
    /// workers' output).
    fn wait_finished(&self, ids: &[String], limit: Duration) {
        let store = self.store();
        let t = Instant::now();
        loop {
            let left = ids
                .iter()
                .filter(|id| store.run(id).unwrap().map(|r| r.status) != Some(RunStatus::Finished))
                .count();
            if left == 0 {
                return;
            }
            assert!(
                t.elapsed() < limit,
                "{left} runs unfinished after {limit:?}; workers said:\n{}",
                self.worker_logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The executions in the log: (run, stage) -> [(pid, start ns, end ns if it ended)].
    fn executions(&self) -> BTreeMap<(String, String), Vec<Execution>> {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let mut out: BTreeMap<(String, String), Vec<Execution>> = BTreeMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [what, run, stage, pid, at] = f[..] else {
                panic!("a torn log line: {line:?}");
            };
            let (pid, at): (i32, u128) = (pid.parse().unwrap(), at.parse().unwrap());
            let list = out.entry((run.into(), stage.into())).or_default();
            match what {
                "start" => list.push(Execution {
                    pid,
                    start: at,
                    end: None,
                }),
                "end" => {
                    let e = list
                        .iter_mut()
                        .rev()
                        .find(|e| e.pid == pid && e.end.is_none())
                        .unwrap();
                    e.end = Some(at);
                }
                other => panic!("{other}"),
            }
        }
        out
    }

    /// Every run finished with `success`, each stage settled (and said done) once.
    fn assert_settled_once(&self, ids: &[String], stages: &[&str]) {
        let store = self.store();
        for id in ids {
            let run = store.run(id).unwrap().unwrap();
            assert_eq!(
                run.exit,
                Some(("success".into(), 0)),
                "{id}: {:#?}\nworkers said:\n{}",
                store
                    .events(id, None)
                    .unwrap()
                    .iter()
                    .map(|e| format!("{} {} {}: {}", e.scope, e.node, e.kind, e.message))
                    .collect::<Vec<_>>(),
                self.worker_logs()
            );
            let nodes = store.nodes(id).unwrap();
            let names: Vec<&str> = nodes.iter().map(|n| n.node.as_str()).collect();
            assert_eq!(names, stages, "{id}");
            let events = store.events(id, None).unwrap();
            for s in stages {
                let done = events
                    .iter()
                    .filter(|e| e.node == *s && e.kind == "done")
                    .count();
                assert_eq!(done, 1, "{id} {s}: {events:#?}");
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Execution {
    pid: i32,
    start: u128,
    end: Option<u128>,
}

fn stop(mut workers: Vec<Child>) {
    for w in &workers {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(w.id()).unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
    for w in &mut workers {
        let status = w.wait().unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "a worker stopped by SIGTERM exits 0"
        );
    }
}

#[test]
fn more_workers_finish_sleep_bound_runs_faster_and_each_run_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new(
        url,
        &workflow(&[stage("a", &[], "0.5"), stage("b", &["a"], "0")]),
    );
    let mut times = Vec::new();
    let mut all = Vec::new();
    for workers in [1, 2, 4, 8] {
        let ids: Vec<String> = (0..16).map(|_| p.detach()).collect();
        let t = Instant::now();
        let pool: Vec<Child> = (0..workers)
            .map(|n| p.worker(all.len() * 10 + n, "30s", &[]))
            .collect();
        p.wait_finished(&ids, Duration::from_secs(90));
        let took = t.elapsed();
        stop(pool);
        eprintln!("{workers} workers: 16 runs in {took:?}");
        times.push(took);
        all.extend(ids);
    }
    p.assert_settled_once(&all, &["a", "b"]);
    let runs = p.executions();
    assert_eq!(runs.len(), all.len() * 2);
    for ((run, stage), list) in &runs {
        assert_eq!(list.len(), 1, "{run} {stage} ran {} times", list.len());
    }
    // Sleep-bound work scales with the workers whatever the cores: loose, for CI.
    assert!(
        times[3] * 3 < times[0],
        "8 workers took {:?}, 1 worker {:?}",
        times[3],
        times[0]
    );
    assert!(times[1] < times[0], "{times:?}");
}

#[test]
fn workers_killed_in_the_middle_of_stages_lose_no_run_and_repeat_only_what_was_cut() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new(
        url,
        &workflow(&[
            stage("a", &[], "0.3"),
            stage("b", &["a"], "0.3"),
            stage("c", &["b"], "0.3"),
        ]),
    );
    let ids: Vec<String> = (0..10).map(|_| p.detach()).collect();
    // Long enough that only a kill lets a lease expire: on a loaded machine (CI, 2 cores) a
    // live worker once went 2 s without renewing, and its stage ran again uncut.
    let lease = "4s";
    let args = ["--max-concurrency", "2"];
    let mut pool: Vec<Child> = (0..3).map(|n| p.worker(n, lease, &args)).collect();
    let mut kills = 0;
    let mut killed: HashSet<i32> = HashSet::new();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let t = Instant::now();
    while kills < 20 {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "only {kills} kills; workers said:\n{}",
            p.worker_logs()
        );
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(150 + seed % 400));
        // A worker in the middle of a stage that has not been cut before (so that a stage
        // is cut once at most, and runs twice at most).
        let runs = p.executions();
        let victim = pool.iter().position(|w| {
            let pid = i32::try_from(w.id()).unwrap();
            let busy: Vec<_> = runs
                .values()
                .filter(|l| l.iter().any(|e| e.pid == pid && e.end.is_none()))
                .collect();
            !busy.is_empty() && busy.iter().all(|l| l.len() == 1)
        });
        let Some(i) = victim else {
            if ids
                .iter()
                .all(|id| p.store().run(id).unwrap().unwrap().status == RunStatus::Finished)
            {
                // Everything finished before 20 kills: queue more.
                let more: Vec<String> = (0..3).map(|_| p.detach()).collect();
                assert!(!more.is_empty());
            }
            continue;
        };
        let mut w = pool.remove(i);
        killed.insert(i32::try_from(w.id()).unwrap());
        w.kill().unwrap();
        w.wait().unwrap();
        kills += 1;
        pool.push(p.worker(100 + kills, lease, &args));
    }
    let ids: Vec<String> = p
        .store()
        .runs(1000)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    p.wait_finished(&ids, Duration::from_secs(90));
    stop(pool);
    p.assert_settled_once(&ids, &["a", "b", "c"]);
    let runs = p.executions();
    let mut again = 0;
    for ((run, stage), list) in &runs {
        // Only a killed worker's execution is repeated, and (as the victims are chosen) a
        // stage is cut once: it runs twice at most. (Should a worker start a second
        // execution between the choice and the kill, the stage is cut twice, and may run
        // three times.)
        let cut: HashSet<i32> = list[..list.len() - 1].iter().map(|e| e.pid).collect();
        for e in &list[..list.len() - 1] {
            assert!(killed.contains(&e.pid), "{run} {stage}: {list:?}");
        }
        assert!(
            list.len() <= 2 || list.len() <= 1 + cut.len(),
            "{run} {stage} ran {} times: {list:?}",
            list.len()
        );
        again += list.len() - 1;
        // Two executions of a stage never overlap: the second starts after the first's
        // program ended (its worker was killed, the program finished on its own).
        let mut sorted = list.clone();
        sorted.sort_by_key(|e| e.start);
        for pair in sorted.windows(2) {
            let end = pair[0].end.unwrap_or(u128::MAX);
            assert!(end <= pair[1].start, "{run} {stage} overlapped: {sorted:?}");
        }
    }
    assert!(again > 0, "some cut stage ran again");
    eprintln!("20 kills: {again} stages ran again, {} runs", ids.len());
}

#[test]
fn a_waiting_run_is_released_and_carried_on_after_an_approval_elsewhere() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new(
        url,
        &format!(
            "{}\n[stages.ok]\nkind = \"gate\"\nneeds = [\"a\"]\nmessage = \"Go on?\"\n{}",
            workflow(&[stage("a", &[], "0")]),
            stage("b", &["ok"], "0")
        ),
    );
    let id = p.detach();
    let w = p.worker(0, "30s", &[]);
    let store = p.store();
    let t = Instant::now();
    while store.run(&id).unwrap().unwrap().status != RunStatus::Waiting {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", p.worker_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Released: no lease while it waits.
    assert_eq!(store.lock_holder(&id).unwrap(), None);
    let out = p
        .command(&["approve", &id, "ok", "--by", "ana"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("a worker carries it on"), "{err}");
    p.wait_finished(std::slice::from_ref(&id), Duration::from_secs(30));
    stop(vec![w]);
    p.assert_settled_once(std::slice::from_ref(&id), &["a", "ok", "b"]);
    let logs = p.worker_logs();
    assert!(
        logs.contains(&format!("run {id} waits on ok; released")),
        "{logs}"
    );
    assert!(logs.contains(&format!("run {id} ended: success")), "{logs}");
    // `status` shows the run and `runs` lists it, on the shared store.
    let out = p.command(&["runs"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id));
}

#[test]
fn detach_and_worker_refuse_a_store_that_is_not_shared() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("wf.toml"),
        workflow(&[stage("a", &[], "0")]),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(bin())
            .args(args)
            .current_dir(dir.path())
            .env_remove("RALPH_FLOW_STORE")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["run", "wf.toml", "--detach", "--set", "log=x"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("--detach needs a PostgreSQL store"), "{err}");
    let (code, err) = run(&["worker"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("a worker needs a PostgreSQL store"), "{err}");
    // A broken workflow is reported at once, with its place, and nothing is queued.
    std::fs::write(
        dir.path().join("bad.toml"),
        "name = \"x\"\n[stages.a]\nkind = \"nope\"\n",
    )
    .unwrap();
    let (code, err) = run(&["run", "bad.toml", "--detach"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("bad.toml:3:"), "{err}");
}

#[test]
fn a_run_queued_from_a_git_checkout_runs_in_a_clone_at_its_commit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new(
        url,
        "name = \"where\"\n\n[stages.where]\nkind = \"command\"\n\
         argv = [\"sh\", \"-c\", \"pwd > where.txt; git rev-parse --abbrev-ref HEAD >> where.txt; cat marker.txt >> where.txt\"]\n",
    );
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
            .args(args)
            .current_dir(p.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    git(&["init", "-q", "-b", "main"]);
    std::fs::write(p.path().join(".gitignore"), "workers/\n").unwrap();
    std::fs::write(p.path().join("marker.txt"), "committed\n").unwrap();
    git(&["add", "-A"]);
    git(&["commit", "-qm", "one"]);
    let head = git(&["rev-parse", "HEAD"]);
    // A change after the commit is not what the run sees.
    std::fs::write(p.path().join("marker.txt"), "uncommitted\n").unwrap();
    let out = p
        .command(&["run", "wf.toml", "--detach", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["run"]
        .as_str()
        .unwrap()
        .to_string();
    let run = p.store().run(&id).unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.options["workspace"]["git"]["commit"], head.as_str());
    let w = p.worker(0, "30s", &[]);
    p.wait_finished(std::slice::from_ref(&id), Duration::from_secs(30));
    stop(vec![w]);
    // The stage's program ran as a unit of work in the worker's clone for units, on the
    // run's branch at the queued commit; the file it left was published and restored into
    // the run's own clone.
    let workspace = p.path().join(format!("workers/0/workspaces/{id}"));
    let said = std::fs::read_to_string(workspace.join("where.txt")).unwrap();
    let units = std::fs::canonicalize(p.path().join("workers/0/units/clones")).unwrap();
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 3, "{said}");
    assert!(Path::new(lines[0]).starts_with(&units), "{said}");
    assert_eq!(
        lines[1..],
        [format!("ralph-flow/{id}").as_str(), "committed"],
        "{said}"
    );
    assert!(!p.path().join("where.txt").exists());
}

#[test]
fn labels_choose_the_worker_and_a_stopped_worker_hands_its_run_back() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new(url, &workflow(&[stage("slow", &[], "3")]));
    let log = format!("log={}", p.log().display());
    let out = p
        .command(&[
            "run", "wf.toml", "--detach", "--labels", "gpu", "--set", &log,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = p.command(&["status", &id]).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("queued"), "{shown}");
    // A worker without the label leaves it queued.
    let plain = p.worker(0, "30s", &[]);
    std::thread::sleep(Duration::from_millis(1500));
    let store = p.store();
    assert_eq!(store.run(&id).unwrap().unwrap().status, RunStatus::Queued);
    // One with it (and more) claims it; SIGTERM in the middle of the stage hands it back.
    let gpu = p.worker(1, "30s", &["--labels", "linux,gpu"]);
    let t = Instant::now();
    while !p
        .executions()
        .values()
        .any(|l| l.iter().any(|e| e.end.is_none()))
    {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", p.worker_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = Instant::now();
    stop(vec![gpu]);
    assert!(t.elapsed() < Duration::from_secs(3), "stopped at once");
    assert_eq!(store.run(&id).unwrap().unwrap().status, RunStatus::Queued);
    assert_eq!(store.lock_holder(&id).unwrap(), None);
    let logs = p.worker_logs();
    assert!(
        logs.contains(&format!("run {id} stopped and handed back to the queue")),
        "{logs}"
    );
    // Another worker with the label carries it to its end; the cut stage ran again.
    let again = p.worker(2, "30s", &["--labels", "gpu"]);
    p.wait_finished(std::slice::from_ref(&id), Duration::from_secs(30));
    stop(vec![plain, again]);
    p.assert_settled_once(std::slice::from_ref(&id), &["slow"]);
    let runs = p.executions();
    let list = &runs[&(id.clone(), "slow".to_string())];
    assert_eq!(list.len(), 2, "{list:?}");
    assert!(list[0].end.is_none(), "the first was stopped: {list:?}");
}

/// A coordinating worker told to stop hands its run back without cancelling the units that
/// run on other, healthy workers: the next coordinator adopts the unit under way and uses
/// its result, so the stage runs once.
#[test]
fn a_stopped_coordinator_leaves_units_on_other_workers_to_finish() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let slow = stage("slow", &[], "3").replace(
        "kind = \"command\"\n",
        "kind = \"command\"\nlabels = [\"llm\"]\n",
    );
    let p = Project::new(url, &workflow(&[slow, stage("after", &["slow"], "0")]));
    let id = p.detach();
    // The coordinator has no `llm` label: the stage's unit runs on the other worker.
    let coordinator = p.worker(0, "30s", &[]);
    let t = Instant::now();
    while p.store().lock_holder(&id).unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", p.worker_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let llm = p.worker(1, "30s", &["--labels", "llm"]);
    while !p
        .executions()
        .values()
        .any(|l| l.iter().any(|e| e.end.is_none()))
    {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", p.worker_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(vec![coordinator]);
    assert!(
        p.worker_logs()
            .contains(&format!("run {id} stopped and handed back to the queue")),
        "{}",
        p.worker_logs()
    );
    // The worker with the label takes the run over and adopts its own unit under way.
    p.wait_finished(std::slice::from_ref(&id), Duration::from_secs(30));
    stop(vec![llm]);
    p.assert_settled_once(std::slice::from_ref(&id), &["slow", "after"]);
    let runs = p.executions();
    let list = &runs[&(id.clone(), "slow".to_string())];
    assert_eq!(
        list.len(),
        1,
        "the unit was not cut and run again: {list:?}"
    );
    assert!(list[0].end.is_some(), "{list:?}");
}

#[test]
fn a_coordinator_whose_lease_is_taken_writes_nothing_more_and_leaves_the_unit_to_its_successor() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new(
        url.clone(),
        &workflow(&[stage("slow", &[], "3"), stage("after", &["slow"], "0")]),
    );
    let id = p.detach();
    let w = p.worker(0, "1500ms", &[]);
    let t = Instant::now();
    while p.executions().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", p.worker_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Another coordinator takes the run over (as if the lease had expired).
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let taken = c
        .execute(
            "UPDATE locks SET holder = 'thief', pid = 1, host = 'elsewhere', \
             expires = expires + 600000 WHERE run = $1",
            &[&id],
        )
        .unwrap();
    assert_eq!(taken, 1);
    let t = Instant::now();
    while !p.worker_logs().contains("no longer holds run") {
        assert!(t.elapsed() < Duration::from_secs(10), "{}", p.worker_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The stage's program is a unit of work, which the run's new holder adopts: it is not
    // stopped with the old coordinator (which could not cancel it any more), it ends, and
    // its result waits in the store for the new holder; the old one settles nothing.
    std::thread::sleep(Duration::from_secs(4));
    let runs = p.executions();
    let list = &runs[&(id.clone(), "slow".to_string())];
    assert_eq!(list.len(), 1);
    assert!(
        list[0].end.is_some(),
        "the program went on to its end: {list:?}"
    );
    let units: Vec<(String, String)> = c
        .query("SELECT key, state FROM units WHERE run = $1", &[&id])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(units.len(), 1, "{units:?}");
    assert!(units[0].0.starts_with("/slow#1.1@"), "{units:?}");
    assert_eq!(units[0].1, "done", "{units:?}");
    let store = p.store();
    assert!(store.nodes(&id).unwrap().is_empty(), "nothing settled");
    let run = store.run(&id).unwrap().unwrap();
    assert_eq!(
        run.status,
        RunStatus::Running,
        "the status is the new holder's"
    );
    assert_eq!(
        store.lock_holder(&id).unwrap().unwrap().holder,
        "thief",
        "the lock is the new holder's"
    );
    stop(vec![w]);
}

/// A run in a git repository, its worker killed with SIGKILL in the middle of its second
/// stage, goes on on another "machine" (a worker with a state directory, so a clone, of its
/// own) from what its first stage left: the commit it made and the file it did not commit,
/// both published to the run's repository before the stage's settlement was committed. The
/// first stage does not run again, and the run's branch is on the repository at the end.
#[test]
fn a_git_run_taken_over_elsewhere_goes_on_from_what_its_settled_stages_left() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    // The scripts are TOML literal strings; the values come as arguments.
    let stage = |name: &str, needs: &str, script: &str| {
        format!(
            "\n[stages.{name}]\nkind = \"command\"\n{needs}argv = [\"sh\", \"-c\", \
             'echo \"start $1 $2 $PPID $(date +%s%N)\" >> \"$3\"; {script}; \
             echo \"end $1 $2 $PPID $(date +%s%N)\" >> \"$3\"', \
             \"sh\", \"{{{{ run.id }}}}\", \"{name}\", \"{{{{ params.log }}}}\"]\n"
        )
    };
    let wf = workflow(&[
        stage(
            "one",
            "",
            "echo one >> notes.txt; git add notes.txt; \
             git -c user.name=t -c user.email=t@t commit -qm one; echo draft > draft.txt",
        ),
        stage(
            "two",
            "needs = [\"one\"]\n",
            "sleep 3; echo two >> notes.txt",
        ),
        stage(
            "three",
            "needs = [\"two\"]\n",
            "cat notes.txt draft.txt > seen.txt; git log --format=%s >> seen.txt",
        ),
    ]);
    let p = Project::new(url, &wf);
    let git = |dir: &Path, args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let origin = p.path().join("origin.git");
    git(
        p.path(),
        &["init", "-q", "--bare", &origin.to_string_lossy()],
    );
    git(p.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(
        p.path().join(".gitignore"),
        "workers/\norigin.git/\nstages.log\n",
    )
    .unwrap();
    git(p.path(), &["add", "-A"]);
    git(p.path(), &["commit", "-qm", "base"]);
    let origin_url = format!("file://{}", origin.display());
    git(p.path(), &["remote", "add", "origin", &origin_url]);
    git(p.path(), &["push", "-q", "origin", "main"]);
    let id = p.detach();
    let mut first = p.worker(0, "2s", &[]);
    let t = Instant::now();
    while p
        .executions()
        .get(&(id.clone(), "two".to_string()))
        .is_none_or(Vec::is_empty)
    {
        assert!(t.elapsed() < Duration::from_secs(30), "{}", p.worker_logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let second = p.worker(1, "2s", &[]);
    p.wait_finished(std::slice::from_ref(&id), Duration::from_secs(60));
    stop(vec![second]);
    p.assert_settled_once(std::slice::from_ref(&id), &["one", "two", "three"]);
    let runs = p.executions();
    assert_eq!(runs[&(id.clone(), "one".to_string())].len(), 1, "{runs:?}");
    assert_eq!(runs[&(id.clone(), "two".to_string())].len(), 2, "{runs:?}");
    // The second machine's clone: stage one's commit and its uncommitted file, stage two's
    // line once (its cut execution wrote nothing here).
    let seen =
        std::fs::read_to_string(p.path().join(format!("workers/1/workspaces/{id}/seen.txt")))
            .unwrap();
    assert_eq!(seen, "one\ntwo\ndraft\none\nbase\n");
    // The repository has the run's branch with stage one's commit, and the last stage's
    // uncommitted files on top of it.
    let branch = format!("ralph-flow/{id}");
    assert_eq!(git(&origin, &["log", "--format=%s", &branch]), "one\nbase");
    let wip = format!("refs/ralph-flow/wip/{branch}");
    assert_eq!(
        git(&origin, &["show", &format!("{wip}:seen.txt")]),
        seen.trim_end()
    );
    assert_eq!(
        git(&origin, &["show", &format!("{wip}:draft.txt")]),
        "draft"
    );
}

/// The items of a fan-out on a worker work in worktrees of its clone, on their own
/// branches; each branch, with what the item's stages committed, is pushed to the run's
/// repository: the result of a run on workers travels as branches.
#[test]
fn the_branches_of_a_fan_out_on_a_worker_are_pushed_to_the_repository() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let wf = r#"name = "fan"

[stages.items]
kind = "for_each"
over = "['a', 'b']"
as = "x"
worktree = { branch = "item/{{ x }}", base = "main" }

[stages.items.stages.work]
kind = "command"
argv = ["sh", "-c", 'echo "$1" > "$1.txt"; git add "$1.txt"; git -c user.name=t -c user.email=t@t commit -qm "item $1"', "sh", "{{ x }}"]
"#;
    let p = Project::new(url, wf);
    let git = |dir: &Path, args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.email=t@example.com", "-c", "user.name=t"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let origin = p.path().join("origin.git");
    git(
        p.path(),
        &["init", "-q", "--bare", &origin.to_string_lossy()],
    );
    git(p.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(p.path().join(".gitignore"), "workers/\norigin.git/\n").unwrap();
    git(p.path(), &["add", "-A"]);
    git(p.path(), &["commit", "-qm", "base"]);
    git(
        p.path(),
        &[
            "remote",
            "add",
            "origin",
            &format!("file://{}", origin.display()),
        ],
    );
    git(p.path(), &["push", "-q", "origin", "main"]);
    let out = p.command(&["run", "wf.toml", "--detach"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let w = p.worker(0, "30s", &[]);
    p.wait_finished(std::slice::from_ref(&id), Duration::from_secs(60));
    stop(vec![w]);
    let run = p.store().run(&id).unwrap().unwrap();
    assert_eq!(run.exit, Some(("success".into(), 0)), "{}", p.worker_logs());
    for x in ["a", "b"] {
        let branch = format!("item/{x}");
        assert_eq!(
            git(&origin, &["log", "--format=%s", &branch]),
            format!("item {x}\nbase")
        );
        assert_eq!(git(&origin, &["show", &format!("{branch}:{x}.txt")]), x);
    }
}

/// One run's fan-out spreads over the workers: its items' programs are units of work that
/// any worker takes, so both workers run some of the four items at once (each takes two at
/// most); a stage that needs a label runs only on the worker that has it.
#[test]
fn one_runs_fan_out_spreads_over_workers_and_a_labelled_stage_goes_to_its_label() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let log_argv = |name: &str, key: &str, sleep: &str| {
        format!(
            "argv = [\"sh\", \"-c\", 'echo \"start $1 $2 $PPID $(date +%s%N)\" >> \"$3\"; \
             sleep $4; echo \"end $1 $2 $PPID $(date +%s%N)\" >> \"$3\"', \"sh\", \
             \"{{{{ run.id }}}}\", \"{name}{key}\", \"{{{{ params.log }}}}\", \"{sleep}\"]\n"
        )
    };
    let wf = format!(
        "name = \"spread\"\n\n[params.log]\ntype = \"string\"\n\n\
         [stages.items]\nkind = \"for_each\"\nover = \"[1, 2, 3, 4]\"\nas = \"n\"\n\n\
         [stages.items.stages.work]\nkind = \"command\"\n{}\n\
         [stages.gpu]\nkind = \"command\"\nneeds = [\"items\"]\nlabels = [\"gpu\"]\n{}",
        log_argv("work", "-{{ n }}", "1"),
        log_argv("gpu", "", "0"),
    );
    let p = Project::new(url, &wf);
    let id = p.detach();
    let plain = p.worker(0, "30s", &["--max-concurrency", "2"]);
    let gpu = p.worker(1, "30s", &["--max-concurrency", "2", "--labels", "gpu"]);
    p.wait_finished(std::slice::from_ref(&id), Duration::from_secs(60));
    let (plain_pid, gpu_pid) = (
        i32::try_from(plain.id()).unwrap(),
        i32::try_from(gpu.id()).unwrap(),
    );
    stop(vec![plain, gpu]);
    let runs = p.executions();
    let mut by_worker: BTreeMap<i32, usize> = BTreeMap::new();
    for n in 1..=4 {
        let list = &runs[&(id.clone(), format!("work-{n}"))];
        assert_eq!(list.len(), 1, "item {n} ran once: {runs:?}");
        *by_worker.entry(list[0].pid).or_default() += 1;
    }
    assert_eq!(
        by_worker.keys().copied().collect::<Vec<_>>(),
        {
            let mut both = vec![plain_pid, gpu_pid];
            both.sort_unstable();
            both
        },
        "the items ran on both workers: {runs:?}\n{}",
        p.worker_logs()
    );
    let gpu_runs = &runs[&(id.clone(), "gpu".to_string())];
    assert_eq!(gpu_runs.len(), 1);
    assert_eq!(
        gpu_runs[0].pid, gpu_pid,
        "the labelled stage ran where the label is"
    );
    let store = p.store();
    let run = store.run(&id).unwrap().unwrap();
    assert_eq!(run.exit, Some(("success".into(), 0)), "{}", p.worker_logs());
}

/// A run's agent calls are units of work too: a `command` agent's program runs on a worker
/// that has the stage's label (with the unit's tag in its environment), its answer goes
/// back to the coordinator, which extracts and validates the output and routes on it.
#[test]
fn agent_calls_are_units_that_answer_the_coordinator() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let wf = r#"name = "ask"

[agents.echo]
kind = "command"
command = ["sh", "-c", 'read -r prompt; printf "{\"said\": \"%s\", \"unit\": \"%s\", \"worker\": %s}" "$prompt" "$RALPH_FLOW_UNIT" "$PPID"']

[stages.ask]
kind = "agent"
agent = "echo"
labels = ["llm"]
prompt = "hello {{ run.id }}"
output = { extract = "json", schema = { type = "object", required = ["said", "unit", "worker"] } }

[stages.after]
kind = "command"
needs = ["ask"]
argv = ["echo", "{{ stages.ask.output.said }}"]
"#;
    let p = Project::new(url, wf);
    let out = p.command(&["run", "wf.toml", "--detach"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let plain = p.worker(0, "30s", &[]);
    let llm = p.worker(1, "30s", &["--labels", "llm"]);
    p.wait_finished(std::slice::from_ref(&id), Duration::from_secs(60));
    let llm_pid = i64::from(llm.id());
    stop(vec![plain, llm]);
    let store = p.store();
    let run = store.run(&id).unwrap().unwrap();
    assert_eq!(run.exit, Some(("success".into(), 0)), "{}", p.worker_logs());
    let nodes = store.nodes(&id).unwrap();
    let ask = nodes.iter().find(|n| n.node == "ask").unwrap();
    assert_eq!(ask.output["said"], format!("hello {id}"));
    assert!(
        ask.output["unit"]
            .as_str()
            .is_some_and(|u| u.parse::<i64>().is_ok()),
        "{:?}",
        ask.output
    );
    assert_eq!(
        ask.output["worker"], llm_pid,
        "the call ran where the label is"
    );
    let after = nodes.iter().find(|n| n.node == "after").unwrap();
    assert_eq!(after.output["stdout"], format!("hello {id}\n"));
    // The coordinator's records of `after` have the program's stdout as the unit answered it
    // (`artifacts.jsonl`, which `export` writes out as files).
    let records: String = (0..2)
        .map(|n| {
            std::fs::read_to_string(
                p.path()
                    .join(format!("workers/{n}/runs/{id}/artifacts.jsonl")),
            )
            .unwrap_or_default()
        })
        .collect();
    let stdout = records
        .lines()
        .filter(|l| l.contains("after") && l.contains("stdout"))
        .collect::<Vec<_>>();
    assert!(
        stdout.len() == 1 && stdout[0].contains(&format!("hello {id}\\n")),
        "{records}"
    );
}

/// A subflow compiled with the run's plan travels with the run: its workflow and its prompt
/// file are stored with the run, so a worker runs it though neither is on any disk any more.
#[test]
fn a_subflow_and_its_prompt_file_travel_with_the_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new(
        url,
        &format!(
            "{}\n[stages.sub]\nkind = \"subflow\"\nneeds = [\"a\"]\nworkflow = \"child.toml\"\nparams = {{ word = \"otter\" }}\n",
            workflow(&[stage("a", &[], "0")]),
        ),
    );
    std::fs::write(
        p.path().join("child.toml"),
        "name = \"child\"\n\n[params.word]\ntype = \"string\"\n\n[agents.echo]\nkind = \"command\"\ncommand = [\"cat\"]\n\n[stages.say]\nkind = \"agent\"\nagent = \"echo\"\nprompt_file = \"say.md\"\n",
    )
    .unwrap();
    std::fs::write(p.path().join("say.md"), "the word is {{ params.word }}\n").unwrap();
    let id = p.detach();
    // As on another machine: neither file is on a disk the worker could read.
    std::fs::remove_file(p.path().join("child.toml")).unwrap();
    std::fs::remove_file(p.path().join("say.md")).unwrap();
    let w = p.worker(0, "30s", &[]);
    p.wait_finished(std::slice::from_ref(&id), Duration::from_secs(30));
    stop(vec![w]);
    let run = p.store().run(&id).unwrap().unwrap();
    assert_eq!(
        run.exit.as_ref().map(|(name, _)| name.as_str()),
        Some("success"),
        "{}",
        p.worker_logs()
    );
    let said = p
        .store()
        .output(&id, "sub>", "say")
        .unwrap()
        .unwrap_or_default();
    assert_eq!(said["text"], "the word is otter", "{said}");
}

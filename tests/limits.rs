//! Limits of the machine (issue 27): too many open files, the file size limit, a full disk.
//! They are the machine's problem, not a stage's: the run stops with exit code 3, naming the
//! limit, stays resumable, and `resume` completes it once the limit is lifted. Each test runs
//! the real binary under a real limit (`sh -c 'ulimit ...; exec ralph-flow ...'`).
#![allow(clippy::unwrap_used)]

mod common;
mod pg;

use std::time::Duration;

use common::{Out, Project};
use ralph_flow::backend::process::Limit;
use ralph_flow::store::{RunStatus, Store};

/// Runs `args` under `ulimit` and checks that the run stopped as resumable for `limit`: exit
/// code 3, the limit named with what to do and how to resume, no stage failed, and the run
/// left running (so resumable). Returns the run's id and what ralph-flow said.
fn stops_resumably(p: &Project, ulimit: &str, args: &[&str], limit: Limit) -> (String, Out) {
    let out = p.run_limited(ulimit, args);
    assert_eq!(out.code, 3, "{}", out.stderr);
    let (run, status) = p.last_run();
    for said in [
        format!("the run stopped: {} was reached", limit.name()),
        // The advice names the limit's own setting (`ulimit -n`, `ulimit -f`). Its numbers
        // are the limited process's, not this one's: only the remedy is compared.
        remedy(limit),
        format!("then `ralph-flow resume {run}` continues the run"),
        "this is the machine's limit, not a failure of the stage".to_string(),
    ] {
        assert!(out.stderr.contains(&said), "`{said}` in:\n{}", out.stderr);
    }
    // No stage failed: the stop is the machine's.
    assert!(!out.stderr.contains("✗"), "{}", out.stderr);
    assert!(!out.stderr.contains("failed"), "{}", out.stderr);
    assert_eq!(status, RunStatus::Running, "left resumable");
    (run, out)
}

/// What the advice of `limit` tells to do, whatever the limit's value in the process that
/// says it.
fn remedy(limit: Limit) -> String {
    match limit {
        Limit::OpenFiles => {
            "files open at once (`ulimit -n`): raise the limit (`ulimit -n 4096`)".to_string()
        }
        Limit::FileSize => "(`ulimit -f`): raise the limit (`ulimit -f unlimited`)".to_string(),
        other => other.advice(),
    }
}

/// Resumes a run with no limit: it completes.
fn resumes(p: &Project, run: &str) -> Out {
    let out = p.run(&["resume", run]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stderr.contains("ended: success"), "{}", out.stderr);
    assert_eq!(p.last_run(), (run.to_string(), RunStatus::Finished));
    out
}

/// A workflow whose `items` fan out over 1..=`n` (at most `concurrency` at once, when given),
/// each item running the stage `work` (its keys), then a stage `after`.
fn fan_out(n: usize, concurrency: Option<usize>, work: &str) -> String {
    let concurrency = concurrency
        .map(|c| format!("max_concurrency = {c}\n"))
        .unwrap_or_default();
    format!(
        r#"name = "fan"

[stages.list]
kind = "command"
argv = ["sh", "-c", "seq -s, 1 {n} | sed 's/.*/[&]/'"]
output = {{ extract = "json" }}

[stages.items]
kind = "for_each"
needs = ["list"]
over = "stages.list.output"
{concurrency}
[stages.items.stages.work]
{work}

[stages.after]
kind = "command"
needs = ["items"]
argv = ["echo", "all items done"]
"#
    )
}

/// `small`, then `big` printing 8 MB (with `big_extra`, e.g. its labels, in its table),
/// then `after`.
fn big_workflow(big_extra: &str) -> String {
    format!(
        r#"name = "big"

[stages.small]
kind = "command"
argv = ["echo", "small"]

[stages.big]
kind = "command"
needs = ["small"]
{big_extra}argv = ["sh", "-c", "head -c 8000000 /dev/zero | tr '\\0' x"]

[stages.after]
kind = "command"
needs = ["big"]
argv = ["echo", "after"]
"#
    )
}

#[test]
fn too_many_open_files_stop_the_run_as_resumable_naming_the_limit() {
    // 20 items, each a program that takes a moment: more open files than 32 allow at once.
    let p = Project::new();
    p.workflow(
        "w.toml",
        &fan_out(
            20,
            None,
            r#"kind = "command"
argv = ["sh", "-c", "sleep 0.3; echo item {{ item }}; echo to-stderr >&2"]"#,
        ),
    );
    let (run, _) = stops_resumably(&p, "-n 32", &["run", "w.toml"], Limit::OpenFiles);
    // Still limited: it stops again the same way.
    stops_resumably(&p, "-n 32", &["resume", &run], Limit::OpenFiles);
    // The limit lifted: the run completes, every item once more.
    resumes(&p, &run);
}

#[test]
fn the_file_size_limit_stops_the_run_as_resumable_instead_of_killing_it() {
    // A stage that prints 8 MB: more than the attempt's `stdout` file may hold under
    // `ulimit -f 4096` (2 MiB in dash's 512-byte blocks, 4 MiB in bash's KiB).
    let p = Project::new();
    p.workflow("w.toml", &big_workflow(""));
    // Not killed by SIGXFSZ (no exit code), but stopped with a message naming the file.
    let (run, out) = stops_resumably(&p, "-f 4096", &["run", "w.toml"], Limit::FileSize);
    let stdout = format!("runs/{run}/big/attempt-1/stdout");
    assert!(
        out.stderr.contains(&format!(
            "stage `big`: cannot write {}",
            p.dir().join(format!(".ralph-flow/{stdout}")).display()
        )),
        "{}",
        out.stderr
    );
    let out = resumes(&p, &run);
    assert!(out.stderr.contains("✓ after done"), "{}", out.stderr);
    // The attempt ran again from its start: its file holds that run's output only.
    let stdout = p.dir().join(".ralph-flow").join(stdout);
    assert_eq!(std::fs::metadata(stdout).unwrap().len(), 8_000_000);
}

#[test]
fn a_store_write_beyond_the_file_size_limit_names_the_limit() {
    // Every item's output is kept in the fan-out's output, which the store spills to a file
    // of about 4 MB, beyond `ulimit -f 2048` (1 MiB in dash, 2 MiB in bash).
    let p = Project::new();
    p.workflow(
        "w.toml",
        &fan_out(
            10,
            Some(2),
            r#"kind = "command"
argv = ["sh", "-c", "head -c 300000 /dev/urandom | od -An -tx1 | tr -d ' \\n' | head -c 400000"]"#,
        ),
    );
    let (run, out) = stops_resumably(&p, "-f 2048", &["run", "w.toml"], Limit::FileSize);
    // The file that met it: a spilled output, in the store's `blobs/`.
    let blobs = p.dir().join(".ralph-flow/blobs/");
    assert!(
        out.stderr
            .contains(&format!("cannot write {}", blobs.display())),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("cannot cannot"), "{}", out.stderr);
    resumes(&p, &run);
}

#[test]
fn the_store_growing_beyond_the_file_size_limit_names_the_limit() {
    // 150 settlements of about 1 KB each: the store's own file (or its log) grows beyond
    // `ulimit -f 120` (60 KiB in dash, 120 KiB in bash), and SQLite says only "disk I/O
    // error": the pending SIGXFSZ tells which limit it met.
    let p = Project::new();
    p.workflow(
        "w.toml",
        &fan_out(
            150,
            Some(4),
            r#"kind = "command"
argv = ["sh", "-c", "head -c 600 /dev/urandom | od -An -tx1 | tr -d ' \\n'"]"#,
        ),
    );
    let (run, out) = stops_resumably(&p, "-f 120", &["run", "w.toml"], Limit::FileSize);
    // The file that met it: the store's.
    let db = p.dir().join(".ralph-flow/state.db");
    assert!(
        out.stderr.contains(&format!(
            "cannot commit to {}: disk I/O error",
            db.display()
        )),
        "{}",
        out.stderr
    );
    resumes(&p, &run);
}

#[test]
fn an_agents_program_that_cannot_start_for_open_files_stops_the_run_too() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"{}
[agents.echo]
kind = "command"
command = ["sh", "-c", "sleep 0.3; cat"]
"#,
            fan_out(
                20,
                None,
                r#"kind = "agent"
agent = "echo"
prompt = "item {{ item }}""#,
            )
        ),
    );
    let (run, out) = stops_resumably(&p, "-n 32", &["run", "w.toml"], Limit::OpenFiles);
    assert!(out.stderr.contains("agent `echo`"), "{}", out.stderr);
    resumes(&p, &run);
}

#[test]
fn an_http_agent_that_cannot_open_a_connection_for_open_files_stops_the_run() {
    // 20 items, each an OpenAI call the server answers after a moment: their connections
    // are more open files than 32 allow at once. A socket that cannot be opened is the
    // machine's limit, not a transient failure of the server to retry.
    let uri = common::serve_posts(
        wiremock::ResponseTemplate::new(200)
            .set_delay(Duration::from_millis(500))
            .set_body_json(serde_json::json!({
                "id": "x", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1}
            })),
    );
    let p = Project::new();
    p.workflow(
        "w.toml",
        &format!(
            r#"{}
[agents.api]
kind = "openai"
model = "m"
base_url = "{uri}/v1"
"#,
            fan_out(
                20,
                None,
                r#"kind = "agent"
agent = "api"
prompt = "item {{ item }}""#,
            )
        ),
    );
    let out = p.run_limited("-n 32", &["run", "w.toml"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    let (run, status) = p.last_run();
    assert_eq!(status, RunStatus::Running, "left resumable");
    for said in [
        format!("the run stopped: {} was reached", Limit::OpenFiles.name()),
        // The connection is what met it.
        format!("agent `api`: POST {uri}/v1/chat/completions failed"),
        "Too many open files".to_string(),
        format!("then `ralph-flow resume {run}` continues the run"),
    ] {
        assert!(out.stderr.contains(&said), "`{said}` in:\n{}", out.stderr);
    }
    assert!(!out.stderr.contains("✗"), "{}", out.stderr);
    assert!(!out.stderr.contains("retry"), "not retried: {}", out.stderr);
    resumes(&p, &run);
}

#[test]
fn programs_get_the_file_size_signal_as_usual() {
    // ralph-flow blocks SIGXFSZ for itself; the programs it starts must not inherit that.
    let p = Project::new();
    p.workflow(
        "w.toml",
        r#"name = "mask"

[stages.mask]
kind = "command"
argv = ["sh", "-c", "grep -E '^Sig(Blk|Ign):' /proc/self/status"]
"#,
    );
    let out = p.run(&["run", "w.toml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let (run, _) = p.last_run();
    let status = p.read(&format!(".ralph-flow/runs/{run}/mask/attempt-1/stdout"));
    // Both masks were read (an empty file would check nothing).
    let names: Vec<&str> = status
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["SigBlk:", "SigIgn:"], "{status}");
    // SIGXFSZ is signal 25: bit 24 of each mask.
    for line in status.lines() {
        let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
        assert_eq!(mask & (1 << 24), 0, "{line}");
    }
}

#[test]
fn a_limit_met_by_a_unit_on_a_worker_stops_the_run_as_resumable() {
    let Some(url) = pg::database() else {
        return;
    };
    // `big` runs where the label `big` is: on a worker under `ulimit -f 4096`, whose copy of
    // the program's stdout cannot hold its 8 MB.
    let p = Project::new();
    p.workflow("w.toml", &big_workflow("labels = [\"big\"]\n"));
    let store_env = [("RALPH_FLOW_STORE", url.as_str())];
    let out = p.run_env(&["run", "w.toml", "--detach"], &store_env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let id = out.stdout.trim().to_string();
    let store = ralph_flow::store::postgres::PgStore::connect(&url).unwrap();
    let mut workers = Workers::default();
    // The coordinator first (no label, no limit), so that the limited worker gets only the
    // unit.
    workers.start(&p, &url, 0, None, &[]);
    let t = std::time::Instant::now();
    while store.lock_holder(&id).unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{}",
            workers.logs(&p)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    workers.start(&p, &url, 1, Some("-f 4096"), &["--labels", "big"]);
    while store.run(&id).unwrap().unwrap().status != RunStatus::Interrupted {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "run {id} never stopped: {:?}\n{}",
            store.run(&id).unwrap().unwrap().status,
            workers.logs(&p)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = workers.logs(&p);
    let unit_files = p.dir().join("workers/1/units/attempts");
    for said in [
        format!("the run stopped: {} was reached", Limit::FileSize.name()),
        // Which stage, which worker, which file.
        "stage `big`: worker ".to_string(),
        format!("cannot write {}", unit_files.display()),
        format!("`ralph-flow resume {id}`"),
    ] {
        assert!(logs.contains(&said), "`{said}` in:\n{logs}");
    }
    // No stage failed: `big` is not settled, its attempt was interrupted.
    let nodes = store.nodes(&id).unwrap();
    assert!(nodes.iter().all(|n| n.node != "big"), "{nodes:#?}");
    let attempts = store.attempts(&id, None).unwrap();
    let big: Vec<_> = attempts.iter().filter(|a| a.node == "big").collect();
    assert_eq!(big.len(), 1, "{attempts:#?}");
    assert_eq!(
        big[0].state,
        ralph_flow::store::AttemptState::Interrupted,
        "{big:#?}"
    );
}

/// Workers of a test, each with a state directory (`workers/N`) and a log
/// (`workers/N.log`), stopped when the test ends.
#[derive(Default)]
struct Workers(Vec<std::process::Child>);

impl Workers {
    /// Starts worker `n` (under `ulimit`, when given).
    fn start(&mut self, p: &Project, url: &str, n: usize, ulimit: Option<&str>, extra: &[&str]) {
        let state = p.dir().join(format!("workers/{n}"));
        std::fs::create_dir_all(&state).unwrap();
        let log = std::fs::File::create(p.dir().join(format!("workers/{n}.log"))).unwrap();
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ralph-flow"));
        c.args(["worker", "--poll", "200ms", "--state-dir"])
            .arg(&state)
            .args(extra)
            .current_dir(&state)
            .env("RALPH_FLOW_STORE", url)
            .env("RALPH_FLOW_LEASE", "30s")
            .env_remove("RUST_LOG");
        let mut c = match ulimit {
            Some(limit) => common::under_ulimit(limit, &c),
            None => c,
        };
        let child = c
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.0.push(child);
    }

    fn logs(&self, p: &Project) -> String {
        (0..self.0.len())
            .map(|n| {
                std::fs::read_to_string(p.dir().join(format!("workers/{n}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            if let Ok(pid) = i32::try_from(w.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let _ = w.wait();
        }
    }
}

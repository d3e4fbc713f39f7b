//! Smaller faults of issue 27, each through the real binary: a source pinned twice in
//! `ralph-flow.lock`, a doubled word in the store's file errors, a damaged store reported
//! without how to recover it, a command's huge argv echoed whole to the progress, and
//! `approve` sending the user to `resume` for a run that workers carry.
#![allow(clippy::unwrap_used)]

mod common;
mod pg;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Project;
use ralph_flow::store::{RunStatus, Store};

#[test]
fn a_source_pinned_twice_in_the_lockfile_is_refused_with_its_line() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        "name = \"w\"\nextends = \"team:base\"\n\n[sources.team]\ngit = \"../presets\"\nrev = \"v1\"\n",
    );
    let entry = |commit: &str| {
        format!(
            "[[source]]\nname = \"team\"\ngit = \"../presets\"\nrev = \"v1\"\ncommit = \"{commit}\"\nhash = \"sha256:00\"\n"
        )
    };
    // As a merge that kept both sides leaves it: the entry at line 2, again at line 9.
    let lock = format!(
        "version = 1\n{}\n{}",
        entry("0123456789abcdef0123456789abcdef01234567"),
        entry("89abcdef0123456789abcdef0123456789abcdef")
    );
    p.write("ralph-flow.lock", &lock);
    let cache = p.dir().join("cache");
    let env = [("RALPH_FLOW_CACHE_DIR", cache.to_str().unwrap())];
    let out = p.run_env(&["check", "--format", "short", "w.toml"], &env);
    assert_eq!(out.code, 3, "{}", out.stderr);
    for said in [
        // Said where the second entry is, in the lockfile.
        "ralph-flow.lock:9:1: error[RF058]: ",
        "also at line 2",
        "source `team` (`../presets` at `v1`) is pinned twice",
        "presets fetch",
    ] {
        assert!(out.stderr.contains(said), "`{said}` in:\n{}", out.stderr);
    }
    // Not at the workflow's declaration of the source.
    assert!(!out.stderr.contains("w.toml:"), "{}", out.stderr);
    // The long form shows both entries.
    let out = p.run_env(&["check", "w.toml"], &env);
    assert_eq!(out.code, 3, "{}", out.stderr);
    for said in ["pinned again here", "first pinned here"] {
        assert!(out.stderr.contains(said), "`{said}` in:\n{}", out.stderr);
    }
}

#[test]
fn no_file_error_says_cannot_twice() {
    // `IoFailure` says "cannot {what} PATH": a `what` that starts with "cannot" doubles it
    // (`IoFailure::new` also asserts it, in debug builds). Calls split over lines are read
    // as one: the first string after the call's parenthesis.
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, found);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for call in ["io(", "IoFailure::new("] {
                    for (at, _) in text.match_indices(call) {
                        let what = text[at + call.len()..].trim_start();
                        let doubled = ["\"cannot", "\"could not"];
                        if doubled.iter().any(|d| what.starts_with(d)) {
                            let line = text[..at].matches('\n').count() + 1;
                            found.push(format!(
                                "{}:{line}: {call}{}",
                                p.display(),
                                &what[..what.len().min(40)]
                            ));
                        }
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("engine"),
        &mut found,
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_spilled_output_that_cannot_be_written_is_said_once() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        "name = \"w\"\n\n[stages.big]\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"head -c 100000 /dev/zero | tr '\\\\0' x\"]\n",
    );
    // A file stands where the store's directory of long outputs goes.
    p.write(".ralph-flow/blobs", "not a directory");
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("cannot write"), "{}", out.stderr);
    assert!(!out.stderr.contains("cannot cannot"), "{}", out.stderr);
}

#[test]
fn a_store_too_damaged_to_check_is_refused_with_how_to_recover_it() {
    let p = Project::new();
    p.workflow(
        "w.toml",
        "name = \"w\"\n\n[stages.a]\nkind = \"command\"\nargv = [\"echo\", \"a\"]\n\n\
         [stages.ok]\nkind = \"gate\"\nneeds = [\"a\"]\nmessage = \"Go on?\"\n",
    );
    let out = p.run(&["run", "w.toml", "--no-wait"]);
    assert_eq!(out.code, 75, "{}", out.stderr);
    let db = p.dir().join(".ralph-flow/state.db");
    // Damage the header of a table's root page: `PRAGMA quick_check` itself then fails.
    common::damage_root_page(&db, "locks", common::Damage::Header);
    // As after a crash: a marker of a process that had the store open and is gone.
    p.write(".ralph-flow/state.db.open-999999999-0", "");
    let out = p.run(&["run", "w.toml", "--no-wait"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(out.stderr.contains("is damaged"), "{}", out.stderr);
    assert!(out.stderr.contains("Move it aside"), "{}", out.stderr);
    // The path said once where it is damaged, once in the command that recovers it.
    let path = db.display().to_string();
    assert!(
        out.stderr.contains(&format!(
            "`sqlite3 {} .recover`",
            ralph_flow::shell::quote(&path)
        )),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.matches(&path).count(), 2, "{}", out.stderr);
}

#[test]
fn a_damaged_store_says_how_to_recover_it_wherever_it_is_read() {
    // A store damaged after it was opened, as `status` reads it: the read says so, with how
    // to recover it, as the checks on opening do.
    let p = Project::new();
    p.workflow(
        "w.toml",
        "name = \"w\"\n\n[stages.a]\nkind = \"command\"\nargv = [\"echo\", \"a\"]\n",
    );
    let out = p.run(&["run", "w.toml"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let db = p.dir().join(".ralph-flow/state.db");
    common::damage_root_page(&db, "nodes", common::Damage::Header);
    let run: String = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT id FROM runs", [], |r| r.get(0))
        .unwrap();
    let out = p.run(&["status", &run]);
    // The reading commands' code for a store that cannot be read.
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("is damaged"), "{}", out.stderr);
    // The store as the command names it (the default state directory, relative).
    assert!(
        out.stderr
            .contains("cannot read nodes from .ralph-flow/state.db: the file is damaged"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("`sqlite3 .ralph-flow/state.db .recover`"),
        "{}",
        out.stderr
    );
}

#[test]
fn progress_lines_bound_what_they_echo_of_a_commands_argv() {
    let p = Project::new();
    let items = vec!["\"{{ params.big }}\""; 40].join(", ");
    p.workflow(
        "w.toml",
        &format!(
            "name = \"w\"\n\n[params.big]\ntype = \"string\"\n\n[stages.echo]\nkind = \"command\"\n\
             argv = [\"true\", {items}]\n"
        ),
    );
    let big = format!("big={}", "x".repeat(100 * 1024));
    let out = p.run(&["run", "w.toml", "--set", &big]);
    // Ended by itself (such an argv may be too long for the system to start it).
    assert_ne!(
        out.code,
        -1,
        "{}",
        &out.stderr[..out.stderr.len().min(2000)]
    );
    assert!(
        out.stderr.len() < 8 * 1024,
        "{} bytes of progress:\n{}",
        out.stderr.len(),
        &out.stderr[..out.stderr.len().min(2000)]
    );
    let started = out
        .stderr
        .lines()
        .find(|l| l.contains("▶ echo"))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(started.contains("$ true xxxx"), "{started}");
    assert!(
        started.ends_with(&format!(
            "… (41 arguments, {} bytes in all)",
            4 + 40 * (100 * 1024 + 1)
        )),
        "{started}"
    );
}

#[test]
fn approving_a_gate_of_a_run_that_workers_carry_says_a_worker_continues_it() {
    let Some(url) = pg::database() else {
        return;
    };
    let p = Project::new();
    // Two gates wait at once: the first answer queues the run for the workers; the second
    // finds it queued.
    p.workflow(
        "w.toml",
        "name = \"two-gates\"\n\n[stages.a]\nkind = \"command\"\nargv = [\"echo\", \"a\"]\n\n\
         [stages.left]\nkind = \"gate\"\nneeds = [\"a\"]\nmessage = \"Left?\"\n\n\
         [stages.right]\nkind = \"gate\"\nneeds = [\"a\"]\nmessage = \"Right?\"\n\n\
         [stages.b]\nkind = \"command\"\nneeds = [\"left\", \"right\"]\nargv = [\"echo\", \"b\"]\n",
    );
    let store_env = [("RALPH_FLOW_STORE", url.as_str())];
    let out = p.run_env(&["run", "w.toml", "--detach"], &store_env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let id = out.stdout.trim().to_string();
    let worker = |n: usize| {
        let state = p.dir().join(format!("worker-{n}"));
        std::fs::create_dir_all(&state).unwrap();
        Command::new(env!("CARGO_BIN_EXE_ralph-flow"))
            .args(["worker", "--poll", "200ms", "--state-dir"])
            .arg(&state)
            .current_dir(&state)
            .env("RALPH_FLOW_STORE", &url)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let stop = |mut w: std::process::Child| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(w.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        w.wait().unwrap();
    };
    let store = ralph_flow::store::postgres::PgStore::connect(&url).unwrap();
    let wait_for = |status: RunStatus| {
        let t = Instant::now();
        while store.run(&id).unwrap().unwrap().status != status {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "run {id} never {status:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let w = worker(0);
    wait_for(RunStatus::Waiting);
    // No worker claims it while the gates are answered.
    stop(w);
    let out = p.run_env(&["approve", &id, "left"], &store_env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // The answer queued the run again.
    assert!(
        out.stderr
            .contains("the run is queued again; a worker carries it on"),
        "{}",
        out.stderr
    );
    assert_eq!(store.run(&id).unwrap().unwrap().status, RunStatus::Queued);
    let out = p.run_env(&["approve", &id, "right"], &store_env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    // The run was queued already: not "queued again", nor `resume`.
    assert!(
        out.stderr
            .contains("the run is queued; a worker carries it on with the answer"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("queued again"), "{}", out.stderr);
    assert!(!out.stderr.contains("resume"), "{}", out.stderr);
    // And one does.
    let w = worker(1);
    wait_for(RunStatus::Finished);
    stop(w);
}

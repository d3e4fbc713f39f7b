//! Smaller faults of issue 27, each through the real binary: a source pinned twice in
//! `ralph-flow.lock`, a doubled word in the store's file errors, a damaged store reported
//! without how to recover it, a command's huge argv echoed whole to the progress, and
//! `approve` sending the user to `resume` for a run that workers carry.
#![allow(clippy::unwrap_used)]

mod pg;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ralph_flow::store::{RunStatus, Store};

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn ralph(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ralph-flow"));
    c.args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("RALPH_FLOW_STORE")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    if matches!(args.first(), Some(&"run" | &"resume")) {
        c.args(["--progress", "plain"]);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn a_source_pinned_twice_in_the_lockfile_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("w.toml"),
        "name = \"w\"\nextends = \"team:base\"\n\n[sources.team]\ngit = \"../presets\"\nrev = \"v1\"\n",
    )
    .unwrap();
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
    std::fs::write(dir.path().join("ralph-flow.lock"), lock).unwrap();
    let out = ralph(
        dir.path(),
        &["check", "--format", "short", "w.toml"],
        &[(
            "RALPH_FLOW_CACHE_DIR",
            dir.path().join("cache").to_str().unwrap(),
        )],
    );
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    for said in [
        "ralph-flow.lock",
        "line 9",
        "also at line 2",
        "source `team` (`../presets` at `v1`) is pinned twice",
        "presets fetch",
    ] {
        assert!(out.stderr.contains(said), "`{said}` in:\n{}", out.stderr);
    }
}

#[test]
fn no_file_error_says_cannot_twice() {
    // `IoFailure` says "cannot {what} PATH": a `what` that starts with "cannot" doubles it.
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, found);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, line) in text.lines().enumerate() {
                    let doubled = ["io(\"cannot", "io(\"could not", "IoFailure::new(\"cannot"];
                    if doubled.iter().any(|d| line.contains(d)) {
                        found.push(format!("{}:{}: {}", p.display(), i + 1, line.trim()));
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
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("w.toml"),
        "name = \"w\"\n\n[stages.big]\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"head -c 100000 /dev/zero | tr '\\\\0' x\"]\n",
    )
    .unwrap();
    // A file stands where the store's directory of long outputs goes.
    std::fs::create_dir_all(dir.path().join(".ralph-flow")).unwrap();
    std::fs::write(dir.path().join(".ralph-flow/blobs"), "not a directory").unwrap();
    let out = ralph(dir.path(), &["run", "w.toml"], &[]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("cannot write"), "{}", out.stderr);
    assert!(!out.stderr.contains("cannot cannot"), "{}", out.stderr);
}

#[test]
fn a_store_too_damaged_to_check_is_refused_with_how_to_recover_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("w.toml"),
        "name = \"w\"\n\n[stages.a]\nkind = \"command\"\nargv = [\"echo\", \"a\"]\n\n\
         [stages.ok]\nkind = \"gate\"\nneeds = [\"a\"]\nmessage = \"Go on?\"\n",
    )
    .unwrap();
    let out = ralph(dir.path(), &["run", "w.toml", "--no-wait"], &[]);
    assert_eq!(out.code, Some(75), "{}", out.stderr);
    let db = dir.path().join(".ralph-flow/state.db");
    let (page_size, root) = {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
            .unwrap();
        let page_size: usize = conn
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .unwrap();
        let root: usize = conn
            .query_row(
                "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = 'locks'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        (page_size, root)
    };
    // Damage the header of a table's root page: `PRAGMA quick_check` itself then fails
    // ("database disk image is malformed") instead of listing what it found.
    let mut bytes = std::fs::read(&db).unwrap();
    let start = (root - 1) * page_size;
    for b in &mut bytes[start..start + 8] {
        *b = 0xA5;
    }
    std::fs::write(&db, bytes).unwrap();
    // As after a crash: a marker of a process that had the store open and is gone.
    std::fs::write(dir.path().join(".ralph-flow/state.db.open-999999999-0"), "").unwrap();
    let out = ralph(dir.path(), &["run", "w.toml", "--no-wait"], &[]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("is damaged"), "{}", out.stderr);
    assert!(out.stderr.contains(".recover"), "{}", out.stderr);
    assert!(out.stderr.contains("Move it aside"), "{}", out.stderr);
}

#[test]
fn progress_lines_bound_what_they_echo_of_a_commands_argv() {
    let dir = tempfile::tempdir().unwrap();
    let items = vec!["\"{{ params.big }}\""; 40].join(", ");
    std::fs::write(
        dir.path().join("w.toml"),
        format!(
            "name = \"w\"\n\n[params.big]\ntype = \"string\"\n\n[stages.echo]\nkind = \"command\"\n\
             argv = [\"true\", {items}]\n"
        ),
    )
    .unwrap();
    let big = format!("big={}", "x".repeat(100 * 1024));
    let out = ralph(dir.path(), &["run", "w.toml", "--set", &big], &[]);
    assert!(
        out.code.is_some(),
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
    let dir = tempfile::tempdir().unwrap();
    // Two gates wait at once: the first answer queues the run for the workers; the second
    // finds it queued.
    std::fs::write(
        dir.path().join("w.toml"),
        "name = \"two-gates\"\n\n[stages.a]\nkind = \"command\"\nargv = [\"echo\", \"a\"]\n\n\
         [stages.left]\nkind = \"gate\"\nneeds = [\"a\"]\nmessage = \"Left?\"\n\n\
         [stages.right]\nkind = \"gate\"\nneeds = [\"a\"]\nmessage = \"Right?\"\n\n\
         [stages.b]\nkind = \"command\"\nneeds = [\"left\", \"right\"]\nargv = [\"echo\", \"b\"]\n",
    )
    .unwrap();
    let store_env = [("RALPH_FLOW_STORE", url.as_str())];
    let out = ralph(dir.path(), &["run", "w.toml", "--detach"], &store_env);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let id = out.stdout.trim().to_string();
    let worker = |n: usize| {
        let state = dir.path().join(format!("worker-{n}"));
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
    let out = ralph(dir.path(), &["approve", &id, "left"], &store_env);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("a worker carries it on"),
        "{}",
        out.stderr
    );
    assert_eq!(store.run(&id).unwrap().unwrap().status, RunStatus::Queued);
    let out = ralph(dir.path(), &["approve", &id, "right"], &store_env);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains("a worker carries it on"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("resume"), "{}", out.stderr);
    // And one does.
    let w = worker(1);
    wait_for(RunStatus::Finished);
    stop(w);
}

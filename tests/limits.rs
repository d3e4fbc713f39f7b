//! Limits of the machine (issue 27): too many open files, the file size limit, a full disk.
//! They are the machine's problem, not a stage's: the run stops with exit code 3, naming the
//! limit, stays resumable, and `resume` completes it once the limit is lifted. Each test runs
//! the real binary under a real limit (`sh -c 'ulimit ...; exec ralph-flow ...'`).
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use ralph_flow::store::sqlite::{SqliteStore, default_path};
use ralph_flow::store::{RunStatus, Store};

/// What ralph-flow did: its exit code (`None` when a signal killed it) and stderr.
struct Out {
    code: Option<i32>,
    stderr: String,
}

/// Runs ralph-flow in `dir`, under the shell's `ulimit` arguments when given.
fn ralph(dir: &Path, ulimit: Option<&str>, args: &[&str]) -> Out {
    let mut c = match ulimit {
        Some(limit) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit {limit} || exit 99; exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_ralph-flow"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_ralph-flow")),
    };
    c.args(args)
        .args(["--progress", "plain"])
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1");
    let out = c.output().unwrap();
    Out {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The id and status of the one run of a state directory.
fn the_run(dir: &Path) -> (String, RunStatus) {
    let store = SqliteStore::open(&default_path(&dir.join(".ralph-flow"))).unwrap();
    let run = store.runs(1).unwrap().into_iter().next().unwrap();
    (run.id, run.status)
}

/// 20 items, each a program that takes a moment: more open files than 32 allow at once.
const FAN_OUT: &str = r#"name = "fan"

[stages.list]
kind = "command"
argv = ["sh", "-c", "echo '[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]'"]
output = { extract = "json" }

[stages.items]
kind = "for_each"
needs = ["list"]
over = "stages.list.output"

[stages.items.stages.work]
kind = "command"
argv = ["sh", "-c", "sleep 0.3; echo item {{ item }}; echo to-stderr >&2"]

[stages.after]
kind = "command"
needs = ["items"]
argv = ["echo", "all items done"]
"#;

#[test]
fn too_many_open_files_stop_the_run_as_resumable_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.toml"), FAN_OUT).unwrap();
    let out = ralph(dir.path(), Some("-n 32"), &["run", "w.toml"]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    let (run, status) = the_run(dir.path());
    assert!(out.stderr.contains("open files"), "{}", out.stderr);
    assert!(out.stderr.contains("`ulimit -n`"), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("ralph-flow resume {run}")),
        "{}",
        out.stderr
    );
    // No item failed: the stop is the machine's, not the stages'.
    assert!(!out.stderr.contains("items failed"), "{}", out.stderr);
    assert!(!out.stderr.contains("✗"), "{}", out.stderr);
    assert_eq!(status, RunStatus::Running, "left resumable");
    // Still limited: it stops again the same way.
    let out = ralph(dir.path(), Some("-n 32"), &["resume", &run]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("open files"), "{}", out.stderr);
    // The limit lifted: the run completes, every item once more.
    let out = ralph(dir.path(), None, &["resume", &run]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("ended: success"), "{}", out.stderr);
    assert_eq!(the_run(dir.path()).1, RunStatus::Finished);
}

/// A stage that prints 8 MB: more than the attempt's `stdout` file may hold under
/// `ulimit -f 4096` (2 MiB in dash's 512-byte blocks, 4 MiB in bash's KiB).
const BIG_OUTPUT: &str = r#"name = "big"

[stages.small]
kind = "command"
argv = ["echo", "small"]

[stages.big]
kind = "command"
needs = ["small"]
argv = ["sh", "-c", "head -c 8000000 /dev/zero | tr '\\0' x"]

[stages.after]
kind = "command"
needs = ["big"]
argv = ["echo", "after"]
"#;

#[test]
fn the_file_size_limit_stops_the_run_as_resumable_instead_of_killing_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.toml"), BIG_OUTPUT).unwrap();
    let out = ralph(dir.path(), Some("-f 4096"), &["run", "w.toml"]);
    // Not killed by SIGXFSZ (no exit code), but stopped with a message.
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    let (run, status) = the_run(dir.path());
    assert!(out.stderr.contains("file size limit"), "{}", out.stderr);
    assert!(out.stderr.contains("`ulimit -f`"), "{}", out.stderr);
    assert!(out.stderr.contains("stage `big`"), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("ralph-flow resume {run}")),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("✗"), "{}", out.stderr);
    assert_eq!(status, RunStatus::Running, "left resumable");
    let out = ralph(dir.path(), None, &["resume", &run]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("✓ after done"), "{}", out.stderr);
    // The attempt ran again from its start: its file holds that run's output only.
    let stdout = dir
        .path()
        .join(format!(".ralph-flow/runs/{run}/big/attempt-1/stdout"));
    assert_eq!(std::fs::metadata(stdout).unwrap().len(), 8_000_000);
}

/// Every item's output is kept in the fan-out's output, which the store spills to a file
/// of about 2 MB, beyond `ulimit -f 2048` (1 MiB in dash, 2 MiB in bash).
const LARGE_SETTLEMENT: &str = r#"name = "spill"

[stages.list]
kind = "command"
argv = ["sh", "-c", "echo '[1,2,3,4,5,6,7,8,9,10]'"]
output = { extract = "json" }

[stages.items]
kind = "for_each"
needs = ["list"]
over = "stages.list.output"
max_concurrency = 2

[stages.items.stages.work]
kind = "command"
argv = ["sh", "-c", "head -c 300000 /dev/urandom | od -An -tx1 | tr -d ' \\n' | head -c 400000"]
"#;

#[test]
fn a_store_write_beyond_the_file_size_limit_names_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("w.toml"), LARGE_SETTLEMENT).unwrap();
    let out = ralph(dir.path(), Some("-f 2048"), &["run", "w.toml"]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("file size limit"), "{}", out.stderr);
    assert!(!out.stderr.contains("cannot cannot"), "{}", out.stderr);
    let (run, status) = the_run(dir.path());
    assert_eq!(status, RunStatus::Running, "left resumable");
    let out = ralph(dir.path(), None, &["resume", &run]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

#[test]
fn programs_get_the_file_size_signal_as_usual() {
    // ralph-flow blocks SIGXFSZ for itself; the programs it starts must not inherit that.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("w.toml"),
        r#"name = "mask"

[stages.mask]
kind = "command"
argv = ["sh", "-c", "grep -E '^Sig(Blk|Ign):' /proc/self/status"]
"#,
    )
    .unwrap();
    let out = ralph(dir.path(), None, &["run", "w.toml", "--json"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let (run, _) = the_run(dir.path());
    let status = std::fs::read_to_string(
        dir.path()
            .join(format!(".ralph-flow/runs/{run}/mask/attempt-1/stdout")),
    )
    .unwrap();
    // SIGXFSZ is signal 25: bit 24 of each mask.
    for line in status.lines() {
        let mask = u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap();
        assert_eq!(mask & (1 << 24), 0, "{line}");
    }
}

#[test]
fn an_agents_program_that_cannot_start_for_open_files_stops_the_run_too() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("w.toml"),
        r#"name = "agents"

[agents.echo]
kind = "command"
command = ["sh", "-c", "sleep 0.3; cat"]

[stages.list]
kind = "command"
argv = ["sh", "-c", "echo '[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]'"]
output = { extract = "json" }

[stages.items]
kind = "for_each"
needs = ["list"]
over = "stages.list.output"

[stages.items.stages.ask]
kind = "agent"
agent = "echo"
prompt = "item {{ item }}"
"#,
    )
    .unwrap();
    let out = ralph(
        dir.path(),
        Some("-n 32"),
        &["run", "w.toml", "--backoff", "10ms"],
    );
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("open files"), "{}", out.stderr);
    assert!(out.stderr.contains("agent `echo`"), "{}", out.stderr);
    assert!(!out.stderr.contains("✗"), "{}", out.stderr);
    let (run, status) = the_run(dir.path());
    assert_eq!(status, RunStatus::Running, "left resumable");
    let out = ralph(dir.path(), None, &["resume", &run]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

#[test]
fn the_store_growing_beyond_the_file_size_limit_names_the_limit() {
    // 150 settlements of about 1 KB each: the store's own file (or its log) grows beyond
    // `ulimit -f 120` (60 KiB in dash, 120 KiB in bash), and SQLite says only "disk I/O
    // error": the pending SIGXFSZ tells which limit it met.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("w.toml"),
        r#"name = "rows"

[stages.list]
kind = "command"
argv = ["sh", "-c", "seq -s, 1 150 | sed 's/.*/[&]/'"]
output = { extract = "json" }

[stages.items]
kind = "for_each"
needs = ["list"]
over = "stages.list.output"
max_concurrency = 4

[stages.items.stages.work]
kind = "command"
argv = ["sh", "-c", "head -c 600 /dev/urandom | od -An -tx1 | tr -d ' \\n'"]
"#,
    )
    .unwrap();
    let out = ralph(dir.path(), Some("-f 120"), &["run", "w.toml"]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("file size limit"), "{}", out.stderr);
    assert!(out.stderr.contains("`ulimit -f`"), "{}", out.stderr);
    let (run, status) = the_run(dir.path());
    assert_eq!(status, RunStatus::Running, "left resumable");
    let out = ralph(dir.path(), None, &["resume", &run]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

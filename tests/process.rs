//! Tests of the process runner: output, stdin, timeouts, idle timeouts, cancellation.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::kill;
use nix::unistd::Pid;
use ralph_flow::backend::process::{Ended, ProcSpec, SpawnError, run};

fn sh(script: &str, dir: &Path) -> ProcSpec {
    ProcSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        cwd: dir.to_path_buf(),
        ..ProcSpec::default()
    }
}

/// Whether a process is still there (a zombie counts as gone: it no longer runs).
fn alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to `within` for a process to be gone.
async fn gone(pid: i32, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    !alive(pid)
}

/// Waits for a file with a pid in it.
async fn read_pid(path: &Path) -> i32 {
    for _ in 0..100 {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no pid in {}", path.display());
}

#[tokio::test(flavor = "current_thread")]
async fn exit_code_and_output_are_reported_and_streamed_to_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = sh(
        "echo out; echo err >&2; echo \"$GREETING\"; exit 3",
        dir.path(),
    );
    spec.env = vec![("GREETING".into(), "hello".into())];
    spec.stdout_path = Some(dir.path().join("stdout"));
    spec.stderr_path = Some(dir.path().join("stderr"));
    let out = run(&spec).await.expect("runs");
    assert_eq!(out.code, Some(3));
    assert_eq!(out.signal, None);
    assert_eq!(out.ended, Ended::Exited);
    assert_eq!(out.stdout, b"out\nhello\n");
    assert_eq!(out.stderr, b"err\n");
    let file = std::fs::read(dir.path().join("stdout")).expect("stdout file");
    assert_eq!(file, b"out\nhello\n");
    let file = std::fs::read(dir.path().join("stderr")).expect("stderr file");
    assert_eq!(file, b"err\n");
}

#[tokio::test(flavor = "current_thread")]
async fn runs_in_the_working_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = run(&sh("pwd", dir.path())).await.expect("runs");
    let pwd = String::from_utf8(out.stdout).expect("utf-8");
    let expected = dir.path().canonicalize().expect("canonical");
    assert_eq!(
        Path::new(pwd.trim()).canonicalize().expect("canonical"),
        expected
    );
}

#[tokio::test(flavor = "current_thread")]
async fn stdin_is_delivered_without_deadlock() {
    let dir = tempfile::tempdir().expect("temp dir");
    // More than any pipe buffer, echoed back while it is written.
    let input: Vec<u8> = (0..2_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut spec = sh("cat; echo done >&2", dir.path());
    spec.stdin = Some(input.clone());
    let out = run(&spec).await.expect("runs");
    assert_eq!(out.code, Some(0));
    assert_eq!(out.stdout.len(), input.len());
    assert!(out.stdout == input);
    assert_eq!(out.stderr, b"done\n");
}

#[tokio::test(flavor = "current_thread")]
async fn without_stdin_the_program_reads_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = run(&sh("cat; echo end", dir.path())).await.expect("runs");
    assert_eq!(out.stdout, b"end\n");
}

#[tokio::test(flavor = "current_thread")]
async fn a_timeout_kills_the_whole_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_file = dir.path().join("grandchild.pid");
    let script = format!(
        "sleep 1000 & echo $! > '{}'; echo started; sleep 1000",
        pid_file.display()
    );
    let mut spec = sh(&script, dir.path());
    spec.timeout = Some(Duration::from_millis(500));
    let start = Instant::now();
    let out = run(&spec).await.expect("runs");
    assert_eq!(out.ended, Ended::Timeout);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(out.code, None);
    assert!(out.signal.is_some());
    assert_eq!(out.stdout, b"started\n");
    let grandchild = read_pid(&pid_file).await;
    assert!(
        gone(grandchild, Duration::from_secs(3)).await,
        "grandchild survived"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_timeout_escalates_to_sigkill() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = sh(
        "trap '' TERM; echo ready; while :; do sleep 0.1; done",
        dir.path(),
    );
    spec.timeout = Some(Duration::from_millis(300));
    let start = Instant::now();
    let out = run(&spec).await.expect("runs");
    assert_eq!(out.ended, Ended::Timeout);
    assert_eq!(out.signal, Some(nix::libc::SIGKILL));
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_idle_timeout_ends_a_silent_program() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = sh("echo hi; sleep 1000", dir.path());
    spec.idle_timeout = Some(Duration::from_millis(400));
    spec.timeout = Some(Duration::from_secs(30));
    let start = Instant::now();
    let out = run(&spec).await.expect("runs");
    assert_eq!(out.ended, Ended::Idle);
    assert_eq!(out.stdout, b"hi\n");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_idle_timeout_spares_a_program_that_keeps_printing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let script = "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.15; done; \
                  for i in 1 2 3 4 5 6 7 8; do echo $i >&2; sleep 0.15; done";
    let mut spec = sh(script, dir.path());
    spec.idle_timeout = Some(Duration::from_millis(600));
    let out = run(&spec).await.expect("runs");
    assert_eq!(out.ended, Ended::Exited);
    assert_eq!(out.code, Some(0));
    assert_eq!(out.stdout.len(), 16);
    assert_eq!(out.stderr.len(), 16);
}

fn has_result(stdout: &[u8]) -> bool {
    stdout.windows(6).any(|w| w == b"RESULT")
}

#[tokio::test(flavor = "current_thread")]
async fn a_done_result_disarms_the_idle_timeout_and_survives_the_timeout() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = sh("echo RESULT; sleep 1000", dir.path());
    spec.idle_timeout = Some(Duration::from_millis(200));
    spec.timeout = Some(Duration::from_millis(1200));
    spec.result_done = Some(has_result);
    let start = Instant::now();
    let out = run(&spec).await.expect("runs");
    assert_eq!(out.ended, Ended::AfterResult);
    assert_eq!(out.stdout, b"RESULT\n");
    assert!(
        start.elapsed() >= Duration::from_millis(1100),
        "{:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn output_held_open_by_a_grandchild_does_not_hold_the_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pid_file = dir.path().join("grandchild.pid");
    let script = format!(
        "sleep 1000 & echo $! > '{}'; echo RESULT",
        pid_file.display()
    );
    let mut spec = sh(&script, dir.path());
    spec.result_done = Some(has_result);
    let start = Instant::now();
    let out = run(&spec).await.expect("runs");
    assert_eq!(out.ended, Ended::Exited);
    assert_eq!(out.code, Some(0));
    assert_eq!(out.stdout, b"RESULT\n");
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
    let grandchild = read_pid(&pid_file).await;
    assert!(
        gone(grandchild, Duration::from_secs(3)).await,
        "grandchild survived"
    );
}

/// A program that ends by itself, nothing left in its group, after starting daemons that
/// left its group and session: `setsid sleep`, and a double fork under `setsid` (the
/// daemon's parent exits, so it is nobody's child of ours). Found by the program's tag, they
/// are stopped soon after it ends, though the program's run returned at once.
#[tokio::test(flavor = "current_thread")]
async fn daemons_that_left_the_group_are_stopped_after_the_program_ends() {
    let dir = tempfile::tempdir().expect("temp dir");
    let one = dir.path().join("setsid.pid");
    let two = dir.path().join("double.pid");
    // Each daemon has left the session (it runs `sleep`, after `setsid`) before the program
    // ends, so that the end finds an empty group.
    let script = r#"setsid sleep 300 >/dev/null 2>&1 </dev/null &
echo $! > "$1"
setsid sh -c 'sleep 300 & echo $! > "$0"' "$2" >/dev/null 2>&1 </dev/null &
for i in $(seq 200); do
  [ -s "$2" ] && [ "$(cat /proc/$(cat "$1")/comm)" = sleep ] && [ "$(cat /proc/$(cat "$2")/comm)" = sleep ] && break
  sleep 0.05
done
echo started"#;
    let spec = ProcSpec {
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
            "sh".into(),
            one.to_string_lossy().into_owned(),
            two.to_string_lossy().into_owned(),
        ],
        cwd: dir.path().to_path_buf(),
        ..ProcSpec::default()
    };
    let start = Instant::now();
    let out = run(&spec).await.expect("runs");
    assert_eq!(
        out.stdout,
        b"started\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "the end waits for no daemon: {:?}",
        start.elapsed()
    );
    let daemons = [read_pid(&one).await, read_pid(&two).await];
    let mut survivors = Vec::new();
    for pid in daemons {
        if !gone(pid, Duration::from_secs(6)).await {
            let _ = kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            survivors.push(pid);
        }
    }
    assert!(
        survivors.is_empty(),
        "daemons {survivors:?} outlived their program"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_the_future_kills_the_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let child_file = dir.path().join("child.pid");
    let grandchild_file = dir.path().join("grandchild.pid");
    let script = format!(
        "echo $$ > '{}'; sleep 1000 & echo $! > '{}'; sleep 1000",
        child_file.display(),
        grandchild_file.display()
    );
    let spec = sh(&script, dir.path());
    let cut = tokio::time::timeout(Duration::from_millis(500), run(&spec)).await;
    assert!(cut.is_err(), "the program should still have been running");
    let child = read_pid(&child_file).await;
    let grandchild = read_pid(&grandchild_file).await;
    assert!(
        gone(grandchild, Duration::from_secs(4)).await,
        "grandchild survived"
    );
    assert!(gone(child, Duration::from_secs(4)).await, "child survived");
}

#[tokio::test(flavor = "current_thread")]
async fn a_missing_program_is_not_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    for program in ["/nonexistent/ralph-flow-test", "ralph-flow-no-such-program"] {
        let spec = ProcSpec {
            argv: vec![program.into()],
            cwd: dir.path().to_path_buf(),
            ..ProcSpec::default()
        };
        let err = run(&spec).await.expect_err("cannot start");
        assert_eq!(
            err,
            SpawnError::NotFound {
                program: program.into()
            }
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_file_that_is_not_executable_is_not_found() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("plain.txt");
    std::fs::write(&path, "not a program").expect("write");
    let program = path.display().to_string();
    let spec = ProcSpec {
        argv: vec![program.clone()],
        cwd: dir.path().to_path_buf(),
        ..ProcSpec::default()
    };
    let err = run(&spec).await.expect_err("cannot start");
    assert_eq!(err, SpawnError::NotFound { program });
}

#[tokio::test(flavor = "current_thread")]
async fn an_empty_command_or_a_missing_directory_is_another_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = ProcSpec {
        cwd: dir.path().to_path_buf(),
        ..ProcSpec::default()
    };
    assert!(matches!(run(&spec).await, Err(SpawnError::Other(_))));
    let spec = sh("true", &dir.path().join("missing"));
    assert!(matches!(run(&spec).await, Err(SpawnError::Other(_))));
}

//! Starting a program and waiting for it: stdin fed, both streams read as they come, and
//! the timeout, the idle timeout and the kill that follows, all in one `select!` loop.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::time::Instant;

use super::group::{GroupGuard, kill_tagged, new_tag};
use super::leftovers::{PidFile, ProcessLogEntry, StartWindow, boot_ticks};
use super::limit::{Limit, LimitHit};
use super::sink::Sink;
use super::{
    EOF_GRACE, Ended, KILL_GRACE, ProcOutput, ProcSpec, SpawnError, SpawnFailure, TAG_ENV,
};

/// How many programs [`run`] started in this process.
static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many programs [`run`] has started in this process so far: a run that sees the same
/// count at its end as at its start started none, and has no process to look for.
pub fn programs_started() -> u64 {
    STARTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// `/dev/null` for a program's input: one descriptor opened once and duplicated for each
/// program (a `dup` instead of an `open` of the path every time).
fn dev_null() -> Stdio {
    static NULL: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    NULL.get_or_init(|| std::fs::File::open("/dev/null").ok())
        .as_ref()
        .and_then(|f| f.try_clone().ok())
        .map_or_else(Stdio::null, Stdio::from)
}

/// Runs a program to its end (or its timeout). Dropping the future kills its process group.
///
/// The program runs in a new process group. When it ends by itself, whatever it left
/// behind in its group gets SIGTERM (and SIGKILL [`KILL_GRACE`] later, from a detached
/// thread). A timeout or an idle timeout sends SIGTERM to the group, waits up to
/// [`KILL_GRACE`] for the program to exit, then sends SIGKILL to the group. Dropping the
/// future does the same as the end of a run: SIGTERM at once, SIGKILL after the grace
/// period from a detached thread.
///
/// Once the program has exited, its output is read until end of file, but no longer than
/// [`EOF_GRACE`]: a grandchild holding the pipes open cannot hold the run.
///
/// Each stream is appended to its file as it arrives, up to [`FILE_CAP`](super::FILE_CAP)
/// bytes; a line at the end of the file then says how many more there were. In memory each
/// keeps at most [`MEMORY_CAP`](super::MEMORY_CAP) bytes: beyond that, the oldest bytes are
/// dropped (so the end of the output, where results are, stays) and counted in
/// `stdout_cut`/`stderr_cut`.
pub async fn run(spec: &ProcSpec) -> Result<ProcOutput, SpawnError> {
    let Some((program, args)) = spec.argv.split_first() else {
        return Err(SpawnFailure::EmptyCommand.into());
    };
    let tag = new_tag();
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env(TAG_ENV, &tag)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            dev_null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if !spec.cwd.as_os_str().is_empty() {
        // Whether it exists is asked only when the start fails (one system call less for
        // every program).
        command.current_dir(&spec.cwd);
    }
    let mut stdout_sink = Sink::new(spec.stdout_path.as_deref());
    let mut stderr_sink = Sink::new(spec.stderr_path.as_deref());

    let start = Instant::now();
    let before = boot_ticks();
    let spawned = command.spawn();
    let started = StartWindow {
        from: before,
        to: boot_ticks(),
    };
    let mut child = spawned.map_err(|e| start_error(spec, program, e))?;
    STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| SpawnFailure::NoProcessId(program.clone()))?;
    let group = GroupGuard {
        pgid: Pid::from_raw(pid),
        tag: tag.clone(),
    };
    // A record that cannot be written for a limit of the machine stops the program (the
    // guard's drop): a resume could not find it.
    let _pid_file = spec
        .pid_file
        .as_deref()
        .map(|path| PidFile::write(path, pid, started))
        .transpose()?;
    let _logged = spec
        .process_log
        .as_deref()
        .map(|path| ProcessLogEntry::start(path, pid, started))
        .transpose()?;

    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let stdin = child.stdin.take();
    let input = spec.stdin.as_deref().unwrap_or_default();
    let feed = async move {
        if let Some(mut pipe) = stdin {
            // A program that exits without reading its input breaks the pipe: not an error.
            let _ = pipe.write_all(input).await;
            let _ = pipe.shutdown().await;
        }
    };
    tokio::pin!(feed);
    let wait = child.wait();
    tokio::pin!(wait);

    // A limit too far to add to an instant (years) is no limit.
    let deadline = spec.timeout.and_then(|t| start.checked_add(t));
    let mut fed = spec.stdin.is_none();
    let mut status = None;
    let mut exited_at = None;
    let mut last_output = start;
    let mut result_done = false;
    let mut ended = Ended::Exited;
    let mut term_sent_at: Option<Instant> = None;
    let mut kill_sent = false;
    let mut out_buf = [0u8; 8192];
    let mut err_buf = [0u8; 8192];

    loop {
        if status.is_some() && stdout.is_none() && stderr.is_none() {
            break;
        }
        // The timeouts apply while the program runs and has not been told to stop.
        let running = status.is_none() && term_sent_at.is_none();
        let idle_at = spec
            .idle_timeout
            .filter(|_| !result_done && running)
            .and_then(|d| last_output.checked_add(d));
        let timeout_at = deadline.filter(|_| running);
        let kill_at = term_sent_at.filter(|_| !kill_sent).map(|t| t + KILL_GRACE);
        let eof_at = exited_at.map(|t: Instant| t + EOF_GRACE);
        tokio::select! {
            read = read_some(&mut stdout, &mut out_buf) => match read {
                Some(n) => {
                    last_output = Instant::now();
                    stdout_sink.push(&out_buf[..n]);
                    if !result_done {
                        result_done = spec.result_done.is_some_and(|done| done(&stdout_sink.kept));
                    }
                    stop_at_limit(&stdout_sink, &group, &mut term_sent_at, status.is_some());
                }
                None => stdout = None,
            },
            read = read_some(&mut stderr, &mut err_buf) => match read {
                Some(n) => {
                    last_output = Instant::now();
                    stderr_sink.push(&err_buf[..n]);
                    stop_at_limit(&stderr_sink, &group, &mut term_sent_at, status.is_some());
                }
                None => stderr = None,
            },
            () = &mut feed, if !fed => fed = true,
            done = &mut wait, if status.is_none() => {
                status = Some(done.map_err(|source| SpawnFailure::Wait { program: program.clone(), source })?);
                exited_at = Some(Instant::now());
            }
            () = sleep_until_opt(timeout_at) => {
                ended = if result_done { Ended::AfterResult } else { Ended::Timeout };
                group.signal(Signal::SIGTERM);
                term_sent_at = Some(Instant::now());
            }
            () = sleep_until_opt(idle_at) => {
                ended = Ended::Idle;
                group.signal(Signal::SIGTERM);
                term_sent_at = Some(Instant::now());
            }
            () = sleep_until_opt(kill_at) => {
                group.signal(Signal::SIGKILL);
                kill_tagged(&group.tag);
                kill_sent = true;
            }
            () = sleep_until_opt(eof_at) => break,
        }
    }
    if term_sent_at.is_some() && !kill_sent {
        // The program exited after SIGTERM; what is left of its group gets no more time,
        // and neither do descendants that left the group.
        group.signal(Signal::SIGKILL);
        kill_tagged(&group.tag);
    }
    drop(group);

    let (code, signal) = match status {
        Some(s) => (s.code(), s.signal()),
        None => (None, None),
    };
    let limited = stdout_sink.hit.is_some() || stderr_sink.hit.is_some();
    if !limited {
        stdout_sink.finish();
        stderr_sink.finish();
    }
    // What the program wrote reached its files before anyone could look: mask secrets now,
    // also (as far as the machine lets) before a limit it met is returned.
    mask_streamed(&stdout_sink, spec.stdout_path.as_deref());
    mask_streamed(&stderr_sink, spec.stderr_path.as_deref());
    // Its output could not be kept for a limit of the machine: the program was stopped, and
    // the run stops with it (the stage runs again on resume).
    if let Some(hit) = stdout_sink.hit.take().or_else(|| stderr_sink.hit.take()) {
        return Err(SpawnError::Limit(hit));
    }
    Ok(ProcOutput {
        code,
        signal,
        stdout_cut: stdout_sink.dropped,
        stderr_cut: stderr_sink.dropped,
        stdout: stdout_sink.kept,
        stderr: stderr_sink.kept,
        ended,
        elapsed: start.elapsed(),
    })
}

/// Masks the secrets in a stream's file. A stream that got no byte made no file: nothing to
/// do (no system call). One kept whole in memory is the file's content: masked there, the
/// file rewritten only when that changed something (no read). Only a stream beyond
/// [`MEMORY_CAP`](super::MEMORY_CAP), or one whose file met a limit of the machine, has its
/// file read back and masked.
pub(super) fn mask_streamed(sink: &Sink, path: Option<&std::path::Path>) {
    let Some(path) = path else {
        return;
    };
    if sink.kept.is_empty() && sink.dropped == 0 {
        return;
    }
    if sink.dropped == 0 && sink.hit.is_none() {
        crate::secrets::redact_streamed(path, &sink.kept);
    } else {
        crate::secrets::redact_file(path);
    }
}

/// Why a program could not start, from the spawn's error.
pub(super) fn start_error(spec: &ProcSpec, program: &str, e: io::Error) -> SpawnError {
    // Too many open files for its pipes: the machine's limit, not the program's failure.
    if let Some(limit) = Limit::of(&e) {
        return SpawnError::Limit(LimitHit {
            limit,
            what: format!("could not start `{program}`"),
            source: e,
        });
    }
    match e.kind() {
        // The child's `chdir` failing looks like a missing program: tell them apart.
        _ if !spec.cwd.as_os_str().is_empty() && !spec.cwd.is_dir() => {
            SpawnFailure::NoWorkingDirectory(spec.cwd.clone()).into()
        }
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => SpawnError::NotFound {
            program: program.to_string(),
        },
        _ => SpawnFailure::Start {
            program: program.to_string(),
            source: e,
        }
        .into(),
    }
}

/// Reads a chunk from a pipe; `None` at end of file or on an error. Pends forever when the
/// pipe is already closed, so that a `select!` branch on it stays quiet.
async fn read_some<R: AsyncRead + Unpin>(pipe: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    match pipe {
        Some(p) => match p.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

/// Stops a running program (SIGTERM to its group; SIGKILL follows after the grace period)
/// once its output cannot be kept for a limit of the machine: it would run on for nothing.
fn stop_at_limit(
    sink: &Sink,
    group: &GroupGuard,
    term_sent_at: &mut Option<Instant>,
    exited: bool,
) {
    if sink.hit.is_some() && term_sent_at.is_none() && !exited {
        group.signal(Signal::SIGTERM);
        *term_sent_at = Some(Instant::now());
    }
}

/// Sleeps until the instant, or forever without one.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn limits_too_far_to_reach_are_no_limits() {
        let spec = ProcSpec {
            argv: vec!["true".into()],
            timeout: Some(Duration::MAX),
            idle_timeout: Some(Duration::MAX),
            ..ProcSpec::default()
        };
        let out = run(&spec).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.code, Some(0));
        assert_eq!(out.ended, Ended::Exited);
    }
}

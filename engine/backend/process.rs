//! Running a program: its own process group, stdin, streamed output, timeouts.
//!
//! Every program runs in a new process group. A timeout, an idle timeout or dropping the
//! future kills the whole group (SIGTERM, then SIGKILL after a grace period), so an agent's
//! children never outlive it.

use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::time::Instant;

/// A program to run. Never through a shell: `argv[0]` is the program.
#[derive(Clone, Debug, Default)]
pub struct ProcSpec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// Added to the inherited environment.
    pub env: Vec<(String, String)>,
    /// Written to stdin, which is then closed; without it stdin is empty (`/dev/null`).
    pub stdin: Option<Vec<u8>>,
    /// Kills the group after this long.
    pub timeout: Option<Duration>,
    /// Kills the group when neither stdout nor stderr produced a byte for this long.
    pub idle_timeout: Option<Duration>,
    /// Receives stdout as it arrives.
    pub stdout_path: Option<PathBuf>,
    /// Receives stderr as it arrives.
    pub stderr_path: Option<PathBuf>,
    /// Tells, from all stdout so far, whether the program's result is complete. From then
    /// on the idle timeout no longer applies, and a timeout ends the program but keeps the
    /// result ([`Ended::AfterResult`]).
    pub result_done: Option<fn(&[u8]) -> bool>,
}

/// How a program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited (or was killed by a signal) by itself.
    Exited,
    /// The timeout killed it.
    Timeout,
    /// The idle timeout killed it.
    Idle,
    /// It had produced its result and then hung; the timeout ended it.
    AfterResult,
}

/// What a program did.
#[derive(Clone, Debug)]
pub struct ProcOutput {
    /// The exit code, when it exited normally.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub ended: Ended,
    pub elapsed: Duration,
}

/// Why a program could not be started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpawnError {
    /// The program does not exist (or is not executable).
    NotFound { program: String },
    /// Anything else (an empty argv, a missing working directory, an I/O error).
    Other(String),
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnError::NotFound { program } => {
                write!(f, "`{program}` was not found; install it or put it on PATH")
            }
            SpawnError::Other(m) => f.write_str(m),
        }
    }
}

/// How long a group has between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// How long, once the program itself has exited, its output may stay open (held by a
/// child it left behind) before the run stops reading it.
pub const EOF_GRACE: Duration = Duration::from_secs(2);

/// How much of each stream is kept in memory; the files receive everything.
pub const MEMORY_CAP: usize = 16 * 1024 * 1024;

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
/// Each stream is appended to its file as it arrives. In memory each keeps at most
/// [`MEMORY_CAP`] bytes: beyond that, the oldest bytes are dropped (so the end of the
/// output, where results are, stays).
pub async fn run(spec: &ProcSpec) -> Result<ProcOutput, SpawnError> {
    let Some((program, args)) = spec.argv.split_first() else {
        return Err(SpawnError::Other(
            "nothing to run: the command is empty".into(),
        ));
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if !spec.cwd.as_os_str().is_empty() {
        if !spec.cwd.is_dir() {
            return Err(SpawnError::Other(format!(
                "the working directory {} does not exist",
                spec.cwd.display()
            )));
        }
        command.current_dir(&spec.cwd);
    }
    let mut stdout_sink = Sink::open(spec.stdout_path.as_deref())?;
    let mut stderr_sink = Sink::open(spec.stderr_path.as_deref())?;

    let start = Instant::now();
    let mut child = command.spawn().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => SpawnError::NotFound {
            program: program.clone(),
        },
        _ => SpawnError::Other(format!("could not start `{program}`: {e}")),
    })?;
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| SpawnError::Other(format!("`{program}` has no process id")))?;
    let group = GroupGuard(Pid::from_raw(pid));

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

    let deadline = spec.timeout.map(|t| start + t);
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
            .map(|d| last_output + d);
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
                }
                None => stdout = None,
            },
            read = read_some(&mut stderr, &mut err_buf) => match read {
                Some(n) => {
                    last_output = Instant::now();
                    stderr_sink.push(&err_buf[..n]);
                }
                None => stderr = None,
            },
            () = &mut feed, if !fed => fed = true,
            done = &mut wait, if status.is_none() => {
                status = Some(done.map_err(|e| SpawnError::Other(format!("waiting for `{program}`: {e}")))?);
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
                kill_sent = true;
            }
            () = sleep_until_opt(eof_at) => break,
        }
    }
    if term_sent_at.is_some() && !kill_sent {
        // The program exited after SIGTERM; what is left of its group gets no more time.
        group.signal(Signal::SIGKILL);
    }
    drop(group);

    let (code, signal) = match status {
        Some(s) => (s.code(), s.signal()),
        None => (None, None),
    };
    Ok(ProcOutput {
        code,
        signal,
        stdout: stdout_sink.kept,
        stderr: stderr_sink.kept,
        ended,
        elapsed: start.elapsed(),
    })
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

/// Sleeps until the instant, or forever without one.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One output stream: its file (created when the first byte arrives, so a silent program
/// costs no file) and the part kept in memory.
struct Sink {
    file: Option<std::fs::File>,
    path: Option<PathBuf>,
    kept: Vec<u8>,
}

impl Sink {
    fn open(path: Option<&Path>) -> Result<Self, SpawnError> {
        if let Some(dir) = path.and_then(Path::parent) {
            if !dir.as_os_str().is_empty() && !dir.is_dir() {
                return Err(SpawnError::Other(format!(
                    "cannot write output to {}: the directory does not exist",
                    dir.display()
                )));
            }
        }
        Ok(Sink {
            file: None,
            path: path.map(Path::to_path_buf),
            kept: Vec::new(),
        })
    }

    /// Appends a chunk to the file and to memory, dropping the oldest bytes beyond the cap
    /// (a quarter of the cap at a time, so that trimming stays cheap).
    fn push(&mut self, chunk: &[u8]) {
        if self.file.is_none() {
            if let Some(p) = self.path.take() {
                match std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&p)
                {
                    Ok(f) => {
                        self.file = Some(f);
                        self.path = Some(p);
                    }
                    Err(e) => tracing::warn!("cannot open {}: {e}; not writing it", p.display()),
                }
            }
        }
        if let Some(file) = &mut self.file {
            if let Err(e) = file.write_all(chunk) {
                let path = self.path.as_deref().unwrap_or(Path::new(""));
                tracing::warn!(
                    "cannot write to {}: {e}; not writing it further",
                    path.display()
                );
                self.file = None;
                self.path = None;
            }
        }
        self.kept.extend_from_slice(chunk);
        if self.kept.len() > MEMORY_CAP {
            let excess = self.kept.len() - MEMORY_CAP * 3 / 4;
            self.kept.drain(..excess);
        }
    }
}

/// Owns a process group: when dropped, signals whatever is left of it (SIGTERM at once,
/// then SIGKILL after [`KILL_GRACE`] from a detached thread, so that dropping never blocks).
struct GroupGuard(Pid);

impl GroupGuard {
    /// Sends a signal to the group; a group already gone is not an error.
    fn signal(&self, signal: Signal) {
        let _ = killpg(self.0, signal);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // Nothing left of the group: nothing to do (and no thread to start).
        if killpg(self.0, None).is_err() {
            return;
        }
        self.signal(Signal::SIGTERM);
        let pgid = self.0;
        std::thread::spawn(move || {
            std::thread::sleep(KILL_GRACE);
            let _ = killpg(pgid, Signal::SIGKILL);
        });
    }
}

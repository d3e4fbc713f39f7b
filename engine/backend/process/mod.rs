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
    /// Where the program's process group and start time are written once it runs
    /// (`PGID START_TICKS`), so that a later `resume` can stop what a killed run left
    /// behind; removed when the program has ended.
    pub pid_file: Option<PathBuf>,
    /// The same, as lines appended to a log shared by many programs (`start PGID TICKS`
    /// when it runs, `end PGID TICKS` when it has ended): no file made or removed per
    /// program. [`stop_leftovers`] reads it.
    pub process_log: Option<PathBuf>,
}

/// The environment variable every program gets, unique to its run of [`run`]: what a
/// timeout or a cancellation also kills by, so that descendants that left the process group
/// (`setsid`) go too.
pub const TAG_ENV: &str = "RALPH_FLOW_PROCESS";

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
    /// The end of stdout (at most [`MEMORY_CAP`] bytes).
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// How many bytes of stdout came before `stdout` and are not in it.
    pub stdout_cut: u64,
    /// How many bytes of stderr came before `stderr` and are not in it.
    pub stderr_cut: u64,
    pub ended: Ended,
    pub elapsed: Duration,
}

/// Why a program could not be started (or waited for).
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The program does not exist (or is not executable).
    #[error("`{program}` was not found; install it or put it on PATH")]
    NotFound { program: String },
    /// Anything else: an empty command, a missing working directory, an I/O error.
    #[error(transparent)]
    Other(#[from] SpawnFailure),
}

/// A failure to run a program other than its absence.
#[derive(Debug, thiserror::Error)]
pub enum SpawnFailure {
    #[error("nothing to run: the command is empty")]
    EmptyCommand,
    #[error("the working directory {} does not exist", .0.display())]
    NoWorkingDirectory(PathBuf),
    #[error("could not start `{program}`")]
    Start {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("`{0}` has no process id")]
    NoProcessId(String),
    #[error("waiting for `{program}`")]
    Wait {
        program: String,
        #[source]
        source: io::Error,
    },
}

/// Errors are equal when they are of the same kind and say the same (I/O errors have no
/// equality of their own).
impl PartialEq for SpawnError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (SpawnError::NotFound { program: a }, SpawnError::NotFound { program: b }) => a == b,
            (SpawnError::Other(a), SpawnError::Other(b)) => {
                std::mem::discriminant(a) == std::mem::discriminant(b)
                    && super::error_chain(a) == super::error_chain(b)
            }
            _ => false,
        }
    }
}

/// How long a group has between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// How long, once the program itself has exited, its output may stay open (held by a
/// child it left behind) before the run stops reading it.
pub const EOF_GRACE: Duration = Duration::from_secs(2);

/// How much of each stream is kept in memory (its end).
pub const MEMORY_CAP: usize = 16 * 1024 * 1024;

/// How much of each stream its file receives (its start); a line at the end of the file
/// says how many bytes more there were.
pub const FILE_CAP: u64 = 64 * 1024 * 1024;

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
/// Each stream is appended to its file as it arrives, up to [`FILE_CAP`] bytes; a line at
/// the end of the file then says how many more there were. In memory each keeps at most
/// [`MEMORY_CAP`] bytes: beyond that, the oldest bytes are dropped (so the end of the
/// output, where results are, stays) and counted in `stdout_cut`/`stderr_cut`.
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
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if !spec.cwd.as_os_str().is_empty() {
        if !spec.cwd.is_dir() {
            return Err(SpawnFailure::NoWorkingDirectory(spec.cwd.clone()).into());
        }
        command.current_dir(&spec.cwd);
    }
    let mut stdout_sink = Sink::new(spec.stdout_path.as_deref());
    let mut stderr_sink = Sink::new(spec.stderr_path.as_deref());

    let start = Instant::now();
    let mut child = command.spawn().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => SpawnError::NotFound {
            program: program.clone(),
        },
        _ => SpawnFailure::Start {
            program: program.clone(),
            source: e,
        }
        .into(),
    })?;
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| SpawnFailure::NoProcessId(program.clone()))?;
    let group = GroupGuard {
        pgid: Pid::from_raw(pid),
        tag: tag.clone(),
    };
    let _pid_file = spec
        .pid_file
        .as_deref()
        .map(|path| PidFile::write(path, pid));
    let _logged = spec
        .process_log
        .as_deref()
        .map(|path| ProcessLogEntry::start(path, pid));

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
    stdout_sink.finish();
    stderr_sink.finish();
    // What the program wrote reached its files before anyone could look: mask secrets now.
    for path in [&spec.stdout_path, &spec.stderr_path].into_iter().flatten() {
        crate::secrets::redact_file(path);
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
    /// Bytes dropped from the front of `kept`.
    dropped: u64,
    /// Bytes written to the file.
    written: u64,
    /// Bytes not written because the file reached [`FILE_CAP`].
    unwritten: u64,
}

impl Sink {
    fn new(path: Option<&Path>) -> Self {
        Sink {
            file: None,
            path: path.map(Path::to_path_buf),
            kept: Vec::new(),
            dropped: 0,
            written: 0,
            unwritten: 0,
        }
    }

    /// Appends a chunk to the file and to memory, dropping the oldest bytes beyond the cap
    /// (a quarter of the cap at a time, so that trimming stays cheap).
    fn push(&mut self, chunk: &[u8]) {
        if self.file.is_none() {
            if let Some(p) = self.path.take() {
                // Its directory is made with its first byte (a silent program makes none).
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    let _ = std::fs::create_dir_all(dir);
                }
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
        let room = usize::try_from(FILE_CAP.saturating_sub(self.written)).unwrap_or(usize::MAX);
        let (to_file, over) = chunk.split_at(chunk.len().min(room));
        self.written += to_file.len() as u64;
        self.unwritten += over.len() as u64;
        if let (Some(file), false) = (&mut self.file, to_file.is_empty()) {
            if let Err(e) = file.write_all(to_file) {
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
            self.dropped += excess as u64;
        }
    }

    /// Ends the file with a line saying how much did not fit in it.
    fn finish(&mut self) {
        if self.unwritten == 0 {
            return;
        }
        if let Some(file) = &mut self.file {
            let _ = write!(
                file,
                "\n[ralph-flow: this file keeps the first {} bytes of the stream; {} more bytes were not written]\n",
                self.written, self.unwritten
            );
        }
    }
}

/// Owns a process group: when dropped, signals whatever is left of it (SIGTERM at once,
/// then SIGKILL after [`KILL_GRACE`] from a detached thread, so that dropping never blocks).
/// A cancelled program's descendants that left the group are killed too (by their tag).
struct GroupGuard {
    pgid: Pid,
    tag: String,
}

impl GroupGuard {
    /// Sends a signal to the group; a group already gone is not an error.
    fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        // Nothing left of the group: nothing to do (and no thread to start).
        if killpg(self.pgid, None).is_err() {
            return;
        }
        self.signal(Signal::SIGTERM);
        let pgid = self.pgid;
        let tag = std::mem::take(&mut self.tag);
        std::thread::spawn(move || {
            std::thread::sleep(KILL_GRACE);
            let _ = killpg(pgid, Signal::SIGKILL);
            kill_tagged(&tag);
        });
    }
}

/// A tag no other program of this machine carries: this process's id, a counter and the
/// time.
fn new_tag() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The processes whose environment holds `KEY=VALUE` (those this user may read), other
/// than this process.
pub fn processes_with_env(key: &str, value: &str) -> Vec<i32> {
    let wanted = format!("{key}={value}");
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == wanted.as_bytes()))
        })
        .filter_map(|pid| i32::try_from(pid).ok())
        .collect()
}

/// Kills (SIGKILL) every process tagged with one run of a program.
fn kill_tagged(tag: &str) {
    if tag.is_empty() {
        return;
    }
    for pid in processes_with_env(TAG_ENV, tag) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// When a process started, in clock ticks after boot (`/proc/PID/stat`, field 22): with the
/// pid, it names one process, even after the pid is reused.
pub fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Tells whether a process is alive (a zombie is not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(|st| st != "Z" && st != "X"))
        })
        .unwrap_or(false)
}

/// The file that records a running program's group, removed when it ends.
struct PidFile(PathBuf);

impl PidFile {
    fn write(path: &Path, pid: i32) -> PidFile {
        let ticks = start_ticks(pid).unwrap_or(0);
        if let Err(e) = std::fs::write(path, format!("{pid} {ticks}\n")) {
            tracing::warn!("cannot write {}: {e}", path.display());
        }
        PidFile(path.to_path_buf())
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A program's lines in a process log: `start` now, `end` when dropped.
struct ProcessLogEntry {
    path: PathBuf,
    line: String,
}

impl ProcessLogEntry {
    fn start(path: &Path, pid: i32) -> ProcessLogEntry {
        let entry = ProcessLogEntry {
            path: path.to_path_buf(),
            line: format!("{pid} {}", start_ticks(pid).unwrap_or(0)),
        };
        entry.append("start");
        entry
    }

    fn append(&self, what: &str) {
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(format!("{what} {}\n", self.line).as_bytes()));
        if let Err(e) = written {
            tracing::warn!("cannot write {}: {e}", self.path.display());
        }
    }
}

impl Drop for ProcessLogEntry {
    fn drop(&mut self) {
        self.append("end");
    }
}

/// The groups a process log says were started and have not ended (`PGID TICKS` each).
fn unended(log: &Path) -> Vec<(i32, u64)> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Vec::new();
    };
    let mut open: Vec<(i32, u64)> = Vec::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(what), Some(pid), Some(ticks)) = (
            parts.next(),
            parts.next().and_then(|p| p.parse::<i32>().ok()),
            parts.next().and_then(|t| t.parse::<u64>().ok()),
        ) else {
            continue;
        };
        match what {
            "start" => open.push((pid, ticks)),
            "end" => open.retain(|g| *g != (pid, ticks)),
            _ => {}
        }
    }
    open
}

/// Stops what an earlier executor of a run left running, before the run goes on: the
/// process groups recorded in `pid_files` and in the process logs `logs` (when the
/// recorded start time still matches; the logs are emptied), and
/// every process whose environment names the run (`RALPH_FLOW_RUN=RUN`, which catches
/// descendants that left their group). SIGTERM, then SIGKILL after [`KILL_GRACE`]; it
/// returns once they are gone (or after a few seconds more), with how many there were.
pub fn stop_leftovers(run: &str, pid_files: &[PathBuf], logs: &[PathBuf]) -> usize {
    let mut groups = Vec::new();
    for log in logs {
        for (pid, ticks) in unended(log) {
            if start_ticks(pid) == Some(ticks) {
                groups.push(pid);
            }
        }
        let _ = std::fs::remove_file(log);
    }
    for file in pid_files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let mut parts = text.split_whitespace();
        let (Some(pid), Some(ticks)) = (
            parts.next().and_then(|p| p.parse::<i32>().ok()),
            parts.next().and_then(|t| t.parse::<u64>().ok()),
        ) else {
            continue;
        };
        // Only the process that was recorded: a pid reused since then is someone else's.
        if start_ticks(pid) == Some(ticks) {
            groups.push(pid);
        }
        let _ = std::fs::remove_file(file);
    }
    let tagged = processes_with_env("RALPH_FLOW_RUN", run);
    let mut all: Vec<i32> = groups.clone();
    all.extend(&tagged);
    all.sort_unstable();
    all.dedup();
    if all.is_empty() {
        return 0;
    }
    for &g in &groups {
        let _ = killpg(Pid::from_raw(g), Signal::SIGTERM);
    }
    for &p in &tagged {
        let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let wait = |limit: Duration| {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            let left = all.iter().any(|&p| alive(p))
                || !processes_with_env("RALPH_FLOW_RUN", run).is_empty();
            if !left {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    };
    if !wait(KILL_GRACE) {
        for &g in &groups {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
        for p in processes_with_env("RALPH_FLOW_RUN", run)
            .into_iter()
            .chain(all.iter().copied())
        {
            let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        wait(Duration::from_secs(5));
    }
    all.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_log_gives_the_groups_that_started_and_did_not_end() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let log = tmp.path().join("processes");
        std::fs::write(
            &log,
            "start 10 100\nstart 11 110\nend 10 100\nstart 10 200\ngarbage\nstart 12",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        // Group 10 ended once and started again (a reused pid, another start time).
        assert_eq!(unended(&log), vec![(11, 110), (10, 200)]);
        assert!(unended(&tmp.path().join("none")).is_empty());
    }

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

    #[tokio::test]
    async fn a_program_is_logged_while_it_runs_and_not_after() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let log = tmp.path().join("processes");
        let spec = ProcSpec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "cat \"$0\"".into(),
                log.to_string_lossy().into_owned(),
            ],
            process_log: Some(log.clone()),
            ..ProcSpec::default()
        };
        let out = run(&spec).await.unwrap_or_else(|e| panic!("{e}"));
        let seen = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            seen.starts_with("start "),
            "the program saw its own line: {seen}"
        );
        assert!(
            unended(&log).is_empty(),
            "{:?}",
            std::fs::read_to_string(&log)
        );
    }
}

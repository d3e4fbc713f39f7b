//! Running a program: its own process group, stdin, streamed output, timeouts.
//!
//! Every program runs in a new process group. A timeout, an idle timeout or dropping the
//! future kills the whole group (SIGTERM, then SIGKILL after a grace period), so an agent's
//! children never outlive it.

use std::path::PathBuf;
use std::time::Duration;

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

/// Runs a program to its end (or its timeout). Dropping the future kills its process group.
pub async fn run(spec: &ProcSpec) -> Result<ProcOutput, SpawnError> {
    let _ = spec;
    Err(SpawnError::Other("not built yet".into()))
}

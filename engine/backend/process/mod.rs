//! Running a program: its own process group, stdin, streamed output, timeouts.
//!
//! Every program runs in a new process group. A timeout, an idle timeout or dropping the
//! future kills the whole group (SIGTERM, then SIGKILL after a grace period), so an agent's
//! children never outlive it.
//!
//! This file holds what a caller gives and gets back ([`ProcSpec`], [`ProcOutput`],
//! [`Ended`]) and the limits; `spawn.rs` runs a program ([`run`]), `sink.rs` captures its
//! output, `group.rs` kills its group and its tagged descendants, `leftovers.rs` records it
//! while it runs and stops what a killed run left ([`stop_leftovers`]), `error.rs` says why
//! it could not start ([`SpawnError`]), `limit.rs` tells a limit of the machine reached
//! (open files, disk space, file size: [`Limit`]) from other errors. `session.rs` starts a
//! program the caller talks to over its stdin and stdout while it runs ([`start`]: an ACP
//! agent), in the same kind of group, its stderr captured the same way.

mod error;
mod group;
mod leftovers;
pub mod limit;
mod session;
mod sink;
mod spawn;

use std::path::PathBuf;
use std::time::Duration;

pub use error::{SpawnError, SpawnFailure};
pub use group::processes_with_env;
pub use leftovers::{start_ticks, stop_leftovers};
pub use limit::{Limit, LimitHit};
pub use session::{Session, SessionEnd, start};
pub use spawn::{programs_started, run};

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

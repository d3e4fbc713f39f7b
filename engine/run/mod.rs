//! The run side: a generic executor over a compiled [`crate::compile::Plan`], with backends, a durable store
//! and artifacts on disk. Nothing here knows any particular workflow.
//!
//! - [`crate::prepare`] (above this layer) loads, checks and compiles a workflow into a
//!   [`Prepared`]: its plan, its files' hash, and its subflows compiled ahead.
//! - [`execute`] runs (or resumes) it and returns how the run ended.

mod agent;
pub mod answer;
pub mod artifacts;
mod attempt;
mod budget;
pub mod cancel;
mod command;
mod context;
pub mod error;
mod exec;
pub mod extract;
mod fanout;
mod frame;
mod gate;
mod lifecycle;
mod loops;
pub mod memory;
mod notify;
mod policy;
pub mod progress;
mod publish;
mod resource;
mod schedule;
mod subflow;
pub mod trace;
pub mod units;
mod watch;
pub mod worker;
mod worktree;
pub use worktree::remove_outside_run as remove_worktree;
mod worktrees;

use std::path::PathBuf;
use std::time::Duration;

pub use crate::store::now_ms;
pub use lifecycle::{execute, new_run_id, register_secrets};

pub use crate::compile::{PrepareError, Prepared};

/// How a run is carried out.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The state directory (`.ralph-flow`): the artifacts, and the store unless `store` is
    /// set.
    pub state_dir: PathBuf,
    /// The store `--store` names (a PostgreSQL database), instead of the state directory's
    /// SQLite file.
    pub store: Option<crate::store::Location>,
    /// The directory commands and agents run in (the project).
    pub cwd: PathBuf,
    /// Caps every running stage, whatever the workflow says.
    pub max_concurrency: Option<usize>,
    /// Keep polling gates (`true`), or stop with the waiting code when only gates are left.
    pub wait: bool,
    /// How often a waiting gate looks for an answer.
    pub gate_poll: Duration,
    /// Record every backend exchange to this file.
    pub record: Option<PathBuf>,
    /// Answer every agent call from this recording instead of a backend.
    pub replay: Option<PathBuf>,
    /// The first delay of exponential backoff for transient failures and rate limits.
    pub backoff: Duration,
    /// How many times a transient failure is retried.
    pub transient_retries: u32,
    /// The longest a rate-limited stage waits in all before it fails.
    pub rate_limit_wait: Duration,
    /// Durable commits with `synchronous=FULL` instead of `NORMAL`.
    pub full_sync: bool,
    pub progress: progress::Mode,
    /// Resume this run instead of starting one.
    pub resume: Option<String>,
    /// How long the run's lease lasts unless renewed (a heartbeat renews it every third of
    /// it); once expired, another process may take the run over. [`LEASE`], or
    /// `RALPH_FLOW_LEASE` (a duration such as `2s`).
    pub lease: Duration,
    /// Stops the run as Ctrl-C does once it turns true (a worker that is told to stop).
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// Publish the run's git workspaces to this repository after every agent, command and
    /// check stage (a run on workers: see `publish`), and restore its worktrees from it.
    pub publish: Option<String>,
    /// Spread the run's agent calls and programs over the workers as units of work, each
    /// needing these labels (the run's) besides its stage's (a run on workers; PostgreSQL).
    pub spread: Option<Vec<String>>,
    /// The store's notifications, routed to the coordinator waiting for the unit each
    /// names (a worker's listener): it looks at once instead of at its next poll.
    pub unit_wake: Option<std::sync::Arc<units::UnitWakes>>,
    /// The tenure that already holds the run (a worker's claim took its lock): the run goes
    /// on under it, so the claim and the executor are one holder. `None`: the executor
    /// draws a tenure of its own as it takes the run.
    pub owner: Option<crate::store::LockOwner>,
    /// Notifiers besides the workflow's own: the user's config file's (`[notify.NAME]`),
    /// checked by the caller.
    pub notify: Vec<crate::model::Notify>,
}

/// The default lease of a run (see [`RunOptions::lease`]); the store's own default, which it
/// uses for a lock whose owner names none.
pub const LEASE: Duration = crate::store::LEASE;

/// The environment variable that sets the lease.
pub const LEASE_ENV: &str = "RALPH_FLOW_LEASE";

/// The lease in force: [`LEASE_ENV`] when it holds a duration of at least 100ms, else
/// [`LEASE`].
pub fn lease_from_env() -> Duration {
    std::env::var(LEASE_ENV)
        .ok()
        .and_then(|v| crate::model::parse_duration(v.trim()))
        .filter(|d| *d >= Duration::from_millis(100))
        .unwrap_or(LEASE)
}

impl RunOptions {
    /// Where the run's records are kept.
    pub fn location(&self) -> crate::store::Location {
        match &self.store {
            Some(location) => location.clone(),
            None => crate::store::Location::StateDir(self.state_dir.clone()),
        }
    }

    /// The defaults for a project directory.
    pub fn new(cwd: PathBuf) -> Self {
        RunOptions {
            state_dir: cwd.join(".ralph-flow"),
            store: None,
            cwd,
            max_concurrency: None,
            wait: true,
            gate_poll: Duration::from_millis(500),
            record: None,
            replay: None,
            backoff: Duration::from_secs(2),
            transient_retries: 3,
            rate_limit_wait: Duration::from_secs(6 * 3600),
            full_sync: false,
            progress: progress::Mode::Plain,
            resume: None,
            lease: lease_from_env(),
            stop: None,
            publish: None,
            spread: None,
            unit_wake: None,
            owner: None,
            notify: Vec::new(),
        }
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEnd {
    /// It took an exit: `success`, `failed` or a declared one.
    Exit {
        name: String,
        code: i64,
        message: Option<String>,
    },
    /// It stopped to wait on gates (their names).
    Waiting(Vec<String>),
    /// Ctrl-C stopped it.
    Interrupted,
    /// It was cancelled (`ralph-flow cancel`, the monitor) while it ran: its stages were
    /// stopped as Ctrl-C stops them, and it cannot be resumed.
    Cancelled(crate::store::Cancellation),
}

/// What [`execute`] returns.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub run_id: String,
    pub end: RunEnd,
    /// The outputs of the top-level stages that ran, by id (read when asked for).
    pub outputs: RanOutputs,
    /// The usage of every agent call of the run (a resumed run's earlier calls included).
    pub usage: crate::backend::Usage,
    /// What the executor did, counted.
    pub work: WorkCounts,
}

/// The outputs of a run's top-level stages, kept as the executor left them and turned into
/// JSON only when asked (`run --json`): a copy of every output at the end of a long run
/// was its largest allocation (14 MB at 10,000 stages).
#[derive(Clone, Debug)]
pub struct RanOutputs(std::sync::Arc<frame::Outputs>);

impl RanOutputs {
    /// The outputs of the stages that ran (not skipped), by id.
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        self.0.ran()
    }
}

/// Writes the outputs of the stages that ran as a JSON object, one output at a time and with
/// secrets masked: `run --json` at the end of a run of 10,000 stages does not build every
/// output's value at once.
impl serde::Serialize for RanOutputs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let views = self.0.borrow();
        let mut map = serializer.serialize_map(None)?;
        for (id, view) in views
            .iter()
            .filter(|(_, v)| v.state != crate::store::NodeState::Skipped)
        {
            let mut output = view.try_output().map_err(serde::ser::Error::custom)?;
            crate::secrets::redact_json(&mut output);
            map.serialize_entry(&*crate::secrets::redact(id), &output)?;
        }
        map.end()
    }
}

/// Counts of the executor's own work in a run (tests check with them that the cost per stage
/// stays flat as runs grow).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCounts {
    /// Template contexts made.
    pub contexts: u64,
    /// Values copied into them: the frames of the chain and their variables, never the
    /// settled stages (templates read those when they ask).
    pub context_items: u64,
    /// Nodes the schedulers looked at to find what is ready.
    pub scheduled: u64,
    /// Settlements (replayed ones of a resume included).
    pub settled: u64,
    /// Durable commits.
    pub commits: u64,
    /// Long outputs left to the store by their views (read back when a template asks).
    pub outputs_in_store: u64,
    /// Outputs read back from the store.
    pub outputs_read: u64,
}

impl RunEnd {
    /// Returns the process exit code.
    pub fn code(&self) -> i32 {
        match self {
            RunEnd::Exit { code, .. } => i32::try_from(*code).unwrap_or(1),
            RunEnd::Waiting(_) => crate::exit::WAITING,
            RunEnd::Interrupted => crate::exit::INTERRUPTED,
            RunEnd::Cancelled(_) => crate::exit::CANCELLED,
        }
    }
}

/// The parameter values of a run as JSON.
pub fn params_json(params: &crate::params::ParamValues) -> serde_json::Value {
    serde_json::to_value(params).unwrap_or_default()
}

//! Durable run state behind one trait.
//!
//! The executor writes only what changed: a node's settlement, an attempt, an event, a gate
//! request; several writes that happen together go in one [`Store::commit`] (one transaction).
//! Everything a resume needs is here; artifacts people read live on disk beside it.
//! [`sqlite::SqliteStore`] is the default; a store named by a URL (PostgreSQL's) implements
//! the same trait, and what only a shared store can do besides ([`shared`]). Which store a
//! [`Location`] opens is decided here ([`location::URL_STORES`]), not by its callers.

pub mod liveness;
pub mod location;
pub mod postgres;
pub mod shared;
pub mod sqlite;

pub use location::{Location, OpenOptions, Opened};
pub use shared::{
    Accept, AcceptUnit, RunQueue, SharedStore, Unit, UnitQueue, UnitRequest, UnitState, Wake,
    WorkerRegistry,
};
pub use sqlite::{default_path, open_default};

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A store error, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed on the store file.
    #[error("{what} {}", path.display())]
    Sqlite {
        what: String,
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// A file or directory beside the store (its directory, a spilled output) failed.
    #[error(transparent)]
    Io(#[from] crate::fs::IoFailure),
    /// A value could not be written or read as JSON.
    #[error("{what}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The store's file is damaged, lost its write-ahead log, or was deleted or replaced
    /// under the run: what happened, and how to recover.
    #[error("{0}")]
    Damaged(String),
    /// The store was written by another version of ralph-flow (its schema, or a value this
    /// version does not know), said with which one to use.
    #[error("{0}")]
    Version(String),
    /// Another process kept the store busy for longer than a call waits.
    #[error("{0}")]
    Busy(String),
    /// The store cannot work where it is (a file system without write-ahead logging).
    #[error("{0}")]
    Unsupported(String),
    /// The connection to the store is closed, or was lost for longer than a call waits, or
    /// could not be started.
    #[error("{0}")]
    Connection(String),
    /// `--store` (or [`STORE_ENV`]) names no store this ralph-flow knows.
    #[error(
        "`{given}` is not a store: give a {schemes} URL (or leave --store and RALPH_FLOW_STORE \
         out for the state directory's SQLite file)"
    )]
    NotAStore { given: String, schemes: String },
    /// What was asked for is not in the store (a gate that does not wait, an output).
    #[error("{0}")]
    NotFound(String),
    /// A worker asked for work without a lease (a caller's mistake).
    #[error("{0}")]
    NoLease(&'static str),
    /// The PostgreSQL server failed or could not be reached.
    #[error("{what}")]
    Postgres {
        what: String,
        #[source]
        source: ::postgres::Error,
    },
    /// What was asked contradicts what the store holds (no such run, a gate that does not
    /// wait, a run another process holds).
    #[error("{0}")]
    Refused(String),
    /// A new run's id is taken (two runs started in the same second drew the same suffix):
    /// the caller draws another.
    #[error("run {0} already exists")]
    RunExists(String),
    /// This coordinator's lease on a run ended (it lapsed, another tenure took the run
    /// over, or the lease was released): the write was refused, whatever process sent it,
    /// and this coordinator must stop working on the run without writing anything more (the
    /// run's next holder carries it on).
    #[error(
        "this coordinator no longer holds run {run} ({now}); it stops without writing more, \
         and the run goes on with whoever takes it over (`ralph-flow resume {run}` where no \
         worker does)"
    )]
    LeaseLost { run: String, now: String },
}

impl StoreError {
    /// A file operation that failed.
    pub fn io(what: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        StoreError::Io(crate::fs::IoFailure::new(what, path, source))
    }

    /// A JSON conversion that failed.
    pub fn json(what: &'static str, source: serde_json::Error) -> Self {
        StoreError::Json { what, source }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// The environment variable that names the store when `--store` is not given.
pub const STORE_ENV: &str = "RALPH_FLOW_STORE";

/// Tokens and cost of one call, or summed over many.
///
/// A call whose answer carried no usage at all (a server that streams none, such as
/// llama-cpp-python's) is counted in `unreported`, not as 0 tokens: when `unreported` is
/// above 0 the counts are a lower bound, and when nothing else was counted the usage is
/// unknown ([`Usage::is_unknown`]). Whatever shows usage says so.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from a prompt cache (part of, not added to, `input_tokens`
    /// where the backend reports them that way; as reported otherwise).
    pub cached_tokens: u64,
    /// The cost in US dollars, when the backend reports it.
    pub cost_usd: Option<f64>,
    /// How many calls reported no usage (their tokens are not in the counts). Left out of
    /// JSON when 0, so recordings and worker payloads of calls that reported read as before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unreported: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// The usage of one call that reported none.
    pub fn unreported_call() -> Self {
        Usage {
            unreported: 1,
            ..Usage::default()
        }
    }

    /// Adds another usage to this one.
    pub fn add(&mut self, other: &Usage) {
        // Saturating: counts come from what agents print.
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        self.unreported = self.unreported.saturating_add(other.unreported);
    }

    /// Returns input plus output tokens (of the calls that reported them).
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Whether nothing was counted: no token, no cost, no call that reported none (a usage
    /// with nothing to show).
    pub fn is_empty(&self) -> bool {
        *self == Usage::default()
    }

    /// Whether nothing is known of this usage: calls reported none, and no call counted a
    /// token or a cost.
    pub fn is_unknown(&self) -> bool {
        self.unreported > 0
            && self.tokens() == 0
            && self.cached_tokens == 0
            && self.cost_usd.is_none()
    }

    /// What is known of the input plus output tokens: exactly that many, at least that many
    /// (some calls reported none, see [`Usage::unreported`]), or nothing. Whatever shows a
    /// count of a usage goes through this ([`Known::map`] for another count than the
    /// tokens), and says it as [`Known`]'s `Display` does.
    pub fn known(&self) -> Known {
        if self.is_unknown() {
            Known::Unknown
        } else if self.unreported > 0 {
            Known::AtLeast(self.tokens())
        } else {
            Known::Exact(self.tokens())
        }
    }

    /// `N calls reported no usage`, when some did.
    pub fn unreported_text(&self) -> Option<String> {
        (self.unreported > 0).then(|| {
            format!(
                "{} call{} reported no usage",
                self.unreported,
                if self.unreported == 1 { "" } else { "s" }
            )
        })
    }

    /// Serializes this usage for people and scripts that read it (`status --json`, `logs
    /// --json`, `run --json`, the monitor's API): as stored, except that the counts are
    /// `null` when the usage is unknown, so that no 0 stands for "not reported". The
    /// `serialize_with` of every record and summary that holds a usage; recordings and worker
    /// payloads write [`Usage`] itself.
    pub fn serialize_shown<S: serde::Serializer>(
        &self,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        self.as_shown().serialize(s)
    }

    /// This usage as [`Usage::serialize_shown`] writes it, to serialize.
    pub fn as_shown(&self) -> impl Serialize + use<> {
        #[derive(Serialize)]
        struct Shown {
            input_tokens: Option<u64>,
            output_tokens: Option<u64>,
            cached_tokens: Option<u64>,
            cost_usd: Option<f64>,
            #[serde(skip_serializing_if = "is_zero")]
            unreported: u64,
        }
        let count = |n: u64| (!self.is_unknown()).then_some(n);
        Shown {
            input_tokens: count(self.input_tokens),
            output_tokens: count(self.output_tokens),
            cached_tokens: count(self.cached_tokens),
            cost_usd: self.cost_usd,
            unreported: self.unreported,
        }
    }

    /// This usage as JSON, as [`Usage::serialize_shown`] writes it.
    pub fn shown(&self) -> serde_json::Value {
        self.serialize_shown(serde_json::value::Serializer)
            .unwrap_or_default()
    }
}

/// What is known of a count of a [`Usage`] ([`Usage::known`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known<T = u64> {
    /// Every call reported its usage.
    Exact(T),
    /// A lower bound: some calls reported none, and their share is not in it.
    AtLeast(T),
    /// No call reported any usage.
    Unknown,
}

impl<T> Known<T> {
    /// Another count, or the same written otherwise, known as this one is.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Known<U> {
        match self {
            Known::Exact(n) => Known::Exact(f(n)),
            Known::AtLeast(n) => Known::AtLeast(f(n)),
            Known::Unknown => Known::Unknown,
        }
    }

    /// The count (a lower bound or not), unless nothing is known.
    pub fn value(self) -> Option<T> {
        match self {
            Known::Exact(n) | Known::AtLeast(n) => Some(n),
            Known::Unknown => None,
        }
    }
}

/// `N`; `≥ N` for a lower bound; `unknown`.
impl<T: std::fmt::Display> std::fmt::Display for Known<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Known::Exact(n) => write!(f, "{n}"),
            Known::AtLeast(n) => write!(f, "≥ {n}"),
            Known::Unknown => f.write_str("unknown"),
        }
    }
}

/// The state of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// An executor is working on it (or died without saying; see the lock).
    Running,
    /// Stopped to wait on a gate; `resume` continues it.
    Waiting,
    /// Stopped by Ctrl-C; `resume` continues it.
    Interrupted,
    /// Ended with an exit (success or a declared outcome).
    Finished,
    /// Waits for a worker (`run --detach`, or a detached run whose gate was answered or
    /// whose worker stopped): `ralph-flow worker` claims it.
    Queued,
    /// Cancelled (`ralph-flow cancel`, the monitor): nothing carries it on, no worker claims
    /// it, `resume` refuses it. Who cancelled it, when and why is in its options
    /// ([`RunRecord::cancellation`]). A running run's executor reads it and stops. Once
    /// cancelled, a run's status never changes again (both stores' `set_status` keep it).
    Cancelled,
}

impl RunStatus {
    /// Returns the name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Finished => "finished",
            RunStatus::Queued => "queued",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => RunStatus::Running,
            "waiting" => RunStatus::Waiting,
            "interrupted" => RunStatus::Interrupted,
            "finished" => RunStatus::Finished,
            "queued" => RunStatus::Queued,
            "cancelled" => RunStatus::Cancelled,
            _ => return None,
        })
    }
}

/// A run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    /// The workflow's `name`.
    pub workflow: String,
    /// The workflow file, as given to `run`.
    pub file: String,
    /// SHA-256 of the workflow's files (the file, its includes, bases and prompt files).
    pub workflow_hash: String,
    /// The params in force.
    pub params: serde_json::Value,
    pub status: RunStatus,
    /// The exit taken, once finished (name and code).
    pub exit: Option<(String, i64)>,
    /// Milliseconds since the Unix epoch.
    pub started_at: i64,
    pub updated_at: i64,
    /// The run's artifact directory.
    pub dir: String,
    /// Settings of the run that `resume` keeps: `{"replay": PATH}` or `{"record": PATH}`
    /// (an object; `{}` when none).
    pub options: serde_json::Value,
}

/// Work that waits for a worker that no live worker can take ([`Store::unplaced`]): a
/// queued run, or a unit of work of a stage, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unplaced {
    /// `""` for the run itself, else the stage whose unit waits (`SCOPE/STAGE`).
    pub stage: String,
    /// The labels a worker needs to take it.
    pub labels: Vec<String>,
    /// Those of them that no live worker has (empty when each has a live worker, but none
    /// has them all; or when it needs none and no worker is live).
    pub missing: Vec<String>,
    /// The last worker seen that had them all, live or gone.
    pub last_seen: Option<SeenWorker>,
}

/// A worker as it was last seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SeenWorker {
    pub host: String,
    pub pid: u32,
    /// When (milliseconds since the Unix epoch, by the store's clock).
    pub seen: i64,
    /// How long before the store was asked.
    pub ago_ms: i64,
}

impl Unplaced {
    /// Why it waits: `no live worker has the label `arm` (last seen: worker host:pid 3m 05s
    /// ago)`, or `(never seen)`.
    pub fn text(&self) -> String {
        let list = |l: &[String]| {
            l.iter()
                .map(|x| format!("`{x}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let why = match (self.missing.as_slice(), self.labels.as_slice()) {
            (_, []) => "no worker is live".to_string(),
            ([one], _) => format!("no live worker has the label `{one}`"),
            ([], all) => format!("no live worker has all of the labels {}", list(all)),
            (some, _) => format!("no live worker has the labels {}", list(some)),
        };
        let seen = match &self.last_seen {
            Some(w) => format!(
                "last seen: worker {}:{} {} ago",
                w.host,
                w.pid,
                crate::text::duration_ms(w.ago_ms.max(0))
            ),
            None if self.labels.is_empty() => "no worker seen yet".to_string(),
            None => "never seen".to_string(),
        };
        format!("{why} ({seen})")
    }

    /// The line `status` shows: `queued: WHY` for the run, `stage S waits for a worker: WHY`
    /// for a unit.
    pub fn line(&self) -> String {
        if self.stage.is_empty() {
            format!("queued: {}", self.text())
        } else {
            format!("stage {} waits for a worker: {}", self.stage, self.text())
        }
    }
}

/// Who cancelled a run, when and why: kept in the run's `options` under
/// [`Cancellation::KEY`] (a TEXT column in both stores, so no schema changes), where
/// `status --json`, `runs --json`, the monitor and `resume` read it with the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancellation {
    /// Who cancelled it (the user name, or what `--by` said).
    pub by: String,
    /// When (milliseconds since the Unix epoch).
    pub at: i64,
    /// Why, when they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Cancellation {
    /// The key of the run's options that holds it.
    pub const KEY: &'static str = "cancelled";

    /// `by ana at 2026-11-27T00:10:00Z: too slow` (or without the reason).
    pub fn text(&self) -> String {
        format!(
            "by {} at {}{}",
            self.by,
            rfc3339(self.at),
            self.reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        )
    }

    /// The cancellation a run's options keep, if they keep one.
    fn in_options(options: &serde_json::Value) -> Option<Cancellation> {
        options
            .get(Cancellation::KEY)
            .and_then(|v| Cancellation::deserialize(v).ok())
    }
}

impl RunRecord {
    /// Who cancelled the run, when and why, if it was cancelled.
    pub fn cancellation(&self) -> Option<Cancellation> {
        Cancellation::in_options(&self.options)
    }

    /// The run's params as `--set` pairs (text as is, other values as JSON): what `resume`
    /// prepares the workflow with again.
    pub fn param_sets(&self) -> Vec<(String, String)> {
        self.params
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| {
                        let s = match v {
                            serde_json::Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        (k.clone(), s)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// How a node settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// It ran and produced its output.
    Done,
    /// A condition, route or escalation rule left it out.
    Skipped,
    /// It failed (after its retries).
    Failed,
    /// Its timeout ended it.
    TimedOut,
}

impl NodeState {
    /// Returns the name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Done => "done",
            NodeState::Skipped => "skipped",
            NodeState::Failed => "failed",
            NodeState::TimedOut => "timed_out",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "done" => NodeState::Done,
            "skipped" => NodeState::Skipped,
            "failed" => NodeState::Failed,
            "timed_out" => NodeState::TimedOut,
            _ => return None,
        })
    }
}

keywords! {
    /// Where an attempt is.
    pub enum AttemptState {
        /// Started, not ended (or ended by a crash: resume marks it interrupted).
        Running = "running",
        /// It gave an answer or an exit that the stage accepts.
        Ok = "ok",
        /// Its output failed validation.
        Invalid = "invalid",
        /// It failed.
        Failed = "failed",
        /// Its timeout ended it.
        TimedOut = "timed_out",
        /// The executor stopped while it ran.
        Interrupted = "interrupted",
    }
}

impl AttemptState {
    /// The attempt state of a stage that ended with `state`.
    pub fn ended(state: NodeState) -> Self {
        match state {
            NodeState::Done => AttemptState::Ok,
            NodeState::TimedOut => AttemptState::TimedOut,
            NodeState::Failed | NodeState::Skipped => AttemptState::Failed,
        }
    }
}

/// A settled node: the unit of resume. Keyed by (run, scope, node).
///
/// `scope` says where in the run: `""` at the top level, `attempts#3` for the third
/// iteration of loop `attempts`, `tickets#T-1/attempts#2` nested. Besides stages, the
/// executor stores its own decisions the same way, under node names starting with `@`
/// (a for_each's item list, a loop iteration's end), so a resume replays them exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub run: String,
    pub scope: String,
    pub node: String,
    pub state: NodeState,
    /// The output (JSON); `null` when skipped.
    pub output: serde_json::Value,
    /// The action the node took (`continue`, `break`, `exit:NAME`, a stage id), if any.
    pub action: Option<String>,
    /// The feedback it gives the next iteration, if any.
    pub feedback: Option<String>,
    /// How many attempts it took.
    pub attempts: u32,
    /// Serialized as [`Usage::serialize_shown`] writes it: nothing but display serializes a
    /// record (the stores write columns).
    #[serde(serialize_with = "Usage::serialize_shown")]
    pub usage: Usage,
    pub started_at: i64,
    pub finished_at: i64,
}

/// One attempt of a node: written when it starts and again when it ends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub run: String,
    pub scope: String,
    pub node: String,
    pub attempt: u32,
    pub state: AttemptState,
    /// The agent that answered, for agent stages.
    pub agent: Option<String>,
    /// The attempt's artifact directory.
    pub dir: String,
    pub error: Option<String>,
    /// Serialized as [`Usage::serialize_shown`] writes it (see [`NodeRecord::usage`]).
    #[serde(serialize_with = "Usage::serialize_shown")]
    pub usage: Usage,
    pub started_at: i64,
    pub finished_at: Option<i64>,
}

/// Something that happened, for `logs` and the progress display.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub run: String,
    /// Milliseconds since the Unix epoch.
    pub at: i64,
    pub scope: String,
    /// The stage, or `""` for the run.
    pub node: String,
    /// `started`, `done`, `skipped`, `failed`, `retry`, `rate_limited`, `waiting`,
    /// `approved`, `rejected`, `iteration`, `exit`, ...
    pub kind: String,
    pub message: String,
}

/// A gate waiting for a person.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GateRequest {
    pub run: String,
    pub scope: String,
    pub gate: String,
    /// The rendered message.
    pub message: String,
    /// Files to look at.
    pub show: Vec<String>,
    pub requested_at: i64,
    /// When an answer is due, if the gate has a timeout.
    pub deadline: Option<i64>,
}

impl GateRequest {
    /// The gate's name as `approve` and `reject` take it: `SCOPE/GATE` inside a loop or a
    /// fan-out item (`tickets#T-1/approve`), the gate's id at the top level.
    pub fn qualified(&self) -> String {
        if self.scope.is_empty() {
            self.gate.clone()
        } else {
            format!("{}/{}", self.scope, self.gate)
        }
    }
}

/// A person's answer to a gate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub run: String,
    pub scope: String,
    pub gate: String,
    pub approved: bool,
    pub comment: Option<String>,
    /// Who answered (the user name, or `timeout`).
    pub by: String,
    pub at: i64,
}

/// A record of what people read of an attempt (its prompt, raw answer, output, feedback, a
/// unit's stdout and stderr tails): `path` under the run's directory
/// (`SCOPE/STAGE/attempt-N/prompt.md`), and its text, secrets masked. A store that keeps
/// them ([`Store::keeps_records`]) has a later record of a path replace the earlier one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactRecord {
    pub run: String,
    pub path: String,
    pub text: String,
}

/// One write of a group commit.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    Node(NodeRecord),
    Attempt(AttemptRecord),
    Event(Event),
    Gate(GateRequest),
    Approval(Approval),
}

impl Write {
    /// Masks the registered secrets (and URLs' passwords) in every text the record holds
    /// (see [`crate::secrets`]).
    pub fn redact(&mut self) {
        use crate::secrets::{redact_in_place as r, redact_json};
        match self {
            Write::Node(n) => {
                redact_json(&mut n.output);
                n.feedback.iter_mut().for_each(r);
                n.action.iter_mut().for_each(r);
            }
            Write::Attempt(a) => a.error.iter_mut().for_each(r),
            Write::Event(e) => r(&mut e.message),
            Write::Gate(g) => {
                r(&mut g.message);
                g.show.iter_mut().for_each(r);
            }
            Write::Approval(a) => a.comment.iter_mut().for_each(r),
        }
    }

    /// Whether [`Write::redact`] would change the record.
    fn leaks(&self) -> bool {
        use crate::secrets::{json_leaks, leaks};
        let any = |t: &Option<String>| t.as_deref().is_some_and(leaks);
        match self {
            Write::Node(n) => json_leaks(&n.output) || any(&n.feedback) || any(&n.action),
            Write::Attempt(a) => any(&a.error),
            Write::Event(e) => leaks(&e.message),
            Write::Gate(g) => leaks(&g.message) || g.show.iter().any(|s| leaks(s)),
            Write::Approval(a) => any(&a.comment),
        }
    }

    /// The writes as a store keeps them, every text masked: what each store's
    /// [`Store::commit`] writes, so that no caller can commit a secret. The writes
    /// themselves when nothing in them is masked (the common case: no copy); else a copy,
    /// masked from the first record that needs it.
    pub fn masked(writes: &[Write]) -> Cow<'_, [Write]> {
        let Some(first) = writes.iter().position(Write::leaks) else {
            return Cow::Borrowed(writes);
        };
        let mut copy = writes.to_vec();
        copy[first..].iter_mut().for_each(Write::redact);
        Cow::Owned(copy)
    }
}

/// Who holds a run: one coordinator's tenure, and the lease it holds the run by.
///
/// `holder` is a token drawn afresh each time a coordinator takes a run ([`current_owner`]):
/// not a process, so two coordinators in one process (a worker that takes back a run it
/// lost) are two holders, and a store fences each one's writes from the other's. A lock with
/// a lease (`expires`) is held until it expires unless its holder renews it (a heartbeat;
/// a fenced commit renews it too); once expired, any process on any host may take it over,
/// and the old holder's writes are refused. The pid, host and start are for display and for
/// one shortcut: a holder that is provably gone on this machine (see [`LockOwner::lapsed`])
/// is taken over before its lease ends. A lock without a lease (written by an older
/// ralph-flow) is held while its process lives, as only a process on the same host can tell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockOwner {
    pub pid: u32,
    pub host: String,
    pub since: i64,
    /// The holder's tenure token (`host:pid:random`, drawn for each taking of a run): two
    /// tenures never share one, even in one process.
    #[serde(default)]
    pub holder: String,
    /// When the lease ends unless renewed (milliseconds since the Unix epoch); `None` for a
    /// lock held while its process lives. A store may time leases by its own clock (the
    /// PostgreSQL store uses the server's): it keeps the length (`expires - since`) and
    /// counts it from when it takes or renews the lock.
    #[serde(default)]
    pub expires: Option<i64>,
    /// The holder process's start time, in clock ticks after boot (`/proc/PID/stat`, field
    /// 22); `None` when unknown (a lock of an older ralph-flow).
    #[serde(default)]
    pub started: Option<u64>,
    /// The boot id of the holder's machine (`/proc/sys/kernel/random/boot_id`).
    #[serde(default)]
    pub boot: Option<String>,
    /// The inode of the holder's PID namespace (`/proc/self/ns/pid`).
    #[serde(default)]
    pub pidns: Option<u64>,
}

impl LockOwner {
    /// This owner with a lease of `lease` from now.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        let now = now_ms();
        self.since = now;
        self.expires = Some(now.saturating_add(ms(lease)));
        self
    }

    /// The lease's length (`expires - since`), if it has one.
    pub fn lease(&self) -> Option<i64> {
        self.expires.map(|e| (e - self.since).max(1))
    }

    /// Who the holder process is, when the lock says (see [`liveness`]).
    pub fn identity(&self) -> Option<liveness::Identity> {
        Some(liveness::Identity {
            start: self.started?,
            boot: self.boot.clone()?,
            pidns: self.pidns?,
        })
    }

    /// Whether this lock is free for a process on `host` to take at `now`: its lease has
    /// lapsed, or its holder is provably gone (same boot and PID namespace as this process,
    /// and its pid free, a zombie, or another process by its start time): a live pid never
    /// keeps a run past its lease, and only that proof ends one sooner. A lock of an older
    /// ralph-flow, without a lease or a start time, is held while its pid lives on its host
    /// (and for good elsewhere). Both taking a lock ([`LockOwner::may_take`]) and calling a
    /// run orphaned (the monitor, `status`) go by this.
    pub fn lapsed(&self, host: &str, now: i64) -> bool {
        self.lapsed_seen_from(host, now, liveness::boot_id(), liveness::pid_namespace())
    }

    /// [`LockOwner::lapsed`] as seen from a machine with this boot id and PID namespace.
    fn lapsed_seen_from(
        &self,
        host: &str,
        now: i64,
        here_boot: Option<&str>,
        here_ns: Option<u64>,
    ) -> bool {
        if self.expires.is_some_and(|expires| expires < now) {
            return true;
        }
        match self.identity() {
            Some(identity) => liveness::gone(self.pid, &identity, here_boot, here_ns),
            // Unknown: the lease alone decides, but a legacy lock has none.
            None => self.expires.is_none() && self.host == host && !process_alive(self.pid),
        }
    }

    /// Whether this owner may take the lock `held` has: it is the same tenure (a worker's
    /// claim, then its executor), or the lock has lapsed ([`LockOwner::lapsed`]). Else why
    /// not ([`StoreError::Refused`]), with what to do.
    pub fn may_take(&self, held: &LockOwner, run: &str, now: i64) -> Result<()> {
        if !held.holder.is_empty() && held.holder == self.holder {
            return Ok(());
        }
        // A lock of an older ralph-flow by this pid: that process is this one, or gone.
        if held.holder.is_empty() && held.host == self.host && held.pid == self.pid {
            return Ok(());
        }
        if held.lapsed(&self.host, now) {
            return Ok(());
        }
        Err(StoreError::Refused(held.refusal(run, now)))
    }

    /// Why a run this lock holds cannot be taken now, and what to do.
    pub fn refusal(&self, run: &str, now: i64) -> String {
        let (pid, host) = (self.pid, &self.host);
        let held = format!(
            "run {run} is held by pid {pid} on {host} since {}",
            rfc3339(self.since)
        );
        match self.expires {
            // Not lapsed, so the lease ends now or later: never a time in the past.
            Some(expires) => format!(
                "{held}; its lease runs until {} (in {}) and moves on while that process \
                 renews it. If that process is gone, try again after that time; if it is \
                 not, stop it (`kill {pid}` on {host}) and try again",
                rfc3339(expires),
                crate::text::duration(Duration::from_millis(
                    u64::try_from(expires.saturating_sub(now)).unwrap_or(0)
                ))
            ),
            None => format!(
                "{held}, for as long as that process lives (a lock without a lease, from an \
                 older ralph-flow); stop it (`kill {pid}` on {host}) and try again"
            ),
        }
    }
}

/// What a store says of a run's lock when a tenure finds its lease lost: `held` is the
/// lock as it is now, `holder` the tenure that lost it.
pub(crate) fn lost_to(held: Option<&LockOwner>, holder: &str) -> String {
    match held {
        None => "nobody holds it now".into(),
        Some(h) if h.holder == holder => format!(
            "its lease ended at {} before it was renewed: the store was out of reach, or \
             this process was stopped",
            h.expires.map_or_else(|| "an unknown time".into(), rfc3339)
        ),
        Some(h) => format!("pid {} on {} holds it now", h.pid, h.host),
    }
}

/// The default lease of a run's lock (`run::LEASE`, `RALPH_FLOW_LEASE` changes it for a run).
pub const LEASE: Duration = Duration::from_secs(30);

/// Milliseconds of a duration, saturating.
pub fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Durable run state.
pub trait Store: Send {
    /// Creates a run.
    fn create_run(&mut self, run: &RunRecord) -> Result<()>;

    /// Returns a run by id.
    fn run(&self, id: &str) -> Result<Option<RunRecord>>;

    /// Returns the newest runs first, at most `limit`.
    fn runs(&self, limit: usize) -> Result<Vec<RunRecord>>;

    /// Sets a run's status and, once finished, its exit.
    fn set_status(&mut self, id: &str, status: RunStatus, exit: Option<(&str, i64)>) -> Result<()>;

    /// Writes a group of records in one durable transaction, their secrets masked
    /// ([`Write::masked`]: the store masks what it is given, whoever commits it).
    fn commit(&mut self, writes: &[Write]) -> Result<()>;

    /// Returns every settled node of a run, in the order they were written.
    fn nodes(&self, run: &str) -> Result<Vec<NodeRecord>>;

    /// Hands every settled node of a run to `each`, in the order they were written, one at
    /// a time where the store can (a resume keeps a compact copy of each: it need not hold
    /// every record at once).
    fn each_node(&self, run: &str, each: &mut dyn FnMut(NodeRecord)) -> Result<()> {
        self.nodes(run)?.into_iter().for_each(each);
        Ok(())
    }

    /// Returns the attempts of a run, optionally of one stage, in order.
    fn attempts(&self, run: &str, node: Option<&str>) -> Result<Vec<AttemptRecord>>;

    /// Returns the attempts of a run that are still `running` (a resume marks them
    /// interrupted): read with a filter in the store, not by reading every attempt of a long
    /// run.
    fn running_attempts(&self, run: &str) -> Result<Vec<AttemptRecord>>;

    /// Returns the events of a run, optionally of one stage, in order.
    fn events(&self, run: &str, node: Option<&str>) -> Result<Vec<Event>>;

    /// Returns the gates of a run that wait for an answer.
    fn pending_gates(&self, run: &str) -> Result<Vec<GateRequest>>;

    /// Returns the answer to a gate, if there is one.
    fn approval(&self, run: &str, scope: &str, gate: &str) -> Result<Option<Approval>>;

    /// Answers a waiting gate. Fails when the gate is not waiting.
    fn answer(&mut self, approval: &Approval) -> Result<()>;

    /// Cancels a run that has not ended (queued, running, waiting, interrupted), in one
    /// transaction: its status becomes [`RunStatus::Cancelled`], `cancellation` is kept in
    /// its options, its waiting gates are withdrawn (and, in the PostgreSQL store, its units
    /// of work that wait or run on workers are cancelled). A running run's executor reads the
    /// status and stops its stages. Returns the status the run had. Refused
    /// ([`StoreError::Refused`], saying why) for a run that finished or was cancelled
    /// already, and for no such run.
    fn cancel(&mut self, run: &str, cancellation: &Cancellation) -> Result<RunStatus>;

    /// The work of a run that waits for a worker and that no live worker can take (its
    /// labels): the run itself while queued, and its queued units of work. Empty on a store
    /// without workers (SQLite).
    fn unplaced(&self, run: &str) -> Result<Vec<Unplaced>> {
        let _ = run;
        Ok(Vec::new())
    }

    /// Takes the run's lock for `owner`'s tenure, with its lease if it has one (see
    /// [`LockOwner`]). Fails, naming the holder and what to do, unless the lock is free,
    /// this tenure's, or lapsed ([`LockOwner::lapsed`]: its lease expired, or its holder is
    /// provably gone).
    ///
    /// Once a store has taken a run with a lease, its writes to that run are fenced by that
    /// tenure: a commit (and a status change) checks, in its own transaction, that the lock
    /// still has this tenure's token and an unexpired lease, renewing it, and fails with
    /// [`StoreError::LeaseLost`] when it has not (whatever process sends it).
    fn lock(&mut self, run: &str, owner: &LockOwner) -> Result<()>;

    /// Renews `owner`'s lease on the run for another lease length (a heartbeat). Fails with
    /// [`StoreError::LeaseLost`] when the run is no longer held by `owner`'s tenure, or its
    /// lease lapsed before this renewal.
    fn renew(&mut self, run: &str, owner: &LockOwner) -> Result<()>;

    /// Releases the run's lock if `owner` holds it.
    fn unlock(&mut self, run: &str, owner: &LockOwner) -> Result<()>;

    /// Who holds the run's lock, if anyone.
    fn lock_holder(&self, run: &str) -> Result<Option<LockOwner>>;

    /// Another handle on the same connection, for a store whose connection can serve
    /// several users (PostgreSQL's: see `PgStore::share`); `None` otherwise.
    fn share(&self) -> Option<Box<dyn Store + Send>> {
        None
    }

    /// A number that changes whenever another process commits to the store: a monitor polls
    /// it to learn that something happened, without reading anything else.
    fn changes(&self) -> Result<u64>;

    /// The output of a settled node, found by its key; `None` when the store has no such
    /// node. An executor reads back this way the large outputs it does not keep in memory.
    fn output(&self, run: &str, scope: &str, node: &str) -> Result<Option<serde_json::Value>>;

    /// Returns the outputs of a node in the runs of a workflow other than `except_run`,
    /// newest first, at most `limit` (cross-run memory). A node in a loop or fan-out has a
    /// record per scope; each counts.
    fn history(
        &self,
        workflow: &str,
        node: &str,
        except_run: &str,
        limit: usize,
    ) -> Result<Vec<(String, NodeRecord)>>;

    /// What each of `runs` takes in the store, in their order ([`StoredSize`]: an estimate of
    /// its rows, and the files the store keeps beside them for it). Empty when the store
    /// cannot say.
    fn stored_sizes(&self, runs: &[&str]) -> Result<Vec<StoredSize>> {
        let _ = runs;
        Ok(Vec::new())
    }

    /// Deletes a run that ended (finished or cancelled: [`delete_refusal`]) from the store,
    /// in one transaction that checks its status and its lock: every row of it in every
    /// table of the store that names runs, and the files the store keeps for it that no
    /// remaining run refers to (SQLite's spilled outputs). Refused ([`StoreError::Refused`],
    /// saying why) for no such run, a run that has not ended (queued, running, waiting,
    /// interrupted: a run that resumed since it was listed is one), and a run whose lock a
    /// live holder has ([`LockOwner::lapsed`]). Returns what it removed.
    fn delete_run(&mut self, run: &str) -> Result<Removed> {
        Err(StoreError::Refused(format!(
            "this store cannot delete runs, so run {run} stays"
        )))
    }

    /// Whether this store keeps the attempts' records ([`ArtifactRecord`]), so that an
    /// executor hands them over with its commits ([`Store::commit_with_records`]) and
    /// readers on any machine find them ([`Store::records`]). A shared store does
    /// (PostgreSQL); the SQLite store does not: its file and the run's `artifacts.jsonl`
    /// lie in the same state directory, which holds the records.
    fn keeps_records(&self) -> bool {
        false
    }

    /// [`Store::commit`] of `writes`, with the attempts' `records` in the same transaction
    /// (their secrets masked, a later record of a path replacing an earlier one). A store
    /// that does not keep records ([`Store::keeps_records`]) commits the writes alone.
    fn commit_with_records(&mut self, writes: &[Write], records: &[ArtifactRecord]) -> Result<()> {
        let _ = records;
        self.commit(writes)
    }

    /// The records of run `run` whose path starts with `under` (`""`: all of them; an
    /// attempt's: `SCOPE/STAGE/attempt-N/`), by path, read through the store's key (no scan
    /// of the run). `None` when the store keeps no record of that run (a store that keeps
    /// none, a run written before it did): its `artifacts.jsonl` has them.
    fn records(&self, run: &str, under: &str) -> Result<Option<Vec<(String, String)>>> {
        let _ = (run, under);
        Ok(None)
    }

    /// The events of a run written since position `after` (0 for all of them), each with
    /// its number (the order of the run's events), in that order; and the position to ask
    /// from next time (see [`Since`]).
    fn events_since(&self, run: &str, after: i64) -> Result<Since<Event>>;

    /// The settled nodes of a run written (or settled again) since position `after` (0 for
    /// all of them), each with its number (a run's write order of nodes, as [`Store::nodes`]
    /// reads them), in that order; and the position to ask from next time (see [`Since`]).
    fn nodes_since(&self, run: &str, after: i64) -> Result<Since<NodeRecord>>;

    /// The attempts of a run written (started, or written again as they end) since position
    /// `after` (0 for all of them), each with the number of its last write; and the position
    /// to ask from next time (see [`Since`]).
    fn attempts_since(&self, run: &str, after: i64) -> Result<Since<AttemptRecord>>;
}

/// What changed in a run's records of one kind since a position ([`Store::events_since`],
/// [`Store::nodes_since`], [`Store::attempts_since`]): a reader that keeps a copy applies
/// `records` (an event is new; a node or an attempt replaces the one of the same key, `scope`
/// and `node`, and `attempt`) and asks again from `next`, so that each refresh reads what
/// changed, not the run. Records of every write committed before the call are in it or in
/// an earlier answer; a record may come again (a store that cannot tell: read-only SQLite
/// stores of schema version 7 give every attempt each time), which the reader's upsert
/// absorbs. Positions are of one run and one kind; nothing else may be read into them.
#[derive(Clone, Debug, PartialEq)]
pub struct Since<T> {
    /// The records, each with its number, in the order of their numbers.
    pub records: Vec<(i64, T)>,
    /// The position to ask from next time.
    pub next: i64,
}

/// What a run takes in a store ([`Store::stored_sizes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StoredSize {
    /// An estimate of the bytes of its rows: the lengths of their columns (the store's own
    /// page and index overhead is not counted).
    pub row_bytes: u64,
    /// The bytes of the files the store keeps beside its rows for it (SQLite's spilled
    /// outputs; one that other runs share counts for each of them).
    pub file_bytes: u64,
}

/// What [`Store::delete_run`] removed of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Removed {
    /// The rows deleted, over every table.
    pub rows: u64,
    /// An estimate of the bytes those rows held, as [`StoredSize::row_bytes`]. The store
    /// reuses the space; a SQLite file does not shrink by it (see `runs prune`'s output).
    pub row_bytes: u64,
    /// The files removed beside the store (spilled outputs no remaining run refers to).
    pub files: u64,
    /// Their bytes, measured as they were removed.
    pub file_bytes: u64,
}

/// Why a run in `status` cannot be deleted ([`Store::delete_run`]), or `None` when it can:
/// only a run that ended (finished, whatever its exit, or cancelled) goes; a run that will
/// go on (queued, running, waiting on a gate, interrupted) stays.
pub fn delete_refusal(run: &str, status: RunStatus) -> Option<String> {
    match status {
        RunStatus::Finished | RunStatus::Cancelled => None,
        RunStatus::Running | RunStatus::Waiting | RunStatus::Interrupted | RunStatus::Queued => {
            Some(format!(
                "run {run} is {} and may go on, so it is not removed; only finished or \
                 cancelled runs are (cancel it first with `ralph-flow cancel {run}` if it is \
                 not needed)",
                status.as_str()
            ))
        }
    }
}

/// Why a run whose lock `held` has cannot be deleted now, or `None` when its lock lapsed
/// ([`LockOwner::lapsed`]) by the clock `now`.
pub fn held_refusal(run: &str, held: &LockOwner, now: i64) -> Option<String> {
    (!held.lapsed(&host_name(), now)).then(|| {
        format!(
            "run {run} ended, but pid {} on {} still holds it (it is finishing, or a \
             resume took it); it is not removed: try again once that process is gone",
            held.pid, held.host
        )
    })
}

/// Returns a lock owner for a new tenure of this process, now, without a lease (see
/// [`LockOwner::with_lease`]): a fresh holder token ([`new_tenure`]), and who this process
/// is (pid, host, start time, boot and PID namespace: see [`LockOwner::lapsed`]).
pub fn current_owner() -> LockOwner {
    let me = liveness::this_process();
    LockOwner {
        pid: std::process::id(),
        host: host_name(),
        since: now_ms(),
        holder: new_tenure(),
        expires: None,
        started: me.as_ref().map(|m| m.start),
        boot: me.as_ref().map(|m| m.boot.clone()),
        pidns: me.map(|m| m.pidns),
    }
}

/// This machine's name.
pub fn host_name() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from("localhost"))
}

/// This process's id, `host:pid:random`, drawn once: what names a worker in what it says.
/// Not a lock holder: each taking of a run draws a tenure of its own ([`new_tenure`]).
pub fn holder_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(new_tenure)
}

/// A new tenure token, `host:pid:random`: unique to one taking of a run (or of a unit of
/// work), so that a store tells two coordinators of one process apart.
pub fn new_tenure() -> String {
    format!(
        "{}:{}:{}",
        host_name(),
        std::process::id(),
        random_hex::<8>()
    )
}

/// `N` random bytes in hex; without the system's generator, the time and a counter.
fn random_hex<const N: usize>() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut bytes = [0u8; N];
    if getrandom::fill(&mut bytes).is_err() {
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mix = (now_ms() as u64).rotate_left(20) ^ n;
        for (b, m) in bytes.iter_mut().zip(mix.to_le_bytes().iter().cycle()) {
            *b = *m;
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Returns the milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Formats milliseconds since the Unix epoch as RFC 3339 (seconds, UTC). A time after the
/// year 9999, which RFC 3339 cannot write (a gate's deadline after a timeout of centuries),
/// shows as the last second it can.
pub fn rfc3339(ms: i64) -> String {
    /// 9999-12-31T23:59:59Z.
    const LAST_SECOND: u64 = 253_402_300_799;
    let secs = (u64::try_from(ms).unwrap_or(0) / 1000).min(LAST_SECOND);
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// The waiting gate an answer is for: the gate of that name in the answer's scope, or, when
/// the answer names no scope, the one place where a gate of that name waits. `run_exists`
/// is asked only to say why there is none.
pub(crate) fn answered_gate<'a>(
    approval: &Approval,
    waiting: &'a [GateRequest],
    run_exists: impl FnOnce() -> Result<bool>,
) -> Result<&'a GateRequest> {
    let named: Vec<&GateRequest> = waiting.iter().filter(|g| g.gate == approval.gate).collect();
    let target = if approval.scope.is_empty() {
        match named.as_slice() {
            [one] => Some(*one),
            [] => None,
            several => {
                let scopes: Vec<String> =
                    several.iter().map(|g| describe_scope(&g.scope)).collect();
                return Err(StoreError::Refused(format!(
                    "gate {} of run {} waits in {} scopes ({}); say which one",
                    approval.gate,
                    approval.run,
                    several.len(),
                    scopes.join(", ")
                )));
            }
        }
    } else {
        named.into_iter().find(|g| g.scope == approval.scope)
    };
    if let Some(target) = target {
        return Ok(target);
    }
    let at = if approval.scope.is_empty() {
        String::new()
    } else {
        format!(" in scope {}", approval.scope)
    };
    Err(StoreError::NotFound(if !run_exists()? {
        format!("no run {}", approval.run)
    } else if waiting.is_empty() {
        format!(
            "gate {}{at} of run {} is not waiting for an answer; the run waits on no gate",
            approval.gate, approval.run
        )
    } else {
        let list: Vec<String> = waiting
            .iter()
            .map(|g| format!("{} ({})", g.gate, describe_scope(&g.scope)))
            .collect();
        format!(
            "gate {}{at} of run {} is not waiting for an answer; waiting: {}",
            approval.gate,
            approval.run,
            list.join(", ")
        )
    }))
}

/// Why a run in `status` cannot be cancelled (it ended), or `None` when it can: the one
/// rule of both stores' [`Store::cancel`].
pub(crate) fn cancel_refusal(
    run: &str,
    status: RunStatus,
    options: &str,
    exit: Option<(String, i64)>,
) -> Option<String> {
    match status {
        RunStatus::Finished => Some(format!(
            "run {run} has already finished{}; there is nothing to cancel",
            exit.map(|(n, c)| format!(" with `{n}` ({c})"))
                .unwrap_or_default()
        )),
        RunStatus::Cancelled => {
            let how = serde_json::from_str::<serde_json::Value>(options)
                .ok()
                .and_then(|o| Cancellation::in_options(&o))
                .map(|c| format!(" {}", c.text()))
                .unwrap_or_default();
            Some(format!("run {run} was cancelled already{how}"))
        }
        RunStatus::Running | RunStatus::Waiting | RunStatus::Interrupted | RunStatus::Queued => {
            None
        }
    }
}

/// The run's options (JSON text) with `cancellation` kept in them.
pub(crate) fn options_cancelled(options: &str, cancellation: &Cancellation) -> Result<String> {
    let mut value: serde_json::Value = serde_json::from_str(options)
        .map_err(|e| StoreError::json("cannot read a run's options", e))?;
    if !value.is_object() {
        value = serde_json::Value::Object(serde_json::Map::new());
    }
    let cancelled = serde_json::to_value(cancellation)
        .map_err(|e| StoreError::json("cannot write a cancellation", e))?;
    if let Some(map) = value.as_object_mut() {
        map.insert(Cancellation::KEY.to_string(), cancelled);
    }
    serde_json::to_string(&value).map_err(|e| StoreError::json("cannot write a run's options", e))
}

fn describe_scope(scope: &str) -> String {
    if scope.is_empty() {
        String::from("top level")
    } else {
        format!("scope {scope}")
    }
}

/// Tells whether a process with this id exists on this host.
pub(crate) fn process_alive(pid: u32) -> bool {
    use nix::errno::Errno;
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    // 0 and ids beyond i32 name process groups or nothing: no process holds the lock.
    match i32::try_from(pid) {
        Ok(raw) if raw > 0 => !matches!(kill(Pid::from_raw(raw), None), Err(Errno::ESRCH)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A lock of this process (its identity as recorded) with a lease from now to `until_ms`
    /// from now.
    fn held_by_me(until_ms: i64) -> LockOwner {
        let mut held = current_owner();
        held.expires = Some(now_ms() + until_ms);
        held
    }

    /// A child that exited and was not reaped: a zombie, with the start time it had.
    fn zombie() -> (std::process::Child, u64) {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let liveness::Seen::Running(start) = liveness::seen(pid) else {
            let _ = child.kill();
            panic!("a child just spawned is running");
        };
        let t = std::time::Instant::now();
        while liveness::seen(pid) != liveness::Seen::Exited {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the child never exited"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        (child, start)
    }

    #[test]
    fn a_zombie_holder_is_provably_gone_before_its_lease_ends() {
        let (mut child, start) = zombie();
        let mut held = held_by_me(60_000);
        held.pid = child.id();
        held.started = Some(start);
        assert!(process_alive(held.pid), "a zombie still has its pid");
        assert!(
            held.lapsed(&host_name(), now_ms()),
            "a zombie holds nothing"
        );
        let me = current_owner().with_lease(Duration::from_secs(30));
        assert!(me.may_take(&held, "r", now_ms()).is_ok());
        let _ = child.wait();
    }

    #[test]
    fn a_live_pid_that_started_at_another_time_is_another_process() {
        let mut held = held_by_me(60_000);
        assert!(
            !held.lapsed(&host_name(), now_ms()),
            "this very process, alive, holds its live lease"
        );
        // The recorded pid now names an unrelated live process (a reused pid).
        held.started = held.started.map(|s| s + 1);
        assert!(process_alive(held.pid));
        assert!(held.lapsed(&host_name(), now_ms()));
    }

    #[test]
    fn in_another_pid_namespace_or_boot_only_the_lease_decides() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("reaped");
        let mut held = held_by_me(60_000);
        held.pid = dead;
        assert!(held.lapsed(&host_name(), now_ms()), "gone here, for sure");
        // The same pid in another PID namespace (a container with the same host name) says
        // nothing of the holder: its lease holds.
        let mut other_ns = held.clone();
        other_ns.pidns = other_ns.pidns.map(|n| n + 1);
        assert!(!other_ns.lapsed(&host_name(), now_ms()));
        assert!(!held.lapsed_seen_from(
            &host_name(),
            now_ms(),
            liveness::boot_id(),
            liveness::pid_namespace().map(|n| n + 1)
        ));
        // Another boot: the pid is not the holder's either.
        let mut other_boot = held.clone();
        other_boot.boot = Some("another-boot".into());
        assert!(!other_boot.lapsed(&host_name(), now_ms()));
        let err = current_owner()
            .may_take(&other_boot, "r", now_ms())
            .expect_err("a live lease holds")
            .to_string();
        assert!(err.contains("its lease runs until"), "{err}");
        // An unknown identity (a lock of an older ralph-flow, with a lease): the lease.
        let mut unknown = held.clone();
        unknown.started = None;
        assert!(!unknown.lapsed(&host_name(), now_ms()));
        // Once the lease lapsed, any of them is taken over.
        for mut h in [other_ns, other_boot, unknown] {
            h.expires = Some(now_ms() - 1);
            assert!(h.lapsed(&host_name(), now_ms()), "{h:?}");
        }
    }

    #[test]
    fn a_live_holder_never_keeps_its_run_past_its_lease() {
        let held = held_by_me(-1);
        assert!(process_alive(held.pid));
        assert!(held.lapsed(&host_name(), now_ms()));
        // A new tenure of the same process is another holder: it takes the lapsed lock
        // over, but not a live one.
        let next = current_owner().with_lease(Duration::from_secs(30));
        assert_ne!(next.holder, held.holder);
        assert!(next.may_take(&held, "r", now_ms()).is_ok());
        let live = held_by_me(60_000);
        let err = next
            .may_take(&live, "r", now_ms())
            .expect_err("live lease")
            .to_string();
        assert!(
            err.contains(&format!("held by pid {} on {}", live.pid, live.host)),
            "{err}"
        );
        assert!(err.contains(&format!("kill {}", live.pid)), "{err}");
        let until = rfc3339(live.expires.expect("a lease"));
        assert!(err.contains(&until) && until >= rfc3339(now_ms()), "{err}");
    }

    #[test]
    fn a_legacy_lock_without_lease_or_start_is_held_while_its_pid_lives_on_its_host() {
        let legacy = |pid: u32, host: &str| LockOwner {
            pid,
            host: host.into(),
            since: 1,
            ..LockOwner::default()
        };
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let dead = child.id();
        child.wait().expect("reaped");
        assert!(!legacy(std::process::id(), "h").lapsed("h", now_ms()));
        assert!(legacy(dead, "h").lapsed("h", now_ms()));
        assert!(!legacy(dead, "elsewhere").lapsed("h", now_ms()));
        let err = current_owner()
            .may_take(&legacy(std::process::id(), "h"), "r", now_ms())
            .expect_err("held")
            .to_string();
        assert!(err.contains("for as long as that process lives"), "{err}");
    }

    #[test]
    fn unreported_calls_are_counted_apart_and_shown_as_unknown() {
        let mut u = Usage::default();
        assert!(!u.is_unknown(), "no call at all is not an unknown");
        u.add(&Usage::unreported_call());
        u.add(&Usage::unreported_call());
        assert!(u.is_unknown());
        assert_eq!(u.known(), Known::Unknown);
        assert_eq!(u.known().to_string(), "unknown");
        assert!(!u.is_empty());
        assert_eq!(
            u.unreported_text().as_deref(),
            Some("2 calls reported no usage")
        );
        assert_eq!(
            u.shown(),
            json!({"input_tokens": null, "output_tokens": null, "cached_tokens": null,
                   "cost_usd": null, "unreported": 2})
        );
        u.add(&Usage {
            input_tokens: 10,
            output_tokens: 2,
            ..Usage::default()
        });
        assert!(!u.is_unknown(), "a lower bound now");
        assert_eq!(u.known(), Known::AtLeast(12));
        assert_eq!(u.known().to_string(), "≥ 12");
        assert_eq!(u.shown()["input_tokens"], 10);
        assert_eq!(u.shown()["unreported"], 2);
        let all = Usage {
            input_tokens: 10,
            output_tokens: 2,
            ..Usage::default()
        };
        assert_eq!(all.known(), Known::Exact(12));
        assert_eq!(all.known().map(|n| n * 2).to_string(), "24");
        assert_eq!(all.shown(), serde_json::to_value(&all).expect("writes"));
        assert!(Usage::default().is_empty() && !all.is_empty());
        assert_eq!(Usage::default().known(), Known::Exact(0));
    }

    /// Records are serialized only to be shown: their usage as [`Usage::shown`] writes it.
    #[test]
    fn a_records_usage_is_serialized_as_shown() {
        let record = AttemptRecord {
            run: "r".into(),
            scope: String::new(),
            node: "n".into(),
            attempt: 1,
            state: AttemptState::Ok,
            agent: None,
            dir: "d".into(),
            error: None,
            usage: Usage::unreported_call(),
            started_at: 1,
            finished_at: Some(2),
        };
        let v = serde_json::to_value(&record).expect("writes");
        assert_eq!(v["usage"], record.usage.shown());
        assert!(v["usage"]["input_tokens"].is_null(), "{v}");
        assert_eq!(v["node"], "n");
    }

    #[test]
    fn usage_json_without_unreported_calls_reads_and_writes_as_before() {
        // What recordings and worker payloads hold, written before the count existed.
        let old = json!({"input_tokens": 5, "output_tokens": 1, "cached_tokens": 0,
                         "cost_usd": 0.5});
        let u: Usage = serde_json::from_value(old.clone()).expect("reads");
        assert_eq!(u.unreported, 0);
        assert_eq!(serde_json::to_value(&u).expect("writes"), old);
        let one = serde_json::to_value(Usage::unreported_call()).expect("writes");
        assert_eq!(one["unreported"], 1);
    }
}

//! What only some stores can do: a store that many processes and machines share keeps a
//! queue of detached runs ([`RunQueue`]), units of work that any worker may carry out
//! ([`UnitQueue`]), the workers it has seen ([`WorkerRegistry`]), and tells of changes as
//! they happen ([`SharedStore::listen`]). The executor and the workers name only these
//! traits; which store implements them is chosen by the URL's scheme (see
//! [`super::Location`]). The SQLite file of a state directory implements none of them.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::{LockOwner, Result, RunRecord, Store};

/// Whether a worker can carry a run out here (its working directory, its repository).
pub type Accept = Arc<dyn Fn(&RunRecord) -> bool + Send + Sync>;

/// What a listener calls with each notification's payload, and with `None` after it
/// reconnected ([`SharedStore::listen`]).
pub type Wake = Box<dyn Fn(Option<&str>) + Send>;

/// Whether a worker can carry a unit out here (its place).
pub type AcceptUnit = Arc<dyn Fn(&serde_json::Value) -> bool + Send + Sync>;

/// Where a unit is: queued, running on a worker, done (with its result) or cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitState {
    Queued,
    Running,
    Done,
    Cancelled,
}

/// A unit of work as the store holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    pub id: i64,
    pub run: String,
    /// What the coordinator asked for: `SCOPE/STAGE#ATTEMPT.CALL@HASH`.
    pub key: String,
    /// `agent` or `command`.
    pub kind: String,
    /// What to do (JSON; see `run::units`).
    pub payload: serde_json::Value,
    /// The labels a worker needs to take it.
    pub labels: Vec<String>,
    /// Where it works (JSON: a git repository and branch, or a directory).
    pub place: serde_json::Value,
    pub state: UnitState,
    /// The worker that holds it (`host:pid:random`), while it runs.
    pub holder: Option<String>,
    /// What came of it (JSON), once done.
    pub result: Option<serde_json::Value>,
}

/// A unit of work a run's coordinator asks for ([`UnitQueue::dispatch`]).
#[derive(Clone, Copy, Debug)]
pub struct UnitRequest<'a> {
    /// The coordinator's tenure: it must hold the run's lock.
    pub coordinator: &'a str,
    pub run: &'a str,
    /// What is asked for: `SCOPE/STAGE#ATTEMPT.CALL@HASH`.
    pub key: &'a str,
    /// The stage the unit belongs to (`SCOPE/STAGE#`): its other unfinished units, asked
    /// for something else, are cancelled.
    pub stage_prefix: &'a str,
    /// `agent` or `command`.
    pub kind: &'a str,
    pub payload: &'a serde_json::Value,
    /// The labels a worker needs to take it.
    pub labels: &'a [String],
    /// Where it works.
    pub place: &'a serde_json::Value,
    /// The run's resource the unit holds while it runs, with its capacity.
    pub hold: Option<(&'a str, i64)>,
}

/// The queue of detached runs: `run --detach` enqueues, workers claim.
pub trait RunQueue {
    /// Records a detached run, queued, with the files its workflow was built from (path and
    /// text, as the loader read them) and the labels a worker must have; wakes the workers.
    fn enqueue(
        &mut self,
        run: &RunRecord,
        sources: &[(String, String)],
        labels: &[String],
    ) -> Result<()>;

    /// Claims one run for `owner` (who must have a lease): the oldest queued run, or running
    /// run whose lease has expired, of the detached runs whose labels are all in `labels`
    /// and that `accept` takes, skipping those another worker is claiming. The claim takes
    /// the run's lease and marks it running, with its artifacts in `runs_dir/ID`, in one
    /// transaction. `None` when there is nothing to claim.
    fn claim(
        &mut self,
        owner: &LockOwner,
        labels: &[String],
        runs_dir: &Path,
        accept: Accept,
    ) -> Result<Option<RunRecord>>;

    /// The files a detached run's workflow was built from (path, text), in the order read.
    fn sources(&self, run: &str) -> Result<Vec<(String, String)>>;

    /// The labels a worker needs to claim a run.
    fn labels(&self, run: &str) -> Result<Vec<String>>;

    /// Hands a detached run back to the queue (a worker that stops): queued again unless it
    /// finished or waits on a gate, or another tenure holds it now, its lock released if
    /// `owner` holds it, the workers woken.
    fn requeue(&mut self, run: &str, owner: &LockOwner) -> Result<()>;

    /// Queues a detached waiting run again when one of its gates has an answer that the run
    /// has not acted on. Returns whether it did.
    fn requeue_if_answered(&mut self, run: &str) -> Result<bool>;
}

/// Units of work: a run's coordinator dispatches them, any worker whose labels suffice
/// claims and carries them out under a lease, and the coordinator reads their results.
pub trait UnitQueue {
    /// Asks for a unit of work: queues it, or finds the one already asked for under the
    /// same run and key. Returns the unit's id. Fails with
    /// [`super::StoreError::LeaseLost`] unless the coordinator holds the run's lock.
    fn dispatch(&mut self, request: &UnitRequest<'_>) -> Result<i64>;

    /// A unit, as the store holds it now.
    fn unit(&self, id: i64) -> Result<Option<Unit>>;

    /// Cancels a unit the coordinator no longer waits for.
    fn cancel_unit(&mut self, id: i64, coordinator: &str) -> Result<()>;

    /// Cancels every unfinished unit of a run (the run was cancelled).
    fn cancel_units(&mut self, run: &str, coordinator: &str) -> Result<()>;

    /// Drops a unit whose result the coordinator used.
    fn forget_unit(&mut self, id: i64, coordinator: &str) -> Result<()>;

    /// Claims one unit for `owner` (who must have a lease) whose labels are all in `labels`
    /// and whose place `accept` takes.
    fn claim_unit(
        &mut self,
        owner: &LockOwner,
        labels: &[String],
        accept: AcceptUnit,
    ) -> Result<Option<Unit>>;

    /// Records that a unit's work was stopped (its lease lost) by `owner`.
    fn unit_stopped(&mut self, id: i64, owner: &LockOwner) -> Result<()>;

    /// Hands a unit back to the queue (its worker stops).
    fn release_unit(&mut self, id: i64, owner: &LockOwner) -> Result<()>;

    /// Renews `owner`'s lease on a unit; `false` when it no longer holds it.
    fn renew_unit(&mut self, id: i64, owner: &LockOwner) -> Result<bool>;

    /// Records a unit's result, if `owner` still holds it; `false` when it was dropped.
    fn finish_unit(
        &mut self,
        id: i64,
        owner: &LockOwner,
        result: &serde_json::Value,
    ) -> Result<bool>;

    /// The units among `ids` that the store holds now, in one read where the store can
    /// (a coordinator's periodic look at all it waits for); those it does not hold are
    /// left out.
    fn units(&self, ids: &[i64]) -> Result<Vec<Unit>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.extend(self.unit(*id)?);
        }
        Ok(out)
    }
}

/// The workers a store has seen, so that work none of them can take says why it waits.
pub trait WorkerRegistry {
    /// Records that worker `id` with `labels` looks for work now, and counts as live for
    /// `live_for` more.
    fn worker_seen(
        &mut self,
        id: &str,
        host: &str,
        pid: u32,
        labels: &[String],
        live_for: Duration,
    ) -> Result<()>;

    /// Records that worker `id` stopped.
    fn worker_gone(&mut self, id: &str) -> Result<()>;
}

/// A store that many processes and machines share (runs on workers): the records, and
/// the queue, units and workers beside them, on a connection that several users of one
/// process can share.
pub trait SharedStore: Store + RunQueue + UnitQueue + WorkerRegistry {
    /// Another handle on the same connection (its calls are queued with this one's), with
    /// no fencing lease.
    fn handle(&self) -> Box<dyn SharedStore>;

    /// Another handle on the same connection whose writes to `run` are fenced by `owner`'s
    /// tenure, as if it had taken the run itself.
    fn fenced(&self, run: &str, owner: &LockOwner) -> Box<dyn Store + Send>;

    /// Listens for changes (a run queued, a gate answered, a unit done) on a connection of
    /// its own, calling `wake` with what each names (a run's id; `unit:ID:queued` for a
    /// unit to claim, `unit:ID` for a unit that finished), and with `None` once after each
    /// reconnection (what was sent meanwhile is lost); ends once `stop` is set.
    fn listen(&self, stop: Arc<AtomicBool>, wake: Wake) -> Result<std::thread::JoinHandle<()>>;

    /// This handle as a store of records only.
    fn into_store(self: Box<Self>) -> Box<dyn Store + Send>;
}

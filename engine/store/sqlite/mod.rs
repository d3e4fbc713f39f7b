//! The default store: one SQLite file in WAL mode.
//!
//! Every [`Store::commit`] is one `BEGIN IMMEDIATE` transaction, so a group of writes lands
//! whole or not at all. Outputs whose JSON text exceeds [`SPILL_BYTES`] are written to
//! `<db dir>/blobs/<sha256>.json` (synced and renamed into place before the commit that refers
//! to them) and read back transparently. Other processes (`ralph-flow approve` from another
//! terminal) write the same file; a busy file is waited on for up to five seconds, and a
//! commit for up to [`BUSY_WAIT`].
//!
//! The schema is versioned with `PRAGMA user_version`; [`SCHEMA_VERSION`] is the version this
//! build writes, and opening a store brings an older file up to it.
//!
//! This file holds [`SqliteStore`] and its [`Store`] implementation, which hands each method
//! to the module of its concern: `open.rs` and `integrity.rs` (opening, crash checks),
//! `schema.rs`, `commit.rs` and `write.rs` (a commit: busy waits, its statements),
//! `blobs.rs` (spilled outputs), `prune.rs` (sizes, deleting runs), `runs.rs`, `read.rs`,
//! `gates.rs`, `locks.rs`, and `rows.rs`
//! (column conversions).

mod blobs;
mod commit;
mod gates;
mod integrity;
mod locks;
mod open;
mod prune;
mod read;
mod rows;
mod runs;
mod schema;
mod write;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

pub use blobs::SPILL_BYTES;
pub use commit::BUSY_WAIT;
pub use open::{Durability, PAGE_SIZE};
pub use schema::SCHEMA_VERSION;

use crate::store::{
    Approval, AttemptRecord, Cancellation, Event, GateRequest, LockOwner, NodeRecord, Removed,
    Result, RunRecord, RunStatus, Since, Store, StoreError, StoredSize, Write,
};

/// How long a write waits for another process that holds the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What is told when a commit waits for another process.
type BusyReport = Box<dyn Fn(&str) + Send>;

/// A store in one SQLite file.
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    blobs: PathBuf,
    /// Told when a commit waits for another process.
    on_busy: Option<BusyReport>,
    /// The file's identity (device, inode) when it was opened: a commit refuses a store
    /// that was deleted or replaced since.
    identity: Option<(u64, u64)>,
    /// This process's open-marker (`state.db.open-PID-N`, holding the highest event row it
    /// committed), removed when the store is closed cleanly; `None` for a read-only store.
    marker: Option<(PathBuf, fs::File)>,
    /// The next write order of nodes and number of events, per run.
    seqs: write::Seqs,
    /// The file's schema version: [`SCHEMA_VERSION`], but for a read-only store of an
    /// older version this build reads as it is (see `schema::OLDEST_READABLE`).
    version: i64,
    /// The run this store took with a lease, and the tenure that took it: its commits and
    /// status changes of that run are fenced by it (see [`Store::lock`]).
    fence: Option<locks::Fence>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        if let Some((m, _)) = &self.marker {
            let _ = fs::remove_file(m);
        }
    }
}

/// Returns the store file in a state directory (`STATE_DIR/state.db`).
pub fn default_path(state_dir: &Path) -> PathBuf {
    state_dir.join("state.db")
}

/// Opens (creating if needed) the store of a state directory.
pub fn open_default(state_dir: &Path) -> Result<SqliteStore> {
    SqliteStore::open(&default_path(state_dir))
}

impl SqliteStore {
    fn error(&self, what: &str, e: rusqlite::Error) -> StoreError {
        sql_error(&self.path, what, e)
    }
}

impl Store for SqliteStore {
    fn create_run(&mut self, run: &RunRecord) -> Result<()> {
        self.insert_run(run)
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>> {
        self.read_run(id)
    }

    fn runs(&self, limit: usize) -> Result<Vec<RunRecord>> {
        self.read_runs(limit)
    }

    fn set_status(&mut self, id: &str, status: RunStatus, exit: Option<(&str, i64)>) -> Result<()> {
        self.write_status(id, status, exit)
    }

    fn cancel(&mut self, run: &str, cancellation: &Cancellation) -> Result<RunStatus> {
        self.cancel_run(run, cancellation)
    }

    fn commit(&mut self, writes: &[Write]) -> Result<()> {
        self.commit_writes(&Write::masked(writes))
    }

    fn nodes(&self, run: &str) -> Result<Vec<NodeRecord>> {
        self.read_nodes(run)
    }

    fn attempts(&self, run: &str, node: Option<&str>) -> Result<Vec<AttemptRecord>> {
        self.read_attempts(run, node)
    }

    fn each_node(&self, run: &str, each: &mut dyn FnMut(NodeRecord)) -> Result<()> {
        self.read_each_node(run, each)
    }

    fn running_attempts(&self, run: &str) -> Result<Vec<AttemptRecord>> {
        self.read_running_attempts(run)
    }

    fn events(&self, run: &str, node: Option<&str>) -> Result<Vec<Event>> {
        self.read_events(run, node)
    }

    fn pending_gates(&self, run: &str) -> Result<Vec<GateRequest>> {
        self.read_pending_gates(run)
    }

    fn approval(&self, run: &str, scope: &str, gate: &str) -> Result<Option<Approval>> {
        self.read_approval(run, scope, gate)
    }

    fn answer(&mut self, approval: &Approval) -> Result<()> {
        self.answer_gate(approval)
    }

    fn lock(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        self.lock_run(run, owner)
    }

    fn renew(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        self.renew_lease(run, owner)
    }

    fn unlock(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        self.unlock_run(run, owner)
    }

    fn lock_holder(&self, run: &str) -> Result<Option<LockOwner>> {
        self.read_lock_holder(run)
    }

    fn changes(&self) -> Result<u64> {
        self.conn
            .pragma_query_value(None, "data_version", |row| row.get::<_, i64>(0))
            .map(|v| u64::try_from(v).unwrap_or_default())
            .map_err(|e| self.error("cannot read", e))
    }

    fn output(&self, run: &str, scope: &str, node: &str) -> Result<Option<serde_json::Value>> {
        self.read_output(run, scope, node)
    }

    fn history(
        &self,
        workflow: &str,
        node: &str,
        except_run: &str,
        limit: usize,
    ) -> Result<Vec<(String, NodeRecord)>> {
        self.read_history(workflow, node, except_run, limit)
    }

    fn stored_sizes(&self, runs: &[&str]) -> Result<Vec<StoredSize>> {
        self.read_stored_sizes(runs)
    }

    fn delete_run(&mut self, run: &str) -> Result<Removed> {
        self.delete_run_rows(run)
    }

    fn events_since(&self, run: &str, after: i64) -> Result<Since<Event>> {
        self.read_events_since(run, after)
    }

    fn nodes_since(&self, run: &str, after: i64) -> Result<Since<NodeRecord>> {
        self.read_nodes_since(run, after)
    }

    fn attempts_since(&self, run: &str, after: i64) -> Result<Since<AttemptRecord>> {
        self.read_attempts_since(run, after)
    }
}

/// A store error of SQLite's: one that says the file is busy says for how long it waited; one
/// that says it is damaged, whichever read or write found it, says how to recover it.
fn sql_error(path: &Path, what: &str, e: rusqlite::Error) -> StoreError {
    if commit::is_busy(&e) {
        StoreError::Busy(format!(
            "{what} {}: another process kept it busy for more than {} s; try again",
            path.display(),
            BUSY_TIMEOUT.as_secs()
        ))
    } else if integrity::is_damage(&e) {
        integrity::damaged(path, what, &e.to_string())
    } else {
        StoreError::Sqlite {
            what: what.to_string(),
            path: path.to_path_buf(),
            source: e,
        }
    }
}

fn json_text<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::json("cannot serialize a value", e))
}

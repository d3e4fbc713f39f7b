//! Run locks: one process at a time runs a run; a dead holder on this host is taken over.

use rusqlite::{OptionalExtension, Row, TransactionBehavior, params};

use super::{SqliteStore, sql_error};
use crate::store::{LockOwner, Result, StoreError, rfc3339};

impl SqliteStore {
    /// Returns who holds a run's lock, if anyone does.
    pub(super) fn read_lock_holder(&self, run: &str) -> Result<Option<LockOwner>> {
        self.conn
            .prepare_cached("SELECT pid, host, since FROM locks WHERE run = ?1")
            .and_then(|mut stmt| stmt.query_row([run], lock_from_row).optional())
            .map_err(|e| self.error("cannot read locks from", e))
    }

    /// [`Store::lock`](crate::store::Store::lock).
    pub(super) fn lock_run(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        let path = self.path.clone();
        let fail = |e| sql_error(&path, "cannot lock a run in", e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let holder = tx
            .prepare_cached("SELECT pid, host, since FROM locks WHERE run = ?1")
            .and_then(|mut stmt| stmt.query_row([run], lock_from_row).optional())
            .map_err(fail)?;
        if let Some(holder) = holder {
            let same_host = holder.host == owner.host;
            if same_host && holder.pid == owner.pid {
                return Ok(());
            }
            if !same_host || crate::store::process_alive(holder.pid) {
                return Err(StoreError::Refused(format!(
                    "run {run} is held by pid {} on {} since {}; wait for it to end or stop it",
                    holder.pid,
                    holder.host,
                    rfc3339(holder.since)
                )));
            }
        }
        tx.prepare_cached(
            "INSERT OR REPLACE INTO locks (run, pid, host, since) VALUES (?1, ?2, ?3, ?4)",
        )
        .and_then(|mut stmt| stmt.execute(params![run, owner.pid, owner.host, owner.since]))
        .map_err(fail)?;
        tx.commit().map_err(fail)
    }

    /// [`Store::unlock`](crate::store::Store::unlock).
    pub(super) fn unlock_run(&mut self, run: &str, pid: u32) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM locks WHERE run = ?1 AND pid = ?2")
            .and_then(|mut stmt| stmt.execute(params![run, pid]))
            .map(drop)
            .map_err(|e| self.error("cannot unlock a run in", e))
    }
}

fn lock_from_row(row: &Row<'_>) -> rusqlite::Result<LockOwner> {
    Ok(LockOwner {
        pid: row.get(0)?,
        host: row.get(1)?,
        since: row.get(2)?,
    })
}

//! Run locks: one process at a time runs a run. A lock is held by a lease that its holder
//! renews (taken over once expired, from any host), or, written by an older ralph-flow, while
//! its process lives (a dead holder on this host is taken over).

use rusqlite::{OptionalExtension, Row, TransactionBehavior, params};

use super::{SqliteStore, sql_error};
use crate::store::{LockOwner, Result, StoreError, now_ms};

const HOLDER: &str = "SELECT pid, host, since, holder, expires FROM locks WHERE run = ?1";

impl SqliteStore {
    /// Returns who holds a run's lock, if anyone does.
    pub(super) fn read_lock_holder(&self, run: &str) -> Result<Option<LockOwner>> {
        self.conn
            .prepare_cached(HOLDER)
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
            .prepare_cached(HOLDER)
            .and_then(|mut stmt| stmt.query_row([run], lock_from_row).optional())
            .map_err(fail)?;
        if let Some(holder) = holder {
            owner
                .may_take(&holder, run, now_ms())
                .map_err(StoreError::Refused)?;
        }
        tx.prepare_cached(
            "INSERT OR REPLACE INTO locks (run, pid, host, since, holder, expires) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                run,
                owner.pid,
                owner.host,
                owner.since,
                owner.holder,
                owner.expires
            ])
        })
        .map_err(fail)?;
        tx.commit().map_err(fail)
    }

    /// [`Store::renew`](crate::store::Store::renew).
    pub(super) fn renew_lease(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        let expires = owner.lease().map(|l| now_ms().saturating_add(l));
        let renewed = self
            .conn
            .prepare_cached("UPDATE locks SET expires = ?3 WHERE run = ?1 AND holder = ?2")
            .and_then(|mut stmt| stmt.execute(params![run, owner.holder, expires]))
            .map_err(|e| self.error("cannot renew a run's lease in", e))?;
        if renewed == 0 {
            let now = match self.read_lock_holder(run)? {
                Some(h) => format!("pid {} on {} holds it", h.pid, h.host),
                None => "nobody holds it".into(),
            };
            return Err(StoreError::LeaseLost {
                run: run.to_string(),
                now,
            });
        }
        Ok(())
    }

    /// [`Store::unlock`](crate::store::Store::unlock).
    pub(super) fn unlock_run(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        self.conn
            .prepare_cached(
                "DELETE FROM locks WHERE run = ?1 AND ((holder <> '' AND holder = ?2) \
                 OR (holder = '' AND pid = ?3 AND host = ?4))",
            )
            .and_then(|mut stmt| stmt.execute(params![run, owner.holder, owner.pid, owner.host]))
            .map(drop)
            .map_err(|e| self.error("cannot unlock a run in", e))
    }
}

fn lock_from_row(row: &Row<'_>) -> rusqlite::Result<LockOwner> {
    Ok(LockOwner {
        pid: row.get(0)?,
        host: row.get(1)?,
        since: row.get(2)?,
        holder: row.get(3)?,
        expires: row.get(4)?,
    })
}

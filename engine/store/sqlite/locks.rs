//! Run locks: one coordinator at a time runs a run. A lock is held by a lease that its
//! holder renews (taken over once expired, from any host, or sooner when its holder is
//! provably gone: `LockOwner::lapsed`), or, written by an older ralph-flow, while its process
//! lives (a dead holder on this host is taken over). Once this store took a run with a
//! lease, its commits, status changes and answers to that run's gates are fenced by it
//! ([`Fence`]).

use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use super::schema::IDENTITY_SINCE;
use super::{SqliteStore, sql_error};
use crate::store::{LockOwner, Result, StoreError, lost_to, now_ms};

pub(super) const HOLDER: &str =
    "SELECT pid, host, since, holder, expires, started, boot, pidns FROM locks WHERE run = ?1";

/// [`HOLDER`] on a store older than [`IDENTITY_SINCE`] (opened read-only): the holder's
/// identity is unknown.
const HOLDER_BEFORE_IDENTITY: &str = "SELECT pid, host, since, holder, expires, NULL, NULL, \
     NULL FROM locks WHERE run = ?1";

/// The tenure that fences this store's writes to a run: the run, its holder token and the
/// lease's length (ms).
#[derive(Clone, Debug)]
pub(super) struct Fence {
    run: String,
    holder: String,
    lease: i64,
}

impl Fence {
    /// Whether `run` is the fenced run.
    pub(super) fn guards(&self, run: &str) -> bool {
        self.run == run
    }

    /// Checks, in a write's transaction, that the lock still has this tenure and its lease
    /// has not lapsed; renews the lease once a third of it is used (so a commit costs one
    /// lookup by key, and an update only every third of a lease). `false`: the lease is lost,
    /// and the transaction must not commit.
    pub(super) fn holds(&self, tx: &Connection) -> rusqlite::Result<bool> {
        let now = now_ms();
        let row: Option<(String, Option<i64>)> = tx
            .prepare_cached("SELECT holder, expires FROM locks WHERE run = ?1")?
            .query_row([&self.run], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((holder, expires)) = row else {
            return Ok(false);
        };
        if holder != self.holder || expires.is_some_and(|e| e < now) {
            return Ok(false);
        }
        if expires.is_none_or(|e| e - now < self.lease - self.lease / 3) {
            tx.prepare_cached("UPDATE locks SET expires = ?2 WHERE run = ?1")?
                .execute(params![self.run, now.saturating_add(self.lease)])?;
        }
        Ok(true)
    }

    /// The error of a write this fence refused, saying who holds the run now.
    pub(super) fn lost(&self, store: &SqliteStore) -> StoreError {
        let held = store.read_lock_holder(&self.run).ok().flatten();
        StoreError::LeaseLost {
            run: self.run.clone(),
            now: lost_to(held.as_ref(), &self.holder),
        }
    }
}

impl SqliteStore {
    /// Returns who holds a run's lock, if anyone does.
    pub(super) fn read_lock_holder(&self, run: &str) -> Result<Option<LockOwner>> {
        let sql = if self.version < IDENTITY_SINCE {
            HOLDER_BEFORE_IDENTITY
        } else {
            HOLDER
        };
        self.conn
            .prepare_cached(sql)
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
            owner.may_take(&holder, run, now_ms())?;
        }
        tx.prepare_cached(
            "INSERT OR REPLACE INTO locks (run, pid, host, since, holder, expires, started, \
             boot, pidns) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                run,
                owner.pid,
                owner.host,
                owner.since,
                owner.holder,
                owner.expires,
                owner.started.and_then(|s| i64::try_from(s).ok()),
                owner.boot,
                owner.pidns.and_then(|n| i64::try_from(n).ok()),
            ])
        })
        .map_err(fail)?;
        tx.commit().map_err(fail)?;
        // From now on this store's writes to the run are this tenure's: fenced by its lease.
        if let Some(lease) = owner.lease() {
            self.fence = Some(Fence {
                run: run.to_string(),
                holder: owner.holder.clone(),
                lease,
            });
        }
        Ok(())
    }

    /// [`Store::renew`](crate::store::Store::renew): only while the lease has not lapsed (a
    /// lapsed lease may have been taken over, and is lost either way).
    pub(super) fn renew_lease(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        let now = now_ms();
        let expires = owner.lease().map(|l| now.saturating_add(l));
        let renewed = self
            .conn
            .prepare_cached(
                "UPDATE locks SET expires = ?3 WHERE run = ?1 AND holder = ?2 \
                 AND (expires IS NULL OR expires >= ?4)",
            )
            .and_then(|mut stmt| stmt.execute(params![run, owner.holder, expires, now]))
            .map_err(|e| self.error("cannot renew a run's lease in", e))?;
        if renewed == 0 {
            let held = self.read_lock_holder(run)?;
            return Err(StoreError::LeaseLost {
                run: run.to_string(),
                now: lost_to(held.as_ref(), &owner.holder),
            });
        }
        Ok(())
    }

    /// [`Store::unlock`](crate::store::Store::unlock).
    pub(super) fn unlock_run(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        if self.fence.as_ref().is_some_and(|f| f.guards(run)) {
            self.fence = None;
        }
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

pub(super) fn lock_from_row(row: &Row<'_>) -> rusqlite::Result<LockOwner> {
    Ok(LockOwner {
        pid: row.get(0)?,
        host: row.get(1)?,
        since: row.get(2)?,
        holder: row.get(3)?,
        expires: row.get(4)?,
        started: row
            .get::<_, Option<i64>>(5)?
            .and_then(|s| u64::try_from(s).ok()),
        boot: row.get(6)?,
        pidns: row
            .get::<_, Option<i64>>(7)?
            .and_then(|n| u64::try_from(n).ok()),
    })
}

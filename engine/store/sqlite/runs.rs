//! The runs table: creating a run, setting its status, reading runs back.

use rusqlite::{OptionalExtension, Row, TransactionBehavior, params};

use super::rows::{json_col, parse_col};
use super::{SqliteStore, json_text, sql_error};
use crate::store::{Cancellation, Result, RunRecord, RunStatus, StoreError, now_ms};

const RUN_COLUMNS: &str = "id, workflow, file, workflow_hash, params, status, exit_name, \
                           exit_code, started_at, updated_at, dir, options";

impl SqliteStore {
    /// [`Store::create_run`](crate::store::Store::create_run).
    pub(super) fn insert_run(&mut self, run: &RunRecord) -> Result<()> {
        let params_text = json_text(&run.params)?;
        let options_text = json_text(&run.options)?;
        let (exit_name, exit_code) = run.exit.clone().unzip();
        let sql = format!(
            "INSERT INTO runs ({RUN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
        );
        let result = self.conn.prepare_cached(&sql).and_then(|mut stmt| {
            stmt.execute(params![
                run.id,
                run.workflow,
                run.file,
                run.workflow_hash,
                params_text,
                run.status.as_str(),
                exit_name,
                exit_code,
                run.started_at,
                run.updated_at,
                run.dir,
                options_text,
            ])
        });
        match result {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(StoreError::RunExists(run.id.clone()))
            }
            other => other
                .map(drop)
                .map_err(|e| self.error("cannot create a run in", e)),
        }
    }

    /// [`Store::run`](crate::store::Store::run).
    pub(super) fn read_run(&self, id: &str) -> Result<Option<RunRecord>> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1");
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| stmt.query_row([id], run_from_row).optional())
            .map_err(|e| self.error("cannot read runs from", e))
    }

    /// [`Store::runs`](crate::store::Store::runs).
    pub(super) fn read_runs(&self, limit: usize) -> Result<Vec<RunRecord>> {
        let sql =
            format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY started_at DESC, rowid DESC LIMIT ?1");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| stmt.query_map([limit], run_from_row)?.collect())
            .map_err(|e| self.error("cannot read runs from", e))
    }

    /// [`Store::set_status`](crate::store::Store::set_status).
    pub(super) fn write_status(
        &mut self,
        id: &str,
        status: RunStatus,
        exit: Option<(&str, i64)>,
    ) -> Result<()> {
        let (exit_name, exit_code) = exit.unzip();
        // A cancelled run stays cancelled: an executor that has not yet seen the cancel
        // (it marks its run running as it starts, interrupted or finished as it ends) does
        // not undo it.
        // A run this store took with a lease changes status only while that tenure holds
        // it, checked in the update's transaction: a coordinator that lost its run (to a
        // takeover, or a lapsed lease) cannot turn back what the next holder did.
        let fence = self.fence.clone().filter(|f| f.guards(id));
        let path = self.path.clone();
        let fail = |e| sql_error(&path, "cannot update a run in", e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        if let Some(f) = &fence
            && !f.holds(&tx).map_err(fail)?
        {
            drop(tx);
            return Err(f.lost(self));
        }
        let changed = tx
            .prepare_cached(
                "UPDATE runs SET status = ?2, exit_name = ?3, exit_code = ?4, updated_at = ?5 \
                 WHERE id = ?1 AND (status <> 'cancelled' OR ?2 = 'cancelled')",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![id, status.as_str(), exit_name, exit_code, now_ms()])
            })
            .map_err(fail)?;
        tx.commit().map_err(fail)?;
        if changed == 0 && self.read_run(id)?.is_some() {
            return Ok(());
        }
        if changed == 0 {
            return Err(StoreError::Refused(format!(
                "no run {id} in {}",
                self.path.display()
            )));
        }
        Ok(())
    }
}

impl SqliteStore {
    /// [`Store::cancel`](crate::store::Store::cancel): the status, the cancellation and the
    /// withdrawal of the run's waiting gates in one transaction, so an `approve` that comes
    /// after finds the run cancelled, not a gate.
    pub(super) fn cancel_run(
        &mut self,
        id: &str,
        cancellation: &Cancellation,
    ) -> Result<RunStatus> {
        let path = self.path.clone();
        let fail = |e| sql_error(&path, "cannot cancel a run in", e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let row: Option<(String, String, Option<String>, Option<i64>)> = tx
            .query_row(
                "SELECT status, options, exit_name, exit_code FROM runs WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(fail)?;
        let Some((status, options, exit_name, exit_code)) = row else {
            return Err(StoreError::Refused(format!(
                "no run {id} in {}",
                self.path.display()
            )));
        };
        let status = RunStatus::parse(&status).ok_or_else(|| {
            StoreError::Version(format!(
                "run {id} has a status this version does not know (`{status}`); use the \
                 ralph-flow that wrote it"
            ))
        })?;
        if let Some(why) =
            crate::store::cancel_refusal(id, status, &options, exit_name.zip(exit_code))
        {
            return Err(StoreError::Refused(why));
        }
        let options = crate::store::options_cancelled(&options, cancellation)?;
        tx.execute(
            "UPDATE runs SET status = 'cancelled', options = ?2, updated_at = ?3 WHERE id = ?1",
            params![id, options, now_ms()],
        )
        .map_err(fail)?;
        tx.execute("DELETE FROM gates WHERE run = ?1", [id])
            .map_err(fail)?;
        tx.commit().map_err(fail)?;
        Ok(status)
    }
}

fn run_from_row(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let exit_name: Option<String> = row.get(6)?;
    let exit_code: Option<i64> = row.get(7)?;
    Ok(RunRecord {
        id: row.get(0)?,
        workflow: row.get(1)?,
        file: row.get(2)?,
        workflow_hash: row.get(3)?,
        params: json_col(row, 4)?,
        status: parse_col(row, 5, RunStatus::parse)?,
        exit: exit_name.zip(exit_code),
        started_at: row.get(8)?,
        updated_at: row.get(9)?,
        dir: row.get(10)?,
        options: json_col(row, 11)?,
    })
}

//! The runs table: creating a run, setting its status, reading runs back.

use rusqlite::{OptionalExtension, Row, params};

use super::rows::{json_col, parse_col};
use super::{SqliteStore, json_text};
use crate::store::{Result, RunRecord, RunStatus, StoreError, now_ms};

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
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE runs SET status = ?2, exit_name = ?3, exit_code = ?4, updated_at = ?5 \
                 WHERE id = ?1",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![id, status.as_str(), exit_name, exit_code, now_ms()])
            })
            .map_err(|e| self.error("cannot update a run in", e))?;
        if changed == 0 {
            return Err(StoreError::Refused(format!(
                "no run {id} in {}",
                self.path.display()
            )));
        }
        Ok(())
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

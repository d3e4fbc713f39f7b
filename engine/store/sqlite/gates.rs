//! Gate requests and their answers: what waits, answering one (in one transaction with the
//! removal of the request), and the answers recorded.

use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use super::rows::json_col;
use super::{SqliteStore, sql_error};
use crate::store::{Approval, GateRequest, Result, Store};

const GATE_COLUMNS: &str = "run, scope, gate, message, show, requested_at, deadline";

const APPROVAL_COLUMNS: &str = "run, scope, gate, approved, comment, by, at";

const INSERT_APPROVAL: &str = "INSERT OR REPLACE INTO approvals (run, scope, gate, approved, \
     comment, by, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

const DELETE_GATE: &str = "DELETE FROM gates WHERE run = ?1 AND scope = ?2 AND gate = ?3";

impl SqliteStore {
    /// Returns the gates of a run named `gate` that wait for an answer, in any scope.
    pub fn find_pending(&self, run: &str, gate: &str) -> Result<Vec<GateRequest>> {
        Ok(self
            .pending_gates(run)?
            .into_iter()
            .filter(|g| g.gate == gate)
            .collect())
    }

    /// [`Store::pending_gates`](crate::store::Store::pending_gates).
    pub(super) fn read_pending_gates(&self, run: &str) -> Result<Vec<GateRequest>> {
        pending(&self.conn, run).map_err(|e| self.error("cannot read gates from", e))
    }

    /// [`Store::approval`](crate::store::Store::approval).
    pub(super) fn read_approval(
        &self,
        run: &str,
        scope: &str,
        gate: &str,
    ) -> Result<Option<Approval>> {
        let sql = format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE run = ?1 AND scope = ?2 AND gate = ?3"
        );
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_row([run, scope, gate], approval_from_row)
                    .optional()
            })
            .map_err(|e| self.error("cannot read approvals from", e))
    }

    /// [`Store::answer`](crate::store::Store::answer).
    pub(super) fn answer_gate(&mut self, approval: &Approval) -> Result<()> {
        let path = self.path.clone();
        let fail = |e| sql_error(&path, "cannot answer a gate in", e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        // The executor's own answer (a gate's timeout) is fenced by its tenure, as its
        // commits are; another process's (`approve`) has no fence.
        if let Some(f) = self.fence.as_ref().filter(|f| f.guards(&approval.run))
            && !f.holds(&tx).map_err(fail)?
        {
            drop(tx);
            return Err(f.lost(self));
        }
        let waiting = pending(&tx, &approval.run).map_err(fail)?;
        let target = crate::store::answered_gate(approval, &waiting, || {
            tx.query_row("SELECT 1 FROM runs WHERE id = ?1", [&approval.run], |_| {
                Ok(())
            })
            .optional()
            .map(|row| row.is_some())
            .map_err(fail)
        })?;
        let answer = Approval {
            scope: target.scope.clone(),
            ..approval.clone()
        };
        insert_approval(&tx, &answer).map_err(fail)?;
        tx.commit().map_err(fail)
    }
}

/// Inserts an answer and removes the gate it answers.
pub(super) fn insert_approval(conn: &Connection, a: &Approval) -> rusqlite::Result<()> {
    conn.prepare_cached(INSERT_APPROVAL)?.execute(params![
        a.run, a.scope, a.gate, a.approved, a.comment, a.by, a.at
    ])?;
    conn.prepare_cached(DELETE_GATE)?
        .execute(params![a.run, a.scope, a.gate])?;
    Ok(())
}

fn pending(conn: &Connection, run: &str) -> rusqlite::Result<Vec<GateRequest>> {
    let sql = format!("SELECT {GATE_COLUMNS} FROM gates WHERE run = ?1 ORDER BY rowid");
    conn.prepare_cached(&sql)?
        .query_map([run], gate_from_row)?
        .collect()
}

fn gate_from_row(row: &Row<'_>) -> rusqlite::Result<GateRequest> {
    Ok(GateRequest {
        run: row.get(0)?,
        scope: row.get(1)?,
        gate: row.get(2)?,
        message: row.get(3)?,
        show: json_col(row, 4)?,
        requested_at: row.get(5)?,
        deadline: row.get(6)?,
    })
}

fn approval_from_row(row: &Row<'_>) -> rusqlite::Result<Approval> {
    Ok(Approval {
        run: row.get(0)?,
        scope: row.get(1)?,
        gate: row.get(2)?,
        approved: row.get(3)?,
        comment: row.get(4)?,
        by: row.get(5)?,
        at: row.get(6)?,
    })
}

//! Reading settlements, attempts and events back: node records with their outputs (inline or
//! spilled), and cross-run history.

use rusqlite::{Row, params};

use super::SqliteStore;
use super::rows::{parse_col, usage_from_row};
use super::schema::{ATTEMPT_SEQ_SINCE, UNREPORTED_SINCE};
use crate::store::{AttemptRecord, AttemptState, Event, NodeRecord, NodeState, Result, Since};

/// The columns of `nodes n` (aliased so that joins can use them) with `$unreported` for
/// the count of calls that reported no usage: the column, or `0` in a store older than
/// [`UNREPORTED_SINCE`] (opened read-only), which has none.
macro_rules! node_columns {
    ($unreported:literal) => {
        concat!(
            "n.run, n.scope, n.node, n.state, n.output, n.output_blob, n.action, n.feedback, \
             n.attempts, n.input_tokens, n.output_tokens, n.cached_tokens, n.cost_usd, ",
            $unreported,
            ", n.started_at, n.finished_at"
        )
    };
}

/// The columns of `attempts`, the count as in [`node_columns`].
macro_rules! attempt_columns {
    ($unreported:literal) => {
        concat!(
            "run, scope, node, attempt, state, agent, dir, error, input_tokens, output_tokens, \
             cached_tokens, cost_usd, ",
            $unreported,
            ", started_at, finished_at"
        )
    };
}

const NODE_COLUMNS: &str = node_columns!("n.unreported");
const NODE_COLUMNS_BEFORE_UNREPORTED: &str = node_columns!("0");
const ATTEMPT_COLUMNS: &str = attempt_columns!("unreported");
const ATTEMPT_COLUMNS_BEFORE_UNREPORTED: &str = attempt_columns!("0");

impl SqliteStore {
    /// The columns of a node record, as this store's schema has them.
    fn node_columns(&self) -> &'static str {
        if self.version < UNREPORTED_SINCE {
            NODE_COLUMNS_BEFORE_UNREPORTED
        } else {
            NODE_COLUMNS
        }
    }

    /// The columns of an attempt record, as this store's schema has them.
    fn attempt_columns(&self) -> &'static str {
        if self.version < UNREPORTED_SINCE {
            ATTEMPT_COLUMNS_BEFORE_UNREPORTED
        } else {
            ATTEMPT_COLUMNS
        }
    }

    fn node_from_row(
        &self,
        row: &Row<'_>,
    ) -> rusqlite::Result<(NodeRecord, Option<String>, Option<String>)> {
        let record = NodeRecord {
            run: row.get(0)?,
            scope: row.get(1)?,
            node: row.get(2)?,
            state: parse_col(row, 3, NodeState::parse)?,
            output: serde_json::Value::Null,
            action: row.get(6)?,
            feedback: row.get(7)?,
            attempts: row.get(8)?,
            usage: usage_from_row(row, 9)?,
            started_at: row.get(14)?,
            finished_at: row.get(15)?,
        };
        Ok((record, row.get(4)?, row.get(5)?))
    }

    fn query_nodes(&self, sql: &str, params: impl rusqlite::Params) -> Result<Vec<NodeRecord>> {
        let mut out = Vec::new();
        self.each_node_of(sql, params, &mut |record| out.push(record))?;
        Ok(out)
    }

    /// Hands each node a query finds to `each`, as it is read.
    fn each_node_of(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        each: &mut dyn FnMut(NodeRecord),
    ) -> Result<()> {
        let fail = |e| self.error("cannot read nodes from", e);
        let mut stmt = self.conn.prepare_cached(sql).map_err(fail)?;
        let rows = stmt
            .query_map(params, |row| self.node_from_row(row))
            .map_err(fail)?;
        for row in rows {
            let (mut record, inline, blob) = row.map_err(fail)?;
            record.output = self.load_output(inline, blob)?;
            each(record);
        }
        Ok(())
    }

    /// [`Store::each_node`](crate::store::Store::each_node).
    pub(super) fn read_each_node(&self, run: &str, each: &mut dyn FnMut(NodeRecord)) -> Result<()> {
        let sql = format!(
            "SELECT {} FROM nodes n WHERE n.run = ?1 ORDER BY n.seq",
            self.node_columns()
        );
        self.each_node_of(&sql, [run], each)
    }

    /// [`Store::nodes`](crate::store::Store::nodes).
    pub(super) fn read_nodes(&self, run: &str) -> Result<Vec<NodeRecord>> {
        let sql = format!(
            "SELECT {} FROM nodes n WHERE n.run = ?1 ORDER BY n.seq",
            self.node_columns()
        );
        self.query_nodes(&sql, [run])
    }

    /// [`Store::attempts`](crate::store::Store::attempts).
    pub(super) fn read_attempts(
        &self,
        run: &str,
        node: Option<&str>,
    ) -> Result<Vec<AttemptRecord>> {
        let sql = format!(
            "SELECT {} FROM attempts WHERE run = ?1 AND (?2 IS NULL OR node = ?2) \
             ORDER BY started_at, scope, node, attempt",
            self.attempt_columns()
        );
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_map(params![run, node], attempt_from_row)?
                    .collect()
            })
            .map_err(|e| self.error("cannot read attempts from", e))
    }

    /// [`Store::running_attempts`](crate::store::Store::running_attempts).
    pub(super) fn read_running_attempts(&self, run: &str) -> Result<Vec<AttemptRecord>> {
        let sql = format!(
            "SELECT {} FROM attempts WHERE run = ?1 AND state = ?2 \
             ORDER BY started_at, scope, node, attempt",
            self.attempt_columns()
        );
        self.conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_map(
                    params![run, AttemptState::Running.as_str()],
                    attempt_from_row,
                )?
                .collect()
            })
            .map_err(|e| self.error("cannot read attempts from", e))
    }

    /// [`Store::events`](crate::store::Store::events): the rows of `events`, and the
    /// settlement events kept in node rows (schema version 5), in the order of their numbers.
    pub(super) fn read_events(&self, run: &str, node: Option<&str>) -> Result<Vec<Event>> {
        let sql = "SELECT run, at, scope, node, kind, message FROM ( \
             SELECT run, seq, at, scope, node, kind, message FROM events \
             WHERE run = ?1 AND (?2 IS NULL OR node = ?2) \
             UNION ALL \
             SELECT run, seq, finished_at, scope, node, state, event FROM nodes \
             WHERE run = ?1 AND event IS NOT NULL AND (?2 IS NULL OR node = ?2)) \
             ORDER BY seq";
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| {
                stmt.query_map(params![run, node], event_from_row)?
                    .collect()
            })
            .map_err(|e| self.error("cannot read events from", e))
    }

    /// [`Store::nodes_since`](crate::store::Store::nodes_since): the rows numbered after
    /// `after` (the count orders every write of the run under the write lock, so no row of an
    /// earlier commit can come later), through the index on (run, seq).
    pub(super) fn read_nodes_since(&self, run: &str, after: i64) -> Result<Since<NodeRecord>> {
        let sql = format!(
            "SELECT {}, n.seq FROM nodes n WHERE n.run = ?1 AND n.seq > ?2 ORDER BY n.seq",
            self.node_columns()
        );
        let fail = |e| self.error("cannot read nodes from", e);
        let mut stmt = self.conn.prepare_cached(&sql).map_err(fail)?;
        let rows = stmt
            .query_map(params![run, after], |row| {
                Ok((self.node_from_row(row)?, row.get::<_, i64>(16)?))
            })
            .map_err(fail)?;
        let mut records = Vec::new();
        for row in rows {
            let ((mut record, inline, blob), seq) = row.map_err(fail)?;
            record.output = self.load_output(inline, blob)?;
            records.push((seq, record));
        }
        Ok(since(records, after))
    }

    /// [`Store::attempts_since`](crate::store::Store::attempts_since): the rows numbered
    /// after `after`; every row, numbered 0, in a store older than [`ATTEMPT_SEQ_SINCE`]
    /// (opened read-only), which does not number them.
    pub(super) fn read_attempts_since(
        &self,
        run: &str,
        after: i64,
    ) -> Result<Since<AttemptRecord>> {
        if self.version < ATTEMPT_SEQ_SINCE {
            let all = self.read_attempts(run, None)?;
            return Ok(Since {
                records: all.into_iter().map(|a| (0, a)).collect(),
                next: after,
            });
        }
        let sql = format!(
            "SELECT {}, seq FROM attempts WHERE run = ?1 AND seq > ?2 ORDER BY seq",
            self.attempt_columns()
        );
        let records = self
            .conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_map(params![run, after], |row| {
                    Ok((row.get::<_, i64>(15)?, attempt_from_row(row)?))
                })?
                .collect()
            })
            .map_err(|e| self.error("cannot read attempts from", e))?;
        Ok(since(records, after))
    }

    /// [`Store::events_since`](crate::store::Store::events_since): as
    /// [`SqliteStore::read_events`], numbered after `after`. An event that a node's row kept
    /// and that a trigger moved into `events` (the stage settled again) keeps its number, so
    /// it is not read twice.
    pub(super) fn read_events_since(&self, run: &str, after: i64) -> Result<Since<Event>> {
        let sql = "SELECT run, at, scope, node, kind, message, seq FROM ( \
             SELECT run, seq, at, scope, node, kind, message FROM events \
             WHERE run = ?1 AND seq > ?2 \
             UNION ALL \
             SELECT run, seq, finished_at, scope, node, state, event FROM nodes \
             WHERE run = ?1 AND seq > ?2 AND event IS NOT NULL) \
             ORDER BY seq";
        let records = self
            .conn
            .prepare_cached(sql)
            .and_then(|mut stmt| {
                stmt.query_map(params![run, after], |row| {
                    Ok((row.get::<_, i64>(6)?, event_from_row(row)?))
                })?
                .collect()
            })
            .map_err(|e| self.error("cannot read events from", e))?;
        Ok(since(records, after))
    }

    /// [`Store::output`](crate::store::Store::output).
    pub(super) fn read_output(
        &self,
        run: &str,
        scope: &str,
        node: &str,
    ) -> Result<Option<serde_json::Value>> {
        use rusqlite::OptionalExtension;
        let row: Option<(Option<String>, Option<String>)> = self
            .conn
            .prepare_cached(
                "SELECT output, output_blob FROM nodes WHERE run = ?1 AND scope = ?2 AND node = ?3",
            )
            .and_then(|mut stmt| {
                stmt.query_row(params![run, scope, node], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()
            })
            .map_err(|e| self.error("cannot read an output from", e))?;
        match row {
            Some((inline, blob)) => self.load_output(inline, blob).map(Some),
            None => Ok(None),
        }
    }

    /// [`Store::history`](crate::store::Store::history).
    pub(super) fn read_history(
        &self,
        workflow: &str,
        node: &str,
        except_run: &str,
        limit: usize,
    ) -> Result<Vec<(String, NodeRecord)>> {
        let sql = format!(
            "SELECT {} FROM nodes n JOIN runs r ON n.run = r.id \
             WHERE r.workflow = ?1 AND n.node = ?2 AND r.id != ?3 \
             ORDER BY r.started_at DESC, r.rowid DESC, n.seq DESC LIMIT ?4",
            self.node_columns()
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let records = self.query_nodes(&sql, params![workflow, node, except_run, limit])?;
        Ok(records.into_iter().map(|n| (n.run.clone(), n)).collect())
    }
}

fn attempt_from_row(row: &Row<'_>) -> rusqlite::Result<AttemptRecord> {
    Ok(AttemptRecord {
        run: row.get(0)?,
        scope: row.get(1)?,
        node: row.get(2)?,
        attempt: row.get(3)?,
        state: parse_col(row, 4, AttemptState::parse)?,
        agent: row.get(5)?,
        dir: row.get(6)?,
        error: row.get(7)?,
        usage: usage_from_row(row, 8)?,
        started_at: row.get(13)?,
        finished_at: row.get(14)?,
    })
}

fn event_from_row(row: &Row<'_>) -> rusqlite::Result<Event> {
    Ok(Event {
        run: row.get(0)?,
        at: row.get(1)?,
        scope: row.get(2)?,
        node: row.get(3)?,
        kind: row.get(4)?,
        message: row.get(5)?,
    })
}

/// The answer of a `*_since` read: the position moves to the highest number read.
fn since<T>(records: Vec<(i64, T)>, after: i64) -> Since<T> {
    let next = records.last().map_or(after, |(n, _)| (*n).max(after));
    Since { records, next }
}

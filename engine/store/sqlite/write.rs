//! The statements of a commit's writes (nodes, attempts, events, gates, answers), run in one
//! transaction.

use rusqlite::{Connection, TransactionBehavior, params};

use super::blobs::Output;
use super::gates::insert_approval;
use super::rows::UsageCols;
use crate::store::Write;

const INSERT_NODE: &str = "INSERT OR REPLACE INTO nodes (run, scope, node, state, output, \
     output_blob, action, feedback, attempts, input_tokens, output_tokens, cached_tokens, \
     cost_usd, started_at, finished_at, seq) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)";

const LAST_NODE_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM nodes WHERE run = ?1";

const LAST_EVENT_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM events WHERE run = ?1";

/// The write order of nodes and the numbers of events (`seq` of both), counted here for
/// each run this connection writes: the highest of each is read from the file once per
/// run, and each row written after it gets the next number, with no lookup of the highest
/// in every commit. One process coordinates a run at a time, but others add events to it
/// (an answer to a gate from `approve` or the monitor): a number taken meanwhile fails the
/// commit on the key, and [`Seqs::forget`] makes the next try read the file again. A
/// commit that fails leaves a gap, which only orders.
#[derive(Debug, Default)]
pub(super) struct Seqs {
    nodes: std::collections::HashMap<String, i64>,
    events: std::collections::HashMap<String, i64>,
}

impl Seqs {
    fn next_node(&mut self, tx: &Connection, run: &str) -> rusqlite::Result<i64> {
        next(&mut self.nodes, tx, LAST_NODE_SEQ, run)
    }

    fn next_event(&mut self, tx: &Connection, run: &str) -> rusqlite::Result<i64> {
        next(&mut self.events, tx, LAST_EVENT_SEQ, run)
    }

    /// The number of the run's last event this connection wrote, if it wrote one.
    pub(super) fn last_event(&self, run: &str) -> Option<i64> {
        self.events.get(run).copied()
    }

    /// Forgets every count: the next write reads them from the file.
    pub(super) fn forget(&mut self) {
        self.nodes.clear();
        self.events.clear();
    }
}

fn next(
    counts: &mut std::collections::HashMap<String, i64>,
    tx: &Connection,
    last_sql: &str,
    run: &str,
) -> rusqlite::Result<i64> {
    let last = match counts.get_mut(run) {
        Some(last) => last,
        None => {
            let last = tx
                .prepare_cached(last_sql)?
                .query_row([run], |row| row.get(0))?;
            counts.entry(run.to_string()).or_insert(last)
        }
    };
    *last += 1;
    Ok(*last)
}

const UPSERT_ATTEMPT: &str = "INSERT INTO attempts (run, scope, node, attempt, state, agent, \
     dir, error, input_tokens, output_tokens, cached_tokens, cost_usd, started_at, finished_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
     ON CONFLICT (run, scope, node, attempt) DO UPDATE SET state = excluded.state, \
     agent = excluded.agent, dir = excluded.dir, error = excluded.error, \
     input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, \
     cached_tokens = excluded.cached_tokens, cost_usd = excluded.cost_usd, \
     started_at = excluded.started_at, finished_at = excluded.finished_at";

const INSERT_EVENT: &str = "INSERT INTO events (run, seq, at, scope, node, kind, message) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

const INSERT_GATE: &str = "INSERT OR REPLACE INTO gates (run, scope, gate, message, show, \
     requested_at, deadline) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// Writes everything in one transaction (raw errors, for the retry of a busy file).
pub(super) fn write_all(
    conn: &mut Connection,
    writes: &[Write],
    outputs: &[Output],
    shows: &[Option<String>],
    seq: &mut Seqs,
) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for ((write, output), show) in writes.iter().zip(outputs).zip(shows) {
        match write {
            Write::Node(n) => {
                let Output { inline, blob } = output;
                let (inline, blob) = (inline.as_deref(), blob.as_deref());
                let u = UsageCols::from(&n.usage);
                let order = seq.next_node(&tx, &n.run)?;
                tx.prepare_cached(INSERT_NODE).and_then(|mut stmt| {
                    stmt.execute(params![
                        n.run,
                        n.scope,
                        n.node,
                        n.state.as_str(),
                        inline,
                        blob,
                        n.action,
                        n.feedback,
                        n.attempts,
                        u.input,
                        u.output,
                        u.cached,
                        u.cost,
                        n.started_at,
                        n.finished_at,
                        order,
                    ])
                })?;
            }
            Write::Attempt(a) => {
                let u = UsageCols::from(&a.usage);
                tx.prepare_cached(UPSERT_ATTEMPT).and_then(|mut stmt| {
                    stmt.execute(params![
                        a.run,
                        a.scope,
                        a.node,
                        a.attempt,
                        a.state.as_str(),
                        a.agent,
                        a.dir,
                        a.error,
                        u.input,
                        u.output,
                        u.cached,
                        u.cost,
                        a.started_at,
                        a.finished_at,
                    ])
                })?;
            }
            Write::Event(e) => {
                let number = seq.next_event(&tx, &e.run)?;
                tx.prepare_cached(INSERT_EVENT).and_then(|mut stmt| {
                    stmt.execute(params![
                        e.run, number, e.at, e.scope, e.node, e.kind, e.message
                    ])
                })?;
            }
            Write::Gate(g) => {
                tx.prepare_cached(INSERT_GATE).and_then(|mut stmt| {
                    stmt.execute(params![
                        g.run,
                        g.scope,
                        g.gate,
                        g.message,
                        show,
                        g.requested_at,
                        g.deadline,
                    ])
                })?;
            }
            Write::Approval(a) => {
                // An answer (a person's, or the timeout's) ends the wait.
                insert_approval(&tx, a)?;
            }
        }
    }
    tx.commit()
}

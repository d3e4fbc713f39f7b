//! The statements of a commit's writes (nodes, attempts, events, gates, answers), run in one
//! transaction.

use rusqlite::{Connection, TransactionBehavior, params};

use super::blobs::Output;
use super::gates::insert_approval;
use super::locks::Fence;
use super::rows::UsageCols;
use crate::store::Write;

/// A node's settlement, written over an earlier one of the same stage in the same scope (a
/// stage settled again). An update, not a replace, so that the trigger of schema version 5
/// moves the earlier row's event into `events` first.
const UPSERT_NODE: &str = "INSERT INTO nodes (run, scope, node, state, output, output_blob, \
     action, feedback, attempts, input_tokens, output_tokens, cached_tokens, cost_usd, \
     started_at, finished_at, seq, event, unreported) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18) \
     ON CONFLICT (run, scope, node) DO UPDATE SET state = excluded.state, \
     output = excluded.output, output_blob = excluded.output_blob, action = excluded.action, \
     feedback = excluded.feedback, attempts = excluded.attempts, \
     input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, \
     cached_tokens = excluded.cached_tokens, cost_usd = excluded.cost_usd, \
     started_at = excluded.started_at, finished_at = excluded.finished_at, seq = excluded.seq, \
     event = excluded.event, unreported = excluded.unreported";

/// The highest number of the run's events, nodes and attempts (one count since schema
/// version 5, attempts in it since version 8).
/// Attempts take their numbers from the same count since schema version 8.
const LAST_SEQ: &str = "SELECT MAX((SELECT COALESCE(MAX(seq), 0) FROM events WHERE run = ?1), \
     (SELECT COALESCE(MAX(seq), 0) FROM nodes WHERE run = ?1), \
     (SELECT COALESCE(MAX(seq), 0) FROM attempts WHERE run = ?1))";

/// The numbers of a run's events and the write order of its nodes (`seq` of both, one
/// count), counted here for each run this connection writes: the highest is read from the
/// file once, and each row written after it gets the next number, with no lookup of the
/// highest in every commit. One process coordinates a run at a time, but others add events
/// to it (an answer to a gate from `approve` or the monitor). So a commit that finds the
/// file changed by another connection since its last one (`PRAGMA data_version`) reads the
/// highest again; it holds the write lock while it counts, so no number is given twice. A
/// number taken all the same fails the commit on the key of `events`, and
/// [`Seqs::forget`] makes the next try read the file again. A commit that fails leaves a
/// gap, which only orders.
#[derive(Debug, Default)]
pub(super) struct Seqs {
    numbers: std::collections::HashMap<String, i64>,
    /// `PRAGMA data_version` at this connection's last commit.
    seen: Option<i64>,
}

impl Seqs {
    fn next(&mut self, tx: &Connection, run: &str) -> rusqlite::Result<i64> {
        let last = match self.numbers.get_mut(run) {
            Some(last) => last,
            None => {
                let last = tx
                    .prepare_cached(LAST_SEQ)?
                    .query_row([run], |row| row.get(0))?;
                self.numbers.entry(run.to_string()).or_insert(last)
            }
        };
        *last += 1;
        Ok(*last)
    }

    /// Forgets the counts if another connection committed since this one last did.
    fn check(&mut self, tx: &Connection) -> rusqlite::Result<()> {
        let version: i64 = tx
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |row| row.get(0))?;
        if self.seen != Some(version) {
            self.numbers.clear();
            self.seen = Some(version);
        }
        Ok(())
    }

    /// The number of the run's last event or node this connection wrote, if it wrote one.
    pub(super) fn last_number(&self, run: &str) -> Option<i64> {
        self.numbers.get(run).copied()
    }

    /// Forgets every count: the next write reads them from the file.
    pub(super) fn forget(&mut self) {
        self.numbers.clear();
    }
}

const UPSERT_ATTEMPT: &str = "INSERT INTO attempts (run, scope, node, attempt, state, agent, \
     dir, error, input_tokens, output_tokens, cached_tokens, cost_usd, started_at, finished_at, \
     unreported, seq) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16) \
     ON CONFLICT (run, scope, node, attempt) DO UPDATE SET state = excluded.state, \
     agent = excluded.agent, dir = excluded.dir, error = excluded.error, \
     input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, \
     cached_tokens = excluded.cached_tokens, cost_usd = excluded.cost_usd, \
     started_at = excluded.started_at, finished_at = excluded.finished_at, \
     unreported = excluded.unreported, seq = excluded.seq";

const INSERT_EVENT: &str = "INSERT INTO events (run, seq, at, scope, node, kind, message) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

const INSERT_GATE: &str = "INSERT OR REPLACE INTO gates (run, scope, gate, message, show, \
     requested_at, deadline) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

/// Tells whether an event is the settlement of the node written after it, so that the
/// node's row can hold it: the same stage, kind and time.
fn settles(e: &crate::store::Event, n: &crate::store::NodeRecord) -> bool {
    e.run == n.run
        && e.scope == n.scope
        && e.node == n.node
        && e.kind == n.state.as_str()
        && e.at == n.finished_at
}

/// Writes everything in one transaction (raw errors, for the retry of a busy file).
/// `false`, with nothing written, when `fence` (the tenure this store took a run with) has
/// lost its lease: checked under the write lock, in the same transaction.
pub(super) fn write_all(
    conn: &mut Connection,
    writes: &[Write],
    outputs: &[Output],
    shows: &[Option<String>],
    seq: &mut Seqs,
    fence: Option<&Fence>,
) -> rusqlite::Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if let Some(fence) = fence
        && !fence.holds(&tx)?
    {
        return Ok(false);
    }
    seq.check(&tx)?;
    let mut rows = writes.iter().zip(outputs).zip(shows).peekable();
    while let Some(((write, output), show)) = rows.next() {
        match write {
            Write::Event(e) => {
                // A settlement's event goes into its node's row (one B-tree leaf less).
                if let Some(&((Write::Node(n), output), _)) = rows.peek()
                    && settles(e, n)
                {
                    rows.next();
                    let number = seq.next(&tx, &n.run)?;
                    write_node(&tx, n, output, number, Some(&e.message))?;
                    continue;
                }
                let number = seq.next(&tx, &e.run)?;
                tx.prepare_cached(INSERT_EVENT).and_then(|mut stmt| {
                    stmt.execute(params![
                        e.run, number, e.at, e.scope, e.node, e.kind, e.message
                    ])
                })?;
            }
            Write::Node(n) => {
                let number = seq.next(&tx, &n.run)?;
                write_node(&tx, n, output, number, None)?;
            }
            Write::Attempt(a) => {
                let number = seq.next(&tx, &a.run)?;
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
                        u.unreported,
                        number,
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
    tx.commit().map(|()| true)
}

/// Writes a node's row: its number in the run, and the message of its settlement event
/// when the row holds the event.
fn write_node(
    tx: &Connection,
    n: &crate::store::NodeRecord,
    output: &Output,
    number: i64,
    event: Option<&str>,
) -> rusqlite::Result<()> {
    let Output { inline, blob, .. } = output;
    let u = UsageCols::from(&n.usage);
    tx.prepare_cached(UPSERT_NODE).and_then(|mut stmt| {
        stmt.execute(params![
            n.run,
            n.scope,
            n.node,
            n.state.as_str(),
            inline.as_deref(),
            blob.as_deref(),
            n.action,
            n.feedback,
            n.attempts,
            u.input,
            u.output,
            u.cached,
            u.cost,
            n.started_at,
            n.finished_at,
            number,
            event,
            u.unreported,
        ])
    })?;
    Ok(())
}

//! The workers of a PostgreSQL store, as each last said it was there: `ralph-flow worker`
//! writes its row (its id, host, pid and labels, when it was seen and until when it counts as
//! live) whenever it looks for work, and marks it gone when it stops. Nothing claims by these
//! rows: they only say why work waits ([`PgStore::unplaced_work`]): a queued run, or a unit
//! of work, whose labels no live worker has, with the last worker seen that had them.

use std::time::Duration;

use super::{NOW_MS, PgStore, pg};
use crate::store::{Result, SeenWorker, Unplaced};

/// How long the row of a worker not seen since is kept (for "last seen").
const KEEP_MS: i64 = 7 * 86_400_000;

/// How many workers, most recently seen first, are read to tell why work waits.
const READ: i64 = 1000;

/// A worker's row, as read.
struct Row {
    host: String,
    pid: i64,
    labels: Vec<String>,
    seen: i64,
    live: bool,
}

impl crate::store::WorkerRegistry for PgStore {
    /// Records that worker `id` (its holder id, `host:pid:random`) with `labels` looks for
    /// work now, and counts as live for `live_for` more (a few of its polls). Rows of workers
    /// not seen for a week are dropped. Not counted as a change ([`crate::store::Store::changes`]):
    /// a monitor need not refresh each time a worker polls.
    fn worker_seen(
        &mut self,
        id: &str,
        host: &str,
        pid: u32,
        labels: &[String],
        live_for: Duration,
    ) -> Result<()> {
        let (id, host, labels) = (id.to_string(), host.to_string(), labels.to_vec());
        let live_for = crate::store::ms(live_for);
        self.call(move |c| {
            let fail = |e| pg("cannot record the worker", e);
            let mut tx = c.transaction().map_err(fail)?;
            tx.execute(
                &format!(
                    "INSERT INTO workers (id, host, pid, labels, seen, until) \
                     VALUES ($1, $2, $3, $4, {NOW_MS}, {NOW_MS} + $5) \
                     ON CONFLICT (id) DO UPDATE SET labels = excluded.labels, \
                     seen = excluded.seen, until = excluded.until"
                ),
                &[&id, &host, &i64::from(pid), &labels, &live_for],
            )
            .map_err(fail)?;
            tx.execute(
                &format!("DELETE FROM workers WHERE seen < {NOW_MS} - $1"),
                &[&KEEP_MS],
            )
            .map_err(fail)?;
            tx.commit().map_err(fail)
        })
    }

    /// Records that worker `id` stopped: it no longer counts as live (its row stays, for
    /// "last seen").
    fn worker_gone(&mut self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.call(move |c| {
            c.execute(
                &format!("UPDATE workers SET seen = {NOW_MS}, until = {NOW_MS} WHERE id = $1"),
                &[&id],
            )
            .map(drop)
            .map_err(|e| pg("cannot record that the worker stopped", e))
        })
    }
}

impl PgStore {
    /// [`Store::unplaced`](crate::store::Store::unplaced): the run while it is queued for a
    /// worker, and each stage with a queued unit, whose labels no live worker has all of.
    pub(super) fn unplaced_work(&self, run: &str) -> Result<Vec<Unplaced>> {
        let run = run.to_string();
        self.call(move |c| {
            let fail = |e| pg("cannot read which workers are live", e);
            let mut wanted: Vec<(String, Vec<String>)> = Vec::new();
            let Some(r) = c
                .query_opt(
                    "SELECT status, detached, labels FROM runs WHERE id = $1",
                    &[&run],
                )
                .map_err(fail)?
            else {
                return Ok(Vec::new());
            };
            if r.get::<_, String>(0) == "queued" && r.get::<_, bool>(1) {
                wanted.push((String::new(), r.get(2)));
            }
            for u in c
                .query(
                    "SELECT DISTINCT stage, labels FROM units WHERE run = $1 AND state = 'queued' \
                     ORDER BY stage",
                    &[&run],
                )
                .map_err(fail)?
            {
                // The unit's stage key is `SCOPE/STAGE#`: shown as `SCOPE/STAGE`.
                let stage: String = u.get(0);
                let stage = stage
                    .trim_end_matches('#')
                    .trim_start_matches('/')
                    .to_string();
                wanted.push((stage, u.get(1)));
            }
            if wanted.is_empty() {
                return Ok(Vec::new());
            }
            let now: i64 = c
                .query_one(&format!("SELECT {NOW_MS}"), &[])
                .map_err(fail)?
                .get(0);
            let workers: Vec<Row> = c
                .query(
                    "SELECT host, pid, labels, seen, until >= $1 FROM workers \
                     ORDER BY seen DESC LIMIT $2",
                    &[&now, &READ],
                )
                .map_err(fail)?
                .iter()
                .map(|w| Row {
                    host: w.get(0),
                    pid: w.get(1),
                    labels: w.get(2),
                    seen: w.get(3),
                    live: w.get(4),
                })
                .collect();
            Ok(wanted
                .into_iter()
                .filter_map(|(stage, labels)| unplaced(stage, labels, &workers, now))
                .collect())
        })
    }
}

/// Why work that needs `labels` waits, or `None` when a live worker has them all.
fn unplaced(stage: String, labels: Vec<String>, workers: &[Row], now: i64) -> Option<Unplaced> {
    let has_all = |w: &Row| labels.iter().all(|l| w.labels.contains(l));
    if workers.iter().any(|w| w.live && has_all(w)) {
        return None;
    }
    let missing = labels
        .iter()
        .filter(|l| !workers.iter().any(|w| w.live && w.labels.contains(l)))
        .cloned()
        .collect();
    // The rows come most recently seen first.
    let last_seen = workers.iter().find(|w| has_all(w)).map(|w| SeenWorker {
        host: w.host.clone(),
        pid: u32::try_from(w.pid).unwrap_or(0),
        seen: w.seen,
        ago_ms: now - w.seen,
    });
    Some(Unplaced {
        stage,
        labels,
        missing,
        last_seen,
    })
}

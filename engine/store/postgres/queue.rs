//! The queue of detached runs in the PostgreSQL store: `run --detach` enqueues a run with
//! its workflow's files and the labels a worker needs; `ralph-flow worker` claims runs with
//! `SELECT ... FOR UPDATE SKIP LOCKED` (queued runs, and running runs whose lease expired:
//! a dead worker's), taking each under a lease in the claim's own transaction; and it
//! listens on [`CHANNEL`] for wake-ups (a queued run, an answered gate, a released lease).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ::postgres::fallible_iterator::FallibleIterator;
use ::postgres::{Client, NoTls};

use super::{
    APPLY_KEY, CHANNEL, NOW_MS, PgStore, RUN_COLUMNS, applied_before, changed, insert_run, notify,
    pg, run_from_row, take_lock, write_key,
};
use crate::store::{
    Accept, Cancellation, LockOwner, Result, RunQueue, RunRecord, RunStatus, StoreError, now_ms,
};

/// How many claimable runs one claim looks at, in queue order, for one this worker accepts.
const CANDIDATES: i64 = 32;

impl RunQueue for PgStore {
    /// Records a detached run, queued, with the files its workflow was built from (path and
    /// text, as the loader read them) and the labels a worker must have; wakes the workers.
    fn enqueue(
        &mut self,
        run: &RunRecord,
        sources: &[(String, String)],
        labels: &[String],
    ) -> Result<()> {
        let (run, sources, labels) = (run.clone(), sources.to_vec(), labels.to_vec());
        let key = write_key();
        self.call(move |c| {
            let fail = |e| pg("cannot queue a run", e);
            let mut tx = c.transaction().map_err(fail)?;
            if applied_before(&mut tx, APPLY_KEY, key).map_err(fail)? {
                return Ok(());
            }
            insert_run(&mut tx, &run, Some(&labels), "cannot queue a run")?;
            let insert = tx
                .prepare("INSERT INTO run_sources (run, seq, path, text) VALUES ($1, $2, $3, $4)")
                .map_err(fail)?;
            for (i, (path, text)) in sources.iter().enumerate() {
                let seq = i32::try_from(i).unwrap_or(i32::MAX);
                tx.execute(&insert, &[&run.id, &seq, path, text])
                    .map_err(fail)?;
            }
            notify(&mut tx, &run.id).map_err(fail)?;
            tx.commit().map_err(fail)
        })
    }

    /// Claims one run for `owner` (who must have a lease): the oldest queued run, or running
    /// run whose lease has expired, of the detached runs whose labels are all in `labels`
    /// and that `accept` takes, skipping those another worker is claiming. The claim takes
    /// the run's lease and marks it running, with its artifacts in `runs_dir/ID`, in one
    /// transaction. `None` when there is nothing to claim.
    fn claim(
        &mut self,
        owner: &LockOwner,
        labels: &[String],
        runs_dir: &Path,
        accept: Accept,
    ) -> Result<Option<RunRecord>> {
        if owner.expires.is_none() {
            return Err(StoreError::NoLease(
                "a worker claims runs with a lease; give the owner one",
            ));
        }
        let (owner, labels) = (owner.clone(), labels.to_vec());
        let runs_dir = runs_dir.to_path_buf();
        self.call(move |c| {
            let fail = |e| pg("cannot claim a run", e);
            let mut tx = c.transaction().map_err(fail)?;
            let rows = tx
                .query(
                    &format!(
                        "SELECT {RUN_COLUMNS} FROM runs r WHERE r.detached \
                         AND r.labels <@ $1::TEXT[] AND (r.status = 'queued' \
                         OR (r.status = 'running' AND NOT EXISTS (SELECT 1 FROM locks l \
                         WHERE l.run = r.id AND (l.expires IS NULL OR l.expires >= {NOW_MS})))) \
                         ORDER BY r.seq LIMIT $2 FOR UPDATE OF r SKIP LOCKED"
                    ),
                    &[&labels, &CANDIDATES],
                )
                .map_err(fail)?;
            for row in rows {
                let mut run = run_from_row(&row)?;
                if !accept(&run) {
                    continue;
                }
                // A `resume` from a command line may hold it: then it is not claimable.
                match take_lock(&mut tx, &run.id, &owner) {
                    Ok(()) => {}
                    Err(StoreError::Refused(_)) => continue,
                    Err(e) => return Err(e),
                }
                run.dir = runs_dir.join(&run.id).to_string_lossy().into_owned();
                run.status = RunStatus::Running;
                run.updated_at = now_ms();
                tx.execute(
                    "UPDATE runs SET status = 'running', dir = $2, updated_at = $3 WHERE id = $1",
                    &[&run.id, &run.dir, &run.updated_at],
                )
                .map_err(fail)?;
                changed(&mut tx).map_err(fail)?;
                tx.commit().map_err(fail)?;
                return Ok(Some(run));
            }
            Ok(None)
        })
    }

    /// The files a detached run's workflow was built from (path, text), in the order read.
    fn sources(&self, run: &str) -> Result<Vec<(String, String)>> {
        let run = run.to_string();
        self.call(move |c| {
            Ok(c.query(
                "SELECT path, text FROM run_sources WHERE run = $1 ORDER BY seq",
                &[&run],
            )
            .map_err(|e| pg("cannot read a run's workflow files", e))?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
        })
    }

    /// The labels a worker needs to claim a run.
    fn labels(&self, run: &str) -> Result<Vec<String>> {
        let run = run.to_string();
        self.call(move |c| {
            Ok(
                c.query_opt("SELECT labels FROM runs WHERE id = $1", &[&run])
                    .map_err(|e| pg("cannot read runs", e))?
                    .map(|r| r.get(0))
                    .unwrap_or_default(),
            )
        })
    }

    /// Hands a detached run back to the queue (a worker that stops): queued again unless it
    /// finished or waits on a gate, or another tenure holds it now (a coordinator that lost
    /// its run does not queue what its successor runs), its lock released if `owner` holds
    /// it, the workers woken.
    fn requeue(&mut self, run: &str, owner: &LockOwner) -> Result<()> {
        let (run, owner) = (run.to_string(), owner.clone());
        self.call(move |c| {
            let fail = |e| pg("cannot queue a run again", e);
            let mut tx = c.transaction().map_err(fail)?;
            tx.execute(
                "UPDATE runs SET status = 'queued', updated_at = $2 WHERE id = $1 AND detached \
                 AND status IN ('running', 'interrupted') AND NOT EXISTS (SELECT 1 FROM locks l \
                 WHERE l.run = $1 AND l.holder <> $3)",
                &[&run, &now_ms(), &owner.holder],
            )
            .map_err(fail)?;
            tx.execute(
                "DELETE FROM locks WHERE run = $1 AND holder = $2",
                &[&run, &owner.holder],
            )
            .map_err(fail)?;
            notify(&mut tx, &run).map_err(fail)?;
            changed(&mut tx).map_err(fail)?;
            tx.commit().map_err(fail)
        })
    }

    /// Queues a detached waiting run again when one of its gates has an answer that the run
    /// has not acted on (the gate's node is not settled): an answer that came after the
    /// gate was requested but before the run said it waits, which the answer's own
    /// transaction could not queue. Returns whether it did.
    fn requeue_if_answered(&mut self, run: &str) -> Result<bool> {
        let run = run.to_string();
        self.call(move |c| {
            let fail = |e| pg("cannot queue a run again", e);
            let mut tx = c.transaction().map_err(fail)?;
            let queued = tx
                .execute(
                    "UPDATE runs SET status = 'queued', updated_at = $2 WHERE id = $1 \
                     AND detached AND status = 'waiting' AND EXISTS (SELECT 1 FROM approvals a \
                     WHERE a.run = $1 AND NOT EXISTS (SELECT 1 FROM nodes n \
                     WHERE n.run = a.run AND n.scope = a.scope AND n.node = a.gate))",
                    &[&run, &now_ms()],
                )
                .map_err(fail)?;
            if queued > 0 {
                notify(&mut tx, &run).map_err(fail)?;
                changed(&mut tx).map_err(fail)?;
            }
            tx.commit().map_err(fail)?;
            Ok(queued > 0)
        })
    }
}

/// [`Store::cancel`](crate::store::Store::cancel) in one transaction: the run's row is
/// locked first (`FOR UPDATE`), so a worker's claim, which skips locked rows, either
/// claimed it before (and its executor finds it cancelled) or finds it cancelled and passes
/// it by; its waiting gates are withdrawn and its unfinished units cancelled (a unit a
/// worker runs becomes `cancelling`: the worker stops it when it next renews its lease).
pub(super) fn cancel_run(
    c: &mut Client,
    run: &str,
    cancellation: &Cancellation,
    key: i64,
) -> Result<RunStatus> {
    let fail = |e| pg("cannot cancel a run", e);
    let mut tx = c.transaction().map_err(fail)?;
    let row = tx
        .query_opt(
            "SELECT status, options, exit_name, exit_code FROM runs WHERE id = $1 FOR UPDATE",
            &[&run],
        )
        .map_err(fail)?;
    let Some(row) = row else {
        return Err(StoreError::Refused(format!("there is no run {run}")));
    };
    let (status, options): (String, String) = (row.get(0), row.get(1));
    let exit = row
        .get::<_, Option<String>>(2)
        .zip(row.get::<_, Option<i64>>(3));
    let status = RunStatus::parse(&status).ok_or_else(|| {
        StoreError::Version(format!(
            "run {run} has a status this version does not know (`{status}`); use the \
             ralph-flow that wrote it"
        ))
    })?;
    // A retried cancel whose first try committed finds its own work done.
    if applied_before(&mut tx, APPLY_KEY, key).map_err(fail)? {
        return Ok(status);
    }
    if let Some(why) = crate::store::cancel_refusal(run, status, &options, exit) {
        return Err(StoreError::Refused(why));
    }
    let options = crate::store::options_cancelled(&options, cancellation)?;
    tx.execute(
        "UPDATE runs SET status = 'cancelled', options = $2, updated_at = $3 WHERE id = $1",
        &[&run, &options, &now_ms()],
    )
    .map_err(fail)?;
    tx.execute("DELETE FROM gates WHERE run = $1", &[&run])
        .map_err(fail)?;
    tx.execute(super::units::CANCEL_RUN_UNITS, &[&run])
        .map_err(fail)?;
    changed(&mut tx).map_err(fail)?;
    tx.commit().map_err(fail)?;
    Ok(status)
}

/// Listens on [`CHANNEL`] on a connection of its own (a thread) and calls `wake` with each
/// notification's payload (what changed: a run's id, `unit:ID`, `unit:ID:queued`), and
/// with `None` once after each reconnection: notifications sent while it was away are
/// lost, so anything may have changed (the caller polls too). Ends once `stop` is set.
pub fn listen(
    url: &str,
    stop: Arc<AtomicBool>,
    wake: crate::store::Wake,
) -> Result<std::thread::JoinHandle<()>> {
    let url = url.to_string();
    let shown = super::shown(&url);
    let connect = move || -> std::result::Result<Client, ::postgres::Error> {
        let mut c = Client::connect(&url, NoTls)?;
        c.batch_execute(&format!("LISTEN {CHANNEL}"))?;
        Ok(c)
    };
    // The client runs a runtime of its own: it connects on its own thread.
    let (ready, started) = std::sync::mpsc::channel::<Result<()>>();
    let thread = std::thread::Builder::new()
        .name("ralph-flow-listen".into())
        .spawn(move || {
            let mut client = match connect() {
                Ok(c) => {
                    let _ = ready.send(Ok(()));
                    Some(c)
                }
                Err(e) => {
                    let _ = ready.send(Err(pg(format!("cannot listen on {shown}"), e)));
                    return;
                }
            };
            let mut delay = Duration::from_millis(100);
            while !stop.load(Ordering::Relaxed) {
                let Some(c) = client.as_mut() else {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(5));
                    client = connect().ok();
                    if client.is_some() {
                        delay = Duration::from_millis(100);
                        wake(None);
                    }
                    continue;
                };
                let got = c
                    .notifications()
                    .timeout_iter(Duration::from_millis(500))
                    .next();
                match got {
                    Ok(Some(n)) => wake(Some(n.payload())),
                    // A timeout: also the moment to notice a closed connection.
                    Ok(None) if !c.is_closed() => {}
                    Ok(None) | Err(_) => client = None,
                }
            }
        })
        .map_err(|e| StoreError::Connection(format!("cannot start the listening thread: {e}")))?;
    match started.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(StoreError::Connection(
            "the listening connection ended before it was ready".into(),
        )),
    }
}

//! Units of work in the PostgreSQL store: the agent calls and programs of a run on workers,
//! which any worker may carry out. The run's coordinator [`PgStore::dispatch`]es a unit
//! (idempotent by the run and a key naming the stage, attempt, call and what is asked);
//! workers [`PgStore::claim_unit`] queued units, and running units whose lease expired,
//! with `SELECT ... FOR UPDATE SKIP LOCKED`, renew their lease while they work, and
//! [`PgStore::finish_unit`] with the result, fenced by that lease; the coordinator reads
//! the result ([`PgStore::unit`]) and [`PgStore::forget_unit`]s it once used.
//!
//! Each change that matters to someone notifies [`CHANNEL`] with the unit it names:
//! `unit:ID:queued` (a unit to claim: dispatched, handed back) and `unit:ID:done` (a result
//! for its coordinator), so that a notification wakes only the coordinator waiting for
//! that unit (see `run::units::UnitWakes`).

use ::postgres::Row;

use super::{CHANNEL, NOW_MS, PgStore, changed, pg};
use crate::store::{
    AcceptUnit, LockOwner, Result, StoreError, Unit, UnitQueue, UnitRequest, UnitState, now_ms,
};

/// How many claimable units one claim looks at, in queue order, for one this worker takes.
const CANDIDATES: i64 = 32;

/// What a cancelled unit becomes: `cancelling` while a worker still holds it (until it has
/// stopped the work, or its lease expired), else `cancelled`.
const CANCEL: &str = "CASE WHEN state = 'running' THEN 'cancelling' ELSE 'cancelled' END";

/// Cancels every unit of a run (`$1`) that has not finished: what a cancelled run's units
/// become (see [`CANCEL`]).
pub(super) const CANCEL_RUN_UNITS: &str = "UPDATE units SET state = CASE WHEN state = 'running' \
     THEN 'cancelling' ELSE 'cancelled' END WHERE run = $1 AND state IN ('queued', 'running')";

impl UnitState {
    fn parse(s: &str) -> UnitState {
        match s {
            "running" => UnitState::Running,
            "done" => UnitState::Done,
            // Cancelled while its holder still runs it: cancelled for the coordinator.
            "cancelled" | "cancelling" => UnitState::Cancelled,
            _ => UnitState::Queued,
        }
    }
}

const UNIT_COLUMNS: &str = "id, run, key, kind, payload, labels, place, state, holder, result";

fn unit_from_row(r: &Row) -> Result<Unit> {
    let json =
        |i: usize| -> Result<serde_json::Value> { super::json_value(&r.get::<_, String>(i)) };
    let result: Option<String> = r.get(9);
    Ok(Unit {
        id: r.get(0),
        run: r.get(1),
        key: r.get(2),
        kind: r.get(3),
        payload: json(4)?,
        labels: r.get(5),
        place: json(6)?,
        state: UnitState::parse(&r.get::<_, String>(7)),
        holder: r.get(8),
        result: result.map(|t| super::json_value(&t)).transpose()?,
    })
}

/// Whether the tenure `$2` holds the lock of the unit's run (`units.run`) under a lease that
/// has not lapsed: what a coordinator's writes to units require.
const HELD_BY: &str = "EXISTS (SELECT 1 FROM locks l WHERE l.run = units.run AND l.holder = $2 \
     AND (l.expires IS NULL OR l.expires >= (extract(epoch from clock_timestamp()) * 1000)::BIGINT))";

/// Fails with [`StoreError::LeaseLost`] unless the tenure `holder` holds the run's lock
/// under a lease that has not lapsed.
fn coordinates(tx: &mut ::postgres::Transaction<'_>, run: &str, holder: &str) -> Result<()> {
    let held = tx
        .query_opt(
            &format!(
                "SELECT 1 FROM locks WHERE run = $1 AND holder = $2 \
                 AND (expires IS NULL OR expires >= {NOW_MS})"
            ),
            &[&run, &holder],
        )
        .map_err(|e| pg("cannot check the run's lease", e))?
        .is_some();
    if held {
        return Ok(());
    }
    Err(StoreError::LeaseLost {
        run: run.to_string(),
        now: "another coordinator holds it".into(),
    })
}

impl UnitQueue for PgStore {
    /// Asks for a unit of work: queues it, or finds the one already asked for under the
    /// same run and key (a coordinator that took the run over adopts what its predecessor
    /// dispatched: a running unit is waited for, a done one's result used). Units of the
    /// same stage under another key (asked for something else) that have not finished are
    /// cancelled. Returns the unit's id.
    /// `hold` names the run's resource the unit holds while it runs, with its capacity: no
    /// more units holding it run at once, across every worker (a merge queue lands one
    /// ticket at a time even while a new coordinator takes over from a dead one). Only the
    /// run's coordinator may ask: `coordinator` must hold the run's lock, else this fails
    /// with [`StoreError::LeaseLost`] (a coordinator that was taken over cannot cancel what
    /// its successor asked for).
    fn dispatch(&mut self, request: &UnitRequest<'_>) -> Result<i64> {
        let UnitRequest {
            coordinator,
            run,
            key,
            stage_prefix,
            kind,
            payload,
            labels,
            place,
            hold,
        } = *request;
        let (resource, capacity) = match hold {
            Some((r, c)) => (Some(r.to_string()), Some(c.max(1))),
            None => (None, None),
        };
        let (run, key, prefix, kind) = (
            run.to_string(),
            key.to_string(),
            stage_prefix.to_string(),
            kind.to_string(),
        );
        let payload = super::json_text(payload)?;
        let place = super::json_text(place)?;
        let labels = labels.to_vec();
        let coordinator = coordinator.to_string();
        self.call(move |c| {
            let fail = |e| pg("cannot queue a unit of work", e);
            let mut tx = c.transaction().map_err(fail)?;
            coordinates(&mut tx, &run, &coordinator)?;
            let id: i64 = match tx
                .query_opt(
                    &format!(
                        "SELECT id, state = 'cancelled' OR (state = 'cancelling' \
                         AND (expires IS NULL OR expires < {NOW_MS})) \
                         FROM units WHERE run = $1 AND key = $2 FOR UPDATE"
                    ),
                    &[&run, &key],
                )
                .map_err(fail)?
            {
                // Cancelled, and stopped (or its holder died): queued again.
                Some(row) => {
                    let id: i64 = row.get(0);
                    if row.get::<_, bool>(1) {
                        tx.execute(
                            "UPDATE units SET state = 'queued', holder = NULL, expires = NULL \
                             WHERE id = $1",
                            &[&id],
                        )
                        .map_err(fail)?;
                    }
                    id
                }
                None => tx
                    .query_one(
                        "INSERT INTO units (run, key, kind, payload, labels, place, state, \
                         created_at, resource, capacity, stage) \
                         VALUES ($1, $2, $3, $4, $5, $6, 'queued', $7, $8, $9, $10) RETURNING id",
                        &[
                            &run,
                            &key,
                            &kind,
                            &payload,
                            &labels,
                            &place,
                            &now_ms(),
                            &resource,
                            &capacity,
                            &prefix,
                        ],
                    )
                    .map_err(fail)?
                    .get(0),
            };
            tx.execute(
                &format!(
                    "UPDATE units SET state = {CANCEL} WHERE run = $1 AND stage = $2 \
                     AND key <> $3 AND state IN ('queued', 'running')"
                ),
                &[&run, &prefix, &key],
            )
            .map_err(fail)?;
            // Names the unit, as queued: the workers look for work; its coordinator, which
            // waits for it to finish, is not woken.
            tx.execute(
                "SELECT pg_notify($1, $2)",
                &[&CHANNEL, &format!("unit:{id}:queued")],
            )
            .map_err(fail)?;
            changed(&mut tx).map_err(fail)?;
            tx.commit().map_err(fail)?;
            Ok(id)
        })
    }

    /// A unit, as the store holds it now.
    fn unit(&self, id: i64) -> Result<Option<Unit>> {
        self.call(move |c| {
            c.query_opt(
                &format!("SELECT {UNIT_COLUMNS} FROM units WHERE id = $1"),
                &[&id],
            )
            .map_err(|e| pg("cannot read a unit of work", e))?
            .map(|r| unit_from_row(&r))
            .transpose()
        })
    }

    /// The units among `ids` that the store holds, in one query.
    fn units(&self, ids: &[i64]) -> Result<Vec<Unit>> {
        let ids = ids.to_vec();
        self.call(move |c| {
            c.query(
                &format!("SELECT {UNIT_COLUMNS} FROM units WHERE id = ANY($1)"),
                &[&ids],
            )
            .map_err(|e| pg("cannot read units of work", e))?
            .iter()
            .map(unit_from_row)
            .collect()
        })
    }

    /// Cancels a unit that has not finished (its worker stops it when it next renews), if
    /// `coordinator` still holds the unit's run under a live lease: a coordinator that lost
    /// its run leaves its units to the next one, which adopts them.
    fn cancel_unit(&mut self, id: i64, coordinator: &str) -> Result<()> {
        let coordinator = coordinator.to_string();
        self.call(move |c| {
            c.execute(
                &format!(
                    "UPDATE units SET state = {CANCEL} WHERE id = $1 \
                     AND state IN ('queued', 'running') AND {HELD_BY}"
                ),
                &[&id, &coordinator],
            )
            .map(drop)
            .map_err(|e| pg("cannot cancel a unit of work", e))
        })
    }

    /// Cancels every unit of a cancelled run that has not finished (those its coordinator
    /// asked for after the run was cancelled, before it noticed), if `coordinator` still
    /// holds the run under a lease that has not lapsed ([`HELD_BY`], as every coordinator's
    /// write to units).
    fn cancel_units(&mut self, run: &str, coordinator: &str) -> Result<()> {
        let (run, coordinator) = (run.to_string(), coordinator.to_string());
        self.call(move |c| {
            c.execute(
                &format!("{CANCEL_RUN_UNITS} AND {HELD_BY}"),
                &[&run, &coordinator],
            )
            .map(drop)
            .map_err(|e| pg("cannot cancel the units of a run", e))
        })
    }

    /// Forgets a unit whose result the coordinator has used, if `coordinator` still holds
    /// the unit's run: a coordinator that lost its run leaves the unit to its successor,
    /// which may be waiting for the same result.
    fn forget_unit(&mut self, id: i64, coordinator: &str) -> Result<()> {
        let coordinator = coordinator.to_string();
        self.call(move |c| {
            c.execute(
                &format!("DELETE FROM units WHERE id = $1 AND {HELD_BY}"),
                &[&id, &coordinator],
            )
            .map(drop)
            .map_err(|e| pg("cannot forget a unit of work", e))
        })
    }

    /// Claims one unit for `owner` (who must have a lease): the oldest queued unit, or
    /// running unit whose lease expired, whose labels are all in `labels` and whose place
    /// `accept` takes, skipping those another worker is claiming.
    fn claim_unit(
        &mut self,
        owner: &LockOwner,
        labels: &[String],
        accept: AcceptUnit,
    ) -> Result<Option<Unit>> {
        let Some(lease) = owner.lease() else {
            return Err(StoreError::NoLease(
                "a worker claims units with a lease; give the owner one",
            ));
        };
        let (owner, labels) = (owner.clone(), labels.to_vec());
        self.call(move |c| {
            let fail = |e| pg("cannot claim a unit of work", e);
            let mut tx = c.transaction().map_err(fail)?;
            let rows = tx
                .query(
                    &format!(
                        "SELECT {UNIT_COLUMNS} FROM units u WHERE labels <@ $1::TEXT[] \
                         AND (state = 'queued' OR (state = 'running' AND expires < {NOW_MS})) \
                         AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = u.run \
                         AND r.status = 'cancelled') \
                         AND NOT EXISTS (SELECT 1 FROM units o WHERE o.run = u.run \
                         AND o.stage = u.stage AND o.id <> u.id \
                         AND o.state IN ('running', 'cancelling') AND o.expires >= {NOW_MS}) \
                         ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED"
                    ),
                    &[&labels, &CANDIDATES],
                )
                .map_err(fail)?;
            for row in rows {
                let mut unit = unit_from_row(&row)?;
                if !accept(&unit.place) {
                    continue;
                }
                // A unit that holds a resource waits while its capacity is taken by units
                // running under a live lease; the count is made under a lock of the run's
                // resource, so two workers claiming at once do not both see room.
                let hold: Option<(String, i64)> = tx
                    .query_one(
                        "SELECT resource, capacity FROM units WHERE id = $1",
                        &[&unit.id],
                    )
                    .map_err(fail)
                    .map(|r| {
                        r.get::<_, Option<String>>(0)
                            .map(|res| (res, r.get::<_, Option<i64>>(1).unwrap_or(1)))
                    })?;
                if let Some((resource, capacity)) = hold {
                    tx.execute(
                        "SELECT pg_advisory_xact_lock(hashtext($1))",
                        &[&format!("{}/{resource}", unit.run)],
                    )
                    .map_err(fail)?;
                    let busy: i64 = tx
                        .query_one(
                            &format!(
                                "SELECT count(*) FROM units WHERE run = $1 AND resource = $2 \
                                 AND id <> $3 AND state = 'running' AND expires >= {NOW_MS}"
                            ),
                            &[&unit.run, &resource, &unit.id],
                        )
                        .map_err(fail)?
                        .get(0);
                    if busy >= capacity {
                        continue;
                    }
                }
                tx.execute(
                    &format!(
                        "UPDATE units SET state = 'running', holder = $2, host = $3, pid = $4, \
                         expires = {NOW_MS} + $5 WHERE id = $1"
                    ),
                    &[
                        &unit.id,
                        &owner.holder,
                        &owner.host,
                        &i64::from(owner.pid),
                        &lease,
                    ],
                )
                .map_err(fail)?;
                changed(&mut tx).map_err(fail)?;
                tx.commit().map_err(fail)?;
                unit.state = UnitState::Running;
                unit.holder = Some(owner.holder.clone());
                return Ok(Some(unit));
            }
            Ok(None)
        })
    }

    /// Tells the store that `owner` has stopped the work of a unit it lost to a
    /// cancellation: another unit of the same stage may start now.
    fn unit_stopped(&mut self, id: i64, owner: &LockOwner) -> Result<()> {
        let holder = owner.holder.clone();
        self.call(move |c| {
            c.execute(
                "UPDATE units SET state = 'cancelled', expires = NULL WHERE id = $1 \
                 AND holder = $2 AND state = 'cancelling'",
                &[&id, &holder],
            )
            .map(drop)
            .map_err(|e| pg("cannot record a stopped unit", e))
        })
    }

    /// Hands a unit back to the queue (a worker that stops, its work stopped), if `owner`
    /// holds it; one that was cancelled meanwhile is cancelled (and stopped) now.
    fn release_unit(&mut self, id: i64, owner: &LockOwner) -> Result<()> {
        let holder = owner.holder.clone();
        self.call(move |c| {
            let fail = |e| pg("cannot hand a unit of work back", e);
            let mut tx = c.transaction().map_err(fail)?;
            let n = tx
                .execute(
                    "UPDATE units SET state = CASE WHEN state = 'cancelling' THEN 'cancelled' \
                     ELSE 'queued' END, holder = NULL, host = NULL, pid = NULL, \
                     expires = NULL WHERE id = $1 AND holder = $2 \
                     AND state IN ('running', 'cancelling')",
                    &[&id, &holder],
                )
                .map_err(fail)?;
            if n == 1 {
                tx.execute(
                    "SELECT pg_notify($1, $2)",
                    &[&CHANNEL, &format!("unit:{id}:queued")],
                )
                .map_err(fail)?;
            }
            tx.commit().map_err(fail)
        })
    }

    /// Renews the lease on a unit; `false` when the holder lost it (cancelled, or taken over
    /// after its lease expired): then it must stop the unit's work.
    fn renew_unit(&mut self, id: i64, owner: &LockOwner) -> Result<bool> {
        let lease = owner.lease().unwrap_or(30_000);
        let holder = owner.holder.clone();
        self.call(move |c| {
            Ok(c.execute(
                &format!(
                    "UPDATE units SET expires = {NOW_MS} + $3 WHERE id = $1 AND holder = $2 \
                     AND state = 'running'"
                ),
                &[&id, &holder, &lease],
            )
            .map_err(|e| pg("cannot renew a unit's lease", e))?
                == 1)
        })
    }

    /// Records a unit's result, if `owner` still holds it (a retried write that was applied
    /// already counts as done); wakes the workers and the coordinator. `false` when the
    /// holder had lost the unit: the result is dropped.
    fn finish_unit(
        &mut self,
        id: i64,
        owner: &LockOwner,
        result: &serde_json::Value,
    ) -> Result<bool> {
        let result = super::json_text(result)?;
        let holder = owner.holder.clone();
        self.call(move |c| {
            let fail = |e| pg("cannot record a unit's result", e);
            let mut tx = c.transaction().map_err(fail)?;
            let n = tx
                .execute(
                    "UPDATE units SET state = 'done', result = $3, expires = NULL \
                     WHERE id = $1 AND holder = $2 AND state = 'running'",
                    &[&id, &holder, &result],
                )
                .map_err(fail)?;
            if n == 0 {
                // Cancelled while it ran: its work is over, so the cancellation is done.
                tx.execute(
                    "UPDATE units SET state = 'cancelled', expires = NULL WHERE id = $1 \
                     AND holder = $2 AND state = 'cancelling'",
                    &[&id, &holder],
                )
                .map_err(fail)?;
            }
            let done = n == 1
                || tx
                    .query_opt(
                        "SELECT 1 FROM units WHERE id = $1 AND holder = $2 AND state = 'done'",
                        &[&id, &holder],
                    )
                    .map_err(fail)?
                    .is_some();
            if n == 1 {
                // Names the unit, done: only its coordinator reads it (and the workers look
                // for work, which the unit's end may have made room for).
                tx.execute(
                    "SELECT pg_notify($1, $2)",
                    &[&CHANNEL, &format!("unit:{id}:done")],
                )
                .map_err(fail)?;
                changed(&mut tx).map_err(fail)?;
            }
            tx.commit().map_err(fail)?;
            Ok(done)
        })
    }
}

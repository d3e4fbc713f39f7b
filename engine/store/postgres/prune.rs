//! Retention in the PostgreSQL store: what a run takes in it, and deleting a run that ended
//! ([`Store::stored_sizes`](crate::store::Store::stored_sizes),
//! [`Store::delete_run`](crate::store::Store::delete_run)).

use ::postgres::{Client, GenericClient};

use super::{NOW_MS, PgStore, changed, pg};
use crate::store::{
    Removed, Result, RunStatus, StoreError, StoredSize, delete_refusal, held_refusal,
};

/// Every table whose rows belong to one run, with the column that names the run: deleting a
/// run deletes from each, in this order (`runs` last). A table added later is one line here.
pub(super) const RUN_TABLES: &[(&str, &str)] = &[
    ("nodes", "run"),
    ("attempts", "run"),
    ("events", "run"),
    ("gates", "run"),
    ("approvals", "run"),
    ("locks", "run"),
    ("run_sources", "run"),
    ("units", "run"),
    ("artifacts", "run"),
    ("runs", "id"),
];

/// A run's rows over every table, and their bytes as the server keeps them
/// (`pg_column_size` of each row: compressed values counted compressed; pages and indexes
/// not counted).
fn rows_of(
    c: &mut impl GenericClient,
    run: &str,
) -> std::result::Result<(u64, u64), ::postgres::Error> {
    let (mut rows, mut bytes) = (0u64, 0u64);
    for (table, key) in RUN_TABLES {
        let row = c.query_one(
            &format!(
                "SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)::BIGINT \
                 FROM {table} t WHERE {key} = $1"
            ),
            &[&run],
        )?;
        rows += u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        bytes += u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
    }
    Ok((rows, bytes))
}

/// Deletes a run that ended, in one transaction serialised with every locker of the run
/// (the advisory lock `take_lock` takes), its row locked while its status is checked.
fn delete(c: &mut Client, run: &str) -> Result<Removed> {
    let fail = |e| pg(format!("cannot delete run {run}"), e);
    let mut tx = c.transaction().map_err(fail)?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&run])
        .map_err(fail)?;
    let Some(row) = tx
        .query_opt("SELECT status FROM runs WHERE id = $1 FOR UPDATE", &[&run])
        .map_err(fail)?
    else {
        return Err(StoreError::Refused(format!("there is no run {run}")));
    };
    let status: String = row.get(0);
    let status = RunStatus::parse(&status).ok_or_else(|| {
        StoreError::Version(format!(
            "run {run} has a status this version does not know (`{status}`); use the \
             ralph-flow that wrote it"
        ))
    })?;
    if let Some(why) = delete_refusal(run, status) {
        return Err(StoreError::Refused(why));
    }
    let held = tx
        .query_opt(
            &format!(
                "SELECT {}, {NOW_MS} FROM locks WHERE run = $1",
                super::LOCK_COLUMNS
            ),
            &[&run],
        )
        .map_err(fail)?;
    if let Some(row) = held {
        let now: i64 = row.get(8);
        if let Some(why) = held_refusal(run, &super::lock_from_row(&row), now) {
            return Err(StoreError::Refused(why));
        }
    }
    let (rows, row_bytes) = rows_of(&mut tx, run).map_err(fail)?;
    for (table, key) in RUN_TABLES {
        tx.execute(&format!("DELETE FROM {table} WHERE {key} = $1"), &[&run])
            .map_err(fail)?;
    }
    changed(&mut tx).map_err(fail)?;
    tx.commit().map_err(fail)?;
    Ok(Removed {
        rows,
        row_bytes,
        ..Removed::default()
    })
}

impl PgStore {
    /// [`Store::stored_sizes`](crate::store::Store::stored_sizes): one query per table for
    /// all of them; no files beside the rows.
    pub(super) fn read_stored_sizes(&self, runs: &[&str]) -> Result<Vec<StoredSize>> {
        let runs: Vec<String> = runs.iter().map(|r| (*r).to_string()).collect();
        self.call(move |c| {
            let mut bytes: std::collections::HashMap<String, u64> =
                std::collections::HashMap::new();
            for (table, key) in RUN_TABLES {
                let rows = c
                    .query(
                        &format!(
                            "SELECT {key}, coalesce(sum(pg_column_size(t.*)), 0)::BIGINT \
                             FROM {table} t WHERE {key} = ANY($1) GROUP BY {key}"
                        ),
                        &[&runs],
                    )
                    .map_err(|e| pg("cannot measure runs", e))?;
                for row in rows {
                    *bytes.entry(row.get(0)).or_default() +=
                        u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
                }
            }
            Ok(runs
                .iter()
                .map(|r| StoredSize {
                    row_bytes: bytes.get(r).copied().unwrap_or(0),
                    file_bytes: 0,
                })
                .collect())
        })
    }

    /// [`Store::delete_run`](crate::store::Store::delete_run). Safe to run again after a
    /// lost connection: a run deleted already is no run, and refused as such.
    pub(super) fn delete_run_rows(&mut self, run: &str) -> Result<Removed> {
        let run = run.to_string();
        self.call(move |c| delete(c, &run))
    }
}

//! Retention: what a run takes in the store, and deleting a run that ended
//! ([`Store::stored_sizes`](crate::store::Store::stored_sizes),
//! [`Store::delete_run`](crate::store::Store::delete_run)).

use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::locks::{HOLDER, lock_from_row};
use super::{SqliteStore, sql_error};
use crate::store::{
    Removed, Result, RunStatus, StoreError, StoredSize, delete_refusal, held_refusal, now_ms,
};

/// Every table whose rows belong to one run, with the column that names the run: deleting a
/// run deletes from each, in this order. `nodes` comes before `events` (its delete trigger
/// moves a settlement's event into `events`), `runs` last. A table added later is one line
/// here.
pub(super) const RUN_TABLES: &[(&str, &str)] = &[
    ("nodes", "run"),
    ("attempts", "run"),
    ("events", "run"),
    ("gates", "run"),
    ("approvals", "run"),
    ("locks", "run"),
    ("runs", "id"),
];

/// The sum of the bytes of a table's columns in a row (`octet_length`, which SQLite answers
/// without reading a long value's overflow pages).
fn row_bytes_sql(conn: &Connection, table: &str) -> rusqlite::Result<String> {
    let columns: Vec<String> = conn
        .prepare_cached("SELECT name FROM pragma_table_info(?1)")?
        .query_map([table], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(if columns.is_empty() {
        String::from("0")
    } else {
        columns
            .iter()
            .map(|c| format!("coalesce(octet_length(\"{}\"), 0)", c.replace('"', "\"\"")))
            .collect::<Vec<_>>()
            .join(" + ")
    })
}

/// The query that counts a table's rows of one run (`?1`) and the bytes of their columns.
fn size_sql(conn: &Connection, table: &str, key: &str) -> rusqlite::Result<String> {
    let sum = row_bytes_sql(conn, table)?;
    Ok(format!(
        "SELECT count(*), coalesce(sum({sum}), 0) FROM {table} WHERE {key} = ?1"
    ))
}

/// The queries of [`size_sql`] for every table of [`RUN_TABLES`].
fn size_sqls(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    RUN_TABLES
        .iter()
        .map(|(table, key)| size_sql(conn, table, key))
        .collect()
}

/// How many runs one query of [`SqliteStore::read_stored_sizes`] measures (SQLite takes at
/// most 32,766 parameters).
const SIZES_AT_ONCE: usize = 500;

/// A run's rows over every table, and an estimate of their bytes.
fn rows_of(conn: &Connection, sqls: &[String], run: &str) -> rusqlite::Result<(u64, u64)> {
    let (mut rows, mut bytes) = (0u64, 0u64);
    for sql in sqls {
        let (n, b): (i64, i64) = conn
            .prepare_cached(sql)?
            .query_row([run], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows += u64::try_from(n).unwrap_or(0);
        bytes += u64::try_from(b).unwrap_or(0);
    }
    Ok((rows, bytes))
}

/// The hashes of the spilled outputs a run's nodes refer to.
fn blobs_of(conn: &Connection, run: &str) -> rusqlite::Result<Vec<String>> {
    conn.prepare_cached(
        "SELECT DISTINCT output_blob FROM nodes WHERE run = ?1 AND output_blob IS NOT NULL",
    )?
    .query_map([run], |r| r.get(0))?
    .collect()
}

/// The bytes of a file, 0 when it is not there.
fn file_len(path: &Path) -> u64 {
    fs::symlink_metadata(path).map_or(0, |m| m.len())
}

impl SqliteStore {
    /// [`Store::stored_sizes`](crate::store::Store::stored_sizes): one query per table for
    /// up to [`SIZES_AT_ONCE`] runs (`runs --limit 1000` stays fast).
    pub(super) fn read_stored_sizes(&self, runs: &[&str]) -> Result<Vec<StoredSize>> {
        let fail = |e| self.error("cannot measure runs in", e);
        let mut sizes: std::collections::HashMap<&str, StoredSize> =
            runs.iter().map(|r| (*r, StoredSize::default())).collect();
        let sums: Vec<(&str, &str, String)> = RUN_TABLES
            .iter()
            .map(|(table, key)| Ok((*table, *key, row_bytes_sql(&self.conn, table)?)))
            .collect::<rusqlite::Result<_>>()
            .map_err(fail)?;
        for chunk in runs.chunks(SIZES_AT_ONCE) {
            let ids = (1..=chunk.len())
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let params = rusqlite::params_from_iter(chunk.iter());
            for (table, key, sum) in &sums {
                let sql = format!(
                    "SELECT {key}, coalesce(sum({sum}), 0) FROM {table} WHERE {key} IN ({ids}) \
                     GROUP BY {key}"
                );
                let mut stmt = self.conn.prepare(&sql).map_err(fail)?;
                let rows = stmt
                    .query_map(params.clone(), |r| {
                        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
                    })
                    .map_err(fail)?;
                for row in rows {
                    let (run, bytes) = row.map_err(fail)?;
                    if let Some(s) = sizes.get_mut(run.as_str()) {
                        s.row_bytes += u64::try_from(bytes).unwrap_or(0);
                    }
                }
            }
            let sql = format!(
                "SELECT DISTINCT run, output_blob FROM nodes WHERE run IN ({ids}) \
                 AND output_blob IS NOT NULL"
            );
            let mut stmt = self.conn.prepare(&sql).map_err(fail)?;
            let rows = stmt
                .query_map(params, |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(fail)?;
            for row in rows {
                let (run, hash) = row.map_err(fail)?;
                if let Some(s) = sizes.get_mut(run.as_str()) {
                    s.file_bytes += file_len(&self.blob_path(&hash));
                }
            }
        }
        Ok(runs
            .iter()
            .map(|r| sizes.get(r).copied().unwrap_or_default())
            .collect())
    }

    /// [`Store::delete_run`](crate::store::Store::delete_run): the status and the lock
    /// checked, and every row deleted, in one `BEGIN IMMEDIATE` transaction (no other
    /// process writes meanwhile: a resume that took the run before it finds it running, one
    /// after finds no run). Spilled outputs that no remaining row refers to are set aside
    /// while the transaction holds the write lock, and removed once it committed (put back
    /// if it did not).
    pub(super) fn delete_run_rows(&mut self, id: &str) -> Result<Removed> {
        self.check_file()?;
        let own = self.marker.as_ref().map(|(p, _)| p.clone());
        if let Some(pid) = super::integrity::marker_naming(&self.path, id, own.as_deref()) {
            return Err(StoreError::Refused(format!(
                "run {id} is the last run process {pid} wrote to {} (which it has open), so it \
                 is not removed now: a crash check of that process would miss its rows; try \
                 again once that process ends or writes another run",
                self.path.display()
            )));
        }
        let path = self.path.clone();
        let blobs_dir = self.blobs.clone();
        let fail = |e| sql_error(&path, "cannot delete a run from", e);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail)?;
        let status: Option<String> = tx
            .query_row("SELECT status FROM runs WHERE id = ?1", [id], |r| r.get(0))
            .optional()
            .map_err(fail)?;
        let Some(status) = status else {
            return Err(StoreError::Refused(format!(
                "no run {id} in {}",
                path.display()
            )));
        };
        let status = RunStatus::parse(&status).ok_or_else(|| {
            StoreError::Version(format!(
                "run {id} has a status this version does not know (`{status}`); use the \
                 ralph-flow that wrote it"
            ))
        })?;
        if let Some(why) = delete_refusal(id, status) {
            return Err(StoreError::Refused(why));
        }
        let held = tx
            .prepare_cached(HOLDER)
            .and_then(|mut stmt| stmt.query_row([id], lock_from_row).optional())
            .map_err(fail)?;
        if let Some(why) = held.and_then(|h| held_refusal(id, &h, now_ms())) {
            return Err(StoreError::Refused(why));
        }
        let sqls = size_sqls(&tx).map_err(fail)?;
        let (rows, row_bytes) = rows_of(&tx, &sqls, id).map_err(fail)?;
        let blobs = blobs_of(&tx, id).map_err(fail)?;
        for (table, key) in RUN_TABLES {
            tx.execute(&format!("DELETE FROM {table} WHERE {key} = ?1"), [id])
                .map_err(fail)?;
        }
        // The outputs no remaining row refers to, set aside under the write lock: a commit
        // that found one of them before (and so did not write it) writes it again once it
        // committed (see `commit.rs`).
        let mut aside: Vec<(PathBuf, PathBuf, u64)> = Vec::new();
        for hash in blobs {
            let used: bool = tx
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM nodes WHERE output_blob = ?1)",
                    [&hash],
                    |r| r.get(0),
                )
                .map_err(fail)?;
            let file = blobs_dir.join(format!("{hash}.json"));
            if used || !file.exists() {
                continue;
            }
            let set = blobs_dir.join(format!(".{hash}.{}.pruned", std::process::id()));
            let len = file_len(&file);
            if let Err(e) = fs::rename(&file, &set) {
                put_back(&aside);
                return Err(StoreError::io("set aside", &file, e));
            }
            aside.push((file, set, len));
        }
        if let Err(e) = tx.commit() {
            put_back(&aside);
            return Err(fail(e));
        }
        let mut removed = Removed {
            rows,
            row_bytes,
            ..Removed::default()
        };
        for (_, set, len) in &aside {
            if fs::remove_file(set).is_ok() {
                removed.files += 1;
                removed.file_bytes += len;
            }
        }
        Ok(removed)
    }
}

/// Puts spilled outputs set aside back where they were.
fn put_back(aside: &[(PathBuf, PathBuf, u64)]) {
    for (file, set, _) in aside {
        let _ = fs::rename(set, file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    /// A commit that found its output already spilled (and so did not write it) writes it
    /// again once it committed, should `runs prune` have removed the file meanwhile.
    #[test]
    fn a_reused_spilled_output_that_went_meanwhile_is_written_again() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store =
            SqliteStore::open(&tmp.path().join("state.db")).unwrap_or_else(|e| panic!("{e}"));
        let big = serde_json::json!({ "text": "z".repeat(100 * 1024) });
        let (first, new) = store.prepare_output(&big).unwrap_or_else(|e| panic!("{e}"));
        assert!(new && first.reused.is_none());
        let hash = first.blob.clone().unwrap_or_default();
        let (again, new) = store.prepare_output(&big).unwrap_or_else(|e| panic!("{e}"));
        assert!(!new && again.reused.is_some(), "found, not written");
        // A prune removes the file before the commit's rows refer to it.
        fs::remove_file(store.blob_path(&hash)).unwrap_or_else(|e| panic!("{e}"));
        store
            .restore_blobs(&[first, again])
            .unwrap_or_else(|e| panic!("{e}"));
        let text = fs::read_to_string(store.blob_path(&hash)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).ok(),
            Some(big)
        );
        assert!(store.runs(1).map(|r| r.is_empty()).unwrap_or(false));
    }
}

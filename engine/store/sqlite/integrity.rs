//! What keeps a store honest after a crash and while it is used: the open-markers that tell
//! a killed writer, the lost write-ahead log they reveal, `PRAGMA quick_check`, and the
//! refusal to commit to a file deleted or replaced since it was opened.

use std::fs;
use std::path::{Path, PathBuf};

use rusqlite::params;

use super::SqliteStore;
use crate::store::{Result, StoreError};

/// The error of a store whose write-ahead log was deleted after a crash.
fn lost_log(path: &Path) -> StoreError {
    let wal = wal_path(path);
    StoreError::Damaged(format!(
        "{} lost its write-ahead log: a process that had it open was killed, and {} was \
         deleted since, so the commits it held are gone. Keep the file as it is and restore {} \
         from a backup if you have one; to start over, move the state directory aside",
        path.display(),
        wal.display(),
        wal.display()
    ))
}

/// A file's device and inode.
pub(super) fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The write-ahead log of a store file.
pub(super) fn wal_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// The marker a process keeps while it has a store open for writing (`.open-PID-N`: a
/// process may hold several connections).
pub(super) fn marker_path(path: &Path, pid: u32) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(
        ".open-{pid}-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    PathBuf::from(name)
}

/// The markers of processes that had the store open and are gone without closing it, with
/// the last event each committed (run, number).
pub(super) fn unclean_markers(path: &Path) -> Vec<(PathBuf, Option<(String, i64)>)> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!(
        "{}.open-",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    );
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(std::io::Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid: i32 = name
                .strip_prefix(&prefix)?
                .split('-')
                .next()?
                .parse()
                .ok()?;
            // A process that is still there has it open; one that is gone was killed.
            let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
            let last = fs::read_to_string(e.path()).ok().and_then(|t| {
                let (run, seq) = t.trim().rsplit_once(' ')?;
                Some((run.to_owned(), seq.parse().ok()?))
            });
            (!alive).then(|| (e.path(), last))
        })
        .collect()
}

/// The process whose open-marker (other than `own`) names `run` as the last run it committed
/// to, if one does: a run that retention must not delete while that process has the store
/// open, since were it killed, the crash check of its marker would look for that run's rows.
pub(super) fn marker_naming(path: &Path, run: &str, own: Option<&Path>) -> Option<u32> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let prefix = format!("{}.open-", path.file_name()?.to_string_lossy());
    fs::read_dir(dir)
        .ok()?
        .filter_map(std::io::Result::ok)
        .filter(|e| own != Some(e.path().as_path()))
        .find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid: u32 = name
                .strip_prefix(&prefix)?
                .split('-')
                .next()?
                .parse()
                .ok()?;
            let text = fs::read_to_string(e.path()).ok()?;
            let (named, _) = text.trim().rsplit_once(' ')?;
            (named == run).then_some(pid)
        })
}

impl SqliteStore {
    /// The checks on a store that a killed process had open: its commits must all be
    /// there (a write-ahead log deleted after the crash loses them), and
    /// `PRAGMA quick_check` must pass.
    pub(super) fn after_crash(&self, markers: &[(PathBuf, Option<(String, i64)>)]) -> Result<()> {
        self.check_log(markers)?;
        self.quick_check()
    }

    /// Each open-marker holds the number of the last event or node its process committed; a
    /// store that lacks one of them lost its write-ahead log.
    pub(super) fn check_log(&self, markers: &[(PathBuf, Option<(String, i64)>)]) -> Result<()> {
        let committed: Vec<&(String, i64)> =
            markers.iter().filter_map(|(_, c)| c.as_ref()).collect();
        if committed.is_empty() {
            return Ok(());
        }
        let version: i64 = self
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap_or(-1);
        if version == 0 {
            // Commits were made, yet the file has not even its schema: all of it was in the
            // log.
            return Err(lost_log(&self.path));
        }
        // Since schema version 8 the last number may be an attempt's.
        let sql = if version >= super::schema::ATTEMPT_SEQ_SINCE {
            "SELECT EXISTS (SELECT 1 FROM events WHERE run = ?1 AND seq >= ?2) \
             OR EXISTS (SELECT 1 FROM nodes WHERE run = ?1 AND seq >= ?2) \
             OR EXISTS (SELECT 1 FROM attempts WHERE run = ?1 AND seq >= ?2)"
        } else {
            "SELECT EXISTS (SELECT 1 FROM events WHERE run = ?1 AND seq >= ?2) \
             OR EXISTS (SELECT 1 FROM nodes WHERE run = ?1 AND seq >= ?2)"
        };
        for (run, seq) in committed {
            let present = self
                .conn
                .query_row(sql, params![run, seq], |row| row.get::<_, bool>(0))
                // A store too damaged to answer is reported by the quick check.
                .unwrap_or(true);
            if !present {
                return Err(lost_log(&self.path));
            }
        }
        Ok(())
    }

    /// Records, in this process's open-marker, the last event or node it committed: the run
    /// and the row's number in it.
    pub(super) fn note_commit(&mut self, run: &str) {
        use std::os::unix::fs::FileExt;
        let Some((_, file)) = &self.marker else {
            return;
        };
        // The commit counted its rows: the last is the highest the file holds.
        let Some(seq) = self.seqs.last_number(run) else {
            return;
        };
        // Fixed width, so that a shorter record overwrites a longer one whole.
        let _ = file.write_at(format!("{:<120}\n", format!("{run} {seq}")).as_bytes(), 0);
    }

    /// Fails when the store's file was deleted or replaced since it was opened (a
    /// `rm -rf .ralph-flow` in the middle of a run): nothing would be saved.
    pub(super) fn check_file(&self) -> Result<()> {
        match (self.identity, identity(&self.path)) {
            (Some(was), Some(is)) if was == is => Ok(()),
            (None, _) => Ok(()),
            (Some(_), now) => Err(StoreError::Damaged(format!(
                "{} was {} while the run was going on, so nothing more can be saved; the run's \
                 state is lost",
                self.path.display(),
                if now.is_none() { "deleted" } else { "replaced" }
            ))),
        }
    }

    /// `PRAGMA quick_check`: fails on a damaged store, before anything is written to it. A
    /// store too damaged for the check to run (SQLite's "malformed") is a damaged store too
    /// (see [`super::sql_error`]).
    fn quick_check(&self) -> Result<()> {
        let problems: Vec<String> = self
            .conn
            .prepare("PRAGMA quick_check")
            .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
            .map_err(|e| self.error("cannot check", e))?;
        if problems.len() == 1 && problems[0] == "ok" {
            return Ok(());
        }
        Err(damaged(&self.path, "cannot write to", &problems.join("; ")))
    }
}

/// Tells whether SQLite says the file is damaged ("database disk image is malformed", "file
/// is not a database").
pub(super) fn is_damage(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _) if matches!(f.code, DatabaseCorrupt | NotADatabase)
    )
}

/// The error of a damaged store: what could not be done (`what`, such as "cannot read"),
/// what SQLite found (`why`), and how to recover it.
pub(super) fn damaged(path: &Path, what: &str, why: &str) -> StoreError {
    StoreError::Damaged(format!(
        "{what} {}: the file is damaged ({why}). Move it aside and recover what can be \
         recovered with `sqlite3 {} .recover`",
        path.display(),
        crate::shell::quote(&path.to_string_lossy())
    ))
}

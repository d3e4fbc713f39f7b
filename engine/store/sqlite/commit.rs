//! A commit of a group of writes: outputs spilled first, then one transaction, tried again
//! with growing pauses while another process holds the file (up to [`BUSY_WAIT`], saying so).

use std::fs;
use std::time::Duration;

use super::blobs::Output;
use super::write::write_all;
use super::{BUSY_TIMEOUT, SqliteStore, json_text, sql_error};
use crate::store::{Result, StoreError, Write};

/// How long one try of a commit waits for a lock before it reports busy; a commit then
/// tries again, up to [`BUSY_WAIT`], saying so.
const COMMIT_BUSY_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a commit waits, in all, for another process that holds the file
/// (`RALPH_FLOW_STORE_BUSY_WAIT`, in seconds, changes it).
pub const BUSY_WAIT: Duration = Duration::from_secs(120);

/// The busy wait in force: [`BUSY_WAIT`], or `RALPH_FLOW_STORE_BUSY_WAIT` seconds.
fn busy_wait() -> Duration {
    std::env::var("RALPH_FLOW_STORE_BUSY_WAIT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(BUSY_WAIT)
}

/// Tells whether a key was taken: a number another process used since this one counted.
fn is_taken(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    )
}

/// Tells whether SQLite said the file is locked by another connection.
pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

impl SqliteStore {
    /// Sets what is told when a commit has to wait for another process.
    pub fn on_busy(&mut self, report: impl Fn(&str) + Send + 'static) {
        self.on_busy = Some(Box::new(report));
    }

    /// [`Store::commit`](crate::store::Store::commit), once the writes are masked
    /// ([`Write::masked`]).
    pub(super) fn commit_writes(&mut self, writes: &[Write]) -> Result<()> {
        self.check_file()?;
        // Serialize and spill first, so the write lock is held only for the inserts.
        let mut outputs = Vec::with_capacity(writes.len());
        let mut spilled = false;
        for write in writes {
            outputs.push(match write {
                Write::Node(node) => {
                    let (output, new_file) = self.prepare_output(&node.output)?;
                    spilled |= new_file;
                    output
                }
                _ => Output::default(),
            });
        }
        if spilled {
            // The renames must be on the disk before the rows that refer to them.
            fs::File::open(&self.blobs)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| StoreError::io("sync", &self.blobs, e))?;
        }
        let shows: Vec<Option<String>> = writes
            .iter()
            .map(|w| match w {
                Write::Gate(g) => json_text(&g.show).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        // Another process (an `approve`, a second reader) may hold the write lock: wait for
        // it with growing pauses, saying so, up to BUSY_WAIT in all.
        let _ = self.conn.busy_timeout(COMMIT_BUSY_TIMEOUT);
        let result = self.commit_retrying(writes, &outputs, &shows);
        let _ = self.conn.busy_timeout(BUSY_TIMEOUT);
        result?;
        self.restore_blobs(&outputs)
    }

    /// Commits, trying again while another process holds the file, up to the busy wait.
    fn commit_retrying(
        &mut self,
        writes: &[Write],
        outputs: &[Output],
        shows: &[Option<String>],
    ) -> Result<()> {
        let started = std::time::Instant::now();
        let limit = busy_wait();
        let mut pause = Duration::from_millis(50);
        let mut reported: Option<Duration> = None;
        let mut recounted = false;
        loop {
            let fence = self.fence.as_ref();
            match write_all(
                &mut self.conn,
                writes,
                outputs,
                shows,
                &mut self.seqs,
                fence,
            ) {
                // Refused by the fence (only a fenced commit is): this tenure lost the run.
                Ok(false) => {
                    return Err(match fence {
                        Some(f) => f.lost(self),
                        None => StoreError::Refused(format!(
                            "a commit to {} was refused for a lease this store does not hold",
                            self.path.display()
                        )),
                    });
                }
                Ok(true) => {
                    if let Some(run) = writes.iter().rev().find_map(|w| match w {
                        Write::Event(e) => Some(e.run.as_str()),
                        Write::Node(n) => Some(n.run.as_str()),
                        Write::Attempt(a) => Some(a.run.as_str()),
                        _ => None,
                    }) {
                        self.note_commit(run);
                    }
                    return Ok(());
                }
                Err(e) if is_taken(&e) && !recounted => {
                    // Another process wrote an event of the run since this one counted.
                    self.seqs.forget();
                    recounted = true;
                }
                Err(e) if is_busy(&e) && started.elapsed() < limit => {
                    let waited = started.elapsed();
                    // Said at once, then every five seconds or so.
                    let due =
                        reported.is_none_or(|at: Duration| waited >= at + Duration::from_secs(5));
                    if let (Some(report), true) = (&self.on_busy, due) {
                        reported = Some(waited);
                        report(&format!(
                            "{} is locked by another process; waited {}s, trying again",
                            self.path.display(),
                            waited.as_secs()
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    let busy = is_busy(&e);
                    let error = sql_error(&self.path, "cannot commit to", e);
                    return Err(if busy {
                        StoreError::Busy(format!(
                            "cannot commit to {}: another process kept it locked for more than {}s; find it (`fuser {}`), then resume the run",
                            self.path.display(),
                            limit.as_secs_f64(),
                            self.path.display()
                        ))
                    } else {
                        error
                    });
                }
            }
        }
    }
}

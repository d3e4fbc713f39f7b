//! What people read of each attempt beside the store: its prompt, raw answer, output,
//! feedback, error (`prompt.md`, `raw.txt`, `output.json`, ...).
//!
//! They are records in one append-only file per run, `RUN_DIR/artifacts.jsonl` (a line
//! `{"path": "SCOPE/STAGE/attempt-N/prompt.md", "text": ...}` each), not a file each:
//! creating a file costs 60-80 µs on an ext4 disk (more once many were deleted), an append a
//! few. [`export`] (`ralph-flow export`) writes them out as files. An attempt's directory is
//! made only for what is written in it (a program's output, an agent backend's files).
//!
//! Records are held and appended in one `write` per commit of the store
//! ([`Artifacts::hand_over`], which the executor calls when it commits), and before anything
//! that may read them (a program, an agent, a template helper reading files). No thread: an
//! append is cheaper than waking one. A write that fails is
//! reported once, and stops the run like a failed commit ([`Artifacts::failure`]).

use super::error::{IoFailure, RunError};
use crate::store::{ArtifactRecord, RunRecord, Store};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The file of a run's records.
pub const RECORDS: &str = "artifacts.jsonl";

/// The most records held before they are written.
const MAX_PENDING: usize = 256;

/// The records of a run.
pub(crate) struct Artifacts {
    run_dir: PathBuf,
    /// Whether the store keeps records (known without the lock, which a commit to a store
    /// that keeps none then does not take more than before).
    keeps: bool,
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// Records not yet written: each a path under the run's directory and a text.
    pending: Vec<(String, String)>,
    /// With a store that keeps records ([`Store::keeps_records`]): the run's id, and the
    /// records written to the file (masked) that the store does not have yet; the next
    /// commit takes them ([`Artifacts::for_store`]).
    for_store: Option<(String, Vec<ArtifactRecord>)>,
    failed: Option<Arc<IoFailure>>,
}

impl Inner {
    /// Appends the pending records (their secrets masked) in one write.
    fn write(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        /// A record's line, written straight from the strings (no JSON value copied).
        #[derive(serde::Serialize)]
        struct Record<'a> {
            path: &'a str,
            text: &'a str,
        }
        let mut lines: Vec<u8> = Vec::new();
        for (path, mut text) in self.pending.drain(..) {
            crate::secrets::redact_in_place(&mut text);
            // Two strings always serialize, into memory.
            if serde_json::to_writer(
                &mut lines,
                &Record {
                    path: &path,
                    text: &text,
                },
            )
            .is_ok()
            {
                lines.push(b'\n');
            }
            if let Some((run, records)) = &mut self.for_store {
                records.push(ArtifactRecord {
                    run: run.clone(),
                    path,
                    text,
                });
            }
        }
        if self.failed.is_some() {
            return;
        }
        if self.file.is_none() {
            match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
            {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    self.fail(std::sync::Arc::new(IoFailure::new("write", &self.path, e)));
                    return;
                }
            }
        }
        if let Some(f) = &mut self.file {
            if let Err(e) = f.write_all(&lines) {
                self.fail(std::sync::Arc::new(IoFailure::new("write", &self.path, e)));
            }
        }
    }

    fn fail(&mut self, failure: Arc<IoFailure>) {
        tracing::error!("state directory: {}", crate::diag::error_chain(&*failure));
        self.failed.get_or_insert(failure);
    }
}

impl Artifacts {
    /// The records of a run's directory; `store_run`: the run's id when its store keeps
    /// records too ([`Store::keeps_records`]), which then go to it with the commits.
    pub(crate) fn start(run_dir: &Path, store_run: Option<&str>) -> Artifacts {
        Artifacts {
            run_dir: run_dir.to_path_buf(),
            keeps: store_run.is_some(),
            inner: Arc::new(Mutex::new(Inner {
                path: run_dir.join(RECORDS),
                file: None,
                pending: Vec::new(),
                for_store: store_run.map(|run| (run.to_string(), Vec::new())),
                failed: None,
            })),
        }
    }

    /// Holds a record of a file under the run's directory (`path`, which lies under it).
    pub(crate) fn file(&self, path: &Path, text: &str) {
        let rel = path.strip_prefix(&self.run_dir).unwrap_or(path);
        let mut inner = lock(&self.inner);
        inner
            .pending
            .push((rel.to_string_lossy().into_owned(), text.to_string()));
        if inner.pending.len() >= MAX_PENDING {
            inner.write();
        }
    }

    /// Writes the held records.
    pub(crate) fn hand_over(&self) {
        lock(&self.inner).write();
    }

    /// Whether records written to the file wait for the store (see [`Artifacts::for_store`]).
    pub(crate) fn held_for_store(&self) -> bool {
        self.keeps
            && lock(&self.inner)
                .for_store
                .as_ref()
                .is_some_and(|(_, records)| !records.is_empty())
    }

    /// Writes the held records, and takes those the store does not have yet: the commit
    /// that calls this writes them in its transaction (empty when the store keeps none).
    pub(crate) fn for_store(&self) -> Vec<ArtifactRecord> {
        let mut inner = lock(&self.inner);
        inner.write();
        match &mut inner.for_store {
            Some((_, records)) => std::mem::take(records),
            None => Vec::new(),
        }
    }

    /// [`Artifacts::hand_over`] as a function, for the template helpers that read files.
    pub(crate) fn waiter(&self) -> impl Fn() + Send + Sync + 'static {
        let inner = self.inner.clone();
        move || lock(&inner).write()
    }

    /// The first write that failed, if one did.
    pub(crate) fn failure(&self) -> Option<Arc<IoFailure>> {
        lock(&self.inner).failed.clone()
    }
}

impl Drop for Artifacts {
    fn drop(&mut self) {
        self.hand_over();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A run's records by path (`SCOPE/STAGE/attempt-N/prompt.md`), later records of a path
/// replacing earlier ones, their secrets masked. A line that cannot be read (the end of a
/// file cut by a crash) and a path that would leave the run's directory are skipped.
pub fn read_records(
    run_dir: &Path,
) -> Result<std::collections::BTreeMap<String, String>, RunError> {
    let log = run_dir.join(RECORDS);
    let text = match std::fs::read_to_string(&log) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(RunError::io("read", log, e)),
    };
    let mut records = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Ok(rec) = serde_json::from_str::<Record>(line) else {
            continue;
        };
        if is_safe(&rec.path) {
            // Masked as they are read too (for `export` and the monitor): a record written
            // before a secret was known, or by a run that did not know it, is not shown.
            let text = match crate::secrets::redact(&rec.text) {
                std::borrow::Cow::Owned(masked) => masked,
                std::borrow::Cow::Borrowed(_) => rec.text,
            };
            records.insert(rec.path, text);
        }
    }
    Ok(records)
}

#[derive(serde::Deserialize)]
struct Record {
    path: String,
    text: String,
}

/// The records of a run whose path starts with `under` (`""`: all; an attempt's:
/// `SCOPE/STAGE/attempt-N/`), by path, their secrets masked: from the store when it keeps
/// the run's records ([`Store::records`]: a shared store, read from any machine), else from
/// the run's `artifacts.jsonl` ([`read_records`]: the SQLite store, and runs written before
/// the store kept them). What `logs`, `export` and the monitor read.
pub fn records(
    store: &dyn Store,
    run: &RunRecord,
    under: &str,
) -> Result<std::collections::BTreeMap<String, String>, RunError> {
    if let Some(kept) = store.records(&run.id, under)? {
        return Ok(kept
            .into_iter()
            .filter(|(path, _)| is_safe(path))
            .map(|(path, mut text)| {
                crate::secrets::redact_in_place(&mut text);
                (path, text)
            })
            .collect());
    }
    let mut all = read_records(Path::new(&run.dir))?;
    if !under.is_empty() {
        all.retain(|path, _| path.starts_with(under));
    }
    Ok(all)
}

/// Where an attempt's records lie under its run's directory (`SCOPE/STAGE/attempt-N/`): its
/// directory less the run's, or, for a directory recorded on another machine under another
/// root, its last components (one a scope part, the stage, `attempt-N`).
pub fn attempt_prefix(run: &RunRecord, attempt: &crate::store::AttemptRecord) -> Option<String> {
    let dir = Path::new(&attempt.dir);
    let rel = match dir.strip_prefix(&run.dir) {
        Ok(rel) => rel.to_path_buf(),
        Err(_) => {
            let depth = attempt.scope.split('/').filter(|p| !p.is_empty()).count() + 2;
            let parts: Vec<_> = dir.components().collect();
            let from = parts.len().checked_sub(depth)?;
            parts[from..].iter().collect()
        }
    };
    let rel = rel.to_string_lossy();
    (!rel.is_empty() && is_safe(&rel)).then(|| format!("{rel}/"))
}

/// Whether a record's path stays under the directory it is written in (no `..`, not
/// absolute, not empty).
fn is_safe(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Writes a run's records ([`records`]) out as files under `out`
/// (`out/SCOPE/STAGE/attempt-N/prompt.md`, ...), later records of a path replacing earlier
/// ones. A line that cannot be read (the end of a file cut by a crash) or a path that would
/// leave `out` is skipped. Returns how many files were written.
pub fn export(store: &dyn Store, run: &RunRecord, out: &Path) -> Result<usize, RunError> {
    write_out(records(store, run, "")?, out)
}

/// Writes records (by path) as files under `out`; returns how many.
fn write_out(
    records: std::collections::BTreeMap<String, String>,
    out: &Path,
) -> Result<usize, RunError> {
    let files: std::collections::BTreeMap<PathBuf, String> = records
        .into_iter()
        .map(|(path, text)| (out.join(path), text))
        .collect();
    for (path, body) in &files {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| RunError::io("create", dir, e))?;
        }
        std::fs::write(path, body).map_err(|e| RunError::io("write", path, e))?;
    }
    Ok(files.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_on_disk_once_handed_over_and_export_as_files() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let run = tmp.path().join("run");
        let a = Artifacts::start(&run, None);
        let dir = run.join("loop#1/s/attempt-1");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        a.file(&dir.join("prompt.md"), "first");
        a.file(&dir.join("prompt.md"), "second");
        a.file(&run.join("t/attempt-1/raw.txt"), "raw");
        a.hand_over();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        assert!(!dir.join("prompt.md").exists(), "records are not files");
        assert!(
            read(&run.join(RECORDS)).contains("second"),
            "on disk once handed over"
        );
        let out = tmp.path().join("out");
        assert_eq!(
            read_records(&run).and_then(|r| write_out(r, &out)).ok(),
            Some(2)
        );
        assert_eq!(read(&out.join("loop#1/s/attempt-1/prompt.md")), "second");
        assert_eq!(read(&out.join("t/attempt-1/raw.txt")), "raw");
        a.file(&dir.join("late.md"), "late");
        a.waiter()();
        assert!(read(&run.join(RECORDS)).contains("late"));
        a.hand_over();
        assert!(a.failure().is_none());
    }

    #[test]
    fn with_a_store_that_keeps_records_each_commit_takes_those_written_since_masked() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let run = tmp.path().join("run");
        std::fs::create_dir_all(&run).unwrap_or_else(|e| panic!("{e}"));
        let _ = crate::secrets::register("hunter2-artifacts-secret");
        let a = Artifacts::start(&run, Some("r1"));
        a.file(
            &run.join("s/attempt-1/prompt.md"),
            "key hunter2-artifacts-secret",
        );
        a.file(&run.join("s/attempt-1/raw.txt"), "raw");
        // Written to the file before a program starts: the store gets them at the commit.
        a.hand_over();
        let taken = a.for_store();
        let paths: Vec<(&str, &str)> = taken
            .iter()
            .map(|r| (r.run.as_str(), r.path.as_str()))
            .collect();
        assert_eq!(
            paths,
            [
                ("r1", "s/attempt-1/prompt.md"),
                ("r1", "s/attempt-1/raw.txt")
            ]
        );
        assert!(
            !taken[0].text.contains("hunter2-artifacts-secret"),
            "{}",
            taken[0].text
        );
        assert!(a.for_store().is_empty(), "each record goes once");
        let jsonl = std::fs::read_to_string(run.join(RECORDS)).unwrap_or_default();
        assert_eq!(jsonl.lines().count(), 2, "the file has them too: {jsonl}");
        // Without such a store nothing is held for it.
        let b = Artifacts::start(&run, None);
        b.file(&run.join("t/attempt-1/prompt.md"), "x");
        assert!(b.for_store().is_empty());
        assert!(
            std::fs::read_to_string(run.join(RECORDS))
                .unwrap_or_default()
                .contains("t/attempt-1/prompt.md"),
            "taking for the store writes the file first"
        );
    }

    #[test]
    fn export_skips_cut_lines_and_paths_that_leave_the_directory() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let run = tmp.path().join("run");
        std::fs::create_dir_all(&run).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            run.join(RECORDS),
            "{\"path\":\"../evil\",\"text\":\"x\"}\n{\"path\":\"/etc/x\",\"text\":\"x\"}\n{\"path\":\"s/attempt-1/raw.txt\",\"text\":\"ok\"}\n{\"path\":\"s/att",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let out = tmp.path().join("out");
        assert_eq!(
            read_records(&run).and_then(|r| write_out(r, &out)).ok(),
            Some(1)
        );
        assert!(!tmp.path().join("evil").exists());
    }

    #[test]
    fn a_write_that_fails_is_reported() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let blocker = tmp.path().join("file");
        std::fs::write(&blocker, "").unwrap_or_else(|e| panic!("{e}"));
        let a = Artifacts::start(&blocker, None);
        a.file(&blocker.join("s/attempt-1/prompt.md"), "x");
        a.hand_over();
        let why = a
            .failure()
            .map(|f| crate::diag::error_chain(&*f))
            .unwrap_or_default();
        assert!(why.contains("cannot write"), "{why}");
        assert!(why.contains("Not a directory"), "the cause is kept: {why}");
    }
}

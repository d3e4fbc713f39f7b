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
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// Records not yet written: each a path under the run's directory and a text.
    pending: Vec<(String, String)>,
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
        for (path, text) in self.pending.drain(..) {
            let text = crate::secrets::redact(&text);
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
    /// The records of a run's directory.
    pub(crate) fn start(run_dir: &Path) -> Artifacts {
        Artifacts {
            run_dir: run_dir.to_path_buf(),
            inner: Arc::new(Mutex::new(Inner {
                path: run_dir.join(RECORDS),
                file: None,
                pending: Vec::new(),
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
        let safe = Path::new(&rec.path)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if safe && !rec.path.is_empty() {
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

/// Writes a run's records out as files under `out` (`out/SCOPE/STAGE/attempt-N/prompt.md`,
/// ...), later records of a path replacing earlier ones. A line that cannot be read (the end
/// of a file cut by a crash) or a path that would leave `out` is skipped. Returns how many
/// files were written.
pub fn export(run_dir: &Path, out: &Path) -> Result<usize, RunError> {
    let files: std::collections::BTreeMap<PathBuf, String> = read_records(run_dir)?
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
        let a = Artifacts::start(&run);
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
        assert_eq!(export(&run, &out).ok(), Some(2));
        assert_eq!(read(&out.join("loop#1/s/attempt-1/prompt.md")), "second");
        assert_eq!(read(&out.join("t/attempt-1/raw.txt")), "raw");
        a.file(&dir.join("late.md"), "late");
        a.waiter()();
        assert!(read(&run.join(RECORDS)).contains("late"));
        a.hand_over();
        assert!(a.failure().is_none());
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
        assert_eq!(export(&run, &out).ok(), Some(1));
        assert!(!tmp.path().join("evil").exists());
    }

    #[test]
    fn a_write_that_fails_is_reported() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let blocker = tmp.path().join("file");
        std::fs::write(&blocker, "").unwrap_or_else(|e| panic!("{e}"));
        let a = Artifacts::start(&blocker);
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

//! What people read of each attempt beside the store: its prompt, raw answer, output,
//! feedback, error (`prompt.md`, `raw.txt`, `output.json`, ...), written by a thread of its
//! own, off the path from one stage to the next.
//!
//! They are records in one append-only file per run, `RUN_DIR/artifacts.jsonl` (a line
//! `{"path": "SCOPE/STAGE/attempt-N/prompt.md", "text": ...}` each), not a file each:
//! creating a file costs 60-80 µs on an ext4 disk (more once many were deleted), an append a
//! few. [`export`] (`ralph-flow export`) writes them out as files. An attempt's directory is
//! made only when a program or an agent runs in it (for what they write: stdout, stderr, an
//! HTTP exchange).
//!
//! Writes are queued in order; [`Artifacts::barrier`] waits until everything queued is on
//! disk, and the executor calls it before anything that may read it (a program, an agent,
//! a template helper reading files). [`Artifacts::finish`] drains the queue at the end of
//! the run. A write that fails is reported once, and stops the run like a failed commit
//! ([`Artifacts::failure`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

enum Job {
    /// Appends records (their secrets masked first): each a path under the run's directory
    /// and a text.
    Records(Vec<(String, String)>),
    /// Answers once everything queued before it is done.
    Barrier(tokio::sync::oneshot::Sender<()>),
    /// The same, for a caller that blocks (a template helper reading a file).
    BarrierSync(mpsc::Sender<()>),
}

/// The artifact writer of a run.
pub(crate) struct Artifacts {
    run_dir: PathBuf,
    /// Jobs sent, and jobs the writer has done: a barrier with nothing queued returns at once.
    sent: AtomicU64,
    done: Arc<AtomicU64>,
    tx: Arc<Mutex<Option<mpsc::Sender<Job>>>>,
    /// Records not yet handed to the writer: they go in batches (one wake-up of the writer
    /// per commit of the store, not one per record).
    pending: Arc<Mutex<Vec<(String, String)>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    failed: Arc<Mutex<Option<String>>>,
}

impl Artifacts {
    /// Starts the writer thread of a run's directory.
    pub fn start(run_dir: &Path) -> Artifacts {
        let (tx, rx) = mpsc::channel::<Job>();
        let failed: Arc<Mutex<Option<String>>> = Arc::default();
        let report = failed.clone();
        let log = run_dir.join(RECORDS);
        let done = Arc::new(AtomicU64::new(0));
        let count = done.clone();
        let thread = std::thread::Builder::new()
            .name("ralph-flow-artifacts".into())
            .spawn(move || write_all(&rx, &log, &report, &count))
            .ok();
        Artifacts {
            run_dir: run_dir.to_path_buf(),
            sent: AtomicU64::new(0),
            done,
            tx: Arc::new(Mutex::new(thread.is_some().then_some(tx))),
            pending: Arc::default(),
            thread: Mutex::new(thread),
            failed,
        }
    }

    /// Queues a record of a file under the run's directory (`path`, which lies under it).
    pub fn file(&self, path: &Path, text: &str) {
        let rel = path.strip_prefix(&self.run_dir).unwrap_or(path);
        let full = {
            let mut pending = lock(&self.pending);
            pending.push((rel.to_string_lossy().into_owned(), text.to_string()));
            pending.len() >= MAX_PENDING
        };
        if full {
            self.hand_over();
        }
    }

    /// Hands the pending records to the writer.
    pub fn hand_over(&self) {
        let records = std::mem::take(&mut *lock(&self.pending));
        if !records.is_empty() {
            self.send(Job::Records(records));
        }
    }

    fn send(&self, job: Job) {
        let tx = lock(&self.tx).clone();
        let job = match tx {
            Some(tx) => match tx.send(job) {
                Ok(()) => {
                    self.sent.fetch_add(1, Ordering::Release);
                    return;
                }
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        // No writer thread (it could not start): write here.
        let mut w = Writer::new(self.run_dir.join(RECORDS));
        w.job(job, &self.failed);
    }

    /// Completes once everything queued so far is on disk.
    pub async fn barrier(&self) {
        self.hand_over();
        if self.done.load(Ordering::Acquire) >= self.sent.load(Ordering::Acquire) {
            return;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Job::Barrier(tx));
        let _ = rx.await;
    }

    /// A function that blocks until everything queued so far is on disk (for the template
    /// helpers that read files); it returns at once after [`Artifacts::finish`].
    pub fn waiter(&self) -> impl Fn() + Send + Sync + 'static {
        let tx = self.tx.clone();
        let pending = self.pending.clone();
        move || {
            let Some(tx) = lock(&tx).clone() else {
                return;
            };
            let records = std::mem::take(&mut *lock(&pending));
            if !records.is_empty() {
                let _ = tx.send(Job::Records(records));
            }
            let (done, wait) = mpsc::channel();
            if tx.send(Job::BarrierSync(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }

    /// The first write that failed, if one did.
    pub fn failure(&self) -> Option<String> {
        lock(&self.failed).clone()
    }

    /// Writes everything queued and stops the thread.
    pub fn finish(&self) {
        self.hand_over();
        lock(&self.tx).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Artifacts {
    fn drop(&mut self) {
        self.finish();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The file of a run's records.
pub const RECORDS: &str = "artifacts.jsonl";

/// The most records held before they are handed to the writer.
const MAX_PENDING: usize = 256;

fn write_all(
    rx: &mpsc::Receiver<Job>,
    log: &Path,
    failed: &Mutex<Option<String>>,
    done: &AtomicU64,
) {
    let mut w = Writer::new(log.to_path_buf());
    while let Ok(job) = rx.recv() {
        w.job(job, failed);
        done.fetch_add(1, Ordering::Release);
    }
}

/// The writer's state: the records file, open once.
struct Writer {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl Writer {
    fn new(path: PathBuf) -> Writer {
        Writer { path, file: None }
    }

    fn job(&mut self, job: Job, failed: &Mutex<Option<String>>) {
        let fail = |message: String| {
            tracing::error!("state directory: {message}");
            lock(failed).get_or_insert(message);
        };
        match job {
            Job::Records(records) => {
                let mut lines = String::new();
                for (path, text) in records {
                    let text = crate::secrets::redact(&text);
                    lines.push_str(&serde_json::json!({"path": path, "text": text}).to_string());
                    lines.push('\n');
                }
                let line = lines;
                if self.file.is_none() {
                    match std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&self.path)
                    {
                        Ok(f) => self.file = Some(f),
                        Err(e) => {
                            fail(format!("cannot write {}: {e}", self.path.display()));
                            return;
                        }
                    }
                }
                if let Some(f) = &mut self.file {
                    if let Err(e) = f.write_all(line.as_bytes()) {
                        fail(format!("cannot write {}: {e}", self.path.display()));
                    }
                }
            }
            Job::Barrier(done) => {
                let _ = done.send(());
            }
            Job::BarrierSync(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Writes a run's records out as files under `out` (`out/SCOPE/STAGE/attempt-N/prompt.md`,
/// ...), later records of a path replacing earlier ones. A line that cannot be read (the end
/// of a file cut by a crash) or a path that would leave `out` is skipped. Returns how many
/// files were written.
pub fn export(run_dir: &Path, out: &Path) -> Result<usize, String> {
    let log = run_dir.join(RECORDS);
    let text = match std::fs::read_to_string(&log) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", log.display())),
    };
    let mut files: std::collections::BTreeMap<PathBuf, String> = Default::default();
    for line in text.lines() {
        let Ok(rec) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(path), Some(body)) = (
            rec.get("path").and_then(serde_json::Value::as_str),
            rec.get("text").and_then(serde_json::Value::as_str),
        ) else {
            continue;
        };
        let rel = Path::new(path);
        let safe = rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if safe && !path.is_empty() {
            files.insert(out.join(rel), body.to_string());
        }
    }
    for (path, body) in &files {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        std::fs::write(path, body).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(files.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_are_on_disk_after_a_barrier_and_export_as_files() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let run = tmp.path().join("run");
        let a = Artifacts::start(&run);
        let dir = run.join("loop#1/s/attempt-1");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        a.file(&dir.join("prompt.md"), "first");
        a.file(&dir.join("prompt.md"), "second");
        a.file(&run.join("t/attempt-1/raw.txt"), "raw");
        a.barrier().await;
        assert!(!dir.join("prompt.md").exists(), "records are not files");
        let out = tmp.path().join("out");
        assert_eq!(export(&run, &out).ok(), Some(2));
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        assert_eq!(read(&out.join("loop#1/s/attempt-1/prompt.md")), "second");
        assert_eq!(read(&out.join("t/attempt-1/raw.txt")), "raw");
        a.file(&dir.join("late.md"), "late");
        a.waiter()();
        assert!(read(&run.join(RECORDS)).contains("late"));
        a.finish();
        assert!(a.failure().is_none());
        // Once finished, the waiter does not block.
        a.waiter()();
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
        a.finish();
        let why = a.failure().unwrap_or_default();
        assert!(why.contains("cannot write"), "{why}");
    }
}

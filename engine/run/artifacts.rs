//! The files people read beside the store (each attempt's `prompt.md`, `raw.txt`,
//! `output.json`, ...), written by a thread of their own so that creating them (60-80 µs a
//! file on an ext4 disk) is not on the path from one stage to the next.
//!
//! The store holds what a run needs; these files are for people and tools. Writes are
//! queued in order; [`Artifacts::barrier`] waits until everything queued is on disk, and the
//! executor calls it before anything that may read the files (a program, an agent CLI), so a
//! program always finds the files of the stages before it. [`Artifacts::finish`] drains the
//! queue at the end of the run. A write that fails is reported once, and stops the run like
//! a failed commit ([`Artifacts::failure`]).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

enum Job {
    /// Creates a directory (and its parents).
    Dir(PathBuf),
    /// Writes a file (its secrets masked first), creating its directory if needed.
    File(PathBuf, String),
    /// Answers once everything queued before it is done.
    Barrier(tokio::sync::oneshot::Sender<()>),
    /// The same, for a caller that blocks (a template helper reading a file).
    BarrierSync(mpsc::Sender<()>),
}

/// The artifact writer of a run.
pub(crate) struct Artifacts {
    tx: Arc<Mutex<Option<mpsc::Sender<Job>>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    failed: Arc<Mutex<Option<String>>>,
}

impl Artifacts {
    /// Starts the writer thread.
    pub fn start() -> Artifacts {
        let (tx, rx) = mpsc::channel::<Job>();
        let failed: Arc<Mutex<Option<String>>> = Arc::default();
        let report = failed.clone();
        let thread = std::thread::Builder::new()
            .name("ralph-flow-artifacts".into())
            .spawn(move || write_all(&rx, &report))
            .ok();
        Artifacts {
            tx: Arc::new(Mutex::new(thread.is_some().then_some(tx))),
            thread: Mutex::new(thread),
            failed,
        }
    }

    /// Queues the creation of a directory.
    pub fn dir(&self, dir: &Path) {
        self.send(Job::Dir(dir.to_path_buf()));
    }

    /// Queues a file (its directory is created if it does not exist).
    pub fn file(&self, path: PathBuf, text: &str) {
        self.send(Job::File(path, text.to_string()));
    }

    fn send(&self, job: Job) {
        let tx = lock(&self.tx).clone();
        let job = match tx {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        // No writer thread (it could not start): write here.
        do_job(job, &mut None, &self.failed);
    }

    /// Completes once everything queued so far is on disk.
    pub async fn barrier(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Job::Barrier(tx));
        let _ = rx.await;
    }

    /// A function that blocks until everything queued so far is on disk (for the template
    /// helpers that read files); it returns at once after [`Artifacts::finish`].
    pub fn waiter(&self) -> impl Fn() + Send + Sync + 'static {
        let tx = self.tx.clone();
        move || {
            let Some(tx) = lock(&tx).clone() else {
                return;
            };
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

fn write_all(rx: &mpsc::Receiver<Job>, failed: &Mutex<Option<String>>) {
    // The last directory made: an attempt's files come one after the other.
    let mut made: Option<PathBuf> = None;
    while let Ok(job) = rx.recv() {
        do_job(job, &mut made, failed);
    }
}

fn do_job(job: Job, made: &mut Option<PathBuf>, failed: &Mutex<Option<String>>) {
    let fail = |message: String| {
        tracing::error!("state directory: {message}");
        failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert(message);
    };
    let ensure = |dir: &Path, made: &mut Option<PathBuf>| -> bool {
        if made.as_deref() == Some(dir) {
            return true;
        }
        match std::fs::create_dir_all(dir) {
            Ok(()) => {
                *made = Some(dir.to_path_buf());
                true
            }
            Err(e) => {
                fail(format!("cannot create {}: {e}", dir.display()));
                false
            }
        }
    };
    match job {
        Job::Dir(dir) => {
            ensure(&dir, made);
        }
        Job::File(path, text) => {
            if let Some(dir) = path.parent() {
                if !ensure(dir, made) {
                    return;
                }
            }
            let text = crate::secrets::redact(&text);
            if let Err(e) = std::fs::write(&path, text.as_bytes()) {
                fail(format!("cannot write {}: {e}", path.display()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_are_on_disk_after_a_barrier_in_the_order_queued() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let a = Artifacts::start();
        let dir = tmp.path().join("s/attempt-1");
        a.dir(&dir);
        a.file(dir.join("prompt.md"), "first");
        a.file(dir.join("prompt.md"), "second");
        a.file(tmp.path().join("t/attempt-1/raw.txt"), "raw");
        a.barrier().await;
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        assert_eq!(read(&dir.join("prompt.md")), "second");
        assert_eq!(read(&tmp.path().join("t/attempt-1/raw.txt")), "raw");
        assert!(a.failure().is_none());
        a.file(dir.join("late.md"), "late");
        a.waiter()();
        assert_eq!(read(&dir.join("late.md")), "late");
        a.finish();
        // Once finished, the waiter does not block.
        a.waiter()();
    }

    #[tokio::test]
    async fn a_write_that_fails_is_reported() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let blocker = tmp.path().join("file");
        std::fs::write(&blocker, "").unwrap_or_else(|e| panic!("{e}"));
        let a = Artifacts::start();
        a.file(blocker.join("sub/prompt.md"), "x");
        a.finish();
        let why = a.failure().unwrap_or_default();
        assert!(why.contains("cannot create"), "{why}");
    }
}

//! The run's reads of the store while it runs: cross-run memory (the `earlier_runs`
//! template function) and the long outputs the executor leaves to the store
//! ([`OutputReader`]).

use minijinja::value::Value;
use minijinja::{Error, ErrorKind};

/// The store `earlier_runs` and [`OutputReader`] read: a handle on the run's connection
/// where it can be shared (PostgreSQL), else a connection of its own, opened the first time
/// something asks (most runs never do).
pub struct MemoryStore {
    location: crate::store::Location,
    store: Option<Box<dyn crate::store::Store + Send>>,
}

impl MemoryStore {
    /// A store ready to read (a shared handle).
    pub fn ready(
        store: Box<dyn crate::store::Store + Send>,
        location: crate::store::Location,
    ) -> Self {
        MemoryStore {
            location,
            store: Some(store),
        }
    }

    /// A store opened when first read.
    pub fn later(location: crate::store::Location) -> Self {
        MemoryStore {
            location,
            store: None,
        }
    }

    fn get(&mut self) -> crate::store::Result<&mut Box<dyn crate::store::Store + Send>> {
        match &mut self.store {
            Some(s) => Ok(s),
            slot @ None => {
                Ok(slot.insert(self.location.open(&crate::store::OpenOptions::default())?))
            }
        }
    }
}

/// Reads back the long outputs a run's views leave to the store (see `frame::View`). A read
/// that fails gives `null` to whoever asked and is kept here: the run's next commit takes it,
/// stops the run as a failed commit does, and commits nothing decided since.
pub struct OutputReader {
    store: std::sync::Arc<std::sync::Mutex<MemoryStore>>,
    run: String,
    failure: std::sync::Mutex<Option<crate::store::StoreError>>,
    reads: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for OutputReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputReader")
            .field("run", &self.run)
            .field("reads", &self.reads())
            .finish_non_exhaustive()
    }
}

impl OutputReader {
    pub fn new(store: std::sync::Arc<std::sync::Mutex<MemoryStore>>, run: String) -> Self {
        OutputReader {
            store,
            run,
            failure: std::sync::Mutex::new(None),
            reads: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The output of the run's node `node` in `scope`, or why it cannot be read.
    pub fn try_read(&self, scope: &str, node: &str) -> crate::store::Result<serde_json::Value> {
        use crate::store::StoreError;
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut store = self.store.lock().map_err(|_| {
            StoreError::Connection("the store's reading connection is unusable".into())
        })?;
        store
            .get()
            .and_then(|s| s.output(&self.run, scope, node))?
            .ok_or_else(|| {
                StoreError::NotFound(format!(
                    "the output of `{node}`{} is not in the store",
                    if scope.is_empty() {
                        String::new()
                    } else {
                        format!(" in `{scope}`")
                    }
                ))
            })
    }

    /// The output, or `null` with the failure kept (see [`OutputReader`]).
    pub fn read(&self, scope: &str, node: &str) -> serde_json::Value {
        self.try_read(scope, node).unwrap_or_else(|e| {
            tracing::error!("{}", crate::diag::error_chain(&e));
            let mut failure = self
                .failure
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            failure.get_or_insert(e);
            serde_json::Value::Null
        })
    }

    /// Takes the first read that failed since the last call, if any.
    pub fn take_failure(&self) -> Option<crate::store::StoreError> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// How many outputs were asked of the store (a read that failed counts too).
    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Adds `earlier_runs(stage, n=5)`: the stage's outputs in earlier runs of the same
/// workflow, newest first, each `{run, started_at, status, output}` (cross-run memory).
pub fn register(
    env: &mut minijinja::Environment<'static>,
    store: std::sync::Arc<std::sync::Mutex<MemoryStore>>,
    workflow: String,
    current_run: String,
) {
    env.add_function(
        "earlier_runs",
        move |stage: String, n: Option<usize>| -> Result<Value, Error> {
            let mut store = store
                .lock()
                .map_err(|_| Error::new(ErrorKind::InvalidOperation, "the store is unusable"))?;
            let rows = store
                .get()
                .and_then(|s| s.history(&workflow, &stage, &current_run, n.unwrap_or(5)))
                .map_err(|e| {
                    Error::new(ErrorKind::InvalidOperation, crate::diag::error_chain(&e))
                })?;
            let out: Vec<serde_json::Value> = rows
                .into_iter()
                .map(|(run, rec)| {
                    serde_json::json!({
                        "run": run,
                        "started_at": crate::store::rfc3339(rec.started_at),
                        "status": rec.state.as_str(),
                        "output": rec.output,
                    })
                })
                .collect();
            Ok(Value::from(minijinja::value::Serde(out)))
        },
    );
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::store::{Location, NodeRecord, NodeState, RunRecord, RunStatus, Write};

    #[test]
    fn a_read_that_fails_gives_null_and_is_kept_for_the_next_commit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let location = Location::StateDir(dir.path().to_path_buf());
        let mut store = location
            .open(&crate::store::OpenOptions::default())
            .expect("open");
        store
            .create_run(&RunRecord {
                id: "r".into(),
                workflow: "w".into(),
                file: "w.toml".into(),
                workflow_hash: String::new(),
                params: serde_json::json!({}),
                status: RunStatus::Running,
                exit: None,
                started_at: 1,
                updated_at: 1,
                dir: String::new(),
                options: serde_json::json!({}),
            })
            .expect("run");
        let long = serde_json::json!({"text": "x".repeat(3000)});
        store
            .commit(&[Write::Node(NodeRecord {
                run: "r".into(),
                scope: "l#1".into(),
                node: "a".into(),
                state: NodeState::Done,
                output: long.clone(),
                action: None,
                feedback: None,
                attempts: 1,
                usage: Default::default(),
                started_at: 1,
                finished_at: 2,
            })])
            .expect("commit");
        let reader = OutputReader::new(
            Arc::new(Mutex::new(MemoryStore::later(location))),
            "r".into(),
        );
        assert_eq!(reader.read("l#1", "a"), long);
        assert!(reader.take_failure().is_none());
        assert_eq!(reader.read("l#1", "gone"), serde_json::Value::Null);
        let failure = reader.take_failure().expect("the failed read is kept");
        assert!(failure.to_string().contains("`gone` in `l#1`"), "{failure}");
        assert!(reader.take_failure().is_none(), "taken once");
        assert_eq!(reader.reads(), 2);
    }
}

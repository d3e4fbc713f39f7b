//! Cross-run memory: the `earlier_runs` template function, which reads the store.

use minijinja::value::Value;
use minijinja::{Error, ErrorKind};

/// The store `earlier_runs` reads: a handle on the run's connection where it can be
/// shared (PostgreSQL), else a connection of its own, opened the first time a template asks
/// (most runs never do).
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
            slot @ None => Ok(slot.insert(
                self.location
                    .open(crate::store::sqlite::Durability::Normal)?,
            )),
        }
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

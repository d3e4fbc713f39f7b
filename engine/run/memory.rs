//! Cross-run memory: the `earlier_runs` template function, which reads the store.

use minijinja::value::Value;
use minijinja::{Error, ErrorKind};

/// Adds `earlier_runs(stage, n=5)`: the stage's outputs in earlier runs of the same
/// workflow, newest first, each `{run, started_at, status, output}` (cross-run memory).
/// It reads the store through its own connection.
pub fn register(
    env: &mut minijinja::Environment<'static>,
    store: std::sync::Arc<std::sync::Mutex<Box<dyn crate::store::Store + Send>>>,
    workflow: String,
    current_run: String,
) {
    env.add_function(
        "earlier_runs",
        move |stage: String, n: Option<usize>| -> Result<Value, Error> {
            let store = store
                .lock()
                .map_err(|_| Error::new(ErrorKind::InvalidOperation, "the store is unusable"))?;
            let rows = store
                .history(&workflow, &stage, &current_run, n.unwrap_or(5))
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

//! Cancelling a run: `ralph-flow cancel` and the monitor's button write the same records (the
//! run's status and who cancelled it, with its waiting gates withdrawn, in one transaction;
//! then its event) and say the same of what happens next ([`Cancelled::next`]). A running
//! run's executor reads the status (`lifecycle::watch_cancel`) and stops its stages.

use crate::store::{
    Cancellation, Event, LockOwner, RunStatus, Store, StoreError, Write, host_name, now_ms,
};

/// Why a run could not be cancelled.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("there is no run `{0}`; `ralph-flow runs` lists them")]
    NoRun(String),
    /// It ended, or was cancelled already: said with how.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(StoreError),
}

/// A recorded cancel.
#[derive(Debug)]
pub struct Cancelled {
    pub run: String,
    /// The status the run had.
    pub was: RunStatus,
    pub cancellation: Cancellation,
    /// The gates it waited on (qualified), now withdrawn.
    pub gates: Vec<String>,
    /// Who held the run when it was cancelled (its executor, for a running run).
    pub holder: Option<LockOwner>,
    /// The cancel is recorded but its event is not (the log misses one line).
    pub event_error: Option<StoreError>,
}

impl Cancelled {
    /// What happens now, as the CLI and the monitor say it.
    pub fn next(&self) -> String {
        match self.was {
            RunStatus::Queued => "it was queued: no worker takes it now".to_string(),
            RunStatus::Waiting if self.gates.is_empty() => {
                "it was waiting: it cannot be resumed".to_string()
            }
            RunStatus::Waiting => format!(
                "it was waiting on {}: the gate{} withdrawn, and it cannot be resumed",
                self.gates.join(", "),
                if self.gates.len() == 1 {
                    " is"
                } else {
                    "s are"
                }
            ),
            RunStatus::Interrupted => "it was interrupted: it cannot be resumed".to_string(),
            RunStatus::Running => match &self.holder {
                Some(h) if !h.lapsed(&host_name(), now_ms()) => format!(
                    "its executor (pid {} on {}) stops its stages within a few seconds and ends \
                     it with exit code {}",
                    h.pid,
                    h.host,
                    crate::exit::CANCELLED
                ),
                _ => "it was marked running, but no live executor holds it: nothing runs it now"
                    .to_string(),
            },
            RunStatus::Finished | RunStatus::Cancelled => String::new(),
        }
    }
}

/// Cancels run `run` (queued, running, waiting or interrupted) as `by`, with an optional
/// reason: see [`Store::cancel`]. A finished or cancelled run is refused, saying so.
pub fn cancel(
    store: &mut dyn Store,
    run: &str,
    reason: Option<String>,
    by: &str,
) -> Result<Cancelled, CancelError> {
    // The reason is stored and shown: masked as everything written is.
    let reason = reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .map(|r| crate::secrets::redact(&r).into_owned());
    let record = store
        .run(run)
        .map_err(CancelError::Store)?
        .ok_or_else(|| CancelError::NoRun(run.to_string()))?;
    let gates = store
        .pending_gates(&record.id)
        .map_err(CancelError::Store)?
        .iter()
        .map(crate::store::GateRequest::qualified)
        .collect();
    let holder = store.lock_holder(&record.id).map_err(CancelError::Store)?;
    let cancellation = Cancellation {
        by: by.to_string(),
        at: now_ms(),
        reason,
    };
    let was = match store.cancel(&record.id, &cancellation) {
        Ok(was) => was,
        Err(StoreError::Refused(why)) => return Err(CancelError::Refused(why)),
        Err(e) => return Err(CancelError::Store(e)),
    };
    let event = Event {
        run: record.id.clone(),
        at: cancellation.at,
        scope: String::new(),
        node: String::new(),
        kind: "cancelled".to_string(),
        message: format!(
            "cancelled by {by} (it was {}){}",
            was.as_str(),
            cancellation
                .reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
    };
    let event_error = store.commit(&[Write::Event(event)]).err();
    Ok(Cancelled {
        run: record.id,
        was,
        cancellation,
        gates,
        holder,
        event_error,
    })
}

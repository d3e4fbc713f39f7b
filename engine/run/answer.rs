//! Answering a gate: `ralph-flow approve`/`reject` and the monitor's buttons write the same
//! records (the answer, in one transaction with the removal of the request, then its event),
//! and say the same of what happens next ([`Next`]): an executor polling the gate picks the
//! answer up, a worker carries a detached run on, or `resume` continues the run.

use crate::store::{Approval, Event, GateRequest, RunStatus, Store, StoreError, Write, now_ms};

/// Who is answering, when nobody says: `$USER`, else `$LOGNAME`, else the name of the
/// process's user in the system's user database, else `uid N`; never "unknown".
pub fn who_answers() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
        })
        .unwrap_or_else(|| format!("uid {}", nix::unistd::getuid()))
}

/// Why a gate could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("a rejection needs a comment: it is the feedback of the next attempt")]
    NoComment,
    #[error("there is no run `{0}`")]
    NoRun(String),
    #[error("gate `{gate}` of run `{run}` is not waiting for an answer{}", waiting_text(.waiting))]
    NotWaiting {
        run: String,
        gate: String,
        /// The gates of the run that wait, qualified.
        waiting: Vec<String>,
    },
    #[error(
        "gate `{gate}` of run `{run}` waits in {} places: {}; name one of them, as in `ralph-flow approve {run} {}`",
        .places.len(),
        .places.join(", "),
        crate::shell::quote(.places.first().map_or("", String::as_str))
    )]
    Ambiguous {
        run: String,
        gate: String,
        places: Vec<String>,
    },
    #[error(
        "run `{run}` was cancelled {how}: its gates no longer wait for an answer, and it cannot \
         go on; start a new run with `ralph-flow run`"
    )]
    Cancelled { run: String, how: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The error for an answer to a cancelled run.
fn cancelled(record: &crate::store::RunRecord) -> AnswerError {
    AnswerError::Cancelled {
        run: record.id.clone(),
        how: record.cancellation().map_or_else(String::new, |c| c.text()),
    }
}

fn waiting_text(waiting: &[String]) -> String {
    if waiting.is_empty() {
        "; no gate of this run is waiting".into()
    } else {
        format!("; waiting: {}", waiting.join(", "))
    }
}

/// What happens to a run once a gate of it is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Next {
    /// An executor carries the run out and polls the gate: it picks the answer up.
    PicksUp,
    /// The answer queued a detached run (`run --detach`) that waited: a worker carries it on.
    Requeued,
    /// A detached run queued already (another answer queued it, or its worker stopped): a
    /// worker claims it and carries it on with the answer.
    Queued,
    /// Nothing carries the run: `ralph-flow resume RUN` continues it.
    Resume,
}

impl Next {
    /// What happens next, as the CLI and the monitor say it.
    pub fn text(self, run: &str) -> String {
        match self {
            Next::PicksUp => "the run picks the answer up".to_string(),
            Next::Requeued => "the run is queued again; a worker carries it on".to_string(),
            Next::Queued => "the run is queued; a worker carries it on with the answer".to_string(),
            Next::Resume => format!("continue the run with `ralph-flow resume {run}`"),
        }
    }
}

/// A recorded answer.
#[derive(Debug)]
pub struct Answered {
    pub approval: Approval,
    /// The gate as it waited.
    pub gate: GateRequest,
    /// Whether the run was being executed (an executor polls the gate) when it was answered.
    pub run_running: bool,
    /// What happens to the run now.
    pub next: Next,
    /// The answer is recorded but its event is not (the log misses one line).
    pub event_error: Option<StoreError>,
}

/// Answers the gate `gate` of run `run`: `SCOPE/GATE` names one waiting gate, a bare id the
/// gate wherever it waits, if it waits in one place only. A rejection needs a comment.
pub fn answer(
    store: &mut dyn Store,
    run: &str,
    gate: &str,
    approved: bool,
    comment: Option<String>,
    by: &str,
) -> Result<Answered, AnswerError> {
    // The comment is stored and fed to the run: masked as everything written is.
    let comment = comment
        .filter(|c| !c.trim().is_empty())
        .map(|c| crate::secrets::redact(&c).into_owned());
    if !approved && comment.is_none() {
        return Err(AnswerError::NoComment);
    }
    let Some(record) = store.run(run)? else {
        return Err(AnswerError::NoRun(run.to_string()));
    };
    if record.status == RunStatus::Cancelled {
        return Err(cancelled(&record));
    }
    let pending = store.pending_gates(&record.id)?;
    let matching: Vec<&GateRequest> = match pending.iter().find(|g| g.qualified() == gate) {
        Some(g) => vec![g],
        None => pending.iter().filter(|g| g.gate == gate).collect(),
    };
    let target = match matching.as_slice() {
        [one] => (*one).clone(),
        [] => {
            return Err(AnswerError::NotWaiting {
                run: record.id,
                gate: gate.to_string(),
                waiting: pending.iter().map(GateRequest::qualified).collect(),
            });
        }
        several => {
            return Err(AnswerError::Ambiguous {
                run: record.id,
                gate: gate.to_string(),
                places: several.iter().map(|g| g.qualified()).collect(),
            });
        }
    };
    let approval = Approval {
        run: record.id.clone(),
        scope: target.scope.clone(),
        gate: target.gate.clone(),
        approved,
        comment,
        by: by.to_string(),
        at: now_ms(),
    };
    if let Err(e) = store.answer(&approval) {
        // Cancelled meanwhile (which withdrew the gate): said as such.
        return Err(match store.run(&record.id) {
            Ok(Some(now)) if now.status == RunStatus::Cancelled => cancelled(&now),
            _ => e.into(),
        });
    }
    let verb = if approved { "approved" } else { "rejected" };
    let event = Event {
        run: record.id.clone(),
        at: approval.at,
        scope: approval.scope.clone(),
        node: approval.gate.clone(),
        kind: verb.to_string(),
        message: format!(
            "{verb} by {by}{}",
            approval
                .comment
                .as_ref()
                .map(|c| format!(": {c}"))
                .unwrap_or_default()
        ),
    };
    let event_error = store.commit(&[Write::Event(event)]).err();
    let run_running = record.status == RunStatus::Running;
    let next = if run_running {
        Next::PicksUp
    } else {
        // A detached run that waited is queued again by the answer (the store does it); one
        // queued already is too (an answer to another of its gates, or its worker stopped):
        // either way a worker carries it on, and `resume` is for runs no worker carries.
        let now = store.run(&record.id).ok().flatten();
        match now {
            Some(r) if r.status == RunStatus::Queued && record.status == RunStatus::Waiting => {
                Next::Requeued
            }
            // Queued by the answer and claimed by a worker already, before this read.
            Some(r)
                if r.status == RunStatus::Running
                    && record.status == RunStatus::Waiting
                    && super::worker::Workspace::from_options(&r.options).is_some() =>
            {
                Next::Requeued
            }
            Some(r)
                if r.status == RunStatus::Queued
                    && super::worker::Workspace::from_options(&r.options).is_some() =>
            {
                Next::Queued
            }
            _ => Next::Resume,
        }
    };
    Ok(Answered {
        approval,
        gate: target,
        run_running,
        next,
        event_error,
    })
}

//! `ralph-flow cancel`: cancels a queued, running, waiting or interrupted run.

use ralph_flow::diag::error_chain;
use ralph_flow::run::cancel::{CancelError, cancel};

use super::run::{fail, say};

#[derive(clap::Args)]
pub(super) struct Args {
    /// The run (`ralph-flow runs` lists them).
    run: String,
    /// Why: recorded with the cancel, and shown by `status`, `logs` and the monitor.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    /// Who cancels (default: $USER, else $LOGNAME, else the login name of the user).
    #[arg(long)]
    by: Option<String>,
    #[command(flatten)]
    store: super::store::StoreArgs,
}

/// `ralph-flow cancel`: a queued, waiting or interrupted run is cancelled at once; a running
/// one is marked cancelled and its executor, wherever it runs, stops its stages and ends it
/// with exit code 125. Every failure is a configuration error (exit 3): no such run, a run
/// that ended, a store that cannot be reached.
pub(super) fn run(args: &Args) -> i32 {
    let location = match args.store.location() {
        Ok(l) => l,
        Err(e) => return fail(&error_chain(&e)),
    };
    let mut store = match super::run::open_store(&location) {
        Ok(s) => s,
        Err(e) => return fail(&error_chain(&e)),
    };
    let by = args
        .by
        .clone()
        .unwrap_or_else(ralph_flow::run::answer::who_answers);
    let done = match cancel(store.as_mut(), &args.run, args.reason.clone(), &by) {
        Ok(done) => done,
        Err(e @ CancelError::NoRun(_)) => {
            let recent: Vec<String> = store
                .runs(5)
                .unwrap_or_default()
                .into_iter()
                .map(|r| format!("{} ({}, {})", r.id, r.workflow, r.status.as_str()))
                .collect();
            return fail(&format!(
                "{}{}",
                error_chain(&e),
                if recent.is_empty() {
                    String::new()
                } else {
                    format!("; recent runs: {}", recent.join(", "))
                }
            ));
        }
        Err(e) => return fail(&error_chain(&e)),
    };
    if let Some(e) = &done.event_error {
        say(&format!(
            "warning: the cancel is recorded, but not its event: {}",
            error_chain(e)
        ));
    }
    say(&format!(
        "cancelled run {} as {by}; {}",
        done.run,
        done.next()
    ));
    0
}

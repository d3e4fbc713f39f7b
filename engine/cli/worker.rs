//! `ralph-flow worker`: claims queued runs from a shared PostgreSQL store and carries them
//! out, until Ctrl-C, SIGTERM or SIGHUP.

use std::rc::Rc;
use std::time::Duration;

use ralph_flow::diag::error_chain;
use ralph_flow::run::RunOptions;
use ralph_flow::run::progress::Mode;
use ralph_flow::run::worker::{WorkerOptions, work};
use ralph_flow::text::printable;

use super::run::{duration, fail, runtime, say};

#[derive(clap::Args)]
#[command(
    mut_arg("store", |a| a.help(
        "The shared PostgreSQL store (`postgres://...`; also RALPH_FLOW_STORE)"
    )),
    // After --max-runs, as the worker's own settings come first.
    mut_arg("state_dir", |a| a.display_order(4).help(
        "The worker's state directory: its runs' artifacts (`runs/ID`) and git checkouts \
         (`workspaces/ID`)"
    )),
)]
pub(super) struct Args {
    #[command(flatten)]
    store: super::store::StoreArgs,
    /// This worker's labels (`gpu,linux`): it claims only runs, and units of work, whose
    /// labels it all has.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    labels: Vec<String>,
    /// The most units of work (agent calls, programs) carried out at once.
    #[arg(long, value_name = "N", default_value_t = 1)]
    max_concurrency: usize,
    /// The most runs coordinated at once (default: 4 times --max-concurrency). A run's
    /// coordinator renders, decides and commits; its work goes to whichever worker has room.
    #[arg(long, value_name = "N")]
    max_runs: Option<usize>,
    /// How often to look for runs besides being woken by the store's notifications.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
    poll: Duration,
    /// How long a run's lease lasts unless renewed (renewed every third of it); a run whose
    /// worker died is taken over once it expires (default 30s, or RALPH_FLOW_LEASE).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    lease: Option<Duration>,
    /// The first delay of the exponential backoff of retries (`2s`, `500ms`).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration)]
    backoff: Duration,
    /// How many times a transient agent failure (non-zero exit, HTTP 5xx) is retried.
    #[arg(long, value_name = "N", default_value_t = 3)]
    transient_retries: u32,
    /// Show each run's progress lines (stderr) besides the worker's own.
    #[arg(long)]
    verbose: bool,
}

/// `ralph-flow worker`. Exits 0 when SIGTERM or SIGHUP (a service manager's stop, a closed
/// terminal) stopped it, 130 after Ctrl-C, 3 when it cannot start. Each stops it the same
/// way: it stops claiming, and hands its runs back to the queue.
pub(super) fn run(args: &Args) -> i32 {
    let cwd = match std::env::current_dir() {
        Ok(d) => d,
        Err(e) => return fail(&format!("no current directory: {e}")),
    };
    let state_dir = args.store.state_dir_in(&cwd);
    let location = match args.store.location_in(&cwd) {
        Ok(l) if l.is_shared() => l,
        Ok(_) => {
            return fail(
                "a worker needs a PostgreSQL store that the workers share: give --store \
                 postgres://... (or set RALPH_FLOW_STORE)",
            );
        }
        Err(e) => return fail(&error_chain(&e)),
    };
    if args.max_concurrency == 0 {
        return fail("--max-concurrency must be at least 1");
    }
    let mut run = RunOptions::new(cwd);
    if let Some(lease) = args.lease {
        if lease < Duration::from_millis(100) {
            return fail("--lease must be at least 100ms");
        }
        run.lease = lease;
    }
    run.backoff = args.backoff;
    run.transient_retries = args.transient_retries;
    run.progress = if args.verbose {
        Mode::Plain
    } else {
        Mode::Quiet
    };
    if let Some(bad) = args
        .labels
        .iter()
        .map(|l| l.trim())
        .find(|l| !l.is_empty() && !ralph_flow::spec::is_label(l))
    {
        return fail(&format!(
            "--labels: `{bad}` is not a label (ASCII letters, digits and `-`, `_`, `.`, `:`, `/`)"
        ));
    }
    let opts = WorkerOptions {
        store: location,
        labels: args
            .labels
            .iter()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect(),
        max_concurrency: args.max_concurrency,
        max_runs: args
            .max_runs
            .unwrap_or_else(|| args.max_concurrency.saturating_mul(4)),
        state_dir,
        poll: args.poll,
        run,
        prepare: ralph_flow::prepare::prepare_in,
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(&error_chain(&e)),
    };
    let local = tokio::task::LocalSet::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Never `eprintln!`: after SIGHUP its terminal is gone, and writing to it fails.
    let report: ralph_flow::run::worker::Report =
        Rc::new(|line: &str| say(&printable(&ralph_flow::secrets::redact(line))));
    let result = local.block_on(&rt, async move {
        let by_signal = async {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{SignalKind, signal};
                let (Ok(mut term), Ok(mut hup)) = (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::hangup()),
                ) else {
                    let _ = tokio::signal::ctrl_c().await;
                    return ralph_flow::exit::INTERRUPTED;
                };
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => ralph_flow::exit::INTERRUPTED,
                    _ = term.recv() => 0,
                    _ = hup.recv() => 0,
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
                ralph_flow::exit::INTERRUPTED
            }
        };
        let worker = work(opts, stopped, report);
        tokio::pin!(worker);
        tokio::select! {
            r = &mut worker => (r, 0),
            code = by_signal => {
                let _ = stop.send(true);
                (worker.await, code)
            }
        }
    });
    match result {
        (Ok(end), code) => {
            say(&format!(
                "worker stopped after {} run{}",
                end.runs,
                if end.runs == 1 { "" } else { "s" }
            ));
            code
        }
        (Err(e), _) => fail(&error_chain(&e)),
    }
}

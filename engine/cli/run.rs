//! `ralph-flow run`, `resume`, `approve` and `reject`.

use nix::sys::signal::Signal;
use ralph_flow::diag::error_chain;
use ralph_flow::secrets::redact;
use ralph_flow::text::printable;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ralph_flow::prepare::prepare_fetching;
use ralph_flow::run::progress::Mode;
use ralph_flow::run::{RunEnd, RunOptions, execute};
use ralph_flow::store::{Location, RunStatus, Store};

use super::EXIT_CONFIG;

/// Options shared by `run` and `resume`.
#[derive(clap::Args)]
#[command(mut_arg("state_dir", |a| a.help(
    "The state directory: the store and every attempt's artifacts"
)))]
pub(super) struct ExecArgs {
    #[command(flatten)]
    store: super::store::StoreArgs,
    /// The most stages running at once, whatever the workflow allows.
    #[arg(long, value_name = "N")]
    max_concurrency: Option<usize>,
    /// When only gates are left to wait on, stop with exit code 75 instead of polling;
    /// `ralph-flow resume` continues after `approve`/`reject`.
    #[arg(long)]
    no_wait: bool,
    /// Record every agent exchange to this file (JSON Lines) for `--replay`.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Answer every agent call from a recording: no agent runs, no network.
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,
    /// The first delay of the exponential backoff of retries (`2s`, `500ms`).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration)]
    backoff: Duration,
    /// How many times a transient agent failure (non-zero exit, HTTP 5xx) is retried.
    #[arg(long, value_name = "N", default_value_t = 3)]
    transient_retries: u32,
    /// Commit with synchronous=FULL (survives power loss, not only crashes).
    #[arg(long)]
    full_sync: bool,
    /// How to show progress (stderr): a live display on a terminal, else plain lines.
    #[arg(long, value_enum, default_value_t = ProgressArg::Auto)]
    progress: ProgressArg,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ProgressArg {
    Auto,
    Tty,
    Plain,
    Quiet,
}

pub(super) fn duration(s: &str) -> Result<Duration, NotADuration> {
    ralph_flow::model::parse_duration(s).ok_or_else(|| NotADuration(s.to_string()))
}

/// A command-line duration that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a duration (such as 500ms, 2s, 1m)")]
pub(super) struct NotADuration(String);

/// Why `run` or `resume` could not go on.
#[derive(Debug, thiserror::Error)]
pub(super) enum Failed {
    #[error("no current directory")]
    NoCurrentDir(#[source] std::io::Error),
    #[error("cannot start the runtime")]
    Runtime(#[source] std::io::Error),
    #[error(
        "there is no run state in {0} (no run has started here); pass --state-dir or --store to look elsewhere"
    )]
    NoState(String),
    #[error(transparent)]
    Store(#[from] ralph_flow::store::StoreError),
    #[error(transparent)]
    Run(#[from] ralph_flow::run::error::RunError),
    /// The user's config file has errors (rendered with their places).
    #[error("{0}")]
    UserConfig(String),
}

#[derive(clap::Args)]
pub(super) struct RunArgs {
    /// The workflow file.
    file: PathBuf,
    /// Set a param (`--set name=value`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Check the workflow, queue the run in the shared store (--store postgres://...) with
    /// its files, params and where it works (this directory, or its git repository and
    /// commit), print its id and return: a `ralph-flow worker` carries it out.
    #[arg(long)]
    detach: bool,
    /// With --detach: only workers that have all these labels claim the run (`gpu,linux`).
    #[arg(long, value_name = "A,B", value_delimiter = ',', requires = "detach")]
    labels: Vec<String>,
    #[command(flatten)]
    exec: ExecArgs,
}

#[derive(clap::Args)]
pub(super) struct ResumeArgs {
    /// The run to continue (`ralph-flow runs` lists them).
    run: String,
    /// Continue even though the workflow's files changed since the run started; the new
    /// version must still have every stage the run has settled.
    #[arg(long)]
    allow_changed: bool,
    #[command(flatten)]
    exec: ExecArgs,
}

#[derive(clap::Args)]
pub(super) struct AnswerArgs {
    /// The run.
    run: String,
    /// The gate (a stage id).
    gate: String,
    /// A comment; after a rejection it is the next attempt's feedback.
    #[arg(long)]
    comment: Option<String>,
    /// Who answers (default: $USER, else $LOGNAME, else the login name of the user).
    #[arg(long)]
    by: Option<String>,
    #[command(flatten)]
    store: super::store::StoreArgs,
}

pub(super) fn options(a: &ExecArgs) -> Result<RunOptions, Failed> {
    let cwd = std::env::current_dir().map_err(Failed::NoCurrentDir)?;
    let mut o = RunOptions::new(cwd.clone());
    o.state_dir = a.store.state_dir_in(&cwd);
    o.store = Some(a.store.location_in(&cwd)?);
    o.max_concurrency = a.max_concurrency;
    o.wait = !a.no_wait;
    o.record = a.record.clone();
    o.replay = a.replay.clone();
    o.backoff = a.backoff;
    o.transient_retries = a.transient_retries;
    o.full_sync = a.full_sync;
    o.notify = user_notifiers()?;
    o.progress = match a.progress {
        ProgressArg::Auto if std::io::stderr().is_terminal() => Mode::Tty,
        ProgressArg::Auto | ProgressArg::Plain => Mode::Plain,
        ProgressArg::Tty => Mode::Tty,
        ProgressArg::Quiet => Mode::Quiet,
    };
    Ok(o)
}

/// The notifiers of the user's config file (`$XDG_CONFIG_HOME/ralph-flow/config.toml`),
/// checked as a workflow's are; none when there is no such file. Its warnings are printed;
/// an error stops the run before it starts.
pub(super) fn user_notifiers() -> Result<Vec<ralph_flow::model::Notify>, Failed> {
    let Some(path) = ralph_flow::preset::user_config_file() else {
        return Ok(Vec::new());
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Failed::UserConfig(format!(
                "cannot read the user config file {}: {e}; fix its permissions or move it away",
                path.display()
            )));
        }
    };
    let mut sources = ralph_flow::source::Sources::new();
    let mut diags = ralph_flow::diag::Diagnostics::default();
    let found = ralph_flow::check::notify::user_config(&mut sources, &path, &text, &mut diags);
    let diags = diags.into_sorted();
    match found {
        Some(notify) => {
            super::print_diagnostics(&sources, &diags);
            Ok(notify)
        }
        None => Err(Failed::UserConfig(format!(
            "the user config file {} has errors; fix them (its [notify.NAME] tables are checked as a workflow's), or move the file away to run without it:\n{}",
            path.display(),
            ralph_flow::diag::render_short(&sources, &diags).trim_end()
        ))),
    }
}

pub(super) fn runtime() -> Result<tokio::runtime::Runtime, Failed> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Failed::Runtime)
}

/// `ralph-flow run`.
pub(super) fn run(args: &RunArgs) -> i32 {
    let Some(sets) = super::sets(&args.set) else {
        return EXIT_CONFIG;
    };
    let file = super::workflow_arg(&args.file);
    let prepared = match prepare_fetching(&file, &sets, &mut super::report_fetch) {
        Ok(p) => p,
        Err(e) => {
            super::print_diagnostics(&e.sources, &e.diagnostics);
            return EXIT_CONFIG;
        }
    };
    super::print_diagnostics(&prepared.sources, &prepared.warnings);
    let opts = match options(&args.exec) {
        Ok(o) => o,
        Err(e) => return fail(&error_chain(&e)),
    };
    if args.detach {
        return detach(args, &prepared, &opts);
    }
    finish(&args.exec, go(&prepared, opts))
}

/// `ralph-flow run --detach`: queues the run for the workers.
fn detach(args: &RunArgs, prepared: &ralph_flow::run::Prepared, opts: &RunOptions) -> i32 {
    let labels: Vec<String> = args
        .labels
        .iter()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if let Some(bad) = labels.iter().find(|l| !ralph_flow::spec::is_label(l)) {
        return fail(&format!(
            "--labels: `{bad}` is not a label (ASCII letters, digits and `-`, `_`, `.`, `:`, `/`)"
        ));
    }
    let id = match ralph_flow::run::worker::enqueue(prepared, opts, &labels) {
        Ok(id) => id,
        Err(e) => return fail(&error_chain(&e)),
    };
    if args.exec.json {
        println!(
            "{}",
            serde_json::json!({ "run": id, "status": "queued", "labels": labels })
        );
    } else {
        println!("{id}");
    }
    say(&format!(
        "queued run {id}; a worker (`ralph-flow worker --store ...`{}) carries it out; follow \
         it with `ralph-flow status {id}` or `ralph-flow serve` on the same store",
        if labels.is_empty() {
            String::new()
        } else {
            format!(" with --labels {}", labels.join(","))
        }
    ));
    0
}

/// Carries out a run. SIGTERM and SIGHUP (a `kill`, a service manager's stop, a CI cancel,
/// a closed terminal) stop it as Ctrl-C does: its stages and their programs are stopped, the
/// run is kept as interrupted, and `resume` continues it. Returns the run and the signal
/// that stopped it, if one did.
fn go(
    prepared: &ralph_flow::run::Prepared,
    mut opts: RunOptions,
) -> (Result<ralph_flow::run::RunResult, Failed>, Option<Signal>) {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return (Err(e), None),
    };
    let (tell, told) = tokio::sync::watch::channel(false);
    opts.stop = Some(told);
    let caught = std::cell::Cell::new(None);
    let result = rt.block_on(async {
        let (Ok(mut term), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) else {
            return execute(prepared, opts).await;
        };
        let signals = async {
            let caught_now = tokio::select! {
                _ = term.recv() => Signal::SIGTERM,
                _ = hup.recv() => Signal::SIGHUP,
            };
            caught.set(Some(caught_now));
            let _ = tell.send(true);
            // The run stops by itself now; this waits for it.
            std::future::pending::<std::convert::Infallible>().await
        };
        tokio::select! {
            r = execute(prepared, opts) => r,
            never = signals => match never {},
        }
    });
    (result.map_err(Failed::from), caught.get())
}

// The exit codes of `exit` are 128 + these signals, as a shell reports them.
const _: () = assert!(128 + Signal::SIGTERM as i32 == ralph_flow::exit::TERMINATED);
const _: () = assert!(128 + Signal::SIGHUP as i32 == ralph_flow::exit::HUNG_UP);

/// Prints a line on stderr, ignoring a failure: after a terminal hangs up (SIGHUP), writing
/// to it fails (EIO), and `eprintln!` would panic where the run ends.
pub(super) fn say(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

pub(super) fn fail(msg: &str) -> i32 {
    say(&format!("error: {}", printable(&redact(msg))));
    EXIT_CONFIG
}

/// Fails with why a run could not start or go on, naming the limit of the machine it met
/// (open files, disk space, file size) when its message does not already.
fn run_failed(e: &Failed) -> i32 {
    use ralph_flow::backend::process::Limit;
    use ralph_flow::run::error::{Halt, RunError};
    let mut msg = error_chain(e);
    if !matches!(e, Failed::Run(RunError::Halted(Halt::Limit { .. }))) {
        if let Some(limit) = Limit::met_by(e) {
            msg.push_str(&format!(
                "
  {} was reached: {}; then try again",
                limit.name(),
                limit.advice()
            ));
        }
    }
    fail(&msg)
}

fn finish(
    args: &ExecArgs,
    (result, signal): (Result<ralph_flow::run::RunResult, Failed>, Option<Signal>),
) -> i32 {
    let r = match result {
        Ok(r) => r,
        Err(e) => return run_failed(&e),
    };
    // Stopped by SIGTERM or SIGHUP: 128 + the signal, as a shell reports it
    // (`exit::TERMINATED`, `exit::HUNG_UP`).
    let stopped_by = signal.filter(|_| matches!(r.end, RunEnd::Interrupted));
    let code = match stopped_by {
        Some(sig) => 128 + sig as i32,
        None => r.end.code(),
    };
    if args.json {
        let (status, exit, message) = match &r.end {
            RunEnd::Exit {
                name,
                code: _,
                message,
            } => ("finished", Some(name.clone()), message.clone()),
            RunEnd::Waiting(_) => ("waiting", None, None),
            RunEnd::Interrupted => ("interrupted", None, None),
            RunEnd::Cancelled(c) => ("cancelled", None, c.reason.clone()),
        };
        // The keys in order, as a JSON object's; the outputs are written one at a time.
        #[derive(serde::Serialize)]
        struct Doc<'a> {
            code: i32,
            exit: Option<String>,
            message: Option<String>,
            outputs: &'a ralph_flow::run::RanOutputs,
            run: &'a str,
            status: &'a str,
            /// As `status --json` shows it: counts of `null` when no call reported usage.
            usage: serde_json::Value,
            waiting_on: Vec<String>,
        }
        let doc = Doc {
            code,
            exit: exit.map(|e| redact(&e).into_owned()),
            message: message.map(|m| redact(&m).into_owned()),
            outputs: &r.outputs,
            run: &r.run_id,
            status,
            usage: r.usage.shown(),
            waiting_on: match &r.end {
                RunEnd::Waiting(g) => g.iter().map(|g| redact(g).into_owned()).collect(),
                _ => Vec::new(),
            },
        };
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let written = serde_json::to_writer_pretty(&mut out, &doc)
            .map_err(std::io::Error::from)
            .and_then(|()| {
                use std::io::Write as _;
                writeln!(out)?;
                out.flush()
            });
        if let Err(e) = written {
            return fail(&format!("cannot write the result: {e}"));
        }
    }
    match &r.end {
        RunEnd::Exit {
            name,
            code,
            message,
        } => {
            say(&format!(
                "run {} ended: {name} (exit code {code}){}{}",
                r.run_id,
                usage_text(&r.usage),
                message
                    .as_ref()
                    .map(|m| format!("\n  {}", printable(&redact(m)).replace('\n', "\n  ")))
                    .unwrap_or_default()
            ));
        }
        RunEnd::Waiting(gates) => {
            say(&format!(
                "run {} is waiting on {}; answer with `ralph-flow approve {} GATE` or `ralph-flow reject {} GATE --comment ...`, then `ralph-flow resume {}`",
                r.run_id,
                if gates.is_empty() {
                    "a gate".to_string()
                } else {
                    gates.join(", ")
                },
                r.run_id,
                r.run_id,
                r.run_id
            ));
        }
        RunEnd::Interrupted => {
            let by = stopped_by
                .map(|sig| format!(" by {}", sig.as_str()))
                .unwrap_or_default();
            say(&format!(
                "run {} was interrupted{by}; continue it with `ralph-flow resume {}`",
                r.run_id, r.run_id
            ));
        }
        RunEnd::Cancelled(c) => {
            say(&format!(
                "run {} was cancelled: {} (by {} at {}); its stages were stopped",
                r.run_id,
                printable(&redact(c.reason.as_deref().unwrap_or("no reason given"))),
                printable(&redact(&c.by)),
                ralph_flow::store::rfc3339(c.at)
            ));
        }
    }
    code
}

/// Shows a run's usage shortly: ` · 13.5k tokens · $0.0336`; ` · tokens unknown (3 calls
/// reported no usage)` when no call reported any, ` · ≥ 13.5k tokens (1 call reported no
/// usage)` when some did not ([`tokens_note`](ralph_flow::run::progress::tokens_note)).
fn usage_text(u: &ralph_flow::backend::Usage) -> String {
    use ralph_flow::run::progress::{short_tokens, tokens_note};
    let mut s = tokens_note(u);
    if let Some(why) = u.unreported_text() {
        s.push_str(&format!(" ({why})"));
    } else if u.tokens() > 0 && u.cached_tokens > 0 {
        s.push_str(&format!(" ({} cached)", short_tokens(u.cached_tokens)));
    }
    if let Some(c) = u.cost_usd {
        s.push_str(&format!(" · ${c:.4}"));
    }
    s
}

pub(super) fn open_store(location: &Location) -> Result<Box<dyn Store + Send>, Failed> {
    if !location.exists() {
        return Err(Failed::NoState(location.to_string()));
    }
    Ok(location.open(&ralph_flow::store::OpenOptions::default())?)
}

/// `ralph-flow resume`.
pub(super) fn resume(args: &ResumeArgs) -> i32 {
    let opts = match options(&args.exec) {
        Ok(o) => o,
        Err(e) => return fail(&error_chain(&e)),
    };
    let store = match open_store(&opts.location()) {
        Ok(s) => s,
        Err(e) => return run_failed(&e),
    };
    let record = match store.run(&args.run) {
        Ok(Some(r)) => r,
        Ok(None) => {
            let recent: Vec<String> = store
                .runs(5)
                .unwrap_or_default()
                .into_iter()
                .map(|r| format!("{} ({}, {})", r.id, r.workflow, r.status.as_str()))
                .collect();
            return fail(&format!(
                "there is no run `{}`{}",
                args.run,
                if recent.is_empty() {
                    String::new()
                } else {
                    format!("; recent runs: {}", recent.join(", "))
                }
            ));
        }
        Err(e) => return fail(&error_chain(&e)),
    };
    if record.status == RunStatus::Finished {
        return fail(&format!(
            "run `{}` has already finished{}; start a new run with `ralph-flow run {}`",
            record.id,
            record
                .exit
                .as_ref()
                .map(|(n, c)| format!(" with `{n}` ({c})"))
                .unwrap_or_default(),
            record.file
        ));
    }
    if record.status == RunStatus::Cancelled {
        return fail(&format!(
            "run `{}` was cancelled {}, so it cannot be resumed; start a new run with \
             `ralph-flow run {}`",
            record.id,
            record
                .cancellation()
                .map_or_else(|| String::from("(by someone unknown)"), |c| c.text()),
            record.file
        ));
    }
    let sets = record.param_sets();
    let prepared = match prepare_fetching(Path::new(&record.file), &sets, &mut super::report_fetch)
    {
        Ok(p) => p,
        Err(e) => {
            super::print_diagnostics(&e.sources, &e.diagnostics);
            return EXIT_CONFIG;
        }
    };
    if prepared.hash != record.workflow_hash {
        if !args.allow_changed {
            return fail(&format!(
                "the workflow {} changed since run `{}` started; resume with --allow-changed to continue with the new version (settled stages are kept), or start a new run",
                record.file, record.id
            ));
        }
        let settled = store.nodes(&record.id).unwrap_or_default();
        let missing: Vec<String> = settled
            .iter()
            .filter(|n| !n.node.starts_with('@') && !n.scope.contains('>'))
            .filter(|n| !prepared.plan.nodes.iter().any(|p| p.name == n.node))
            .map(|n| n.node.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !missing.is_empty() {
            return fail(&format!(
                "the changed workflow no longer has stages that run `{}` settled: {}; restore them or start a new run",
                record.id,
                missing.join(", ")
            ));
        }
        say("note: the workflow changed since the run started; continuing with the new version");
    }
    drop(store);
    let mut opts = opts;
    opts.resume = Some(record.id.clone());
    finish(&args.exec, go(&prepared, opts))
}

/// `ralph-flow approve` and `ralph-flow reject`.
pub(super) fn answer(args: &AnswerArgs, approved: bool) -> i32 {
    use ralph_flow::run::answer::{AnswerError, answer};
    // Said before the store is opened, in the words of the command line.
    if !approved && args.comment.is_none() {
        return fail("a rejection needs --comment: it is the feedback of the next attempt");
    }
    let location = match args.store.location() {
        Ok(l) => l,
        Err(e) => return fail(&error_chain(&e)),
    };
    let mut store = match open_store(&location) {
        Ok(s) => s,
        Err(e) => return fail(&error_chain(&e)),
    };
    let by = args
        .by
        .clone()
        .unwrap_or_else(ralph_flow::run::answer::who_answers);
    let answered = match answer(
        store.as_mut(),
        &args.run,
        &args.gate,
        approved,
        args.comment.clone(),
        &by,
    ) {
        Ok(a) => a,
        Err(AnswerError::NoComment) => {
            return fail("a rejection needs --comment: it is the feedback of the next attempt");
        }
        Err(e) => return fail(&error_chain(&e)),
    };
    if let Some(e) = &answered.event_error {
        say(&format!(
            "warning: the answer is recorded, but not its event: {}",
            error_chain(e)
        ));
    }
    let verb = if approved { "approved" } else { "rejected" };
    let next = answered.next.text(&answered.approval.run);
    say(&format!(
        "{verb} gate `{}` of run {} as {by}; {next}",
        answered.gate.qualified(),
        answered.approval.run
    ));
    0
}

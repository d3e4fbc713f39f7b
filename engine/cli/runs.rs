//! `ralph-flow runs`, `status` and `logs`: read what runs did from the store.

use std::path::{Path, PathBuf};

use ralph_flow::backend::Usage;
use ralph_flow::secrets::redact;
use ralph_flow::store::{
    AttemptRecord, Event, GateRequest, Location, LockOwner, NodeRecord, NodeState, RunRecord,
    RunStatus, Store, Unplaced,
};
use ralph_flow::store::{Known, now_ms, rfc3339};
use ralph_flow::text::duration_ms;
use ralph_flow::text::printable;
use serde::Serialize;

/// The state directory when `--state-dir` is not given.
use super::store::DEFAULT_STATE_DIR;

/// How many recent run ids an unknown-run error lists.
const RECENT: usize = 5;

/// The exit code for a store that cannot be read.
const EXIT_STORE: i32 = 1;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(super) struct RunsArgs {
    #[command(subcommand)]
    command: Option<RunsCommand>,
    #[command(flatten)]
    store: super::store::StoreArgs,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
    /// Show at most this many runs, newest first.
    #[arg(long, value_name = "N", default_value_t = 20)]
    limit: usize,
}

/// What `runs` does besides listing.
#[derive(clap::Subcommand)]
enum RunsCommand {
    /// Remove runs that ended (finished or cancelled), older than an age or beyond a count
    /// per workflow, with their directories, workspaces and rows; say how much was freed.
    /// Never a queued, running or waiting run. Also `ralph-flow gc`.
    Prune(super::prune::Args),
}

#[derive(clap::Args)]
pub(super) struct StatusArgs {
    /// The run (default: the newest).
    run: Option<String>,
    #[command(flatten)]
    store: super::store::StoreArgs,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub(super) struct LogsArgs {
    /// The run.
    run: String,
    /// Show only this stage's events, and its attempts with their records (prompt, raw
    /// answer, output, ...).
    #[arg(long, value_name = "STAGE")]
    stage: Option<String>,
    /// With `--stage`: print each attempt's records in full, not only their names.
    #[arg(long, requires = "stage")]
    text: bool,
    #[command(flatten)]
    store: super::store::StoreArgs,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub(super) struct ExportArgs {
    /// The run.
    run: String,
    /// Where to write the files (default: the run's directory, beside what its programs and
    /// agents wrote there).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    #[command(flatten)]
    store: super::store::StoreArgs,
}

/// `ralph-flow export`: a run's attempt records (prompts, answers, outputs, feedback) as
/// files, `SCOPE/STAGE/attempt-N/prompt.md` and so on.
pub(super) fn export(args: &ExportArgs) -> i32 {
    exit_code(write_export(args))
}

fn write_export(args: &ExportArgs) -> Result<(), Failure> {
    let (store, run) = open_run(&location(&args.store)?, Some(&args.run))?;
    let dir = PathBuf::from(&run.dir);
    // A run coordinated on another machine (a shared store) has its directory there.
    if args.out.is_none() && store.keeps_records() && !dir.is_dir() {
        return Err(Failure(
            format!(
                "run {}'s directory {} is not on this machine (another machine coordinated \
                 the run); give `--out DIR` to write its records there",
                run.id,
                dir.display()
            ),
            super::EXIT_CONFIG,
        ));
    }
    let out = args.out.clone().unwrap_or_else(|| dir.clone());
    let n = ralph_flow::run::artifacts::export(store.as_ref(), &run, &out)
        .map_err(|e| Failure(e.message(), EXIT_STORE))?;
    println!(
        "wrote {n} file{} of run {} under {}",
        if n == 1 { "" } else { "s" },
        run.id,
        out.display()
    );
    Ok(())
}

/// `ralph-flow runs`: a table of runs, newest first; `runs prune`.
pub(super) fn runs(args: &RunsArgs) -> i32 {
    match &args.command {
        Some(RunsCommand::Prune(prune)) => super::prune::run(prune),
        None => exit_code(list(args)),
    }
}

/// `ralph-flow status`: a run's settled nodes, waiting gates and usage.
pub(super) fn status(args: &StatusArgs) -> i32 {
    exit_code(show_status(args))
}

/// `ralph-flow logs`: a run's events in order.
pub(super) fn logs(args: &LogsArgs) -> i32 {
    exit_code(show_logs(args))
}

/// Why a command failed: the message and the exit code.
pub(super) struct Failure(pub(super) String, pub(super) i32);

impl From<ralph_flow::store::StoreError> for Failure {
    fn from(e: ralph_flow::store::StoreError) -> Self {
        Failure(ralph_flow::diag::error_chain(&e), EXIT_STORE)
    }
}

pub(super) fn exit_code(result: Result<(), Failure>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(Failure(message, code)) => {
            eprintln!("error: {}", printable(&redact(&message)));
            code
        }
    }
}

/// Opens the store for reading; `None` when there is none yet (reading does not create one).
fn open(location: &Location) -> Result<Option<Box<dyn Store + Send>>, Failure> {
    Ok(location.open_to_read()?)
}

fn location(store: &super::store::StoreArgs) -> Result<Location, Failure> {
    store
        .location()
        .map_err(|e| Failure(ralph_flow::diag::error_chain(&e), super::EXIT_CONFIG))
}

/// Opens the store and finds the run `id`, or the newest run when `id` is `None`; fails with
/// [`super::EXIT_CONFIG`] naming recent runs when there is no such run.
fn open_run(
    location: &Location,
    id: Option<&str>,
) -> Result<(Box<dyn Store + Send>, RunRecord), Failure> {
    let Some(store) = open(location)? else {
        return Err(unknown_run(location, id, &[]));
    };
    let found = match id {
        Some(id) => store.run(id)?,
        None => store.runs(1)?.into_iter().next(),
    };
    match found {
        Some(run) => Ok((store, run)),
        None => {
            let recent: Vec<String> = store.runs(RECENT)?.into_iter().map(|r| r.id).collect();
            Err(unknown_run(location, id, &recent))
        }
    }
}

fn unknown_run(location: &Location, id: Option<&str>, recent: &[String]) -> Failure {
    let what = match id {
        Some(id) => format!("no run {id} in {location}"),
        None => format!("no runs in {location}"),
    };
    let hint = if recent.is_empty() {
        String::from("; there are no runs yet")
    } else {
        format!("; recent runs: {}", recent.join(", "))
    };
    Failure(format!("{what}{hint}"), super::EXIT_CONFIG)
}

pub(super) fn print_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure(format!("cannot write JSON: {e}"), EXIT_STORE))?;
    println!("{}", redact(&text));
    Ok(())
}

/// A run with how long it has taken.
#[derive(Serialize)]
struct RunView<'a> {
    #[serde(flatten)]
    run: &'a RunRecord,
    duration_ms: i64,
    /// Its size on disk (`runs` only): the files of its directories on this machine (its
    /// run directory, workspaces and units' directories) plus an estimate of its rows in
    /// the store and its spilled outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    size_bytes: Option<u64>,
    /// Its work that waits for a worker none of the live ones can take, and why (only on a
    /// store with workers).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unplaced: Vec<Unplaced>,
}

impl<'a> RunView<'a> {
    fn new(run: &'a RunRecord) -> Self {
        // A running run is still going; the others stopped at their last update.
        let end = if run.status == RunStatus::Running {
            now_ms()
        } else {
            run.updated_at
        };
        RunView {
            run,
            duration_ms: (end - run.started_at).max(0),
            size_bytes: None,
            unplaced: Vec::new(),
        }
    }

    /// With why its work waits, read from `store` for a run that waits for workers (queued,
    /// or running with units).
    fn placed_by(mut self, store: &dyn Store) -> Result<Self, Failure> {
        if matches!(self.run.status, RunStatus::Queued | RunStatus::Running) {
            self.unplaced = store.unplaced(&self.run.id)?;
        }
        Ok(self)
    }
}

fn list(args: &RunsArgs) -> Result<(), Failure> {
    let place = location(&args.store)?;
    let store = open(&place)?;
    let runs = match &store {
        Some(store) => store.runs(args.limit)?,
        None => Vec::new(),
    };
    let mut views: Vec<RunView<'_>> = match &store {
        Some(store) => runs
            .iter()
            .map(|r| RunView::new(r).placed_by(store.as_ref()))
            .collect::<Result<_, _>>()?,
        None => runs.iter().map(RunView::new).collect(),
    };
    if let Some(store) = &store {
        let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
        let stored = store.stored_sizes(&ids)?;
        let state_dir = std::path::absolute(&args.store.state_dir)
            .unwrap_or_else(|_| args.store.state_dir.clone());
        for (i, v) in views.iter_mut().enumerate() {
            v.size_bytes = Some(super::prune::run_size(v.run, &state_dir, stored.get(i)));
        }
    }
    if args.json {
        return print_json(&views);
    }
    if views.is_empty() {
        println!("no runs in {place}");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            vec![
                v.run.id.clone(),
                v.run.workflow.clone(),
                match v.unplaced.first() {
                    // Why it waits, shortly: the whole line is in `status`.
                    Some(u) => format!("{} ({})", v.run.status.as_str(), u.text()),
                    None => v.run.status.as_str().to_string(),
                },
                exit_text(v.run),
                rfc3339(v.run.started_at),
                duration_ms(v.duration_ms),
                v.size_bytes
                    .map_or_else(|| String::from("-"), ralph_flow::text::bytes),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "ID", "WORKFLOW", "STATUS", "EXIT", "STARTED", "DURATION", "SIZE"
            ],
            &rows
        )
    );
    Ok(())
}

/// A waiting gate with the commands that answer it.
#[derive(Serialize)]
struct GateView<'a> {
    #[serde(flatten)]
    gate: &'a GateRequest,
    approve: String,
    reject: String,
}

#[derive(Serialize)]
struct StatusView<'a> {
    #[serde(flatten)]
    run: RunView<'a>,
    lock: Option<LockOwner>,
    nodes: &'a [NodeRecord],
    pending_gates: Vec<GateView<'a>>,
    /// The usage of every settled stage: see [`Total`].
    #[serde(flatten)]
    total: Total,
    /// The id of the run's OpenTelemetry trace (its spans carry it when exported).
    trace_id: String,
}

/// A run's usage, as `status --json` writes it: `total` (its counts `null` when no call
/// reported any, [`Usage::serialize_shown`]) and `usage_unknown_calls` (how many calls
/// reported no usage: the counts leave their tokens out).
struct Total(Usage);

impl Serialize for Total {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("total", &self.0.as_shown())?;
        m.serialize_entry("usage_unknown_calls", &self.0.unreported)?;
        m.end()
    }
}

fn show_status(args: &StatusArgs) -> Result<(), Failure> {
    let (store, run) = open_run(&location(&args.store)?, args.run.as_deref())?;
    let nodes = store.nodes(&run.id)?;
    let gates = store.pending_gates(&run.id)?;
    let lock = store.lock_holder(&run.id)?;
    let mut total = Usage::default();
    for node in &nodes {
        total.add(&node.usage);
    }
    let nodes = with_region_sums(nodes);
    let state_flag = if args.store.state_dir == Path::new(DEFAULT_STATE_DIR) {
        String::new()
    } else {
        format!(
            " --state-dir {}",
            ralph_flow::shell::quote(&args.store.state_dir.to_string_lossy())
        )
    };
    let gate_views: Vec<GateView<'_>> = gates
        .iter()
        .map(|g| {
            let target = format!(
                "{} {}{state_flag}",
                ralph_flow::shell::quote(&run.id),
                ralph_flow::shell::quote(&g.qualified())
            );
            GateView {
                gate: g,
                approve: format!("ralph-flow approve {target}"),
                reject: format!("ralph-flow reject {target} --comment \"...\""),
            }
        })
        .collect();
    let view = StatusView {
        run: RunView::new(&run).placed_by(store.as_ref())?,
        lock,
        nodes: &nodes,
        pending_gates: gate_views,
        total: Total(total),
        trace_id: ralph_flow::run::trace::TraceIds::trace_id(&run),
    };
    if args.json {
        return print_json(&view);
    }
    print!("{}", printable(&redact(&status_text(&view))));
    Ok(())
}

fn status_text(view: &StatusView<'_>) -> String {
    let run = view.run.run;
    let mut out = format!(
        "run {}: {} ({})\nstatus: {}{}\nstarted: {}, duration {}\n",
        run.id,
        run.workflow,
        run.file,
        run.status.as_str(),
        match &run.exit {
            Some(_) => format!(", exit {}", exit_text(run)),
            None => String::new(),
        },
        rfc3339(run.started_at),
        duration_ms(view.run.duration_ms),
    );
    if let Some(c) = run.cancellation() {
        out += &format!("cancelled {}\n", c.text());
    }
    // Where traces are exported from here, the id to look the run up by.
    if ralph_flow::run::trace::endpoint().is_some() {
        out += &format!("trace: {}\n", view.trace_id);
    }
    for u in &view.run.unplaced {
        out += &format!("{}\n", u.line());
    }
    if let Some(lock) = &view.lock {
        out += &format!(
            "held by pid {} on {} since {}\n",
            lock.pid,
            lock.host,
            rfc3339(lock.since)
        );
    }
    // The executor's own decisions (`@` nodes) are for resume, not for people.
    let mut scopes: Vec<(&str, Vec<&NodeRecord>)> = Vec::new();
    for node in view.nodes.iter().filter(|n| !n.node.starts_with('@')) {
        match scopes.iter_mut().find(|(s, _)| *s == node.scope) {
            Some((_, nodes)) => nodes.push(node),
            None => scopes.push((&node.scope, vec![node])),
        }
    }
    if scopes.is_empty() {
        out += "\nno settled stages yet\n";
    }
    for (scope, nodes) in scopes {
        let title = if scope.is_empty() { "top level" } else { scope };
        out += &format!("\n{title}:\n");
        let rows: Vec<Vec<String>> = nodes
            .iter()
            .map(|n| {
                vec![
                    n.node.clone(),
                    n.state.as_str().to_string(),
                    n.attempts.to_string(),
                    tokens(&n.usage),
                    cost(&n.usage),
                ]
            })
            .collect();
        out += &indent(&table(
            &[
                "STAGE",
                "STATE",
                "ATTEMPTS",
                "TOKENS (IN/OUT/CACHED)",
                "COST",
            ],
            &rows,
        ));
    }
    if !view.pending_gates.is_empty() {
        out += "\nwaiting for an answer:\n";
    }
    for g in &view.pending_gates {
        let gate = g.gate;
        let place = if gate.scope.is_empty() {
            String::new()
        } else {
            format!(" (in {})", gate.scope)
        };
        out += &format!("  {}{place}: {}\n", gate.gate, gate.message);
        if !gate.show.is_empty() {
            out += &format!("    look at: {}\n", gate.show.join(", "));
        }
        out += &format!("    asked: {}\n", rfc3339(gate.requested_at));
        if let Some(deadline) = gate.deadline {
            out += &format!("    due: {}\n", rfc3339(deadline));
        }
        out += &format!("    approve: {}\n    reject:  {}\n", g.approve, g.reject);
    }
    out += &format!("\n{}\n", total_text(&view.total.0));
    out
}

#[derive(Serialize)]
struct LogsView<'a> {
    run: &'a str,
    stage: Option<&'a str>,
    events: &'a [Event],
    /// The stage's attempts (with `--stage` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<&'a [AttemptRecord]>,
    /// The stage's attempts' records by path under the run's directory (with `--stage`
    /// only).
    #[serde(skip_serializing_if = "Option::is_none")]
    records: Option<&'a std::collections::BTreeMap<String, String>>,
}

/// Gives each loop, for_each and group row what its body did: the usage of every stage
/// below it, and as attempts the number of iterations or items that ran. (The store keeps
/// a region's own record; its body's stages are recorded in child scopes `NAME#KEY`.)
fn with_region_sums(mut nodes: Vec<NodeRecord>) -> Vec<NodeRecord> {
    let sums: Vec<Option<(Usage, u32)>> = nodes
        .iter()
        .map(|region| {
            let prefix = if region.scope.is_empty() {
                format!("{}#", region.node)
            } else {
                format!("{}/{}#", region.scope, region.node)
            };
            let mut usage = Usage::default();
            let mut bodies: Vec<&str> = Vec::new();
            for n in nodes.iter().filter(|n| n.scope.starts_with(&prefix)) {
                usage.add(&n.usage);
                let body = n.scope[prefix.len()..].split('/').next().unwrap_or("");
                if !bodies.contains(&body) {
                    bodies.push(body);
                }
            }
            (!bodies.is_empty()).then(|| (usage, u32::try_from(bodies.len()).unwrap_or(u32::MAX)))
        })
        .collect();
    for (node, sum) in nodes.iter_mut().zip(sums) {
        if let Some((usage, bodies)) = sum {
            node.usage = usage;
            node.attempts = bodies;
        }
    }
    nodes
}

fn show_logs(args: &LogsArgs) -> Result<(), Failure> {
    let (store, run) = open_run(&location(&args.store)?, Some(&args.run))?;
    let stage = args.stage.as_deref();
    let events = store.events(&run.id, stage)?;
    let attempts = match stage {
        Some(stage) => Some(store.attempts(&run.id, Some(stage))?),
        None => None,
    };
    // The stage's attempts' records, from the store or the run's `artifacts.jsonl`.
    let records = match &attempts {
        Some(attempts) => Some(attempt_records(store.as_ref(), &run, attempts)?),
        None => None,
    };
    let view = LogsView {
        run: &run.id,
        stage,
        events: &events,
        attempts: attempts.as_deref(),
        records: records.as_ref(),
    };
    if args.json {
        return print_json(&view);
    }
    // Settled stages show what they used.
    let nodes = store.nodes(&run.id)?;
    let usage: std::collections::HashMap<(&str, &str), &Usage> = nodes
        .iter()
        .map(|n| ((n.scope.as_str(), n.node.as_str()), &n.usage))
        .collect();
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            let place = match (e.scope.as_str(), e.node.as_str()) {
                ("", "") => String::from("-"),
                ("", node) => node.to_string(),
                (scope, "") => scope.to_string(),
                (scope, node) => format!("{scope}/{node}"),
            };
            let used = usage
                .get(&(e.scope.as_str(), e.node.as_str()))
                .filter(|_| NodeState::parse(&e.kind).is_some())
                .filter(|u| !u.is_empty())
                .map_or_else(String::new, |u| format!("{} {}", tokens(u), cost(u)));
            vec![
                rfc3339(e.at),
                place,
                e.kind.clone(),
                used,
                e.message.clone(),
            ]
        })
        .collect();
    if rows.is_empty() {
        match stage {
            Some(stage) => println!("no events of stage {stage} in run {}", run.id),
            None => println!("no events in run {}", run.id),
        }
    } else {
        print!(
            "{}",
            table(
                &[
                    "TIME",
                    "WHERE",
                    "KIND",
                    "TOKENS (IN/OUT/CACHED) COST",
                    "MESSAGE"
                ],
                &rows
            )
        );
        let mut total = Usage::default();
        for n in &nodes {
            total.add(&n.usage);
        }
        println!("\n{}", total_text(&total));
    }
    if let Some(attempts) = &attempts {
        if !attempts.is_empty() {
            println!("\nattempts:");
        }
        let rows: Vec<Vec<String>> = attempts
            .iter()
            .map(|a| {
                let scope = if a.scope.is_empty() { "-" } else { &a.scope };
                vec![
                    scope.to_string(),
                    format!("#{}", a.attempt),
                    a.state.to_string(),
                    a.agent.clone().unwrap_or_else(|| String::from("-")),
                    tokens(&a.usage),
                    a.dir.clone(),
                ]
            })
            .collect();
        if !rows.is_empty() {
            print!(
                "{}",
                indent(&table(
                    &["SCOPE", "ATTEMPT", "STATE", "AGENT", "TOKENS", "DIRECTORY"],
                    &rows
                ))
            );
            print_records(records.as_ref(), args.text);
            println!(
                "\n(each attempt's prompt, answer and output: `ralph-flow export {}` writes them into these directories)",
                run.id
            );
        }
    }
    Ok(())
}

/// The records of each attempt (by path under the run's directory, masked), read per
/// attempt: through the store's key where it keeps them.
fn attempt_records(
    store: &dyn Store,
    run: &RunRecord,
    attempts: &[AttemptRecord],
) -> Result<std::collections::BTreeMap<String, String>, Failure> {
    let mut all = std::collections::BTreeMap::new();
    for a in attempts {
        let Some(prefix) = ralph_flow::run::artifacts::attempt_prefix(run, a) else {
            continue;
        };
        let found = ralph_flow::run::artifacts::records(store, run, &prefix)
            .map_err(|e| Failure(e.message(), EXIT_STORE))?;
        all.extend(found);
    }
    Ok(all)
}

/// Under the attempts' table: each attempt's records, by name with their size, or in full
/// (`--text`).
fn print_records(records: Option<&std::collections::BTreeMap<String, String>>, text: bool) {
    let Some(records) = records.filter(|r| !r.is_empty()) else {
        return;
    };
    println!("\nrecords:");
    for (path, body) in records {
        let lines = body.lines().count();
        let size = format!(
            "{lines} line{}, {} B",
            if lines == 1 { "" } else { "s" },
            body.len()
        );
        if text {
            println!("\n== {} ({size})", printable(path));
            println!("{}", printable(body).trim_end());
        } else {
            println!("  {}  ({size})", printable(path));
        }
    }
}

fn exit_text(run: &RunRecord) -> String {
    match &run.exit {
        Some((name, code)) => format!("{name} ({code})"),
        None => String::from("-"),
    }
}

/// Tokens as `IN/OUT/CACHED` ([`Known`]): `unknown` when no call reported usage, and a
/// lower bound (`≥ IN/OUT/CACHED (N calls reported no usage)`) when some calls did not.
/// Never a 0 for a call that reported nothing.
fn tokens(u: &Usage) -> String {
    match (in_out_cached(u), u.unreported_text()) {
        (known @ Known::AtLeast(_), Some(why)) => format!("{known} ({why})"),
        (known, _) => known.to_string(),
    }
}

/// The counts as `IN/OUT/CACHED`, known as the tokens are.
fn in_out_cached(u: &Usage) -> Known<String> {
    u.known()
        .map(|_| format!("{}/{}/{}", u.input_tokens, u.output_tokens, u.cached_tokens))
}

/// The total line of `status` and `logs`: `total: IN/OUT/CACHED tokens (in/out/cached),
/// cost C`, with a lower bound or `unknown` said as [`tokens`] does.
fn total_text(u: &Usage) -> String {
    let known = in_out_cached(u);
    let what = (known != Known::Unknown).then_some("in/out/cached");
    let why = u.unreported_text();
    let notes: Vec<&str> = what.into_iter().chain(why.as_deref()).collect();
    format!(
        "total: {known} tokens ({}), cost {}",
        notes.join("; "),
        cost(u)
    )
}

fn cost(u: &Usage) -> String {
    u.cost_usd
        .map_or_else(|| String::from("-"), |c| format!("${c:.4}"))
}

/// Lays out rows under headers in columns, the last column unpadded.
pub(super) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    // What agents and programs wrote is shown, never interpreted by the terminal.
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| printable(&redact(c)).into_owned())
                .collect()
        })
        .collect();
    let rows = &rows;
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                s += cell;
            } else {
                s += &format!("{cell:<w$}  ");
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out += &line(row.iter().map(String::as_str).collect());
    }
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["A", "BB"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "w".into()]],
        );
        assert_eq!(t, "A    BB\nxxx  y\nz    w\n");
    }
}

//! What the store says about runs and stages, shaped for the pages and the API: summaries
//! of runs, the live state of each node of a plan, the attempts of a stage with what they
//! wrote.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::store::{
    AttemptRecord, AttemptState, Event, GateRequest, Known, NodeRecord, RunRecord, RunStatus,
    Store, StoreError, Usage, now_ms, rfc3339,
};
use crate::text::duration_ms;

use super::cache::{Copies, Kinds, Records};

/// One run, as the runs page and `/api/runs` show it.
#[derive(Clone, Debug, Serialize)]
pub(super) struct RunSummary {
    pub id: String,
    pub workflow: String,
    pub file: String,
    /// `running`, `waiting` (on a gate), `interrupted`, `finished`.
    pub state: &'static str,
    /// What the state column says (`finished: done (0)`).
    pub state_text: String,
    /// `ok`, `bad`, `live` or `idle`: the colour of the state.
    pub tone: &'static str,
    pub exit: Option<String>,
    pub exit_code: Option<i64>,
    pub started_at: i64,
    pub started: String,
    pub updated_at: i64,
    pub duration_ms: i64,
    pub duration: String,
    /// The run's usage (its attempts'), serialized with what is said of it: see
    /// [`RunUsage`].
    #[serde(flatten)]
    pub usage: RunUsage,
    pub gates_waiting: usize,
    pub stages_done: usize,
    pub stages_failed: usize,
    /// The stages running now (`scope/stage` attempt N).
    pub running: Vec<String>,
    /// Why its units of work wait (`stage S waits for a worker: no live worker has the
    /// label ...`), on a store with workers; why the run itself waits is its `state_text`.
    pub waiting_for: Vec<String>,
    /// The id of the run's OpenTelemetry trace (see `run::trace`).
    pub trace_id: String,
}

/// A run's usage, summed over its attempts. A summary writes it as `usage` (its counts
/// `null` when no call reported usage, [`Usage::serialize_shown`]) and what is said of it,
/// made from it as it is written: `tokens` (input plus output; `null` when no call reported
/// usage, a lower bound when some did not), `tokens_text` (`13530`, `≥ 13530` or
/// `unknown`), `usage_unknown_calls` (how many calls reported no usage), `usage_note` (`3
/// calls reported no usage`, when some did) and `cost` ([`cost_text`]).
#[derive(Clone, Debug, Default)]
pub(super) struct RunUsage(pub Usage);

impl Serialize for RunUsage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let u = &self.0;
        let known = u.known();
        let mut m = s.serialize_map(Some(6))?;
        m.serialize_entry("usage", &u.as_shown())?;
        m.serialize_entry("tokens", &known.value())?;
        m.serialize_entry("tokens_text", &known.to_string())?;
        m.serialize_entry("usage_unknown_calls", &u.unreported)?;
        m.serialize_entry("usage_note", &u.unreported_text())?;
        m.serialize_entry("cost", &cost_text(u.cost_usd))?;
        m.end()
    }
}

/// Everything about one run that the run page shows. Serialized (`/api/runs/ID`) as
/// `summary`, `record`, `nodes` (settled, without the executor's own decisions `@...`),
/// `attempts`, `gates`, `events` and `live`.
#[derive(Clone, Debug)]
pub(super) struct RunDetail {
    pub summary: RunSummary,
    pub record: RunRecord,
    /// Its nodes, attempts and events: the monitor's copy ([`super::cache`]), shared.
    pub records: Arc<Records>,
    pub gates: Vec<GateView>,
    /// The live state of each node of the plan, by stage id.
    pub live: BTreeMap<String, NodeLive>,
}

impl RunDetail {
    /// Settled nodes, without the executor's own decisions (`@...`).
    pub(super) fn nodes(&self) -> impl Iterator<Item = &NodeRecord> {
        self.records
            .nodes
            .iter()
            .filter(|n| !n.node.starts_with('@'))
    }

    pub(super) fn attempts(&self) -> &[AttemptRecord] {
        &self.records.attempts
    }

    pub(super) fn events(&self) -> &[Event] {
        &self.records.events
    }
}

impl Serialize for RunDetail {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        /// The nodes, serialized as a list as they are iterated.
        struct Nodes<'a>(&'a RunDetail);
        impl Serialize for Nodes<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.nodes())
            }
        }
        let mut m = s.serialize_struct("RunDetail", 7)?;
        m.serialize_field("summary", &self.summary)?;
        m.serialize_field("record", &self.record)?;
        m.serialize_field("nodes", &Nodes(self))?;
        m.serialize_field("attempts", self.attempts())?;
        m.serialize_field("gates", &self.gates)?;
        m.serialize_field("events", self.events())?;
        m.serialize_field("live", &self.live)?;
        m.end()
    }
}

/// A gate that waits, as a page shows it.
#[derive(Clone, Debug, Serialize)]
pub(super) struct GateView {
    /// `SCOPE/GATE`, as `approve` takes it.
    pub name: String,
    pub gate: String,
    pub scope: String,
    pub message: String,
    pub show: Vec<String>,
    pub since: String,
    pub deadline: Option<String>,
}

/// The live state of a node of the plan.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct NodeLive {
    /// `pending`, `running`, `waiting`, `done`, `failed`, `timed_out`, `skipped`.
    pub state: &'static str,
    /// A short note drawn under it: `×3`, `attempt 2`, `iteration 2`, `4/10 items`.
    pub badge: String,
}

fn tone(state: &str, exit_code: Option<i64>) -> &'static str {
    match state {
        "running" => "live",
        "waiting" | "queued" => "wait",
        "orphaned" => "bad",
        "finished" if exit_code == Some(0) => "ok",
        "finished" => "bad",
        _ => "idle",
    }
}

/// Whether a run marked running has lost its executor, as a takeover would judge it
/// ([`LockOwner::lapsed`](crate::store::LockOwner::lapsed)): its lease expired unrenewed, or
/// its holder is provably gone from this host (its pid free, a zombie or another process: a
/// `kill -9`, a crash; a clean exit changes the status first). No holder yet means the run
/// is starting; a holder with a live lease that is not provably gone counts as alive.
pub(super) fn orphaned(store: &dyn Store, run: &RunRecord) -> Result<bool, StoreError> {
    if run.status != RunStatus::Running {
        return Ok(false);
    }
    Ok(match store.lock_holder(&run.id)? {
        None => false,
        Some(holder) => holder.lapsed(&crate::store::host_name(), crate::store::now_ms()),
    })
}

/// Summarises a run from what the store holds of it; `orphaned` from [`orphaned`].
pub(super) fn summary(
    run: &RunRecord,
    nodes: &[NodeRecord],
    attempts: &[AttemptRecord],
    gates: usize,
    orphaned: bool,
) -> RunSummary {
    let mut usage = Usage::default();
    for a in attempts {
        usage.add(&a.usage);
    }
    let state = if orphaned {
        "orphaned"
    } else if gates > 0 && !matches!(run.status, RunStatus::Finished | RunStatus::Cancelled) {
        "waiting"
    } else {
        run.status.as_str()
    };
    let end = if (matches!(run.status, RunStatus::Running) && !orphaned) || state == "waiting" {
        now_ms()
    } else {
        run.updated_at
    };
    let exit_code = run.exit.as_ref().map(|(_, c)| *c);
    let state_text = match (&run.exit, state) {
        (Some((name, code)), _) => format!("finished: {name} ({code})"),
        (None, "waiting") => format!(
            "waiting on {gates} gate{}",
            if gates == 1 { "" } else { "s" }
        ),
        (None, "orphaned") => format!(
            "stopped: its process is gone; `ralph-flow resume {}`, or a worker takes it over \
             once its lease ends if it was queued",
            run.id
        ),
        (None, "queued") => "queued: waits for a worker".to_string(),
        (None, "cancelled") => match run.cancellation() {
            Some(c) => format!("cancelled {}", c.text()),
            None => "cancelled".to_string(),
        },
        (None, s) => s.to_string(),
    };
    let running = attempts
        .iter()
        .filter(|a| a.state == AttemptState::Running && run.status == RunStatus::Running)
        .filter(|_| !orphaned)
        .map(|a| format!("{} (attempt {})", qualified(&a.scope, &a.node), a.attempt))
        .collect();
    let real = |n: &&NodeRecord| !n.node.starts_with('@');
    RunSummary {
        id: run.id.clone(),
        workflow: run.workflow.clone(),
        file: run.file.clone(),
        state,
        tone: tone(state, exit_code),
        state_text,
        exit: run.exit.as_ref().map(|(n, _)| n.clone()),
        exit_code,
        started_at: run.started_at,
        started: rfc3339(run.started_at).replace('T', " "),
        updated_at: run.updated_at,
        duration_ms: (end - run.started_at).max(0),
        duration: duration_ms((end - run.started_at).max(0)),
        usage: RunUsage(usage),
        trace_id: crate::run::trace::TraceIds::trace_id(run),
        gates_waiting: gates,
        stages_done: nodes
            .iter()
            .filter(real)
            .filter(|n| n.state == crate::store::NodeState::Done)
            .count(),
        stages_failed: nodes
            .iter()
            .filter(real)
            .filter(|n| {
                matches!(
                    n.state,
                    crate::store::NodeState::Failed | crate::store::NodeState::TimedOut
                )
            })
            .count(),
        running,
        waiting_for: Vec::new(),
    }
}

/// An attempt's usage in words: `12 tokens in, 3 out`; `usage unknown: the agent reported
/// none`; a lower bound said as such (`≥ 12 tokens in, 3 out (1 call reported no usage)`).
pub(super) fn attempt_usage_text(u: &Usage) -> String {
    let known = u
        .known()
        .map(|_| format!("{} tokens in, {} out", u.input_tokens, u.output_tokens));
    match (known, u.unreported_text()) {
        (Known::Unknown, _) => "usage unknown: the agent reported none".into(),
        (known, Some(why)) => format!("{known} ({why})"),
        (known, None) => known.to_string(),
    }
}

/// `$0.0123`, or `—` when no backend reported a cost.
pub(super) fn cost_text(cost: Option<f64>) -> String {
    match cost {
        Some(c) => format!("${c:.4}"),
        None => "—".into(),
    }
}

/// `SCOPE/STAGE`, or the stage at the top level.
pub(super) fn qualified(scope: &str, node: &str) -> String {
    if scope.is_empty() {
        node.to_string()
    } else {
        format!("{scope}/{node}")
    }
}

/// Every run, newest first, summarised.
pub(super) fn runs(store: &mut dyn Store) -> Result<Vec<RunSummary>, StoreError> {
    let mut out = Vec::new();
    for run in store.runs(10_000)? {
        let nodes = store.nodes(&run.id)?;
        let attempts = store.attempts(&run.id, None)?;
        let gates = store.pending_gates(&run.id)?.len();
        let lost = orphaned(store, &run)?;
        let s = summary(&run, &nodes, &attempts, gates, lost);
        out.push(placed(s, store, &run, lost)?);
    }
    Ok(out)
}

/// A summary with why the run's work waits for workers, when none of the live ones can take
/// it ([`Store::unplaced`]): a queued run's state says why, and each unit that waits is in
/// `waiting_for`.
fn placed(
    mut s: RunSummary,
    store: &dyn Store,
    run: &RunRecord,
    orphaned: bool,
) -> Result<RunSummary, StoreError> {
    if orphaned || !matches!(run.status, RunStatus::Queued | RunStatus::Running) {
        return Ok(s);
    }
    for u in store.unplaced(&run.id)? {
        if u.stage.is_empty() {
            s.state_text = u.line();
        } else {
            s.waiting_for.push(u.line());
        }
    }
    Ok(s)
}

/// One run with everything its page shows, read afresh; `None` when there is no such run.
/// The monitor reads through its copy ([`run_from`]); this is what that copy must equal.
#[cfg(test)]
pub(super) fn run(store: &mut dyn Store, id: &str) -> Result<Option<RunDetail>, StoreError> {
    let Some(record) = store.run(id)? else {
        return Ok(None);
    };
    let records = Arc::new(Records::read(store, id)?);
    detail(store, record, records).map(Some)
}

/// One run with everything its page shows, its records brought up to date in the monitor's
/// copy `copies` (what changed since the last refresh); `None` when there is no such run.
pub(super) fn run_from(
    store: &mut dyn Store,
    copies: &mut Copies,
    id: &str,
) -> Result<Option<RunDetail>, StoreError> {
    let Some(record) = store.run(id)? else {
        copies.forget(id);
        return Ok(None);
    };
    let records = copies.refresh(store, id, record.started_at, Kinds::All)?;
    detail(store, record, records).map(Some)
}

/// A run's page from its row and records: its gates, lock and units read now.
fn detail(
    store: &mut dyn Store,
    record: RunRecord,
    records: Arc<Records>,
) -> Result<RunDetail, StoreError> {
    let gates = store.pending_gates(&record.id)?;
    let lost = orphaned(store, &record)?;
    let summary = summary(
        &record,
        &records.nodes,
        &records.attempts,
        gates.len(),
        lost,
    );
    let summary = placed(summary, store, &record, lost)?;
    let live = live_states(&record, lost, &records.nodes, &records.attempts, &gates);
    let gates = gates
        .into_iter()
        .map(|g| GateView {
            name: g.qualified(),
            since: rfc3339(g.requested_at).replace('T', " "),
            deadline: g.deadline.map(|d| rfc3339(d).replace('T', " ")),
            gate: g.gate,
            scope: g.scope,
            message: g.message,
            show: g.show,
        })
        .collect();
    Ok(RunDetail {
        summary,
        record,
        records,
        gates,
        live,
    })
}

/// The segments of a scope naming a region (`attempts#3/tickets#T-1` → (`attempts`, `3`),
/// (`tickets`, `T-1`)).
fn scope_segments(scope: &str) -> impl Iterator<Item = (&str, &str)> {
    scope.split('/').filter_map(|seg| seg.rsplit_once('#'))
}

/// The live state of every node name that the store knows of. A node that ran several
/// times (in loop iterations, fan-out items) takes the state of its latest record, unless one
/// of its attempts runs or its gate waits now. A region (loop, for_each, group) is running
/// while anything inside it runs.
pub(super) fn live_states(
    run: &RunRecord,
    orphaned: bool,
    nodes: &[NodeRecord],
    attempts: &[AttemptRecord],
    gates: &[GateRequest],
) -> BTreeMap<String, NodeLive> {
    let live_run = run.status == RunStatus::Running && !orphaned;
    let mut latest: HashMap<&str, &NodeRecord> = HashMap::new();
    let mut settled_count: HashMap<&str, usize> = HashMap::new();
    let mut items_total: HashMap<&str, usize> = HashMap::new();
    // Regions: iterations seen, and items seen / items with something still going on.
    let mut keys_seen: HashMap<&str, HashSet<&str>> = HashMap::new();
    let mut keys_busy: HashMap<&str, HashSet<&str>> = HashMap::new();
    let mut busy_regions: HashSet<&str> = HashSet::new();
    for n in nodes {
        if let Some(f) = n.node.strip_prefix("@items:") {
            items_total.insert(f, n.output.as_array().map_or(0, Vec::len));
            continue;
        }
        if n.node.starts_with('@') {
            continue;
        }
        for (region, key) in scope_segments(&n.scope) {
            keys_seen.entry(region).or_default().insert(key);
        }
        *settled_count.entry(&n.node).or_default() += 1;
        let e = latest.entry(&n.node).or_insert(n);
        if n.finished_at >= e.finished_at {
            *e = n;
        }
    }
    let mut running: HashMap<&str, u32> = HashMap::new();
    for a in attempts {
        if a.state == AttemptState::Running && live_run {
            running.insert(&a.node, a.attempt);
            for (region, key) in scope_segments(&a.scope) {
                keys_seen.entry(region).or_default().insert(key);
                keys_busy.entry(region).or_default().insert(key);
                busy_regions.insert(region);
            }
        }
    }
    let mut waiting: HashSet<&str> = HashSet::new();
    for g in gates {
        waiting.insert(&g.gate);
        for (region, key) in scope_segments(&g.scope) {
            keys_seen.entry(region).or_default().insert(key);
            keys_busy.entry(region).or_default().insert(key);
            busy_regions.insert(region);
        }
    }
    let mut names: HashSet<&str> = latest.keys().copied().collect();
    names.extend(running.keys().copied());
    names.extend(waiting.iter().copied());
    names.extend(keys_seen.keys().copied());
    let mut out = BTreeMap::new();
    for name in names {
        let settled = latest.get(name);
        let state = if waiting.contains(name) {
            "waiting"
        } else if running.contains_key(name) || busy_regions.contains(name) {
            "running"
        } else if let Some(n) = settled {
            n.state.as_str()
        } else if live_run {
            "running"
        } else {
            "pending"
        };
        let badge = if let Some(total) = items_total.get(name) {
            let busy = keys_busy.get(name).map_or(0, HashSet::len);
            let seen = keys_seen.get(name).map_or(0, HashSet::len);
            let done = if settled.is_some() && busy == 0 {
                *total
            } else {
                seen.saturating_sub(busy)
            };
            format!("{done}/{total} items")
        } else if let Some(keys) = keys_seen.get(name) {
            let last = keys
                .iter()
                .filter_map(|k| k.parse::<u64>().ok())
                .max()
                .unwrap_or(0);
            if last > 0 {
                format!("iteration {last}")
            } else {
                String::new()
            }
        } else if let Some(a) = running.get(name) {
            format!("attempt {a}")
        } else {
            match settled_count.get(name) {
                Some(c) if *c > 1 => format!("×{c}"),
                _ => settled
                    .filter(|n| n.attempts > 1)
                    .map(|n| format!("{} attempts", n.attempts))
                    .unwrap_or_default(),
            }
        };
        out.insert(name.to_string(), NodeLive { state, badge });
    }
    out
}

/// One attempt of a stage, with what it wrote.
#[derive(Clone, Debug, Serialize)]
pub(super) struct AttemptView {
    pub record: AttemptRecord,
    /// Its usage in words ([`attempt_usage_text`]).
    pub usage: String,
    pub started: String,
    pub took: String,
    pub files: Vec<FileView>,
    /// The attempt its diffs are from (`attempt 1 in review_loop#1`).
    pub diff_from: Option<String>,
    /// What its agent did while it worked, as its backend reported it (ACP agents): tool
    /// calls, plans, permissions asked and their answers, files written.
    pub activity: Vec<ActivityLine>,
}

/// One step of an agent's work, from an event of its stage ([`ACTIVITY_KINDS`]).
#[derive(Clone, Debug, Serialize)]
pub(super) struct ActivityLine {
    /// `tool`, `plan`, `permission`, `wrote` or `denied`.
    pub kind: String,
    /// The time of day, `HH:MM:SS`.
    pub at: String,
    pub text: String,
    /// A permission denied (shown apart).
    pub denied: bool,
}

/// The events that tell what an agent did within an attempt (written by `run::watch`).
const ACTIVITY_KINDS: &[&str] = &["tool", "plan", "permission", "wrote", "denied"];

/// The activity of an attempt: its stage's events in its scope between its start and its
/// end (to now while it runs), the last 500.
fn attempt_activity(events: &[crate::store::Event], a: &AttemptRecord) -> Vec<ActivityLine> {
    let end = a.finished_at.unwrap_or(i64::MAX);
    let mut lines: Vec<ActivityLine> = events
        .iter()
        .filter(|e| {
            e.node == a.node
                && e.scope == a.scope
                && e.at >= a.started_at
                && e.at <= end
                && ACTIVITY_KINDS.contains(&e.kind.as_str())
        })
        .map(|e| ActivityLine {
            kind: e.kind.clone(),
            at: rfc3339(e.at).get(11..19).unwrap_or_default().to_owned(),
            denied: e.kind == "permission" && e.message.contains(": denied by policy"),
            text: e.message.clone(),
        })
        .collect();
    if lines.len() > 500 {
        lines.drain(..lines.len() - 500);
    }
    lines
}

/// Where a file is listed among an attempt's: what it was asked, what it answered, what was
/// made of it, then the rest by name.
fn file_rank(name: &str) -> (usize, String) {
    const ORDER: &[&str] = &[
        "prompt.md",
        "raw.txt",
        "answer.md",
        "output.json",
        "feedback.md",
        "error.txt",
        "denied.txt",
        "command.json",
    ];
    (
        ORDER.iter().position(|n| *n == name).unwrap_or(ORDER.len()),
        name.to_string(),
    )
}

/// A text an attempt wrote (a record, from the store or `artifacts.jsonl`, or a file of its
/// directory).
#[derive(Clone, Debug, Serialize)]
pub(super) struct FileView {
    pub name: String,
    pub text: String,
    pub lines: usize,
    pub bytes: usize,
    /// Long texts start collapsed.
    pub long: bool,
    /// The changes from the same file of the attempt before, as unified diff lines with
    /// their kind (`+`, `-`, ` `, `@`).
    pub diff: Vec<(char, String)>,
}

/// One place a stage ran (a scope), with its attempts and how it settled.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Instance {
    pub scope: String,
    /// Where it is: one of [`INSTANCE_STATES`].
    pub state: &'static str,
    pub settled: Option<NodeRecord>,
    pub output: Option<String>,
    pub attempts: Vec<AttemptView>,
}

/// The states of a stage's instances, in the order the filter lists them: `running` (an
/// attempt runs, or the next is due), `waiting` (its gate waits), how it settled (`done`,
/// `failed`, `timed_out`, `skipped`), or `interrupted` (its run stopped before it settled).
pub(super) const INSTANCE_STATES: &[&str] = &[
    "running",
    "waiting",
    "done",
    "failed",
    "timed_out",
    "skipped",
    "interrupted",
];

/// How many instances a stage page shows.
pub(super) const PAGE_SIZE: usize = 100;

/// One page of a stage's instances (its loop iterations, its fan-out items), filtered by
/// state, with the count of each state.
#[derive(Clone, Debug, Serialize)]
pub(super) struct StagePage {
    pub instances: Vec<Instance>,
    /// How many instances are in each state, for every state some instance is in.
    pub counts: Vec<(&'static str, usize)>,
    /// Instances in all.
    pub total: usize,
    /// Instances in the state filtered by (all of them without a filter).
    pub matching: usize,
    /// The state filtered by; `""` for every state.
    pub state: String,
    /// This page's number (from 1), within `1..=pages`.
    pub page: usize,
    pub pages: usize,
    /// The number (from 1) of the first instance shown, among those matching.
    pub first: usize,
}

/// The most of a text shown (the end is kept).
const MAX_TEXT: usize = 256 * 1024;

fn file_view(name: &str, text: &str) -> FileView {
    let text = crate::text::tail(text, MAX_TEXT);
    let lines = text.lines().count();
    FileView {
        name: name.to_string(),
        lines,
        bytes: text.len(),
        long: lines > 24 || text.len() > 3000,
        diff: Vec::new(),
        text,
    }
}

/// The texts an attempt wrote: its records (from the store where it keeps them, else
/// `artifacts.jsonl`), then the files of its directory that no record names, in
/// [`file_rank`]'s order.
fn attempt_files(
    a: &AttemptRecord,
    run: &RunRecord,
    records: &BTreeMap<String, String>,
) -> Vec<FileView> {
    let dir = Path::new(&a.dir);
    let mut files: Vec<FileView> = Vec::new();
    // Under the run's directory, or, recorded on another machine, by its last components.
    if let Some(prefix) = crate::run::artifacts::attempt_prefix(run, a) {
        for (path, text) in records.range(prefix.clone()..) {
            let Some(name) = path.strip_prefix(&prefix) else {
                break;
            };
            files.push(file_view(name, text));
        }
    }
    // What a program or a backend wrote in the attempt's directory.
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut names: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        names.sort();
        for p in names {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if files.iter().any(|f| f.name == name) || !p.is_file() {
                continue;
            }
            if let Ok(bytes) = std::fs::read(&p) {
                files.push(file_view(&name, &String::from_utf8_lossy(&bytes)));
            }
        }
    }
    files.sort_by_key(|f| file_rank(&f.name));
    files
}

/// A stage's instance before its texts are read: its scope, settlement and attempts (by
/// number).
struct Found<'a> {
    scope: &'a str,
    settled: Option<&'a NodeRecord>,
    attempts: Vec<&'a AttemptRecord>,
    state: &'static str,
}

impl Found<'_> {
    /// When it started: its first attempt's start, else its settlement's.
    fn start(&self) -> i64 {
        self.attempts
            .first()
            .map(|a| a.started_at)
            .or(self.settled.map(|n| n.started_at))
            .unwrap_or(0)
    }
}

/// A page (`page`, from 1; a page past the last shows the last) of the instances of stage
/// `node` in a run, those in `state` only unless it is empty, with each attempt's texts and
/// diffs against the attempt of the stage before it in time. Read from the monitor's copy of
/// the run (`records`) and its waiting gates; only the texts of the attempts shown (and of
/// the attempts their diffs are from) are read.
pub(super) fn stage(
    store: &dyn Store,
    run: &RunRecord,
    records: &Records,
    node: &str,
    page: usize,
    state: &str,
) -> Result<StagePage, StoreError> {
    let lost = orphaned(store, run)?;
    let live_run = run.status == RunStatus::Running && !lost;
    let waiting: HashSet<String> = store
        .pending_gates(&run.id)?
        .into_iter()
        .filter(|g| g.gate == node)
        .map(|g| g.scope)
        .collect();
    // Each instance, by scope.
    let mut by_scope: BTreeMap<&str, Found<'_>> = BTreeMap::new();
    let blank = |scope| Found {
        scope,
        settled: None,
        attempts: Vec::new(),
        state: "",
    };
    for n in records.nodes.iter().filter(|n| n.node == node) {
        by_scope
            .entry(&n.scope)
            .or_insert_with(|| blank(&n.scope))
            .settled = Some(n);
    }
    for a in records.attempts.iter().filter(|a| a.node == node) {
        by_scope
            .entry(&a.scope)
            .or_insert_with(|| blank(&a.scope))
            .attempts
            .push(a);
    }
    for scope in &waiting {
        by_scope.entry(scope).or_insert_with(|| blank(scope));
    }
    let mut all: Vec<Found<'_>> = by_scope.into_values().collect();
    for f in &mut all {
        f.attempts.sort_by_key(|a| a.attempt);
        let running = f.attempts.iter().any(|a| a.state == AttemptState::Running);
        f.state = if waiting.contains(f.scope) {
            "waiting"
        } else if running && live_run {
            "running"
        } else if let Some(n) = f.settled {
            n.state.as_str()
        } else if live_run {
            "running"
        } else {
            "interrupted"
        };
    }
    // Each attempt's texts are diffed against the attempt of the stage before it (in time,
    // whatever its scope: the previous loop iteration's last attempt, say).
    let mut order: Vec<&AttemptRecord> = all.iter().flat_map(|f| f.attempts.clone()).collect();
    order.sort_by_key(|a| (a.started_at, a.scope.as_str(), a.attempt));
    let before: HashMap<(&str, u32), &AttemptRecord> = order
        .windows(2)
        .map(|w| ((w[1].scope.as_str(), w[1].attempt), w[0]))
        .collect();
    all.sort_by_key(Found::start);
    let counts: Vec<(&'static str, usize)> = INSTANCE_STATES
        .iter()
        .map(|s| (*s, all.iter().filter(|f| f.state == *s).count()))
        .filter(|(_, n)| *n > 0)
        .collect();
    let total = all.len();
    let matching: Vec<&Found<'_>> = all
        .iter()
        .filter(|f| state.is_empty() || f.state == state)
        .collect();
    let pages = matching.len().div_ceil(PAGE_SIZE).max(1);
    let page = page.clamp(1, pages);
    let shown = matching.iter().skip((page - 1) * PAGE_SIZE).take(PAGE_SIZE);
    let texts = if matching.is_empty() {
        BTreeMap::new()
    } else {
        // From the store where it keeps them (any machine), else `artifacts.jsonl`.
        crate::run::artifacts::records(store, run, "").unwrap_or_default()
    };
    let mut instances = Vec::new();
    for f in shown {
        let mut attempts = Vec::new();
        for a in &f.attempts {
            let mut files = attempt_files(a, run, &texts);
            let prev = before.get(&(a.scope.as_str(), a.attempt));
            if let Some(prev) = prev {
                let prev_files = attempt_files(prev, run, &texts);
                for f in &mut files {
                    if let Some(p) = prev_files.iter().find(|p| p.name == f.name)
                        && p.text != f.text
                    {
                        f.diff = diff_lines(&p.text, &f.text);
                    }
                }
            }
            let took = match a.finished_at {
                Some(f) => duration_ms(f - a.started_at),
                None => format!("{} so far", duration_ms(now_ms() - a.started_at)),
            };
            attempts.push(AttemptView {
                diff_from: prev.map(|p| {
                    format!(
                        "attempt {}{}",
                        p.attempt,
                        if p.scope.is_empty() {
                            String::new()
                        } else {
                            format!(" in {}", p.scope)
                        }
                    )
                }),
                usage: attempt_usage_text(&a.usage),
                activity: attempt_activity(&records.events, a),
                started: rfc3339(a.started_at).replace('T', " "),
                took,
                files,
                record: (*a).clone(),
            });
        }
        let settled = f.settled.cloned();
        let output = settled
            .as_ref()
            .filter(|n| !n.output.is_null())
            .map(|n| serde_json::to_string_pretty(&n.output).unwrap_or_default());
        instances.push(Instance {
            scope: f.scope.to_string(),
            state: f.state,
            settled,
            output,
            attempts,
        });
    }
    Ok(StagePage {
        instances,
        counts,
        total,
        matching: matching.len(),
        state: state.to_string(),
        page,
        pages,
        first: (page - 1) * PAGE_SIZE + 1,
    })
}

/// A line diff, as unified diff lines with three lines of context.
pub(super) fn diff_lines(old: &str, new: &str) -> Vec<(char, String)> {
    let diff = similar::TextDiff::from_lines(old, new);
    let mut out = Vec::new();
    for group in diff.grouped_ops(3) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            continue;
        };
        let (o, n) = (first.old_range().start, first.new_range().start);
        out.push((
            '@',
            format!(
                "@@ -{},{} +{},{} @@",
                o + 1,
                last.old_range().end - o,
                n + 1,
                last.new_range().end - n
            ),
        ));
        for op in &group {
            for change in diff.iter_changes(op) {
                let tag = match change.tag() {
                    similar::ChangeTag::Delete => '-',
                    similar::ChangeTag::Insert => '+',
                    similar::ChangeTag::Equal => ' ',
                };
                out.push((tag, change.value().trim_end_matches('\n').to_string()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NodeState;

    fn rec(scope: &str, node: &str, state: NodeState, at: i64) -> NodeRecord {
        NodeRecord {
            run: "r".into(),
            scope: scope.into(),
            node: node.into(),
            state,
            output: serde_json::Value::Null,
            action: None,
            feedback: None,
            attempts: 1,
            usage: Usage::default(),
            started_at: at,
            finished_at: at,
        }
    }

    fn run(status: RunStatus) -> RunRecord {
        RunRecord {
            id: "r".into(),
            workflow: "w".into(),
            file: "w.toml".into(),
            workflow_hash: String::new(),
            params: serde_json::json!({}),
            status,
            exit: None,
            started_at: 0,
            updated_at: 0,
            dir: "/tmp/r".into(),
            options: serde_json::json!({}),
        }
    }

    #[test]
    fn a_node_takes_its_latest_state_and_regions_count_iterations_and_items() {
        let mut items = rec("", "@items:tickets", NodeState::Done, 1);
        items.output = serde_json::json!(["a", "b", "c"]);
        let nodes = vec![
            rec("attempts#1", "review", NodeState::Failed, 10),
            rec("attempts#2", "review", NodeState::Done, 20),
            items,
            rec("tickets#a", "work", NodeState::Done, 30),
        ];
        let attempt = AttemptRecord {
            run: "r".into(),
            scope: "tickets#b".into(),
            node: "work".into(),
            attempt: 2,
            state: AttemptState::Running,
            agent: None,
            dir: String::new(),
            error: None,
            usage: Usage::default(),
            started_at: 40,
            finished_at: None,
        };
        let live = live_states(
            &run(RunStatus::Running),
            false,
            &nodes,
            std::slice::from_ref(&attempt),
            &[],
        );
        assert_eq!(live["review"].state, "done");
        assert_eq!(live["review"].badge, "×2");
        assert_eq!(live["attempts"].badge, "iteration 2");
        assert_eq!(live["work"].state, "running");
        assert_eq!(live["tickets"].state, "running");
        assert_eq!(live["tickets"].badge, "1/3 items");
        // A dead run shows nothing as running.
        let live = live_states(&run(RunStatus::Interrupted), false, &nodes, &[], &[]);
        assert_eq!(live["work"].state, "done");
        // Nor does a run whose executor is gone.
        let live = live_states(
            &run(RunStatus::Running),
            true,
            &nodes,
            std::slice::from_ref(&attempt),
            &[],
        );
        assert_eq!(live["work"].state, "done");
        let s = summary(&run(RunStatus::Running), &nodes, &[attempt], 0, true);
        assert_eq!(s.state, "orphaned");
        assert!(
            s.state_text.contains("ralph-flow resume r"),
            "{}",
            s.state_text
        );
        assert!(s.running.is_empty());
    }

    #[test]
    fn diffs_show_changed_lines_with_context() {
        let d = diff_lines("a\nb\nc\n", "a\nB\nc\n");
        assert_eq!(d[0].0, '@');
        assert!(d.contains(&('-', "b".into())));
        assert!(d.contains(&('+', "B".into())));
        assert!(d.contains(&(' ', "a".into())));
        assert!(diff_lines("same\n", "same\n").is_empty());
    }

    #[test]
    fn a_summary_names_the_runs_trace() {
        let mut r = run(RunStatus::Finished);
        r.options = serde_json::json!({"trace": {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}});
        assert_eq!(
            summary(&r, &[], &[], 0, false).trace_id,
            "0af7651916cd43dd8448eb211c80319c"
        );
    }
}

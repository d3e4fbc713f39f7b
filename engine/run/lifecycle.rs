//! A run from its start to its end: checks before anything runs, the store, resume, the
//! run's own worktree, Ctrl-C, and how the run ends.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value as Json;
use tokio::sync::watch;

use super::exec::*;
use super::frame::*;
use super::progress::Progress;
use super::{Prepared, RunEnd, RunOptions, RunResult, now_ms};
use crate::backend::replay::{Recorder, ReplayBackend};
use crate::compile::NodeId;
use crate::model::StageKind;
use crate::store::{
    AttemptState, Location, LockOwner, OpenOptions, RunRecord, RunStatus, SharedStore, Store, Write,
};

/// Checks, before anything runs, that every agent a stage of the plan can call is usable
/// here (its program installed, its key set), or has a fallback that is. Returns notes on
/// agents that will hand over to a fallback; fails with what to install or set.
pub(super) fn preflight(prepared: &Prepared, opts: &RunOptions) -> Result<Vec<String>, RunError> {
    let plan = &prepared.plan;
    let agents = &plan.workflow.agents;
    let mut used: Vec<usize> = Vec::new();
    for (i, node) in plan.nodes.iter().enumerate() {
        if node.kind != StageKind::Agent {
            continue;
        }
        if let Some(a) = plan.agent_of(NodeId(i)).ok().filter(|a| !used.contains(a)) {
            used.push(a);
        }
    }
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    for a in used {
        let chain = plan.fallback_chain(a);
        let mut reasons = Vec::new();
        let mut usable = None;
        for &j in &chain {
            let config = agent_config(&agents[j], plan, &prepared.sources)?;
            match crate::backend::preflight(&config, &opts.cwd) {
                Ok(()) => {
                    usable = Some(j);
                    break;
                }
                Err(why) => reasons.push(format!(
                    "agent `{}`: {}",
                    config.name,
                    crate::diag::error_chain(&*super::error::Cause::from(why))
                )),
            }
        }
        let place = prepared.sources.locate(agents[a].name.span);
        match usable {
            Some(j) if j == a => {}
            Some(j) => notes.push(format!(
                "{}; its stages will use its fallback `{}`",
                reasons.join("; "),
                agents[j].name.value
            )),
            None => problems.push(format!("{place}: {}", reasons.join("; then its fallback "))),
        }
    }
    if problems.is_empty() {
        Ok(notes)
    } else {
        Err(RunError::AgentsUnusable(problems))
    }
}

/// Registers the run's secrets, so that nothing written or printed from now on holds them
/// (see [`crate::secrets`]): the values of the variables the workflow's agents name
/// (`api_key_env`), the key variables of its agents' kinds, the variables it lists in
/// `secrets`, and the environment's well-known secrets.
pub fn register_secrets(prepared: &Prepared) {
    let _ = register_secrets_noting(prepared);
}

/// [`register_secrets`], returning a warning for each variable the workflow names as secret
/// whose value is too short to be masked (the names only, never the values).
pub(crate) fn register_secrets_noting(prepared: &Prepared) -> Vec<String> {
    use crate::backend::key_variables;
    use crate::model::AgentKind;
    use crate::secrets::{MIN_LEN, Registered, register_env};
    crate::secrets::register_well_known();
    let mut notes = Vec::new();
    let mut named = |var: &str, what: String| {
        if register_env(var) == Registered::Short {
            notes.push(format!(
                "the value of {var} ({what}) is shorter than {MIN_LEN} characters: it is not masked in what the run writes and prints"
            ));
        }
    };
    let workflow = &prepared.plan.workflow;
    for a in &workflow.agents {
        let var = match a.kind.value {
            AgentKind::OpenAi | AgentKind::Anthropic => {
                agent_config(a, &prepared.plan, &prepared.sources)
                    .ok()
                    .and_then(|c| crate::backend::http::key_variable(&c))
            }
            _ => a.api_key_env.as_ref().map(|v| v.value.clone()),
        };
        if let Some(var) = var {
            named(&var, format!("the key of agent `{}`", a.name.value));
        }
        for var in key_variables(a.kind.value) {
            register_env(var);
        }
    }
    for var in &workflow.secrets {
        named(&var.value, "listed in `secrets`".to_string());
    }
    notes
}

/// Keeps the state directory (the store, artifacts, worktrees) out of the user's git tree
/// without the user doing anything, as pytest does with its cache: a `.gitignore` holding
/// `*` inside it, which ignores itself too.
fn ignore_in_git(state_dir: &Path) -> Result<(), RunError> {
    let path = state_dir.join(".gitignore");
    if path.exists() {
        return Ok(());
    }
    std::fs::write(
        &path,
        "# Written by ralph-flow: its state stays out of git.\n*\n",
    )
    .map_err(|e| RunError::io("write", path, e))
}

/// Runs a prepared workflow (or resumes a run of it) to its end, in four phases: open the
/// store, start or resume the run, drive its body, finish it. However it ends, the spans of
/// a process that exports traces are sent (for a bounded time) before it returns.
pub async fn execute(prepared: &Prepared, opts: RunOptions) -> Result<RunResult, RunError> {
    let result = execute_run(prepared, opts).await;
    super::trace::flush().await;
    result
}

async fn execute_run(prepared: &Prepared, mut opts: RunOptions) -> Result<RunResult, RunError> {
    let secret_notes = register_secrets_noting(prepared);
    // The notifiers' variables are read (and their secrets registered) before the run
    // writes anything.
    let (notifier, notify_notes) =
        super::notify::Notifier::new(&prepared.plan.workflow.notify, &opts.notify, &opts.cwd);
    prepare_state_dir(&opts.state_dir)?;
    let mut opened = open_store(&opts)?;
    let begun = start_or_resume(prepared, &mut opts, opened.store.as_mut())?;
    let taken = take_run(&opts, opened.store.as_mut(), &begun.run)?;
    let (mut shared, side) = share(
        opts,
        opened,
        begun.run,
        begun.resumed,
        &taken,
        prepared.subflows.later.clone(),
    )?;
    shared.notifier = notifier;
    announce(
        &shared,
        prepared,
        &taken,
        begun
            .preflight_notes
            .into_iter()
            .chain(secret_notes)
            .chain(notify_notes),
    );
    let exec = Exec::new(&shared, &prepared.plan, &prepared.sources, String::new())?;
    exec.warn_unenforceable_budgets()?;
    // Subflows whose params are written out are prepared now, once: an invalid one or an
    // agent of theirs that cannot run stops the run before anything starts.
    if let Err(e) = shared.preload_subflows(&prepared.subflows) {
        shared.flush();
        return Err(e);
    }
    // A run with its own worktree works there, from its first stage to its last.
    let run_worktree = match exec.enter_run_worktree().await {
        Ok(w) => w,
        Err(e) => {
            shared.flush();
            return Err(e);
        }
    };
    let top = Frame {
        cwd: run_worktree
            .clone()
            .unwrap_or_else(|| shared.opts.cwd.clone()),
        ..Frame::default()
    };
    let cancelled: RefCell<Option<crate::store::Cancellation>> = RefCell::new(None);
    let end = drive(&exec, &top, side, &taken.owner, &cancelled).await;
    let end = match settle(&exec, end, cancelled.into_inner()) {
        Ok(end) => end,
        Err(e) => {
            notify_end(&shared, None).await;
            return Err(e);
        }
    };
    if let Some(path) = &run_worktree {
        exec.leave_run_worktree(path, &end).await;
    }
    notify_end(&shared, Some(&end)).await;
    let outputs = super::RanOutputs(top.outputs.clone());
    finish(shared, end, outputs, &taken.owner)
}

/// Creates the state directory, kept out of git.
fn prepare_state_dir(state_dir: &Path) -> Result<(), RunError> {
    std::fs::create_dir_all(state_dir).map_err(|e| RunError::io("create", state_dir, e))?;
    ignore_in_git(state_dir)
}

/// The store a run writes to, as the first phase opened it.
struct OpenedStore {
    store: Box<dyn Store + Send>,
    /// A handle on the store's connection for the run's units of work (a run on workers).
    units: Option<Box<dyn SharedStore>>,
    location: Location,
    options: OpenOptions,
}

/// Opens the run's store. A run on workers hands its units of work through the store's own
/// connection.
fn open_store(opts: &RunOptions) -> Result<OpenedStore, RunError> {
    let location = opts.location();
    let options = OpenOptions {
        full_sync: opts.full_sync,
        ..OpenOptions::default()
    };
    let shared = match opts.spread {
        Some(_) => location.open_shared(&options)?,
        None => None,
    };
    let (store, units) = match shared {
        Some(s) => {
            let units = s.handle();
            (s.into_store(), Some(units))
        }
        None => (location.open(&options)?, None),
    };
    Ok(OpenedStore {
        store,
        units,
        location,
        options,
    })
}

/// A run as it starts: its record, what it settled before (a resume), and notes of the
/// check of its agents.
struct Begun {
    run: RunRecord,
    resumed: HashMap<(String, String), Box<super::frame::Resumed>>,
    preflight_notes: Vec<String>,
}

/// Before anything runs or is recorded, every agent must be usable (a replayed run calls
/// none). A run on workers that spreads its agent calls leaves the check to the workers
/// that take them (a worker without an agent's CLI should lack its label).
fn check_agents(prepared: &Prepared, opts: &RunOptions) -> Result<Vec<String>, RunError> {
    if opts.replay.is_none() && (opts.spread.is_none() || opts.record.is_some()) {
        preflight(prepared, opts)
    } else {
        Ok(Vec::new())
    }
}

/// Starts a new run, or reads back the run `opts.resume` names.
fn start_or_resume(
    prepared: &Prepared,
    opts: &mut RunOptions,
    store: &mut dyn Store,
) -> Result<Begun, RunError> {
    match opts.resume.clone() {
        Some(id) => resume_run(prepared, opts, store, &id),
        None => {
            let preflight_notes = check_agents(prepared, opts)?;
            let run = start_run(prepared, opts, store)?;
            Ok(Begun {
                run,
                resumed: HashMap::new(),
                preflight_notes,
            })
        }
    }
}

/// Reads back run `id` to resume it: refused when it finished or was cancelled.
fn resume_run(
    prepared: &Prepared,
    opts: &mut RunOptions,
    store: &mut dyn Store,
    id: &str,
) -> Result<Begun, RunError> {
    let run = store
        .run(id)?
        .ok_or_else(|| RunError::NoSuchRun(id.to_string()))?;
    if run.status == RunStatus::Finished {
        return Err(RunError::Finished {
            id: id.to_string(),
            exit: run
                .exit
                .as_ref()
                .map_or("?".to_string(), |(n, c)| format!("{n} = {c}")),
        });
    }
    if run.status == RunStatus::Cancelled {
        return Err(RunError::Cancelled {
            id: id.to_string(),
            how: run.cancellation().map_or_else(String::new, |c| c.text()),
        });
    }
    // A run started with `--replay` or `--record` resumes with it.
    let stored = |key: &str| {
        run.options
            .get(key)
            .and_then(Json::as_str)
            .map(PathBuf::from)
    };
    if opts.replay.is_none() && opts.record.is_none() {
        opts.replay = stored("replay");
        opts.record = stored("record");
    }
    let preflight_notes = check_agents(prepared, opts)?;
    // A compact copy of each settled node, read one at a time: a resume of 10,000
    // settled stages held every stored record (about 800 bytes each) besides.
    let mut resumed = HashMap::new();
    store.each_node(id, &mut |mut n| {
        let key = (std::mem::take(&mut n.scope), std::mem::take(&mut n.node));
        resumed.insert(key, Box::new(super::frame::Resumed::new(n)));
    })?;
    Ok(Begun {
        run,
        resumed,
        preflight_notes,
    })
}

/// Creates a new run's record, drawing another id while the drawn one is taken.
fn start_run(
    prepared: &Prepared,
    opts: &RunOptions,
    store: &mut dyn Store,
) -> Result<RunRecord, RunError> {
    let started = now_ms();
    let id = new_run_id(started);
    let absolute = |p: &Option<PathBuf>| {
        p.as_ref().map(|p| {
            std::path::absolute(p)
                .unwrap_or_else(|_| p.clone())
                .to_string_lossy()
                .into_owned()
        })
    };
    let mut options = serde_json::Map::new();
    if let Some(p) = absolute(&opts.replay) {
        options.insert("replay".into(), Json::String(p));
    }
    if let Some(p) = absolute(&opts.record) {
        options.insert("record".into(), Json::String(p));
    }
    options.insert(
        super::trace::OPTIONS_KEY.into(),
        super::trace::TraceIds::new_json(),
    );
    let run_dir = |id: &str| {
        opts.state_dir
            .join("runs")
            .join(id)
            .to_string_lossy()
            .into_owned()
    };
    let mut run = RunRecord {
        id: id.clone(),
        workflow: prepared.plan.workflow.name.value.clone(),
        file: prepared.path.to_string_lossy().into_owned(),
        workflow_hash: prepared.hash.clone(),
        params: super::params_json(&prepared.plan.params),
        status: RunStatus::Running,
        exit: None,
        started_at: started,
        updated_at: started,
        dir: run_dir(&id),
        options: Json::Object(options),
    };
    // Ids are the second and 16 random bits: runs started together may draw the
    // same one, and then draw again.
    let mut draws = 1;
    loop {
        match store.create_run(&run) {
            Err(crate::store::StoreError::RunExists(_)) if draws < 16 => {
                draws += 1;
                run.id = new_run_id(now_ms());
                run.dir = run_dir(&run.id);
            }
            other => break other?,
        }
    }
    Ok(run)
}

/// The run as this executor holds it.
struct Taken {
    /// The tenure this executor holds the run by.
    owner: LockOwner,
    /// A queued run (`run --detach`) that starts here, on a worker: nothing of it ran before.
    first_start: bool,
    /// How many programs an earlier executor of the run left running, stopped now.
    leftovers: usize,
}

/// Takes the run's lock (a worker's claim took it already), stops what a killed executor
/// of the run left running, and marks the run running.
fn take_run(opts: &RunOptions, store: &mut dyn Store, run: &RunRecord) -> Result<Taken, RunError> {
    // The tenure this executor holds the run by: a worker's claim (which took the lock
    // already), else a new one. Every write of this store to the run is fenced by it.
    let owner = match &opts.owner {
        Some(claimed) => claimed.clone(),
        None => crate::store::current_owner().with_lease(opts.lease),
    };
    store.lock(&run.id, &owner)?;
    let first_start = run.status == RunStatus::Queued;
    // What a killed executor of this run left running is stopped before anything starts
    // again, so that no stage ever runs beside an earlier copy of itself.
    let leftovers = if opts.resume.is_some() {
        stop_interrupted(opts, store, run)?
    } else {
        0
    };
    store.set_status(&run.id, RunStatus::Running, None)?;
    std::fs::create_dir_all(&run.dir).map_err(|e| RunError::io("create", &run.dir, e))?;
    Ok(Taken {
        owner,
        first_start,
        leftovers,
    })
}

/// Stops the programs of the attempts a resumed run left running, and records those
/// attempts as interrupted. Returns how many programs were stopped.
fn stop_interrupted(
    opts: &RunOptions,
    store: &mut dyn Store,
    run: &RunRecord,
) -> Result<usize, RunError> {
    let interrupted = store.running_attempts(&run.id)?;
    let pid_files: Vec<PathBuf> = interrupted
        .iter()
        .map(|a| PathBuf::from(&a.dir).join("process"))
        .collect();
    let logs = [Path::new(&run.dir).join(super::command::PROCESS_LOG)];
    // Programs tagged with the run: all of them were this run's executor's, unless its
    // work is spread as units, whose programs the workers holding them stop.
    let tag = opts
        .spread
        .is_none()
        .then_some(("RALPH_FLOW_RUN", run.id.as_str()));
    let leftovers = crate::backend::process::stop_leftovers(tag, &pid_files, &logs);
    // Those attempts are over: say so, so that `status` and `logs` do not show them as
    // running beside the new ones.
    let writes: Vec<Write> = interrupted
        .into_iter()
        .map(|mut a| {
            a.state = AttemptState::Interrupted;
            a.finished_at = Some(now_ms());
            a.error =
                Some("the run stopped while this attempt ran; resume ran the stage again".into());
            Write::Attempt(a)
        })
        .collect();
    if !writes.is_empty() {
        store.commit(&writes)?;
    }
    Ok(leftovers)
}

/// What drives a run beside its body: its lease's heartbeat and the watch for a cancel,
/// each through a handle of its own on the store.
struct Side {
    /// The executor's connection shared, for the lease (`None`: SQLite, whose lease is
    /// renewed through a connection opened when first needed).
    lease_store: Option<Box<dyn Store + Send>>,
    /// Where a cancel is read (`None`: it cannot be watched).
    cancel_store: Option<Box<dyn Store + Send>>,
    location: Location,
    options: OpenOptions,
}

/// The run's shared state: its store, artifacts, replay or recording, units of work, and
/// the handles its lease, its cancel watch and its reads of the store go through.
fn share(
    opts: RunOptions,
    opened: OpenedStore,
    run: RunRecord,
    resumed: HashMap<(String, String), Box<super::frame::Resumed>>,
    taken: &Taken,
    later: Option<crate::compile::Later>,
) -> Result<(Shared, Side), RunError> {
    let OpenedStore {
        store,
        units: units_store,
        location,
        options,
    } = opened;
    let replay = match &opts.replay {
        Some(p) => Some(Arc::new(
            ReplayBackend::open(p).map_err(|e| RunError::Recording(e.into()))?,
        )),
        None => None,
    };
    let recorder = match &opts.record {
        Some(p) => Some(Arc::new(
            Recorder::create(p, opts.resume.is_some())
                .map_err(|e| RunError::Recording(e.into()))?,
        )),
        None => None,
    };
    let (interrupt, _) = watch::channel(false);
    let artifacts = super::artifacts::Artifacts::start(
        Path::new(&run.dir),
        store.keeps_records().then_some(run.id.as_str()),
    );
    let units = match (&opts.spread, units_store) {
        (Some(labels), Some(handle)) => Some(super::units::Units::new(
            handle,
            &run.id,
            &taken.owner.holder,
            labels.clone(),
            opts.unit_wake.clone(),
            interrupt.subscribe(),
        )),
        _ => None,
    };
    // `earlier_runs` reads through the store's connection where it can be shared, and the
    // lease is renewed through it; a SQLite store's lease is renewed through a connection of
    // its own, opened when first needed (a live holder keeps its run by its lease alone,
    // `LockOwner::lapsed`).
    let lease_store = store.share();
    // A cancel (`ralph-flow cancel`, the monitor) is read through a handle of its own: the
    // executor's connection shared where it can be (PostgreSQL), else the SQLite file
    // opened to read.
    let cancel_store = match store.share() {
        Some(s) => Some(s),
        None => location.open_to_read().unwrap_or_else(|e| {
            // The run goes on; only a cancel is not seen until it ends.
            tracing::warn!(
                "a cancel of this run cannot be watched ({}); it is seen when the run ends",
                crate::diag::error_chain(&e)
            );
            None
        }),
    };
    let memory = match store.share() {
        Some(s) => super::memory::MemoryStore::ready(s, location.clone()),
        None => super::memory::MemoryStore::later(location.clone()),
    };
    let memory = Arc::new(std::sync::Mutex::new(memory));
    let outputs = Arc::new(super::memory::OutputReader::new(
        memory.clone(),
        run.id.clone(),
    ));
    let publisher = opts.publish.clone().map(super::publish::Publisher::new);
    let trace = super::trace::RunTrace::of(&run);
    let shared = Shared {
        global: opts.max_concurrency.map(super::resource::limit),
        progress: Progress::new(opts.progress),
        opts,
        run,
        store: RefCell::new(store),
        pending: RefCell::new(Vec::new()),
        queued: Cell::new(0),
        committed: Cell::new(0),
        resumed_scopes: scopes_of(resumed.keys().map(|(s, _)| s.as_str())),
        resumed: RefCell::new(resumed),
        work: Cell::default(),
        artifacts,
        subflows: RefCell::default(),
        later,
        interrupt,
        usage: RefCell::new(HashMap::new()),
        denied: RefCell::default(),
        replay,
        recorder,
        unreported_noted: RefCell::default(),
        store_error: RefCell::new(None),
        run_consts: std::cell::OnceCell::new(),
        memory,
        outputs,
        to_store: RefCell::default(),
        publisher,
        units,
        notifier: None,
        trace,
    };
    let side = Side {
        lease_store,
        cancel_store,
        location,
        options,
    };
    Ok((shared, side))
}

/// Records how the run starts (or resumes), and the notes of its checks; counts earlier
/// usage against the budgets of a resumed run.
fn announce(
    shared: &Shared,
    prepared: &Prepared,
    taken: &Taken,
    notes: impl Iterator<Item = String>,
) {
    let owner = &taken.owner;
    if taken.leftovers > 0 {
        let text = format!(
            "stopped {} process{} that the run's previous executor left running",
            taken.leftovers,
            if taken.leftovers == 1 { "" } else { "es" }
        );
        shared.progress.note(&format!("! {text}"));
        shared.event("", "", "warning", text);
    }
    for note in notes {
        shared.progress.note(&format!("! {note}"));
        shared.event("", "", "warning", note);
    }
    // A queued run (`run --detach`) starts on a worker: nothing of it ran before.
    let first_start = taken.first_start && shared.resumed.borrow().is_empty();
    if first_start {
        shared.event(
            "",
            "",
            "started",
            format!(
                "run of {} by pid {} on {}",
                prepared.path.display(),
                owner.pid,
                owner.host
            ),
        );
    } else if shared.opts.resume.is_some() {
        shared.event(
            "",
            "",
            "resumed",
            format!("resumed by pid {} on {}", owner.pid, owner.host),
        );
    } else {
        shared.event(
            "",
            "",
            "started",
            format!("run of {}", prepared.path.display()),
        );
    }
    shared.flush();
    // Earlier usage counts against the budgets of a resumed run.
    for rec in shared.resumed.borrow().values() {
        shared
            .usage
            .borrow_mut()
            .entry(String::new())
            .or_default()
            .add(&rec.usage);
    }
}

/// Stops the run as Ctrl-C does on Ctrl-C, or once `opts.stop` turns true (a worker told
/// to stop). Never completes.
async fn ctrl_c(shared: &Shared) {
    let told = async {
        match shared.opts.stop.clone() {
            Some(mut s) => {
                let _ = s.wait_for(|v| *v).await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        r = tokio::signal::ctrl_c() => if r.is_ok() {
            let _ = shared.interrupt.send(true);
        },
        () = told => {
            let _ = shared.interrupt.send(true);
        },
    }
    std::future::pending::<()>().await;
}

/// Drives the run's body to its end, beside Ctrl-C, the lease's heartbeat and the watch
/// for a cancel; then stops what the run's programs left running.
async fn drive(
    exec: &Exec<'_>,
    top: &Frame<'_>,
    side: Side,
    owner: &LockOwner,
    cancelled: &RefCell<Option<crate::store::Cancellation>>,
) -> BodyEnd {
    let shared = exec.shared;
    let Side {
        lease_store,
        cancel_store,
        location,
        options,
    } = side;
    let heartbeat = async {
        match owner.lease() {
            Some(_) => heartbeat(shared, lease_store, (&location, options), owner).await,
            None => std::future::pending().await,
        }
    };
    let cancel_watch = async {
        match cancel_store {
            Some(store) => watch_cancel(shared, store, cancelled).await,
            None => std::future::pending().await,
        }
    };
    let programs_before = crate::backend::process::programs_started();
    let end = tokio::select! {
        end = exec.run_body(top) => end,
        () = ctrl_c(shared) => BodyEnd::Stopped,
        () = heartbeat => BodyEnd::Stopped,
        () = cancel_watch => BodyEnd::Stopped,
        () = record_notifications(shared) => BodyEnd::Stopped,
    };
    // Nothing a run started outlives it: what its stages left running (descendants that left
    // their process group, such as `setsid` daemons, and groups still dying from their stop)
    // is stopped, and waited for, before the run reports its end and lets go of its lock. A
    // run spread as units leaves its units' programs to the workers that hold them; one that
    // started no program (agents over HTTP, a replay) has nothing to look for.
    if shared.opts.spread.is_none()
        && crate::backend::process::programs_started() != programs_before
    {
        let id = shared.run.id.clone();
        let stopped = tokio::task::spawn_blocking(move || {
            crate::backend::process::stop_leftovers(Some(("RALPH_FLOW_RUN", &id)), &[], &[])
        })
        .await
        .unwrap_or(0);
        if stopped > 0 {
            tracing::debug!("stopped {stopped} process(es) that the run's programs left running");
        }
    }
    end
}

/// Records each notification's outcome as an event of the run as it comes back (a failed
/// one is noted in the progress too). Never completes.
async fn record_notifications(shared: &Shared) {
    if let Some(notifier) = &shared.notifier {
        while let Some(outcome) = notifier.next_outcome().await {
            record_notification(shared, outcome);
            shared.flush();
        }
    }
    std::future::pending::<()>().await;
}

fn record_notification(shared: &Shared, (scope, node, kind, message): super::notify::Outcome) {
    if kind != super::notify::DELIVERED {
        shared.progress.note(&format!("! {message}"));
    }
    shared.event(&scope, &node, kind, message);
}

/// At the run's end: announces it to the notifiers that ask (a run that finished, failed
/// or was cancelled; `None`: it halted, announced to none), gives the deliveries under way
/// [`super::notify::GRACE`] and records how each ended.
async fn notify_end(shared: &Shared, end: Option<&RunEnd>) {
    let Some(notifier) = &shared.notifier else {
        return;
    };
    if let Some(end) = end
        && let Some(event) = super::notify::end_event(end)
        && notifier.wants(event)
    {
        let exit = match end {
            RunEnd::Exit {
                name,
                code,
                message,
            } => Some((name.clone(), *code, message.clone())),
            _ => None,
        };
        notifier.announce(&super::notify::Announcement {
            event,
            run: shared.run.id.clone(),
            workflow: shared.run.workflow.clone(),
            gate: None,
            status: event.as_str(),
            exit,
        });
    }
    let outcomes = notifier.drain(super::notify::GRACE).await;
    if outcomes.is_empty() {
        return;
    }
    for outcome in outcomes {
        record_notification(shared, outcome);
    }
    shared.flush();
}

/// How the run ended, once every record and artifact of its body is written: halted by the
/// store, cancelled, interrupted, or by its body's end.
fn settle(
    exec: &Exec<'_>,
    end: BodyEnd,
    cancelled: Option<crate::store::Cancellation>,
) -> Result<RunEnd, RunError> {
    let shared = exec.shared;
    shared.flush();
    // Every artifact is on disk before the run reports its end.
    shared.artifacts.hand_over();
    if let Some(m) = shared.artifacts.failure() {
        shared.progress.note(&format!(
            "! some artifacts were not written: {}",
            crate::diag::error_chain(&*m)
        ));
    }
    shared.progress.finish();
    // A cancel that came after the watcher last looked (the run ended meanwhile) still
    // ends it as cancelled: the store keeps a cancelled run's status whatever is written.
    let cancelled = cancelled.or_else(|| {
        let store = shared.store.borrow();
        let run = store.run(&shared.run.id).ok().flatten()?;
        (run.status == RunStatus::Cancelled).then(|| cancellation_of(&run))
    });
    if let Some(halt) = shared.store_error.borrow_mut().take() {
        return Err(RunError::Halted(halt));
    }
    Ok(if let Some(c) = cancelled {
        // Units it asked for after the cancel, before it noticed, are withdrawn too (the
        // cancel withdrew those there were then).
        if let Some(units) = &shared.units {
            units.cancel_all();
        }
        RunEnd::Cancelled(c)
    } else if *shared.interrupt.borrow() {
        RunEnd::Interrupted
    } else {
        exec.run_end(end)
    })
}

/// Records how the run ended (an event and its status), lets go of its lock, and returns
/// its result.
fn finish(
    shared: Shared,
    end: RunEnd,
    outputs: super::RanOutputs,
    owner: &LockOwner,
) -> Result<RunResult, RunError> {
    let (status, exit) = match &end {
        RunEnd::Exit { name, code, .. } => (RunStatus::Finished, Some((name.as_str(), *code))),
        RunEnd::Waiting(_) => (RunStatus::Waiting, None),
        RunEnd::Interrupted => (RunStatus::Interrupted, None),
        RunEnd::Cancelled(_) => (RunStatus::Cancelled, None),
    };
    let event = crate::store::Event {
        run: shared.run.id.clone(),
        at: now_ms(),
        scope: String::new(),
        node: String::new(),
        kind: status.as_str().to_string(),
        message: end_message(&end, owner),
    };
    let mut store = shared.store.into_inner();
    // Written straight to the store, not through the run's queue (the store masks it).
    store
        .commit(&[Write::Event(event)])
        .and_then(|()| store.set_status(&shared.run.id, status, exit))
        .and_then(|()| store.unlock(&shared.run.id, owner))?;
    // The run's span, once it is over for good (a waiting or interrupted run goes on later).
    if let Some(t) = &shared.trace
        && matches!(status, RunStatus::Finished | RunStatus::Cancelled)
    {
        t.run_end(&shared.run, status, exit);
    }
    let usage = shared.usage.borrow().get("").cloned().unwrap_or_default();
    Ok(RunResult {
        run_id: shared.run.id.clone(),
        end,
        outputs,
        usage,
        work: super::WorkCounts {
            outputs_read: shared.outputs.reads(),
            ..shared.work.get()
        },
    })
}

/// The message of the event that records how a run ended.
fn end_message(end: &RunEnd, owner: &LockOwner) -> String {
    match end {
        RunEnd::Exit {
            name,
            code,
            message,
        } => format!(
            "exit {name} ({code}){}",
            message
                .as_ref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        ),
        RunEnd::Waiting(g) => format!("waiting on {}", g.join(", ")),
        RunEnd::Interrupted => "interrupted".to_string(),
        RunEnd::Cancelled(c) => format!(
            "stopped by pid {} on {}: the run was cancelled {}",
            owner.pid,
            owner.host,
            c.text()
        ),
    }
}

/// Renews the run's lease every third of it, through `store` (a shared handle on the
/// executor's connection), or else through a connection of its own opened on the run's
/// store (`location`, with its options) when first needed (SQLite), on tokio's blocking
/// pool, so a slow store does not hold the executor up. When the lease is
/// lost (another tenure took the run over, or it could not be renewed before it expired:
/// the run may be another's now), the run stops as a failed commit stops it: its programs
/// are stopped, nothing more is written (no settlement, no status: the next holder owns
/// them), and units under way on workers are left to the next coordinator. Never completes
/// otherwise.
async fn heartbeat(
    shared: &Shared,
    store: Option<Box<dyn Store + Send>>,
    (location, options): (&Location, OpenOptions),
    owner: &LockOwner,
) {
    use crate::store::StoreError;
    let lease = Duration::from_millis(
        owner
            .lease()
            .map_or(30_000, |l| u64::try_from(l).unwrap_or(1)),
    );
    let period = lease / 3;
    let store = Arc::new(std::sync::Mutex::new(store));
    let mut renewed = tokio::time::Instant::now();
    // A renewal under way, and when it was sent (the lease runs from no earlier).
    type Renewal = (
        tokio::task::JoinHandle<crate::store::Result<()>>,
        tokio::time::Instant,
    );
    let mut inflight: Option<Renewal> = None;
    let lost = |e: StoreError| {
        shared
            .progress
            .note(&format!("! {}", crate::diag::error_chain(&e)));
        shared
            .store_error
            .borrow_mut()
            .get_or_insert(Halt::Store(e));
        let _ = shared.interrupt.send(true);
    };
    loop {
        tokio::time::sleep(period).await;
        let (mut call, sent) = inflight.take().unwrap_or_else(|| {
            let (store, run, owner) = (store.clone(), shared.run.id.clone(), owner.clone());
            let location = location.clone();
            let call = tokio::task::spawn_blocking(move || match store.lock() {
                Ok(mut handle) => match &mut *handle {
                    Some(s) => s.renew(&run, &owner),
                    // A SQLite store: its connection for the lease, opened once.
                    None => handle.insert(location.open(&options)?).renew(&run, &owner),
                },
                Err(_) => Err(StoreError::Connection(
                    "the lease's connection failed".into(),
                )),
            });
            (call, tokio::time::Instant::now())
        });
        match tokio::time::timeout(period, &mut call).await {
            Ok(Ok(Ok(()))) => renewed = sent,
            Ok(Ok(Err(e @ StoreError::LeaseLost { .. }))) => {
                lost(e);
                break;
            }
            Ok(Ok(Err(e))) => {
                tracing::warn!("cannot renew the lease: {}", crate::diag::error_chain(&e))
            }
            Ok(Err(_)) => {}
            Err(_) => inflight = Some((call, sent)),
        }
        if renewed.elapsed() >= lease {
            lost(StoreError::LeaseLost {
                run: shared.run.id.clone(),
                now: format!(
                    "its lease of {} could not be renewed in time",
                    crate::text::duration(lease)
                ),
            });
            break;
        }
    }
    std::future::pending::<()>().await;
}

/// How often a run reads whether it was cancelled: one read of its row, so a cancel stops
/// its stages within about this long.
const CANCEL_POLL: Duration = Duration::from_secs(1);

/// Who cancelled a cancelled run, as its record says (a run cancelled by an older
/// ralph-flow, without the record, by someone unknown).
fn cancellation_of(run: &RunRecord) -> crate::store::Cancellation {
    run.cancellation()
        .unwrap_or_else(|| crate::store::Cancellation {
            by: "someone".into(),
            at: run.updated_at,
            reason: None,
        })
}

/// Reads the run's status every [`CANCEL_POLL`] through `store` (on tokio's blocking pool,
/// so a slow store does not hold the executor up). Once it is cancelled (`ralph-flow
/// cancel`, the monitor), it keeps who did it in `cancelled` and stops the run as Ctrl-C
/// does: no stage starts, running ones are stopped with their programs. A read that fails
/// is tried again at the next poll (the commits say when the store is gone). Never
/// completes.
async fn watch_cancel(
    shared: &Shared,
    store: Box<dyn Store + Send>,
    cancelled: &RefCell<Option<crate::store::Cancellation>>,
) {
    let store = Arc::new(std::sync::Mutex::new(store));
    loop {
        tokio::time::sleep(CANCEL_POLL).await;
        let (store, id) = (store.clone(), shared.run.id.clone());
        let read = tokio::task::spawn_blocking(move || match store.lock() {
            Ok(s) => s.run(&id).ok().flatten(),
            Err(_) => None,
        })
        .await;
        if let Ok(Some(run)) = read
            && run.status == RunStatus::Cancelled
        {
            let c = cancellation_of(&run);
            shared.progress.note(&format!(
                "! run {} was cancelled {}; stopping its stages",
                run.id,
                c.text()
            ));
            *cancelled.borrow_mut() = Some(c);
            let _ = shared.interrupt.send(true);
            break;
        }
    }
    std::future::pending::<()>().await;
}

/// A new run's id: the time, and 16 bits that differ between processes.
pub fn new_run_id(ms: i64) -> String {
    let secs = ms / 1000;
    let t = std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    let stamp = humantime::format_rfc3339_seconds(t).to_string();
    let stamp: String = stamp
        .chars()
        .filter(|c| c.is_ascii_digit())
        .take(14)
        .collect();
    // The pid, the milliseconds and the nanoseconds, mixed (a multiplicative hash) so that
    // each of them changes the 16 bits kept: two runs started in the same second by two
    // processes differ.
    let mixed = (u64::from(std::process::id()) << 32 ^ (ms as u64 % 1000) << 20 ^ nanos())
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    format!("{}-{}-{:04x}", &stamp[..8], &stamp[8..], mixed >> 48)
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0)
}

impl Exec<'_> {
    pub(crate) fn run_end(&self, end: BodyEnd) -> RunEnd {
        if let Some(i) = self.exit.get() {
            return self.exit_end(i, None);
        }
        let exit = |name: &str| self.plan.exit(name).unwrap_or(0);
        match end {
            BodyEnd::Completed | BodyEnd::Break | BodyEnd::Continue(_) => {
                self.exit_end(exit(&self.success_exit()), None)
            }
            BodyEnd::Exit(i) => self.exit_end(i, None),
            BodyEnd::Failed { node, message, .. } => {
                let place = self
                    .plan
                    .find(&node)
                    .map(|id| format!(" ({})", self.sources.locate(self.plan.stage(id).id.span)))
                    .unwrap_or_default();
                let message = format!("stage `{node}`{place} failed: {message}");
                self.exit_end(exit("failed"), Some(message))
            }
            BodyEnd::Waiting => {
                let gates = self
                    .shared
                    .store
                    .borrow()
                    .pending_gates(&self.shared.run.id)
                    .map(|g| g.iter().map(crate::store::GateRequest::qualified).collect())
                    .unwrap_or_default();
                RunEnd::Waiting(gates)
            }
            BodyEnd::Stopped => RunEnd::Interrupted,
        }
    }

    /// The exit a run takes when it completes: `success` when declared, else the only
    /// declared exit with code 0 (a workflow may call its success `clean` or `done`).
    pub(super) fn success_exit(&self) -> String {
        let wf = &self.plan.workflow;
        if wf.exits.iter().any(|e| e.name.value == "success") {
            return "success".into();
        }
        let zero: Vec<&String> = wf
            .exits
            .iter()
            .filter(|e| e.code.value == 0)
            .map(|e| &e.name.value)
            .collect();
        match zero.as_slice() {
            [one] => (*one).clone(),
            _ => "success".into(),
        }
    }

    /// The end of a run by an exit: with a message, or the exit's own rendered over the
    /// params.
    pub(super) fn exit_end(&self, i: usize, message: Option<String>) -> RunEnd {
        let e = &self.plan.exits[i];
        let own = || {
            e.message.as_ref().map(|m| {
                crate::params::render_params(m, &self.plan.params).unwrap_or_else(|_| m.clone())
            })
        };
        RunEnd::Exit {
            name: e.name.clone(),
            code: e.code,
            message: message.or_else(own),
        }
    }
}

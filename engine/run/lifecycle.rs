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
use crate::check::StageId as NodeId;
use crate::model::StageKind;
use crate::store::{AttemptState, RunRecord, RunStatus, Store, Write};

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

/// Runs a prepared workflow (or resumes a run of it) to its end.
pub async fn execute(prepared: &Prepared, mut opts: RunOptions) -> Result<RunResult, RunError> {
    // Before anything runs or is recorded, every agent must be usable (a replayed run calls
    // none).
    // A run on workers that spreads its agent calls leaves the check to the workers that
    // take them (a worker without an agent's CLI should lack its label).
    let check_agents = |opts: &RunOptions| {
        if opts.replay.is_none() && (opts.spread.is_none() || opts.record.is_some()) {
            preflight(prepared, opts)
        } else {
            Ok(Vec::new())
        }
    };
    let preflight_notes;
    let secret_notes = register_secrets_noting(prepared);
    std::fs::create_dir_all(&opts.state_dir)
        .map_err(|e| RunError::io("create", &opts.state_dir, e))?;
    ignore_in_git(&opts.state_dir)?;
    let durability = if opts.full_sync {
        crate::store::sqlite::Durability::Full
    } else {
        crate::store::sqlite::Durability::Normal
    };
    let location = opts.location();
    let publish = opts.publish.clone();
    let unit_wake = opts.unit_wake.clone();
    let spread = match (&opts.spread, &opts.store) {
        (Some(labels), Some(url)) => Some((url.clone(), labels.clone())),
        _ => None,
    };
    // A run on workers hands its units of work through the store's own connection.
    let (mut store, units_store): (Box<dyn Store>, _) = match (&location, &spread) {
        (crate::store::Location::Postgres(url), Some(_)) => {
            let pg = crate::store::postgres::PgStore::connect_reporting(
                url,
                Box::new(|m| {
                    let m = crate::secrets::redact(m);
                    eprintln!("! store: {}", crate::text::printable(&m));
                }),
            )?;
            let units = pg.share();
            (Box::new(pg), Some(units))
        }
        _ => (location.open(durability)?, None),
    };
    let plan = &prepared.plan;
    let (run, resumed) = match &opts.resume {
        Some(id) => {
            let run = store
                .run(id)?
                .ok_or_else(|| RunError::NoSuchRun(id.clone()))?;
            if run.status == RunStatus::Finished {
                return Err(RunError::Finished {
                    id: id.clone(),
                    exit: run
                        .exit
                        .as_ref()
                        .map_or("?".to_string(), |(n, c)| format!("{n} = {c}")),
                });
            }
            if run.status == RunStatus::Cancelled {
                return Err(RunError::Cancelled {
                    id: id.clone(),
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
            preflight_notes = check_agents(&opts)?;
            // A compact copy of each settled node, read one at a time: a resume of 10,000
            // settled stages held every stored record (about 800 bytes each) besides.
            let mut map = HashMap::new();
            store.each_node(id, &mut |mut n| {
                let key = (std::mem::take(&mut n.scope), std::mem::take(&mut n.node));
                map.insert(key, Box::new(super::frame::Resumed::new(n)));
            })?;
            (run, map)
        }
        None => {
            preflight_notes = check_agents(&opts)?;
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
            let mut run = RunRecord {
                id: id.clone(),
                workflow: plan.workflow.name.value.clone(),
                file: prepared.path.to_string_lossy().into_owned(),
                workflow_hash: prepared.hash.clone(),
                params: super::params_json(&plan.params),
                status: RunStatus::Running,
                exit: None,
                started_at: started,
                updated_at: started,
                dir: opts
                    .state_dir
                    .join("runs")
                    .join(&id)
                    .to_string_lossy()
                    .into_owned(),
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
                        run.dir = opts
                            .state_dir
                            .join("runs")
                            .join(&run.id)
                            .to_string_lossy()
                            .into_owned();
                    }
                    other => break other?,
                }
            }
            (run, HashMap::new())
        }
    };
    // The tenure this executor holds the run by: a worker's claim (which took the lock
    // already), else a new one. Every write of this store to the run is fenced by it.
    let owner = match &opts.owner {
        Some(claimed) => claimed.clone(),
        None => crate::store::current_owner().with_lease(opts.lease),
    };
    store.lock(&run.id, &owner)?;
    // A queued run (`run --detach`) starts here, on a worker: nothing of it ran before.
    let first_start = run.status == RunStatus::Queued && resumed.is_empty();
    // What a killed executor of this run left running is stopped before anything starts
    // again, so that no stage ever runs beside an earlier copy of itself.
    let mut leftovers = 0;
    if opts.resume.is_some() {
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
        leftovers = crate::backend::process::stop_leftovers(tag, &pid_files, &logs);
        // Those attempts are over: say so, so that `status` and `logs` do not show them as
        // running beside the new ones.
        let writes: Vec<Write> = interrupted
            .into_iter()
            .map(|mut a| {
                a.state = AttemptState::Interrupted;
                a.finished_at = Some(now_ms());
                a.error = Some(
                    "the run stopped while this attempt ran; resume ran the stage again".into(),
                );
                Write::Attempt(a)
            })
            .collect();
        if !writes.is_empty() {
            store.commit(&writes)?;
        }
    }
    store.set_status(&run.id, RunStatus::Running, None)?;
    std::fs::create_dir_all(&run.dir).map_err(|e| RunError::io("create", &run.dir, e))?;
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
    let artifacts = super::artifacts::Artifacts::start(Path::new(&run.dir));
    let units = match (spread, units_store) {
        (Some((_, labels)), Some(pg)) => Some(super::units::Units::new(
            pg,
            &run.id,
            &owner.holder,
            labels,
            unit_wake,
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
        interrupt,
        usage: RefCell::new(HashMap::new()),
        denied: RefCell::default(),
        replay,
        recorder,
        unreported_noted: RefCell::default(),
        store_error: RefCell::new(None),
        memory,
        outputs,
        to_store: RefCell::default(),
        publisher: publish.map(super::publish::Publisher::new),
        units,
    };
    if leftovers > 0 {
        let text = format!(
            "stopped {leftovers} process{} that the run's previous executor left running",
            if leftovers == 1 { "" } else { "es" }
        );
        shared.progress.note(&format!("! {text}"));
        shared.event("", "", "warning", text);
    }
    for note in preflight_notes.into_iter().chain(secret_notes) {
        shared.progress.note(&format!("! {note}"));
        shared.event("", "", "warning", note);
    }
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
    let exec = Exec::new(&shared, plan, &prepared.sources, String::new())?;
    exec.warn_unenforceable_budgets()?;
    // Subflows whose params are written out are prepared now, once: an invalid one or an
    // agent of theirs that cannot run stops the run before anything starts.
    if let Err(e) = shared.preload_subflows(plan, &prepared.sources) {
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
    let stop = shared.opts.stop.clone();
    let ctrl_c = async {
        let told = async {
            match stop {
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
    };
    let heartbeat = async {
        match owner.lease() {
            Some(_) => heartbeat(&shared, lease_store, durability, &owner).await,
            None => std::future::pending().await,
        }
    };
    let cancelled: RefCell<Option<crate::store::Cancellation>> = RefCell::new(None);
    let cancel_watch = async {
        match cancel_store {
            Some(store) => watch_cancel(&shared, store, &cancelled).await,
            None => std::future::pending().await,
        }
    };
    let programs_before = crate::backend::process::programs_started();
    let end = tokio::select! {
        end = exec.run_body(&top) => end,
        () = ctrl_c => BodyEnd::Stopped,
        () = heartbeat => BodyEnd::Stopped,
        () = cancel_watch => BodyEnd::Stopped,
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
    let cancelled = cancelled.into_inner().or_else(|| {
        let store = shared.store.borrow();
        let run = store.run(&shared.run.id).ok().flatten()?;
        (run.status == RunStatus::Cancelled).then(|| cancellation_of(&run))
    });
    let end = if let Some(halt) = shared.store_error.borrow_mut().take() {
        return Err(RunError::Halted(halt));
    } else if let Some(c) = cancelled {
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
    };
    if let Some(path) = &run_worktree {
        exec.leave_run_worktree(path, &end).await;
    }
    let mut store = shared.store.into_inner();
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
        message: match &end {
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
        },
    };
    // Written straight to the store, not through the run's queue (the store masks it).
    store
        .commit(&[Write::Event(event)])
        .and_then(|()| store.set_status(&shared.run.id, status, exit))
        .and_then(|()| store.unlock(&shared.run.id, &owner))?;
    let outputs = super::RanOutputs(top.outputs.clone());
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

/// Renews the run's lease every third of it, through `store` (a shared handle on the
/// executor's connection), or else through a connection of its own opened on the run's
/// store when first needed (SQLite), on tokio's blocking pool, so a slow store does not hold the executor up. When the lease is
/// lost (another tenure took the run over, or it could not be renewed before it expired:
/// the run may be another's now), the run stops as a failed commit stops it: its programs
/// are stopped, nothing more is written (no settlement, no status: the next holder owns
/// them), and units under way on workers are left to the next coordinator. Never completes
/// otherwise.
async fn heartbeat(
    shared: &Shared,
    store: Option<Box<dyn Store + Send>>,
    durability: crate::store::sqlite::Durability,
    owner: &crate::store::LockOwner,
) {
    use crate::store::StoreError;
    let lease = Duration::from_millis(
        owner
            .lease()
            .map_or(30_000, |l| u64::try_from(l).unwrap_or(1)),
    );
    let period = lease / 3;
    let store = Arc::new(std::sync::Mutex::new(store));
    let location = shared.opts.location();
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
                    None => handle
                        .insert(location.open(durability)?)
                        .renew(&run, &owner),
                },
                Err(_) => Err(StoreError::State("the lease's connection failed".into())),
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

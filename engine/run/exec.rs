//! The executor: runs the bodies of a plan as DAGs, loops as bounded repetitions of a body,
//! fan-outs as concurrent bodies. Single-threaded (a current-thread tokio runtime): agents
//! and commands are processes and requests, so one thread is plenty, and the state needs no
//! locks. Every settled node is committed before anything that depends on it starts; nodes
//! that settle together are committed together.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::LocalBoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use minijinja::Value;
use petgraph::Direction;
use petgraph::visit::EdgeRef;
use serde_json::{Value as Json, json};
use tokio::sync::{Semaphore, watch};

use super::extract::Extractor;
use super::progress::Progress;
use super::resource::PrioritySemaphore;
use super::{Prepared, RunEnd, RunOptions, RunResult, now_ms};
use crate::backend::replay::{Recorder, ReplayBackend};
use crate::backend::{AgentConfig, Backend, Usage};
use crate::check::StageId as NodeId;
use crate::compile::{Edge, Plan, Target, resolve_count, resolve_duration};
use crate::model::{Action, StageBody, StageKind};
use crate::source::Sources;
use crate::store::{NodeRecord, NodeState, RunRecord, RunStatus, Store, Write, rfc3339};

/// What is shared by a run and its subflows.
pub(crate) struct Shared {
    pub opts: RunOptions,
    pub run: RunRecord,
    pub store: RefCell<Box<dyn Store>>,
    pub pending: RefCell<Vec<Write>>,
    /// Settled nodes of an earlier attempt at this run, by (scope, node).
    pub resumed: RefCell<HashMap<(String, String), NodeRecord>>,
    pub interrupt: watch::Sender<bool>,
    pub progress: Progress,
    pub global: Option<Semaphore>,
    /// Usage by key: `""` for the run, a loop instance's key for a loop.
    pub usage: RefCell<HashMap<String, Usage>>,
    pub replay: Option<Arc<ReplayBackend>>,
    pub recorder: Option<Arc<Recorder>>,
    /// A store failure: the run cannot be trusted to be durable any more, so it stops.
    pub store_error: RefCell<Option<String>>,
    /// A second connection to the store, for `earlier_runs()` in templates (template
    /// functions must be `Send + Sync`; the executor's own connection is not shared).
    pub memory: Arc<std::sync::Mutex<crate::store::sqlite::SqliteStore>>,
}

impl Shared {
    /// Queues a write for the next group commit.
    pub fn write(&self, mut w: Write) {
        w.redact();
        self.pending.borrow_mut().push(w);
    }

    /// Commits every queued write in one transaction.
    pub fn flush(&self) {
        let writes: Vec<Write> = std::mem::take(&mut *self.pending.borrow_mut());
        if writes.is_empty() {
            return;
        }
        if let Err(e) = self.store.borrow_mut().commit(&writes) {
            tracing::error!("store commit failed: {e}");
            self.store_error.borrow_mut().get_or_insert(e.0);
            let _ = self.interrupt.send(true);
        }
    }

    /// A failure to write the state directory (artifacts): handled like a failed commit, so
    /// that the run stops, nothing new starts, and `resume` continues once it is fixed.
    pub fn io_failed(&self, message: String) -> Outcome {
        tracing::error!("state directory: {message}");
        self.store_error
            .borrow_mut()
            .get_or_insert(format!("the state directory cannot be written: {message}"));
        let _ = self.interrupt.send(true);
        Outcome::Stopped
    }

    /// Queues an event.
    pub fn event(&self, scope: &str, node: &str, kind: &str, message: String) {
        self.write(Write::Event(crate::store::Event {
            run: self.run.id.clone(),
            at: now_ms(),
            scope: scope.to_string(),
            node: node.to_string(),
            kind: kind.to_string(),
            message,
        }));
    }
}

/// A frame: one execution of a body (the top level, a loop iteration, a for_each item, a
/// group), with what its templates see.
#[derive(Default)]
pub(crate) struct Frame<'a> {
    pub parent: Option<&'a Frame<'a>>,
    pub region: Option<NodeId>,
    /// Where in the run (`""`, `attempts#2`, `tickets#T-1/attempts#1`).
    pub scope: String,
    pub cwd: PathBuf,
    /// Variables this frame adds (loop variables, the item).
    pub vars: Vec<(String, Value)>,
    /// For a loop iteration: the loop's name and its variables (for `loops.ID`).
    pub loop_vars: Option<(String, Value)>,
    /// For a loop iteration: the outputs of earlier iterations, oldest first.
    pub earlier: Rc<Vec<BTreeMap<String, Json>>>,
    /// For a loop iteration: the key under which the loop's usage is summed, and its budget.
    pub usage_key: Option<(String, NodeId)>,
    /// What ran in this frame (and the latest outputs of loops and groups inside it).
    pub outputs: RefCell<BTreeMap<String, View>>,
    /// A group's concurrency limit.
    pub limit: Option<Rc<Semaphore>>,
    /// For a for_each item: the items of the same fan-out that have settled so far
    /// (`stages.FOR_EACH.settled`), shared by every item.
    pub siblings: Option<Rc<RefCell<Vec<Json>>>>,
}

impl Frame<'_> {
    fn chain(&self) -> Vec<&Frame<'_>> {
        let mut out = vec![self];
        let mut cur = self.parent;
        while let Some(f) = cur {
            out.push(f);
            cur = f.parent;
        }
        out.reverse();
        out
    }

    pub fn child_scope(&self, part: &str) -> String {
        if self.scope.is_empty() {
            part.to_string()
        } else {
            format!("{}/{part}", self.scope)
        }
    }
}

/// What templates see of a settled stage.
#[derive(Clone, Debug)]
pub(crate) struct View {
    pub output: Json,
    pub state: NodeState,
    pub feedback: Option<String>,
    pub attempts: u32,
    pub usage: Usage,
}

/// How a node settled, or why it did not.
#[derive(Debug)]
pub(crate) enum Outcome {
    Settled(Settled),
    /// A gate waits for an answer (and the run does not keep polling).
    Waiting,
    /// The run is stopping (Ctrl-C, an exit elsewhere).
    Stopped,
}

#[derive(Debug)]
pub(crate) struct Settled {
    pub state: NodeState,
    pub output: Json,
    pub action: Option<Target>,
    pub feedback: Option<String>,
    /// Why it failed, for the run's message.
    pub message: Option<String>,
    pub attempts: u32,
    pub usage: Usage,
    pub started_at: i64,
    /// It came from the store (a resume); it is not written again.
    pub resumed: bool,
    /// It failed for reasons outside the work (an agent that could not be reached, a
    /// timeout, a program that could not start): its `on_error` is taken, and its message
    /// is never handed to an agent as feedback.
    pub infra: bool,
}

impl Settled {
    pub fn new(state: NodeState, output: Json, started_at: i64) -> Self {
        Settled {
            state,
            output,
            action: None,
            feedback: None,
            message: None,
            attempts: 0,
            usage: Usage::default(),
            started_at,
            resumed: false,
            infra: false,
        }
    }

    /// A failure for reasons outside the work: no feedback, the given action.
    pub fn error(state: NodeState, message: String, action: Target, started_at: i64) -> Self {
        let mut s = Settled::new(state, Json::Null, started_at);
        s.message = Some(message);
        s.action = Some(action);
        s.infra = true;
        s
    }
}

/// How a body ended.
#[derive(Debug)]
pub(crate) enum BodyEnd {
    Completed,
    Continue(Option<String>),
    Break,
    Exit(usize),
    Failed {
        node: String,
        message: String,
        feedback: Option<String>,
        /// The failure's cause lies outside the work (see [`Settled::infra`]).
        infra: bool,
    },
    Waiting,
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ns {
    Pending,
    Running,
    Ran,
    Failed,
    Skipped,
    Waiting,
}

/// The executor of one plan (the run's, or a subflow's).
pub(crate) struct Exec<'p> {
    pub shared: &'p Shared,
    pub plan: &'p Plan,
    pub sources: &'p Sources,
    pub env: minijinja::Environment<'static>,
    /// Prefix of every scope (a subflow's place in the parent run).
    pub prefix: String,
    pub agents: Vec<AgentConfig>,
    pub backends: RefCell<HashMap<String, Arc<dyn Backend>>>,
    pub extractors: HashMap<NodeId, Extractor>,
    pub resources: Vec<PrioritySemaphore>,
    pub stop: watch::Sender<bool>,
    pub exit: Cell<Option<usize>>,
    pub params: Value,
}

/// Checks, before anything runs, that every agent a stage of the plan can call is usable
/// here (its program installed, its key set), or has a fallback that is. Returns notes on
/// agents that will hand over to a fallback; fails with what to install or set.
fn preflight(prepared: &Prepared, opts: &RunOptions) -> Result<Vec<String>, String> {
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
                Err(why) => reasons.push(format!("agent `{}`: {why}", config.name)),
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
        Err(format!(
            "{} agent{} of this workflow cannot run here, so nothing was started:\n  {}\n\
             Install or set what is named, give the agent a `fallbacks` entry that can run, \
             or point it at another backend with `--set` or an override.",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems.join("\n  ")
        ))
    }
}

/// Registers the values of the API key variables the workflow's agents use as secrets, so
/// that nothing written or printed from now on holds them (see [`crate::secrets`]).
fn register_secrets(prepared: &Prepared) {
    use crate::model::AgentKind;
    for a in &prepared.plan.workflow.agents {
        let var = match a.kind.value {
            AgentKind::OpenAi | AgentKind::Anthropic => {
                agent_config(a, &prepared.plan, &prepared.sources)
                    .ok()
                    .and_then(|c| crate::backend::http::key_variable(&c))
            }
            _ => a.api_key_env.as_ref().map(|v| v.value.clone()),
        };
        if let Some(var) = var {
            crate::secrets::register_env(&var);
        }
    }
}

/// Keeps the state directory (the store, artifacts, worktrees) out of the user's git tree
/// without the user doing anything, as pytest does with its cache: a `.gitignore` holding
/// `*` inside it, which ignores itself too.
fn ignore_in_git(state_dir: &Path) -> Result<(), String> {
    let path = state_dir.join(".gitignore");
    if path.exists() {
        return Ok(());
    }
    std::fs::write(
        &path,
        "# Written by ralph-flow: its state stays out of git.\n*\n",
    )
    .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Runs a prepared workflow (or resumes a run of it) to its end.
pub async fn execute(prepared: &Prepared, mut opts: RunOptions) -> Result<RunResult, String> {
    // Before anything runs or is recorded, every agent must be usable (a replayed run calls
    // none).
    let check_agents = |opts: &RunOptions| {
        if opts.replay.is_none() {
            preflight(prepared, opts)
        } else {
            Ok(Vec::new())
        }
    };
    let preflight_notes;
    register_secrets(prepared);
    std::fs::create_dir_all(&opts.state_dir)
        .map_err(|e| format!("cannot create {}: {e}", opts.state_dir.display()))?;
    ignore_in_git(&opts.state_dir)?;
    let durability = if opts.full_sync {
        crate::store::sqlite::Durability::Full
    } else {
        crate::store::sqlite::Durability::Normal
    };
    let db = crate::store::sqlite::default_path(&opts.state_dir);
    let mut store =
        crate::store::sqlite::SqliteStore::open_with(&db, durability).map_err(|e| e.to_string())?;
    store.on_busy(|m| eprintln!("! store: {}", super::progress::printable(m)));
    let mut store: Box<dyn Store> = Box::new(store);
    let plan = &prepared.plan;
    let (run, resumed) = match &opts.resume {
        Some(id) => {
            let run = store
                .run(id)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("there is no run `{id}`; `ralph-flow runs` lists them"))?;
            if run.status == RunStatus::Finished {
                return Err(format!(
                    "run `{id}` has finished (exit {}); start a new one with `ralph-flow run`",
                    run.exit
                        .as_ref()
                        .map_or("?".to_string(), |(n, c)| format!("{n} = {c}"))
                ));
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
            let nodes = store.nodes(id).map_err(|e| e.to_string())?;
            let map = nodes
                .into_iter()
                .map(|n| ((n.scope.clone(), n.node.clone()), n))
                .collect();
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
            let run = RunRecord {
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
            store.create_run(&run).map_err(|e| e.to_string())?;
            (run, HashMap::new())
        }
    };
    let owner = crate::store::current_owner();
    store.lock(&run.id, &owner).map_err(|e| e.to_string())?;
    // What a killed executor of this run left running is stopped before anything starts
    // again, so that no stage ever runs beside an earlier copy of itself.
    let mut leftovers = 0;
    if opts.resume.is_some() {
        let interrupted: Vec<crate::store::AttemptRecord> = store
            .attempts(&run.id, None)
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|a| a.state == "running")
            .collect();
        let pid_files: Vec<PathBuf> = interrupted
            .iter()
            .map(|a| PathBuf::from(&a.dir).join("process"))
            .collect();
        leftovers = crate::backend::process::stop_leftovers(&run.id, &pid_files);
        // Those attempts are over: say so, so that `status` and `logs` do not show them as
        // running beside the new ones.
        let writes: Vec<Write> = interrupted
            .into_iter()
            .map(|mut a| {
                a.state = "interrupted".into();
                a.finished_at = Some(now_ms());
                a.error = Some(
                    "the run stopped while this attempt ran; resume ran the stage again".into(),
                );
                Write::Attempt(a)
            })
            .collect();
        if !writes.is_empty() {
            store.commit(&writes).map_err(|e| e.to_string())?;
        }
    }
    store
        .set_status(&run.id, RunStatus::Running, None)
        .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&run.dir).map_err(|e| format!("cannot create {}: {e}", run.dir))?;
    let replay = match &opts.replay {
        Some(p) => Some(Arc::new(ReplayBackend::open(p)?)),
        None => None,
    };
    let recorder = match &opts.record {
        Some(p) => Some(Arc::new(Recorder::create(p, opts.resume.is_some())?)),
        None => None,
    };
    let (interrupt, _) = watch::channel(false);
    let shared = Shared {
        global: opts.max_concurrency.map(|n| Semaphore::new(n.max(1))),
        progress: Progress::new(opts.progress),
        opts,
        run,
        store: RefCell::new(store),
        pending: RefCell::new(Vec::new()),
        resumed: RefCell::new(resumed),
        interrupt,
        usage: RefCell::new(HashMap::new()),
        replay,
        recorder,
        store_error: RefCell::new(None),
        memory: Arc::new(std::sync::Mutex::new(
            crate::store::sqlite::SqliteStore::open(&db).map_err(|e| e.to_string())?,
        )),
    };
    if leftovers > 0 {
        let text = format!(
            "stopped {leftovers} process{} that the run's previous executor left running",
            if leftovers == 1 { "" } else { "es" }
        );
        shared.progress.note(&format!("! {text}"));
        shared.event("", "", "warning", text);
    }
    for note in preflight_notes {
        shared.progress.note(&format!("! {note}"));
        shared.event("", "", "warning", note);
    }
    if shared.opts.resume.is_some() {
        shared.event("", "", "resumed", format!("resumed by pid {}", owner.pid));
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
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = shared.interrupt.send(true);
        }
        std::future::pending::<()>().await;
    };
    let end = tokio::select! {
        end = exec.run_body(&top) => end,
        () = ctrl_c => BodyEnd::Stopped,
    };
    shared.flush();
    shared.progress.finish();
    let end = if let Some(e) = shared.store_error.borrow().clone() {
        return Err(format!(
            "the store failed, so the run stopped (resume it once the cause is fixed): {e}"
        ));
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
        },
    };
    store
        .commit(&[Write::Event(event)])
        .and_then(|()| store.set_status(&shared.run.id, status, exit))
        .and_then(|()| store.unlock(&shared.run.id, owner.pid))
        .map_err(|e| e.to_string())?;
    let outputs = top
        .outputs
        .borrow()
        .iter()
        .filter(|(_, v)| v.state != NodeState::Skipped)
        .map(|(k, v)| (k.clone(), v.output.clone()))
        .collect();
    let usage = shared.usage.borrow().get("").cloned().unwrap_or_default();
    Ok(RunResult {
        run_id: shared.run.id.clone(),
        end,
        outputs,
        usage,
    })
}

fn new_run_id(ms: i64) -> String {
    let secs = ms / 1000;
    let t = std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    let stamp = humantime::format_rfc3339_seconds(t).to_string();
    let stamp: String = stamp
        .chars()
        .filter(|c| c.is_ascii_digit())
        .take(14)
        .collect();
    let salt = (u64::from(std::process::id()) << 20) ^ (ms as u64 % 1000) ^ nanos();
    format!("{}-{}-{:04x}", &stamp[..8], &stamp[8..], salt & 0xffff)
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0)
}

/// Makes a scope or a key safe as one path component.
pub fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '#') {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    if out.is_empty() || out.starts_with('.') {
        format!("_{out}")
    } else {
        out
    }
}

impl<'p> Exec<'p> {
    pub fn new(
        shared: &'p Shared,
        plan: &'p Plan,
        sources: &'p Sources,
        prefix: String,
    ) -> Result<Self, String> {
        let mut env = plan.templates.clone();
        let roots = [shared.opts.cwd.clone(), shared.opts.state_dir.clone()]
            .into_iter()
            .chain(
                plan.workflow
                    .file_roots
                    .iter()
                    .map(|r| crate::check::base_dir(sources, r.span).join(&r.value)),
            );
        super::helpers::register(&mut env, super::helpers::Roots::new(roots));
        super::helpers::register_memory(
            &mut env,
            shared.memory.clone(),
            plan.workflow.name.value.clone(),
            shared.run.id.clone(),
        );
        // A stage that has not run (yet) is undefined, and so are its attributes
        // (`stages.review.last` in the first iteration): templates guard with `is defined`.
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
        let mut agents = Vec::new();
        for a in &plan.workflow.agents {
            agents.push(agent_config(a, plan, sources)?);
        }
        let mut extractors = HashMap::new();
        for (i, node) in plan.nodes.iter().enumerate() {
            let id = NodeId(i);
            if matches!(
                node.kind,
                StageKind::Agent | StageKind::Command | StageKind::Check
            ) {
                let st = plan.stage(id);
                let declared = st.output.as_ref().and_then(|o| o.schema.as_ref());
                let schema = declared.and(plan.schemas.get(&id));
                let ex = Extractor::new(st.output.as_ref(), schema)
                    .map_err(|e| format!("stage `{}`: {e}", node.name))?;
                extractors.insert(id, ex);
            }
        }
        let mut resources = Vec::new();
        for r in &plan.workflow.resources {
            let cap = resolve_count(&r.capacity.value, &plan.params)
                .map_err(|e| format!("resource `{}`: {e}", r.name.value))?;
            resources.push(PrioritySemaphore::new(usize::try_from(cap).unwrap_or(1)));
        }
        let (stop, _) = watch::channel(false);
        Ok(Exec {
            shared,
            plan,
            sources,
            env,
            prefix,
            agents,
            backends: RefCell::new(HashMap::new()),
            extractors,
            resources,
            stop,
            exit: Cell::new(None),
            params: jv(&plan.params),
        })
    }

    /// Builds every agent's backend (a bad setting fails the run before anything starts)
    /// and says loudly when a budget cannot be enforced because a backend does not report
    /// what it counts (cost, or tokens).
    fn warn_unenforceable_budgets(&self) -> Result<(), String> {
        let budgets = self.plan.workflow.budget.iter().chain(
            (0..self.plan.nodes.len()).filter_map(|i| self.plan.stage(NodeId(i)).budget.as_ref()),
        );
        let (mut cost, mut tokens) = (false, false);
        for b in budgets {
            cost |= b.cost_usd.is_some();
            tokens |= b.tokens.is_some();
        }
        for (i, a) in self.agents.iter().enumerate() {
            let caps = self.backend(i)?.capabilities();
            let mut missing = Vec::new();
            if cost && !caps.cost {
                missing.push("cost");
            }
            if tokens && !caps.usage {
                missing.push("tokens");
            }
            if !missing.is_empty() {
                let text = format!(
                    "agent `{}` ({}) does not report {}, so its calls do not count against the {} budgets",
                    a.name,
                    a.kind.as_str(),
                    missing.join(" or "),
                    missing.join(" and ")
                );
                tracing::warn!("{text}");
                self.shared.progress.note(&format!("! {text}"));
                self.shared.event("", "", "warning", text);
            }
        }
        Ok(())
    }

    /// The full scope of a frame (with a subflow's prefix).
    pub fn scope(&self, frame: &Frame<'_>) -> String {
        match (self.prefix.is_empty(), frame.scope.is_empty()) {
            (true, _) => frame.scope.clone(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{}", self.prefix, frame.scope),
        }
    }

    /// Tells whether the run is stopping (an exit taken, Ctrl-C, a store failure): nothing
    /// new may start.
    pub fn halted(&self) -> bool {
        *self.stop.borrow()
            || *self.shared.interrupt.borrow()
            || self.shared.store_error.borrow().is_some()
    }

    /// Completes when the run stops (an exit taken, Ctrl-C, a store failure).
    pub async fn stopped(&self) {
        let mut a = self.stop.subscribe();
        let mut b = self.shared.interrupt.subscribe();
        tokio::select! {
            _ = a.wait_for(|v| *v) => {},
            _ = b.wait_for(|v| *v) => {},
        }
    }

    /// Ends the run with an exit: stops everything else.
    fn take_exit(&self, i: usize) {
        if self.exit.get().is_none() {
            self.exit.set(Some(i));
        }
        let _ = self.stop.send(true);
    }

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
    fn success_exit(&self) -> String {
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
    fn exit_end(&self, i: usize, message: Option<String>) -> RunEnd {
        let e = &self.plan.exits[i];
        let own = || {
            e.message.as_ref().map(|m| {
                crate::compile::render_params(m, &self.plan.params).unwrap_or_else(|_| m.clone())
            })
        };
        RunEnd::Exit {
            name: e.name.clone(),
            code: e.code,
            message: message.or_else(own),
        }
    }

    // ----- templates -----

    /// Builds the template context of a frame, with extra variables.
    pub fn context(&self, frame: &Frame<'_>, extra: &[(&str, Value)]) -> Value {
        let chain = frame.chain();
        let mut stages: BTreeMap<String, BTreeMap<&'static str, Value>> = BTreeMap::new();
        let mut vars: BTreeMap<String, Value> = BTreeMap::new();
        let mut loops: BTreeMap<String, Value> = BTreeMap::new();
        for f in &chain {
            if let Some(last) = f.earlier.last() {
                let mut names: HashSet<&String> = HashSet::new();
                for it in f.earlier.iter() {
                    names.extend(it.keys());
                }
                for name in names {
                    let e = stages.entry(name.clone()).or_default();
                    e.insert("last", last.get(name).map(jv).unwrap_or(Value::from(())));
                    let hist: Vec<Value> = f
                        .earlier
                        .iter()
                        .filter_map(|m| m.get(name).map(jv))
                        .collect();
                    e.insert("history", Value::from(hist));
                }
            }
            for (name, v) in f.outputs.borrow().iter() {
                let e = stages.entry(name.clone()).or_default();
                e.insert("output", jv(&v.output));
                e.insert("status", Value::from(v.state.as_str()));
                e.insert("ran", Value::from(v.state != NodeState::Skipped));
                e.insert(
                    "feedback",
                    v.feedback.clone().map(Value::from).unwrap_or_default(),
                );
                e.insert("attempts", Value::from(v.attempts));
                e.insert("usage", jv(&v.usage));
            }
            for (k, v) in &f.vars {
                vars.insert(k.clone(), v.clone());
            }
            if let (Some(n), Some(settled)) = (f.region, &f.siblings) {
                let e = stages.entry(self.plan.node(n).name.clone()).or_default();
                e.insert("settled", jv(&*settled.borrow()));
            }
            if let Some((name, v)) = &f.loop_vars {
                loops.insert(name.clone(), v.clone());
            }
        }
        let mut run: BTreeMap<&str, Value> = BTreeMap::new();
        run.insert("id", Value::from(self.shared.run.id.clone()));
        run.insert("dir", Value::from(self.shared.run.dir.clone()));
        run.insert(
            "workflow",
            Value::from(self.plan.workflow.name.value.clone()),
        );
        run.insert(
            "started_at",
            Value::from(rfc3339(self.shared.run.started_at)),
        );
        run.insert("cwd", Value::from(frame.cwd.to_string_lossy().into_owned()));
        let mut ctx: BTreeMap<String, Value> = vars;
        ctx.insert("params".into(), self.params.clone());
        ctx.insert(
            "stages".into(),
            Value::from(
                stages
                    .into_iter()
                    .map(|(k, v)| (k, Value::from(v)))
                    .collect::<BTreeMap<_, _>>(),
            ),
        );
        ctx.insert("loops".into(), Value::from(loops));
        for (k, v) in extra {
            if *k == "stage_dir" {
                run.insert("stage_dir", v.clone());
            } else {
                ctx.insert((*k).to_string(), v.clone());
            }
        }
        ctx.insert("run".into(), Value::from(run));
        Value::from(ctx)
    }

    /// Renders a compiled template of the plan (`STAGE/prompt`, ...).
    pub fn render(&self, name: &str, ctx: &Value) -> Result<String, String> {
        let t = self
            .env
            .get_template(name)
            .map_err(|e| format!("template `{name}`: {e}"))?;
        let text = t.render(ctx).map_err(|e| describe_error(&e))?;
        if !name.contains("/argv/") && super::helpers::spread_items(&text).is_some() {
            return Err(
                "`spread` makes one argument per item and works only as a whole argv item of a command or check"
                    .into(),
            );
        }
        Ok(text)
    }

    /// Evaluates an expression (`when`, `until`, `over`, ...).
    pub fn eval(&self, src: &str, ctx: &Value) -> Result<Value, String> {
        let expr = self
            .env
            .compile_expression(src)
            .map_err(|e| describe_error(&e))?;
        expr.eval(ctx)
            .map_err(|e| format!("`{src}`: {}", describe_error(&e)))
    }

    // ----- bodies -----

    /// Runs a body to its end.
    pub fn run_body<'s>(&'s self, frame: &'s Frame<'s>) -> LocalBoxFuture<'s, BodyEnd> {
        async move {
            let body = self.plan.body(frame.region);
            let g = &body.graph;
            let mut state: HashMap<NodeId, Ns> =
                body.order.iter().map(|n| (*n, Ns::Pending)).collect();
            let mut chosen: HashSet<NodeId> = HashSet::new();
            let mut ending: Option<BodyEnd> = None;
            let mut waiting = false;
            let mut running: FuturesUnordered<LocalBoxFuture<'s, (NodeId, Outcome)>> =
                FuturesUnordered::new();
            loop {
                if ending.is_none() && !self.halted() {
                    let mut progressed = true;
                    while progressed {
                        progressed = false;
                        for &n in &body.order {
                            if state[&n] != Ns::Pending {
                                continue;
                            }
                            let Some(&idx) = body.index.get(&n) else {
                                continue;
                            };
                            let mut ready = true;
                            let mut needs_ran = Vec::new();
                            let mut routed = false;
                            for e in g.edges_directed(idx, Direction::Incoming) {
                                let from = g[e.source()];
                                match state[&from] {
                                    Ns::Pending | Ns::Running | Ns::Waiting => ready = false,
                                    s => match e.weight() {
                                        Edge::Needs => needs_ran.push(s == Ns::Ran),
                                        Edge::Route(_) => routed = true,
                                    },
                                }
                            }
                            if !ready {
                                continue;
                            }
                            progressed = true;
                            let run = match self.decide(frame, n, &needs_ran, routed, &chosen) {
                                Ok(run) => run,
                                Err(message) => {
                                    let node = self.plan.node(n).name.clone();
                                    let mut s =
                                        Settled::new(NodeState::Failed, Json::Null, now_ms());
                                    s.message = Some(message.clone());
                                    s.feedback = Some(message);
                                    s.action = Some(Target::Fail);
                                    self.settle(frame, n, &s);
                                    state.insert(n, Ns::Failed);
                                    ending.get_or_insert(BodyEnd::Failed {
                                        node,
                                        message: s.message.unwrap_or_default(),
                                        feedback: s.feedback,
                                        infra: true,
                                    });
                                    break;
                                }
                            };
                            if run {
                                state.insert(n, Ns::Running);
                                running.push(self.run_node(frame, n));
                            } else {
                                let s = Settled::new(NodeState::Skipped, Json::Null, now_ms());
                                self.settle(frame, n, &s);
                                state.insert(n, Ns::Skipped);
                            }
                        }
                        if ending.is_some() {
                            break;
                        }
                    }
                }
                self.shared.flush();
                let Some((n, outcome)) = running.next().await else {
                    break;
                };
                let mut done = vec![(n, outcome)];
                while let Some(Some(more)) = running.next().now_or_never() {
                    done.push(more);
                }
                for (n, outcome) in done {
                    match outcome {
                        Outcome::Settled(s) => {
                            self.settle(frame, n, &s);
                            state.insert(
                                n,
                                match s.state {
                                    NodeState::Done => Ns::Ran,
                                    NodeState::Skipped => Ns::Skipped,
                                    NodeState::Failed | NodeState::TimedOut => Ns::Failed,
                                },
                            );
                            let node = self.plan.node(n).name.clone();
                            match s.action {
                                None => {}
                                Some(Target::Stage(t)) => {
                                    chosen.insert(t);
                                }
                                Some(Target::Continue) => {
                                    ending.get_or_insert(BodyEnd::Continue(s.feedback));
                                }
                                Some(Target::Break) => {
                                    ending.get_or_insert(BodyEnd::Break);
                                }
                                Some(Target::Exit(i)) => {
                                    self.take_exit(i);
                                    ending.get_or_insert(BodyEnd::Exit(i));
                                }
                                Some(Target::Fail | Target::Reject) => {
                                    if frame.parent.is_none() && self.prefix.is_empty() {
                                        // A failure at the top level ends the run.
                                        let _ = self.stop.send(true);
                                    }
                                    ending.get_or_insert(BodyEnd::Failed {
                                        node,
                                        message: s.message.unwrap_or_else(|| "failed".into()),
                                        feedback: s.feedback,
                                        infra: s.infra,
                                    });
                                }
                                Some(Target::Approve) => {}
                            }
                        }
                        Outcome::Waiting => {
                            state.insert(n, Ns::Waiting);
                            waiting = true;
                        }
                        Outcome::Stopped => {
                            state.insert(n, Ns::Skipped);
                            ending.get_or_insert(BodyEnd::Stopped);
                        }
                    }
                }
            }
            self.shared.flush();
            if self.halted() && ending.is_none() {
                return match self.exit.get() {
                    Some(i) => BodyEnd::Exit(i),
                    None => BodyEnd::Stopped,
                };
            }
            match ending {
                Some(e) => e,
                None if waiting => BodyEnd::Waiting,
                None => BodyEnd::Completed,
            }
        }
        .boxed_local()
    }

    /// Decides whether a ready node runs (`true`) or is skipped.
    fn decide(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        needs_ran: &[bool],
        routed: bool,
        chosen: &HashSet<NodeId>,
    ) -> Result<bool, String> {
        if let Some(rec) = self.shared.resumed.borrow().get(&self.key(frame, n)) {
            return Ok(rec.state != NodeState::Skipped);
        }
        if routed {
            if !chosen.contains(&n) {
                return Ok(false);
            }
        } else if !needs_ran.is_empty() && !needs_ran.iter().any(|r| *r) {
            return Ok(false);
        }
        // Escalation rules and `when` are expressions, evaluated like every other one; the
        // context is built once, and only when there is something to evaluate.
        let rules: Vec<&str> = match self.plan.node(n).parent {
            Some(p) => self
                .plan
                .node(p)
                .escalations
                .iter()
                .filter(|(_, targets)| targets.contains(&n))
                .map(|(cond, _)| cond.as_str())
                .collect(),
            None => Vec::new(),
        };
        let when = self.plan.stage(n).when.as_ref();
        if rules.is_empty() && when.is_none() {
            return Ok(true);
        }
        let ctx = self.context(frame, &[]);
        if !rules.is_empty() {
            let mut any = false;
            for r in rules {
                let v = self
                    .eval(r, &ctx)
                    .map_err(|e| format!("an escalation rule could not be evaluated: {e}"))?;
                if v.is_true() {
                    any = true;
                    break;
                }
            }
            if !any {
                return Ok(false);
            }
        }
        if let Some(w) = when {
            let v = self
                .eval(&w.value, &ctx)
                .map_err(|e| format!("its `when` could not be evaluated: {e}"))?;
            if !v.is_true() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Records a settled node: in the frame (for templates) and in the store.
    fn settle(&self, frame: &Frame<'_>, n: NodeId, s: &Settled) {
        let name = self.plan.node(n).name.clone();
        let scope = self.scope(frame);
        frame.outputs.borrow_mut().insert(
            name.clone(),
            View {
                output: s.output.clone(),
                state: s.state,
                feedback: s.feedback.clone(),
                attempts: s.attempts,
                usage: s.usage.clone(),
            },
        );
        if s.resumed {
            tracing::debug!(scope = %scope, stage = %name, state = s.state.as_str(), "settled earlier (resume)");
            return;
        }
        tracing::debug!(scope = %scope, stage = %name, state = s.state.as_str(), action = ?s.action, "settled");
        let finished = now_ms();
        self.shared.progress.settled(
            &scope,
            &name,
            s.state.as_str(),
            Duration::from_millis(u64::try_from(finished - s.started_at).unwrap_or(0)),
            &s.usage,
            s.message.as_deref(),
        );
        let msg = match (&s.message, &s.action) {
            (Some(m), _) => m.clone(),
            (None, Some(a)) => format!("then {}", self.action_text(a)),
            (None, None) => String::new(),
        };
        self.shared.event(&scope, &name, s.state.as_str(), msg);
        self.shared.write(Write::Node(NodeRecord {
            run: self.shared.run.id.clone(),
            scope,
            node: name,
            state: s.state,
            output: s.output.clone(),
            action: s.action.as_ref().map(|a| self.action_text(a)),
            feedback: s.feedback.clone(),
            attempts: s.attempts,
            usage: s.usage.clone(),
            started_at: s.started_at,
            finished_at: finished,
        }));
    }

    /// Writes an action as stored.
    pub fn action_text(&self, t: &Target) -> String {
        match t {
            Target::Continue => "continue".into(),
            Target::Break => "break".into(),
            Target::Fail => "fail".into(),
            Target::Approve => "approve".into(),
            Target::Reject => "reject".into(),
            Target::Exit(i) => format!("exit:{}", self.plan.exits[*i].name),
            Target::Stage(s) => self.plan.node(*s).name.clone(),
        }
    }

    /// Reads a stored action back.
    pub fn parse_action(&self, s: &str) -> Option<Target> {
        self.plan.target(&Action::parse(s)?)
    }

    /// The store key of a node in a frame: (scope, stage).
    fn key(&self, frame: &Frame<'_>, n: NodeId) -> (String, String) {
        (self.scope(frame), self.plan.node(n).name.clone())
    }

    /// Returns a settled node from an earlier attempt at the run, if there is one.
    pub fn resumed(&self, frame: &Frame<'_>, n: NodeId) -> Option<Settled> {
        let rec = self
            .shared
            .resumed
            .borrow()
            .get(&self.key(frame, n))
            .cloned()?;
        self.settled_from(&rec)
    }

    /// Turns a stored record into a settlement.
    pub fn settled_from(&self, rec: &NodeRecord) -> Option<Settled> {
        let action = match &rec.action {
            Some(a) => Some(self.parse_action(a)?),
            None => None,
        };
        Some(Settled {
            state: rec.state,
            output: rec.output.clone(),
            action,
            feedback: rec.feedback.clone(),
            message: None,
            attempts: rec.attempts,
            usage: rec.usage.clone(),
            started_at: rec.started_at,
            resumed: true,
            infra: false,
        })
    }

    /// Runs one node to its settlement.
    fn run_node<'s>(
        &'s self,
        frame: &'s Frame<'s>,
        n: NodeId,
    ) -> LocalBoxFuture<'s, (NodeId, Outcome)> {
        async move {
            let kind = self.plan.node(n).kind;
            // A run that is stopping (a failed commit, Ctrl-C, an exit) starts nothing new.
            if self.halted() {
                return (n, Outcome::Stopped);
            }
            if !kind.is_region() {
                if let Some(s) = self.resumed(frame, n) {
                    return (n, Outcome::Settled(s));
                }
            }
            let work = async {
                match kind {
                    StageKind::Loop => self.run_loop(frame, n).await,
                    StageKind::ForEach => self.run_for_each(frame, n).await,
                    StageKind::Group => self.run_group(frame, n).await,
                    StageKind::Subflow => self.run_subflow(frame, n).await,
                    StageKind::Gate => self.run_gate(frame, n).await,
                    _ => self.run_leaf(frame, n).await,
                }
            };
            let outcome = if kind.is_region() {
                work.await
            } else {
                tokio::select! {
                    biased;
                    () = self.stopped() => Outcome::Stopped,
                    o = work => o,
                }
            };
            (n, outcome)
        }
        .boxed_local()
    }

    /// Takes the permits a leaf stage needs and runs it. The resource comes first, so a
    /// stage queued for it (a merge queue) holds no concurrency slot while it waits.
    async fn run_leaf(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let _resource = match self.plan.node(n).resource {
            Some(r) => {
                let prio = self.priority(frame, n, r);
                Some(self.resources[r].acquire(prio).await)
            }
            None => None,
        };
        let mut _limits = Vec::new();
        let mut cur = Some(frame);
        while let Some(f) = cur {
            if let Some(l) = &f.limit {
                _limits.push(l.acquire().await.ok());
            }
            cur = f.parent;
        }
        let _global = match &self.shared.global {
            Some(s) => s.acquire().await.ok(),
            None => None,
        };
        if self.halted() {
            return Outcome::Stopped;
        }
        match self.plan.node(n).kind {
            StageKind::Agent => self.run_agent(frame, n).await,
            StageKind::Command | StageKind::Check => self.run_command(frame, n).await,
            _ => Outcome::Settled(Settled::new(NodeState::Done, Json::Null, now_ms())),
        }
    }

    /// Ranks a stage waiting for a resource: by the resource's `order`, else higher first.
    fn priority(&self, frame: &Frame<'_>, n: NodeId, r: usize) -> i64 {
        let Some(p) = &self.plan.stage(n).priority else {
            return 0;
        };
        let ctx = self.context(frame, &[]);
        let Ok(v) = self.eval(&p.value, &ctx) else {
            return 0;
        };
        let order = &self.plan.workflow.resources[r].order;
        if !order.is_empty() {
            let s = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            return order
                .iter()
                .position(|o| o.value == s)
                .map_or(order.len() as i64, |i| i as i64);
        }
        match i64::try_from(v.clone()) {
            Ok(x) => -x,
            Err(_) => f64::try_from(v).map(|f| -(f as i64)).unwrap_or(0),
        }
    }

    // ----- regions -----

    /// Runs a loop. Its body's outputs become visible outside (their latest values) when
    /// the loop ends, so an iteration never sees a value left over from the one before.
    async fn run_loop(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let mut latest: BTreeMap<String, View> = BTreeMap::new();
        let outcome = self.run_loop_inner(frame, n, &mut latest).await;
        frame.outputs.borrow_mut().extend(latest);
        outcome
    }

    async fn run_loop_inner(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        latest: &mut BTreeMap<String, View>,
    ) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let StageBody::Loop {
            max_iterations,
            until,
            on_exhausted,
            stuck,
            worktree,
            ..
        } = &st.body
        else {
            return Outcome::Settled(Settled::new(NodeState::Failed, Json::Null, started));
        };
        let max = match max_iterations
            .as_ref()
            .map(|m| resolve_count(&m.value, &self.plan.params))
        {
            Some(Ok(m)) => m,
            Some(Err(e)) => return self.fail_now(started, format!("max_iterations: {e}")),
            None => 1,
        };
        let cwd = match worktree {
            Some(_) => match self
                .enter_worktree(frame, n, &frame.child_scope(&node.name))
                .await
            {
                Ok(p) => p,
                Err(e) => return self.fail_now(started, e),
            },
            None => frame.cwd.clone(),
        };
        let usage_key = format!("{}#{}", self.scope(frame), node.name);
        let mut earlier: Vec<BTreeMap<String, Json>> = Vec::new();
        let mut history: Vec<Value> = Vec::new();
        let mut feedback: Option<String> = None;
        let mut stuck_prev: Option<Json> = None;
        let mut stuck_count = 0u64;
        let repeats = stuck
            .as_ref()
            .and_then(|s| s.repeats.as_ref())
            .and_then(|r| resolve_count(&r.value, &self.plan.params).ok())
            .unwrap_or(2);
        let outcome_of = |s: &str, it: u64| json!({"iterations": it, "outcome": s});
        for it in 1..=max {
            let scope = frame.child_scope(&format!("{}#{it}", node.name));
            let mut lv: BTreeMap<&str, Value> = BTreeMap::new();
            lv.insert("iteration", Value::from(it));
            lv.insert("max_iterations", Value::from(max));
            lv.insert(
                "feedback",
                feedback.clone().map(Value::from).unwrap_or(Value::from("")),
            );
            lv.insert("history", Value::from(history.clone()));
            let loop_value = Value::from(lv.clone());
            let iframe = Frame {
                parent: Some(frame),
                region: Some(n),
                scope,
                cwd: cwd.clone(),
                vars: lv
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), v.clone()))
                    .collect(),
                loop_vars: Some((node.name.clone(), loop_value)),
                earlier: Rc::new(earlier.clone()),
                usage_key: Some((usage_key.clone(), n)),
                outputs: RefCell::new(BTreeMap::new()),
                limit: None,
                siblings: None,
            };
            // An iteration replayed from the store (a resume) is not announced again.
            let scope = self.scope(&iframe);
            let inner = format!("{scope}/");
            let replayed = self
                .shared
                .resumed
                .borrow()
                .keys()
                .any(|(s, _)| *s == scope || s.starts_with(&inner));
            if !replayed {
                self.shared
                    .progress
                    .note(&format!("↻ {scope} iteration {it} of {max}"));
            }
            let end = self.run_body(&iframe).await;
            // The iteration's outputs: the loop's history, and the latest outputs outside.
            let outs: BTreeMap<String, View> = iframe.outputs.take();
            let mut snapshot = BTreeMap::new();
            for (k, v) in &outs {
                if v.state != NodeState::Skipped {
                    snapshot.insert(k.clone(), v.output.clone());
                }
                if v.state != NodeState::Skipped || !latest.contains_key(k) {
                    latest.insert(k.clone(), v.clone());
                }
            }
            let iter_feedback = match &end {
                BodyEnd::Continue(f) => f.clone(),
                BodyEnd::Failed {
                    feedback,
                    message,
                    infra: false,
                    ..
                } => Some(feedback.clone().unwrap_or_else(|| message.clone())),
                BodyEnd::Failed { infra: true, .. } => None,
                _ => {
                    let mut parts = Vec::new();
                    for (k, v) in &outs {
                        if let Some(f) = &v.feedback {
                            parts.push(format!("{k}: {f}"));
                        }
                    }
                    (!parts.is_empty()).then(|| parts.join("\n\n"))
                }
            };
            match end {
                BodyEnd::Stopped => return Outcome::Stopped,
                BodyEnd::Waiting => return Outcome::Waiting,
                BodyEnd::Exit(i) => {
                    let mut s = Settled::new(NodeState::Done, outcome_of("exit", it), started);
                    s.action = Some(Target::Exit(i));
                    return Outcome::Settled(s);
                }
                BodyEnd::Break => {
                    self.leave_worktree(frame, n, &cwd, true).await;
                    return Outcome::Settled(Settled::new(
                        NodeState::Done,
                        outcome_of("break", it),
                        started,
                    ));
                }
                BodyEnd::Failed {
                    node: failed,
                    message,
                    feedback,
                    infra,
                } => {
                    self.leave_worktree(frame, n, &cwd, false).await;
                    return Outcome::Settled(self.region_failed(
                        n,
                        outcome_of("failed", it),
                        started,
                        format!("`{failed}` failed in iteration {it}: {message}"),
                        feedback,
                        infra,
                    ));
                }
                BodyEnd::Completed | BodyEnd::Continue(_) => {}
            }
            // `until` and `stuck` see the iteration's outputs.
            let end_frame = Frame {
                parent: Some(frame),
                region: Some(n),
                scope: iframe.scope.clone(),
                cwd: cwd.clone(),
                vars: iframe.vars.clone(),
                loop_vars: iframe.loop_vars.clone(),
                earlier: iframe.earlier.clone(),
                usage_key: None,
                outputs: RefCell::new(outs),
                limit: None,
                siblings: None,
            };
            let ctx = self.context(&end_frame, &[]);
            if let Some(u) = until {
                match self.eval(&u.value, &ctx) {
                    Ok(v) if v.is_true() => {
                        self.leave_worktree(frame, n, &cwd, true).await;
                        return Outcome::Settled(Settled::new(
                            NodeState::Done,
                            outcome_of("until", it),
                            started,
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => return self.fail_now(started, format!("its `until` failed: {e}")),
                }
            }
            if let Some(sk) = stuck {
                match self.eval(&sk.on.value, &ctx) {
                    Ok(v) => {
                        let j: Json = serde_json::to_value(&v).unwrap_or(Json::Null);
                        let empty = j.is_null()
                            || j.as_array().is_some_and(Vec::is_empty)
                            || j.as_str().is_some_and(str::is_empty);
                        if !empty && stuck_prev.as_ref() == Some(&j) {
                            stuck_count += 1;
                        } else {
                            stuck_count = 1;
                        }
                        stuck_prev = Some(j);
                        if !empty && stuck_count >= repeats {
                            self.shared.progress.note(&format!(
                                "⟳ {} is stuck: the same findings {stuck_count} times in a row",
                                node.name
                            ));
                            self.leave_worktree(frame, n, &cwd, false).await;
                            let then = sk
                                .then
                                .as_ref()
                                .map(|a| self.target_of(&a.value))
                                .unwrap_or(Target::Fail);
                            return Outcome::Settled(self.loop_end(
                                n,
                                started,
                                "stuck",
                                it,
                                then,
                                format!(
                                    "stuck: the same findings {stuck_count} iterations in a row"
                                ),
                                &history,
                            ));
                        }
                    }
                    Err(e) => {
                        return self.fail_now(started, format!("its `stuck.on` failed: {e}"));
                    }
                }
            }
            feedback = iter_feedback.clone();
            let mut h: BTreeMap<&str, Value> = BTreeMap::new();
            h.insert("iteration", Value::from(it));
            h.insert(
                "feedback",
                iter_feedback.map(Value::from).unwrap_or(Value::from("")),
            );
            h.insert("outputs", jv(&snapshot));
            history.push(Value::from(h));
            earlier.push(snapshot);
        }
        self.leave_worktree(frame, n, &cwd, false).await;
        let then = on_exhausted
            .as_ref()
            .map(|a| self.target_of(&a.value))
            .unwrap_or(Target::Fail);
        Outcome::Settled(self.loop_end(
            n,
            started,
            "exhausted",
            max,
            then,
            format!("no success after {max} iterations"),
            &history,
        ))
    }

    /// The settlement of a loop, for_each or group whose body failed: a failure that is not
    /// the work's takes the region's `on_error` and hands no feedback on (the loop does not
    /// go on as if it were a verdict); any other takes its `on_fail` with the feedback.
    fn region_failed(
        &self,
        n: NodeId,
        output: Json,
        started: i64,
        message: String,
        feedback: Option<String>,
        infra: bool,
    ) -> Settled {
        let node = self.plan.node(n);
        let mut s = Settled::new(NodeState::Failed, output, started);
        s.message = Some(message);
        if infra {
            s.infra = true;
            s.action = Some(node.on_error.clone());
        } else {
            s.feedback = feedback;
            s.action = Some(node.on_fail.clone());
        }
        s
    }

    /// The settlement of a loop that ended by a rule (`stuck`, exhausted) with an action.
    /// When the action runs a stage (one that handles giving up: a report, a block with
    /// context), the loop's output carries its `history` for that stage to read.
    #[allow(clippy::too_many_arguments)]
    fn loop_end(
        &self,
        n: NodeId,
        started: i64,
        outcome: &str,
        it: u64,
        then: Target,
        message: String,
        history: &[Value],
    ) -> Settled {
        let mut output = json!({"iterations": it, "outcome": outcome});
        if matches!(then, Target::Stage(_)) {
            output["history"] =
                serde_json::to_value(history).unwrap_or_else(|_| Json::Array(Vec::new()));
        }
        match then {
            Target::Fail => {
                let mut s = Settled::new(NodeState::Failed, output, started);
                s.message = Some(message.clone());
                s.feedback = Some(message);
                s.action = Some(self.plan.node(n).on_fail.clone());
                s
            }
            other => {
                let mut s = Settled::new(NodeState::Done, output, started);
                s.message = Some(message);
                if other != Target::Break {
                    s.action = Some(other);
                }
                s
            }
        }
    }

    /// Resolves an action of the model.
    pub fn target_of(&self, a: &Action) -> Target {
        self.plan.target(a).unwrap_or(Target::Fail)
    }

    /// A node that fails before it starts (a limit that cannot be resolved, a template).
    pub fn fail_now(&self, started: i64, message: String) -> Outcome {
        Outcome::Settled(Settled::error(
            NodeState::Failed,
            message,
            Target::Fail,
            started,
        ))
    }

    async fn run_for_each(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let StageBody::ForEach {
            over,
            as_name,
            key,
            max_concurrency,
            aggregate,
            result,
            worktree,
            ..
        } = &st.body
        else {
            return Outcome::Stopped;
        };
        let scope = self.scope(frame);
        let items_key = (scope.clone(), format!("@items:{}", node.name));
        let recorded = self
            .shared
            .resumed
            .borrow()
            .get(&items_key)
            .map(|rec| rec.output.as_array().cloned().unwrap_or_default());
        let items = match recorded {
            Some(items) => items,
            None => {
                let ctx = self.context(frame, &[]);
                let src = over.as_ref().map(|o| o.value.as_str()).unwrap_or("[]");
                let v = match self.eval(src, &ctx) {
                    Ok(v) => v,
                    Err(e) => return self.fail_now(started, format!("its `over` failed: {e}")),
                };
                let j: Json = serde_json::to_value(&v).unwrap_or(Json::Null);
                let Some(list) = j.as_array().cloned() else {
                    return self.fail_now(
                        started,
                        format!("its `over` must give a list, but gave {}", short_json(&j)),
                    );
                };
                self.record_decision(&scope, &items_key.1, Json::Array(list.clone()));
                list
            }
        };
        let var = as_name
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_else(|| "item".to_string());
        let limit = match max_concurrency
            .as_ref()
            .map(|m| resolve_count(&m.value, &self.plan.params))
        {
            Some(Ok(m)) => usize::try_from(m).unwrap_or(usize::MAX).max(1),
            Some(Err(e)) => return self.fail_now(started, format!("max_concurrency: {e}")),
            None => items.len().max(1),
        };
        let sem = Rc::new(Semaphore::new(limit));
        let result_stage = self.result_stage(st, result.as_ref());
        let mut keys = Vec::new();
        let mut seen = HashSet::new();
        for (i, item) in items.iter().enumerate() {
            let k = match key {
                Some(k) => {
                    let ctx = self.context(
                        frame,
                        &[(var.as_str(), jv(item)), ("index", Value::from(i))],
                    );
                    match self.eval(&k.value, &ctx) {
                        Ok(v) => v
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string()),
                        Err(e) => {
                            return self.fail_now(started, format!("its `key` failed: {e}"));
                        }
                    }
                }
                None => i.to_string(),
            };
            let k = sanitize(&k);
            if !seen.insert(k.clone()) {
                return self.fail_now(
                    started,
                    format!("two items have the key `{k}`; keys must be unique"),
                );
            }
            keys.push(k);
        }
        let mut running: FuturesUnordered<LocalBoxFuture<'_, (usize, BodyEnd, Option<Json>)>> =
            FuturesUnordered::new();
        let siblings: Rc<RefCell<Vec<Json>>> = Rc::default();
        for (i, item) in items.iter().enumerate() {
            let sem = sem.clone();
            let siblings = siblings.clone();
            let var = var.clone();
            let k = keys[i].clone();
            let fut = async move {
                let _permit = sem.acquire().await.ok();
                let scope = frame.child_scope(&format!("{}#{k}", node.name));
                let cwd = match worktree {
                    Some(_) => match self
                        .enter_worktree_item(frame, n, &scope, &var, item, i)
                        .await
                    {
                        Ok(p) => p,
                        Err(e) => {
                            // No stage of the item ran: say here why it failed.
                            self.shared.event(&scope, &node.name, "failed", e.clone());
                            self.shared.progress.note(&format!("✗ {scope}: {e}"));
                            return (
                                i,
                                BodyEnd::Failed {
                                    node: node.name.clone(),
                                    message: e,
                                    feedback: None,
                                    infra: true,
                                },
                                None,
                            );
                        }
                    },
                    None => frame.cwd.clone(),
                };
                let iframe = Frame {
                    parent: Some(frame),
                    region: Some(n),
                    scope,
                    cwd: cwd.clone(),
                    vars: vec![
                        (var.clone(), jv(item)),
                        ("index".to_string(), Value::from(i)),
                    ],
                    siblings: Some(siblings.clone()),
                    ..Frame::default()
                };
                let end = self.run_body(&iframe).await;
                let ok = matches!(
                    end,
                    BodyEnd::Completed | BodyEnd::Break | BodyEnd::Continue(_)
                );
                if worktree.is_some() {
                    self.leave_worktree_at(n, &cwd, ok).await;
                }
                let result = result_stage.and_then(|r| {
                    iframe
                        .outputs
                        .borrow()
                        .get(&self.plan.node(r).name)
                        .filter(|v| v.state == NodeState::Done)
                        .map(|v| v.output.clone())
                });
                // The items that start from now on see this one.
                if !matches!(end, BodyEnd::Waiting | BodyEnd::Stopped) {
                    siblings.borrow_mut().push(json!({
                        "key": k,
                        "index": i,
                        "item": item,
                        "ok": ok,
                        "result": result.clone().unwrap_or(Json::Null),
                    }));
                }
                (i, end, result)
            };
            running.push(fut.boxed_local());
        }
        let mut results: Vec<Option<Json>> = vec![None; items.len()];
        let mut failures = Vec::new();
        let mut infra = false;
        let mut waiting = false;
        let mut stopped = false;
        let mut exit = None;
        while let Some((i, end, result)) = running.next().await {
            results[i] = result;
            match end {
                BodyEnd::Completed | BodyEnd::Break | BodyEnd::Continue(_) => {}
                BodyEnd::Failed {
                    node: f,
                    message,
                    infra: item_infra,
                    ..
                } => {
                    infra |= item_infra;
                    failures.push(format!("item `{}`: `{f}` failed: {message}", keys[i]));
                }
                BodyEnd::Waiting => waiting = true,
                BodyEnd::Stopped => stopped = true,
                BodyEnd::Exit(x) => exit = Some(x),
            }
        }
        if let Some(x) = exit {
            let mut s = Settled::new(NodeState::Done, Json::Null, started);
            s.action = Some(Target::Exit(x));
            return Outcome::Settled(s);
        }
        if stopped {
            return Outcome::Stopped;
        }
        if waiting {
            return Outcome::Waiting;
        }
        let results: Vec<Json> = results
            .into_iter()
            .map(|r| r.unwrap_or(Json::Null))
            .collect();
        let value = self.aggregate(aggregate.as_ref(), result_stage, &results);
        let output = json!({"results": results, "value": value});
        if failures.is_empty() {
            Outcome::Settled(Settled::new(NodeState::Done, output, started))
        } else {
            let msg = format!(
                "{} of {} items failed: {}",
                failures.len(),
                items.len(),
                failures.join("; ")
            );
            Outcome::Settled(self.region_failed(n, output, started, msg.clone(), Some(msg), infra))
        }
    }

    async fn run_group(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let StageBody::Group {
            max_concurrency,
            aggregate,
            result,
            ..
        } = &st.body
        else {
            return Outcome::Stopped;
        };
        let limit = match max_concurrency
            .as_ref()
            .map(|m| resolve_count(&m.value, &self.plan.params))
        {
            Some(Ok(m)) => Some(Rc::new(Semaphore::new(
                usize::try_from(m).unwrap_or(1).max(1),
            ))),
            Some(Err(e)) => return self.fail_now(started, format!("max_concurrency: {e}")),
            None => None,
        };
        let gframe = Frame {
            parent: Some(frame),
            region: Some(n),
            scope: frame.child_scope(&node.name),
            cwd: frame.cwd.clone(),
            vars: Vec::new(),
            loop_vars: None,
            earlier: Rc::new(Vec::new()),
            usage_key: None,
            outputs: RefCell::new(BTreeMap::new()),
            limit,
            siblings: None,
        };
        let end = self.run_body(&gframe).await;
        let outs = gframe.outputs.take();
        let mut results = Vec::new();
        for c in st.children() {
            if let Some(v) = outs.get(&c.id.value) {
                if v.state == NodeState::Done {
                    results.push(v.output.clone());
                }
            }
        }
        for (k, v) in outs {
            frame.outputs.borrow_mut().insert(k, v);
        }
        let result_stage = self.result_stage(st, result.as_ref());
        let value = self.aggregate(aggregate.as_ref(), result_stage, &results);
        let output = json!({"results": results, "value": value});
        match end {
            BodyEnd::Stopped => Outcome::Stopped,
            BodyEnd::Waiting => Outcome::Waiting,
            BodyEnd::Exit(i) => {
                let mut s = Settled::new(NodeState::Done, output, started);
                s.action = Some(Target::Exit(i));
                Outcome::Settled(s)
            }
            BodyEnd::Continue(f) => {
                let mut s = Settled::new(NodeState::Done, output, started);
                s.action = Some(Target::Continue);
                s.feedback = f;
                Outcome::Settled(s)
            }
            BodyEnd::Break => {
                let mut s = Settled::new(NodeState::Done, output, started);
                s.action = Some(Target::Break);
                Outcome::Settled(s)
            }
            BodyEnd::Completed => Outcome::Settled(Settled::new(NodeState::Done, output, started)),
            BodyEnd::Failed {
                node: f,
                message,
                feedback,
                infra,
            } => Outcome::Settled(self.region_failed(
                n,
                output,
                started,
                format!("`{f}` failed: {message}"),
                feedback,
                infra,
            )),
        }
    }

    /// Records a decision of the executor (a for_each's items, a worktree) under a node
    /// name starting with `@`, so that a resume makes the same one; committed at once.
    fn record_decision(&self, scope: &str, node: &str, output: Json) {
        let now = now_ms();
        self.shared.write(Write::Node(NodeRecord {
            run: self.shared.run.id.clone(),
            scope: scope.to_string(),
            node: node.to_string(),
            state: NodeState::Done,
            output,
            action: None,
            feedback: None,
            attempts: 1,
            usage: Usage::default(),
            started_at: now,
            finished_at: now,
        }));
        self.shared.flush();
    }

    /// The stage whose output is a fan-out's result: `result`, else the body's last stage.
    fn result_stage(
        &self,
        st: &crate::model::Stage,
        result: Option<&crate::model::Text>,
    ) -> Option<NodeId> {
        let name = result.or_else(|| st.children().last().map(|c| &c.id))?;
        self.plan.find(&name.value)
    }

    /// Combines fan-out results.
    fn aggregate(
        &self,
        agg: Option<&crate::model::Aggregate>,
        result_stage: Option<NodeId>,
        results: &[Json],
    ) -> Json {
        let Some(agg) = agg else {
            return Json::Array(results.to_vec());
        };
        let field = agg.field.as_ref().map(|f| f.value.as_str()).unwrap_or("");
        let get = |r: &Json| -> Json {
            field
                .split('.')
                .filter(|p| !p.is_empty())
                .fold(r.clone(), |cur, p| {
                    cur.get(p).cloned().unwrap_or(Json::Null)
                })
        };
        let present: Vec<&Json> = results.iter().filter(|r| !r.is_null()).collect();
        match agg.mode.value.as_str() {
            "all" => Json::Bool(
                !present.is_empty() && present.iter().all(|r| get(r) == Json::Bool(true)),
            ),
            "any" => Json::Bool(present.iter().any(|r| get(r) == Json::Bool(true))),
            "worst" | "best" => {
                let order: Vec<String> = if agg.order.is_empty() {
                    result_stage
                        .and_then(|r| self.plan.schemas.get(&r))
                        .and_then(|s| {
                            let path: Vec<&str> = field.split('.').collect();
                            crate::check::outputs::walk_schema(s, &path).ok().cloned()
                        })
                        .and_then(|f| f.get("enum").cloned())
                        .and_then(|e| serde_json::from_value(e).ok())
                        .unwrap_or_default()
                } else {
                    agg.order.iter().map(|o| o.value.clone()).collect()
                };
                let rank = |r: &Json| {
                    let v = get(r);
                    let s = v
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string());
                    order.iter().position(|o| *o == s)
                };
                let ranked = present.iter().filter_map(|r| rank(r).map(|i| (i, get(r))));
                let pick = if agg.mode.value == "worst" {
                    ranked.max_by_key(|(i, _)| *i)
                } else {
                    ranked.min_by_key(|(i, _)| *i)
                };
                pick.map(|(_, v)| v).unwrap_or(Json::Null)
            }
            "highest" | "lowest" => {
                let num = |r: &Json| get(r).as_f64();
                let mut best: Option<(&Json, f64)> = None;
                for r in &present {
                    if let Some(x) = num(r) {
                        let better = match best {
                            None => true,
                            Some((_, b)) => {
                                if agg.mode.value == "highest" {
                                    x > b
                                } else {
                                    x < b
                                }
                            }
                        };
                        if better {
                            best = Some((r, x));
                        }
                    }
                }
                best.map(|(r, _)| r.clone()).unwrap_or(Json::Null)
            }
            _ => Json::Array(results.to_vec()),
        }
    }

    // ----- worktrees -----

    async fn enter_worktree(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        scope: &str,
    ) -> Result<PathBuf, String> {
        let ctx = self.context(frame, &[]);
        self.make_worktree(n, scope, &ctx).await
    }

    async fn enter_worktree_item(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        scope: &str,
        var: &str,
        item: &Json,
        index: usize,
    ) -> Result<PathBuf, String> {
        let ctx = self.context(frame, &[(var, jv(item)), ("index", Value::from(index))]);
        self.make_worktree(n, scope, &ctx).await
    }

    async fn make_worktree(&self, n: NodeId, scope: &str, ctx: &Value) -> Result<PathBuf, String> {
        let name = &self.plan.node(n).name;
        let branch = self.render(&format!("{name}/worktree/branch"), ctx)?;
        let base = match self.env.get_template(&format!("{name}/worktree/base")) {
            Ok(_) => self.render(&format!("{name}/worktree/base"), ctx)?,
            Err(_) => "HEAD".to_string(),
        };
        let full = if self.prefix.is_empty() {
            scope.to_string()
        } else {
            format!("{}/{scope}", self.prefix)
        };
        let path = self.worktree_path(&full.split('/').map(sanitize).collect::<Vec<_>>().join("/"));
        super::worktree::ensure(&self.shared.opts.cwd, &path, branch.trim(), base.trim())
            .await
            .map_err(|e| format!("cannot create the worktree for `{name}`: {e}"))?;
        self.shared.event(
            scope,
            name,
            "worktree",
            format!("{} on {}", path.display(), branch.trim()),
        );
        self.record_decision(
            &full,
            &format!("@worktree:{name}"),
            json!({"path": path.to_string_lossy(), "branch": branch.trim()}),
        );
        Ok(path)
    }

    /// Where a worktree of this run lives: `STATE_DIR/worktrees/RUN/REL`.
    fn worktree_path(&self, rel: &str) -> PathBuf {
        self.shared
            .opts
            .state_dir
            .join("worktrees")
            .join(&self.shared.run.id)
            .join(rel)
    }

    /// Makes the run's own worktree (`worktree` at the top of the workflow), if it has one:
    /// `STATE_DIR/worktrees/RUN/@run`, on its branch; a resume finds it again.
    async fn enter_run_worktree(&self) -> Result<Option<PathBuf>, String> {
        let Some(w) = &self.plan.workflow.worktree else {
            return Ok(None);
        };
        let ctx = self.context(&Frame::default(), &[]);
        let branch = self.render(crate::compile::RUN_WORKTREE_BRANCH, &ctx)?;
        let base = match &w.base {
            Some(_) => self.render(crate::compile::RUN_WORKTREE_BASE, &ctx)?,
            None => "HEAD".to_string(),
        };
        let path = self.worktree_path("@run");
        super::worktree::ensure(&self.shared.opts.cwd, &path, branch.trim(), base.trim())
            .await
            .map_err(|e| format!("cannot create the run's worktree: {e}"))?;
        self.shared.event(
            "",
            "",
            "worktree",
            format!("the run works in {} on {}", path.display(), branch.trim()),
        );
        self.shared.progress.note(&format!(
            "⎇ the run works in {} on branch {}",
            path.display(),
            branch.trim()
        ));
        Ok(Some(path))
    }

    /// Removes the run's own worktree as its `cleanup` says, once the run has ended (a
    /// run that waits or was interrupted keeps it for its resume).
    async fn leave_run_worktree(&self, path: &Path, end: &RunEnd) {
        let RunEnd::Exit { code, .. } = end else {
            return;
        };
        let cleanup = self
            .plan
            .workflow
            .worktree
            .as_ref()
            .and_then(|w| w.cleanup.as_ref())
            .map(|c| c.value.as_str());
        let remove = match cleanup {
            Some("always") => true,
            Some("never") => false,
            _ => *code == 0,
        };
        if remove {
            if let Err(e) = super::worktree::remove(&self.shared.opts.cwd, path).await {
                self.shared
                    .progress
                    .note(&format!("! could not remove {}: {e}", path.display()));
            }
        }
    }

    async fn leave_worktree(&self, frame: &Frame<'_>, n: NodeId, cwd: &Path, ok: bool) {
        if cwd != frame.cwd {
            self.leave_worktree_at(n, cwd, ok).await;
        }
    }

    async fn leave_worktree_at(&self, n: NodeId, path: &Path, ok: bool) {
        let cleanup = match &self.plan.stage(n).body {
            StageBody::Loop {
                worktree: Some(w), ..
            }
            | StageBody::ForEach {
                worktree: Some(w), ..
            } => w.cleanup.as_ref().map(|c| c.value.clone()),
            _ => return,
        };
        let remove = match cleanup.as_deref() {
            Some("always") => true,
            Some("never") => false,
            _ => ok,
        };
        if remove {
            if let Err(e) = super::worktree::remove(&self.shared.opts.cwd, path).await {
                self.shared
                    .progress
                    .note(&format!("! could not remove {}: {e}", path.display()));
            }
        }
    }

    /// Builds (once) and returns the backend of an agent.
    pub fn backend(&self, agent: usize) -> Result<Arc<dyn Backend>, String> {
        let cfg = &self.agents[agent];
        if let Some(b) = self.backends.borrow().get(&cfg.name) {
            return Ok(b.clone());
        }
        let b: Arc<dyn Backend> = match &self.shared.replay {
            Some(r) => r.clone(),
            None => Arc::from(crate::backend::build(cfg)?),
        };
        let b: Arc<dyn Backend> = match &self.shared.recorder {
            Some(rec) => Arc::new(rec.wrap(b, &cfg.name)),
            None => b,
        };
        self.backends
            .borrow_mut()
            .insert(cfg.name.clone(), b.clone());
        Ok(b)
    }
}

/// Renders an agent's settings over the params.
fn agent_config(
    a: &crate::model::Agent,
    plan: &Plan,
    sources: &Sources,
) -> Result<AgentConfig, String> {
    let r = |t: &crate::model::Text| {
        crate::compile::render_params(&t.value, &plan.params)
            .map_err(|e| format!("agent `{}`: {e}", a.name.value))
    };
    let opt = |t: &Option<crate::model::Text>| t.as_ref().map(r).transpose();
    Ok(AgentConfig {
        name: a.name.value.clone(),
        kind: a.kind.value,
        model: opt(&a.model)?,
        args: a.args.iter().map(r).collect::<Result<_, _>>()?,
        env: a
            .env
            .iter()
            .map(|(k, v)| Ok((k.value.clone(), r(v)?)))
            .collect::<Result<_, String>>()?,
        command: a.command.iter().map(r).collect::<Result<_, _>>()?,
        prompt_via: opt(&a.prompt_via)?,
        base_url: opt(&a.base_url)?,
        api_key_env: opt(&a.api_key_env)?,
        api: opt(&a.api)?,
        max_tokens: a
            .max_tokens
            .as_ref()
            .map(|m| resolve_count(&m.value, &plan.params))
            .transpose()
            .map_err(|e| format!("agent `{}`: max_tokens: {e}", a.name.value))?,
        file: a
            .file
            .as_ref()
            .map(|f| crate::check::base_dir(sources, f.span).join(&f.value)),
        program: None,
        permissions: a.permissions.as_ref().map(|p| p.value).unwrap_or_default(),
        structured_output: a
            .structured_output
            .as_ref()
            .map(|m| m.value)
            .unwrap_or_default(),
    })
}

/// Converts a serializable value for templates.
pub fn jv<T: serde::Serialize + ?Sized>(x: &T) -> Value {
    Value::from(minijinja::value::Serde(x))
}

/// A minijinja error with its cause chain, on one line.
pub fn describe_error(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}

/// A JSON value shortened for a message.
pub fn short_json(j: &Json) -> String {
    let s = j.to_string();
    if s.len() > 120 {
        let mut cut = 120;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &s[..cut])
    } else {
        s
    }
}

/// Returns the duration of a limit: the stage's, else the agent's.
pub fn limit(
    stage: Option<&crate::source::Spanned<crate::model::Dur>>,
    agent: Option<&crate::source::Spanned<crate::model::Dur>>,
    plan: &Plan,
) -> Option<Duration> {
    stage
        .or(agent)
        .and_then(|d| resolve_duration(&d.value, &plan.params).ok())
}

//! The executor's shared state: [`Shared`] (one per run: the store, the pending writes,
//! progress) and [`Exec`] (one per plan: the run's, and each subflow's), with what every part
//! of the executor uses (scopes, stopping, actions, backends).
//!
//! The executor runs the bodies of a plan as DAGs ([`super::schedule`]), loops as bounded
//! repetitions of a body ([`super::loops`]), fan-outs as concurrent bodies
//! ([`super::fanout`]). Single-threaded (a current-thread tokio runtime): agents and commands
//! are processes and requests, so one thread is plenty, and the state needs no locks. Every
//! settled node is committed before anything that depends on it starts; nodes that settle
//! together are committed together.

pub(super) use super::error::{Halt, IoFailure, RunError, StageError, TemplateError};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use minijinja::Value;
use serde_json::Value as Json;
use tokio::sync::{Semaphore, watch};

use super::context::to_value;
use super::extract::Extractor;
use super::frame::{Frame, Outcome, Settled};
use super::progress::Progress;
use super::resource::PrioritySemaphore;
use super::{RunOptions, now_ms};
use crate::backend::replay::{Recorder, ReplayBackend};
use crate::backend::{AgentConfig, Backend, Usage};
use crate::compile::NodeId;
use crate::compile::{Later, Plan, PrepareError, SubflowKey, Subflows, Target};
use crate::model::{Action, StageKind};
use crate::params::{resolve_count, resolve_duration};
use crate::source::Sources;
use crate::store::{NodeState, RunRecord, Store, Write};
use crate::template::{self, Roots};

/// What is shared by a run and its subflows.
pub(crate) struct Shared {
    pub opts: RunOptions,
    pub run: RunRecord,
    pub store: RefCell<Box<dyn Store>>,
    pub pending: RefCell<Vec<Write>>,
    /// How many writes were ever queued, and how many of them are committed.
    pub queued: Cell<u64>,
    pub committed: Cell<u64>,
    /// Settled nodes of an earlier attempt at this run, by (scope, node), until each settles
    /// again from its record (boxed, so that a consumed record leaves only its slot behind).
    pub resumed: RefCell<HashMap<(String, String), Box<super::frame::Resumed>>>,
    /// Every scope that holds a settled node of an earlier attempt, with its enclosing
    /// scopes: a loop iteration replayed on resume is not announced again.
    pub resumed_scopes: HashSet<String>,
    /// What the executor did, counted (see [`super::WorkCounts`]).
    pub work: Cell<super::WorkCounts>,
    /// The writer of the files people read (each attempt's prompt, answer, output).
    pub artifacts: super::artifacts::Artifacts,
    /// The subflows admitted so far, by file and params: compiled ahead with the plan, or
    /// prepared once during the run.
    pub subflows: RefCell<HashMap<SubflowKey, Arc<super::Prepared>>>,
    /// Prepares a subflow whose params come from outputs (the run's plan's callback).
    pub later: Option<Later>,
    pub interrupt: watch::Sender<bool>,
    pub progress: Progress,
    pub global: Option<Semaphore>,
    /// Usage by key: `""` for the run, a loop instance's key for a loop.
    pub usage: RefCell<HashMap<String, Usage>>,
    /// The denied actions of the agents in each loop instance (by the loop's usage key),
    /// for the loop's outcome when it gives up: "stage `s`: agent `a` was denied ...".
    pub denied: RefCell<HashMap<String, Vec<String>>>,
    pub replay: Option<Arc<ReplayBackend>>,
    pub recorder: Option<Arc<Recorder>>,
    /// The agents whose calls under a tokens budget reported no usage, each noted once
    /// (see `budget.rs`, `add_usage`).
    pub unreported_noted: RefCell<HashSet<String>>,
    /// A store failure: the run cannot be trusted to be durable any more, so it stops.
    pub store_error: RefCell<Option<Halt>>,
    /// The parts of `run` in templates that stay the same for the whole run (its id,
    /// directory, workflow, start and root), made once.
    pub run_consts: std::cell::OnceCell<[(&'static str, minijinja::Value); 5]>,
    /// The store `earlier_runs()` reads in templates (template functions must be `Send +
    /// Sync`): a handle on the executor's connection on PostgreSQL, else a second
    /// connection opened when a template first asks.
    pub memory: Arc<std::sync::Mutex<super::memory::MemoryStore>>,
    /// Reads back the long outputs that views leave to the store (through `memory`).
    pub outputs: Arc<super::memory::OutputReader>,
    /// The views with a long output settled since the last commit: (their frame's outputs,
    /// scope, stage). Once the commit is done, each leaves its output to the store.
    pub to_store: RefCell<Vec<(std::sync::Weak<super::frame::Outputs>, String, String)>>,
    /// Where a run on workers publishes its git workspaces (see [`super::publish`]).
    pub publisher: Option<super::publish::Publisher>,
    /// A run on workers: its agent calls and programs are units of work that any worker
    /// may take (see [`super::units`]).
    pub units: Option<super::units::Units>,
    /// The run's notifiers and their deliveries under way (see [`super::notify`]).
    pub notifier: Option<super::notify::Notifier>,
    /// The run's spans, when this process exports traces (see [`super::trace`]).
    pub trace: Option<super::trace::RunTrace>,
}

/// A subflow that does not check, as the run reports it.
fn invalid_subflow(path: &Path, e: &PrepareError) -> RunError {
    RunError::InvalidSubflow {
        path: path.to_path_buf(),
        diagnostics: e.render(),
    }
}

/// Every scope of the records, with the scopes that enclose them (`a#1/b#2` gives `a#1` too).
pub(crate) fn scopes_of<'a>(scopes: impl Iterator<Item = &'a str>) -> HashSet<String> {
    let mut out = HashSet::new();
    for s in scopes {
        let mut cur = s;
        while !cur.is_empty() && out.insert(cur.to_string()) {
            cur = cur.rsplit_once('/').map_or("", |(p, _)| p);
        }
    }
    out
}

impl Shared {
    /// Queues a write for the next group commit (the store masks its secrets as it commits
    /// it).
    pub(super) fn write(&self, w: Write) {
        self.pending.borrow_mut().push(w);
        self.queued.set(self.queued.get() + 1);
    }

    /// Counts some of the executor's work.
    pub(super) fn count(&self, f: impl FnOnce(&mut super::WorkCounts)) {
        let mut w = self.work.get();
        f(&mut w);
        self.work.set(w);
    }

    /// Tells whether writes wait for a commit.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.borrow().is_empty()
    }

    /// Commits every queued write in one transaction; then the views with a long output
    /// settled in it leave their output to the store. When an output could not be read
    /// back since the last commit, nothing is committed (what was decided since may rest on
    /// the `null` given in its place) and the run stops as on a failed commit.
    pub(super) fn flush(&self) {
        let writes: Vec<Write> = std::mem::take(&mut *self.pending.borrow_mut());
        let to_store = std::mem::take(&mut *self.to_store.borrow_mut());
        self.committed.set(self.queued.get());
        if let Some(e) = self.outputs.take_failure() {
            self.store_error.borrow_mut().get_or_insert(Halt::Store(e));
            let _ = self.interrupt.send(true);
            return;
        }
        if writes.is_empty() && !self.artifacts.held_for_store() {
            return;
        }
        // A coordinator that lost its lease writes nothing more (its store would refuse it
        // anyway, unless the lease lapsed with nobody taking it yet): what its stopping
        // stages queue (interrupted attempts, failures) is the next holder's to decide.
        if matches!(
            &*self.store_error.borrow(),
            Some(Halt::Store(crate::store::StoreError::LeaseLost { .. }))
        ) {
            return;
        }
        self.count(|w| w.commits += 1);
        // The records of what is committed are written too (one wake-up per commit): to
        // `artifacts.jsonl`, and, when the store keeps them, to the store in the same
        // transaction (those written to the file since the last commit, before a program
        // started, come with this one).
        let records = self.artifacts.for_store();
        let committed = if records.is_empty() {
            self.store.borrow_mut().commit(&writes)
        } else {
            self.store
                .borrow_mut()
                .commit_with_records(&writes, &records)
        };
        if let Err(e) = committed {
            // A full disk or the file size limit: the run's error names the limit.
            if let Some(limit) = crate::backend::process::Limit::met_by(&e) {
                self.limit_reached(None, limit, crate::diag::error_chain(&e));
                return;
            }
            tracing::error!("store commit failed: {}", crate::diag::error_chain(&e));
            self.store_error.borrow_mut().get_or_insert(Halt::Store(e));
            let _ = self.interrupt.send(true);
            return;
        }
        for (outputs, scope, node) in to_store {
            if let Some(outputs) = outputs.upgrade() {
                if let Some(view) = outputs.borrow().get_mut(&node) {
                    view.leave_to_store(&scope, &node, &self.outputs);
                    self.count(|w| w.outputs_in_store += 1);
                }
            }
        }
    }

    /// Makes what was queued so far durable, in one commit with whatever else the executor
    /// queues in the same turn: this yields once, so that the other stages and schedulers
    /// that are ready queue their writes too, and the first of them to come back commits
    /// them all (a group commit). Call it before anything that must not happen unless the
    /// writes are durable (starting an agent or a program).
    pub(super) async fn durable(&self) {
        if !self.has_pending() {
            return;
        }
        let mine = self.queued.get();
        tokio::task::yield_now().await;
        if self.committed.get() < mine {
            self.flush();
        }
    }

    /// Stops the run for a failure that is not the stage's (a workspace that cannot be
    /// published): like a failed commit, nothing new starts and `resume` continues.
    pub(super) fn halt(&self, halt: Halt) -> Outcome {
        tracing::error!("{}", crate::diag::error_chain(&halt));
        self.store_error.borrow_mut().get_or_insert(halt);
        let _ = self.interrupt.send(true);
        Outcome::Stopped
    }

    /// A failure to write the state directory (artifacts): handled like a failed commit, so
    /// that the run stops, nothing new starts, and `resume` continues once it is fixed. One
    /// for a limit of the machine (open files, disk space, file size) names the limit.
    pub(super) fn io_failed(&self, failure: Arc<IoFailure>) -> Outcome {
        if let Some(limit) = crate::backend::process::Limit::of(&failure.source) {
            return self.limit_reached(None, limit, crate::diag::error_chain(&*failure));
        }
        tracing::error!("state directory: {}", crate::diag::error_chain(&*failure));
        self.store_error
            .borrow_mut()
            .get_or_insert(Halt::Artifacts(failure));
        let _ = self.interrupt.send(true);
        Outcome::Stopped
    }

    /// A limit of the machine reached (open files, disk space, file size) where a stage
    /// (`stage`, its scope and name) started a program or wrote its output: the run stops as
    /// on a failed commit, the stage is not settled (it runs again on `resume`), and the
    /// run's error names the limit.
    pub(super) fn limit_reached(
        &self,
        stage: Option<String>,
        limit: crate::backend::process::Limit,
        message: String,
    ) -> Outcome {
        let halt = Halt::Limit {
            run: self.run.id.clone(),
            stage,
            limit,
            message,
        };
        // Said once, by the run's error (a tracing error would print it twice).
        tracing::debug!("{}", crate::diag::error_chain(&halt));
        self.store_error.borrow_mut().get_or_insert(halt);
        let _ = self.interrupt.send(true);
        Outcome::Stopped
    }

    /// The prepared subflow of a file with params: compiled ahead with the run's plan (and
    /// admitted before the run started), else prepared now through the plan's callback, once
    /// per run, and admitted.
    pub(super) fn subflow(
        &self,
        path: &Path,
        sets: &[(String, String)],
    ) -> Result<Arc<super::Prepared>, RunError> {
        let key = (path.to_path_buf(), sets.to_vec());
        if let Some(p) = self.subflows.borrow().get(&key) {
            return Ok(p.clone());
        }
        let later = self
            .later
            .as_ref()
            .ok_or_else(|| RunError::InvalidSubflow {
                path: path.to_path_buf(),
                diagnostics: "it was not prepared with the run's workflow".into(),
            })?;
        let prepared = later
            .prepare(path, sets)
            .map_err(|e| invalid_subflow(path, &e))?;
        let prepared = Arc::new(prepared);
        self.admit(key, prepared.clone())?;
        Ok(prepared)
    }

    /// Takes a prepared subflow into the run: its agents' keys registered as secrets and,
    /// unless the run replays, its agents checked.
    fn admit(&self, key: SubflowKey, prepared: Arc<super::Prepared>) -> Result<(), RunError> {
        for note in super::lifecycle::register_secrets_noting(&prepared) {
            self.progress.note(&format!("! {note}"));
            self.event("", "", "warning", note);
        }
        if self.opts.replay.is_none() {
            for note in super::lifecycle::preflight(&prepared, &self.opts)? {
                self.progress.note(&format!("! {note}"));
                self.event("", "", "warning", note);
            }
        }
        self.subflows.borrow_mut().insert(key, prepared);
        Ok(())
    }

    /// Admits, before the run, the subflows compiled with a plan (and theirs): an invalid
    /// one, or an agent of theirs that cannot run, stops the run before anything starts.
    pub(super) fn preload_subflows(&self, subflows: &Subflows) -> Result<(), RunError> {
        for ahead in &subflows.ahead {
            if self.subflows.borrow().contains_key(&ahead.key) {
                continue;
            }
            let in_stage = |source| RunError::Subflow {
                stage: ahead.stage.clone(),
                source: Box::new(source),
            };
            let child = match &ahead.prepared {
                Ok(child) => child.clone(),
                Err(e) => return Err(in_stage(invalid_subflow(&ahead.key.0, e))),
            };
            self.admit(ahead.key.clone(), child.clone())
                .map_err(in_stage)?;
            self.preload_subflows(&child.subflows)?;
        }
        Ok(())
    }

    /// Says something the run's user should know of: in the log (`tracing`), in the
    /// progress (`! TEXT`), and as a `warning` event of the run.
    pub(super) fn warn(&self, text: String) {
        tracing::warn!("{text}");
        self.progress.note(&format!("! {text}"));
        self.event("", "", "warning", text);
    }

    /// Queues an event.
    pub(super) fn event(&self, scope: &str, node: &str, kind: &str, message: String) {
        self.event_at(scope, node, kind, message, now_ms());
    }

    /// Queues an event that happened at `at` (milliseconds since the Unix epoch). A stage's
    /// settlement event has the time of its settlement: queued just before the node, the
    /// store can keep the two in one row.
    pub(super) fn event_at(&self, scope: &str, node: &str, kind: &str, message: String, at: i64) {
        self.write(Write::Event(crate::store::Event {
            run: self.run.id.clone(),
            at,
            scope: scope.to_string(),
            node: node.to_string(),
            kind: kind.to_string(),
            message,
        }));
    }
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
    /// The directories the template helpers read (canonical), which an ACP agent may read
    /// through the client too: shared by every call.
    pub roots: std::sync::Arc<[PathBuf]>,
}

/// Makes a scope or a key safe as one path component.
pub(super) fn sanitize(s: &str) -> String {
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
    pub(super) fn new(
        shared: &'p Shared,
        plan: &'p Plan,
        sources: &'p Sources,
        prefix: String,
    ) -> Result<Self, RunError> {
        let roots = [shared.opts.cwd.clone(), shared.opts.state_dir.clone()]
            .into_iter()
            .chain(
                plan.workflow
                    .file_roots
                    .iter()
                    .map(|r| crate::fs::base_dir(sources, r.span).join(&r.value)),
            );
        let roots: Vec<PathBuf> = roots.filter_map(|d| d.canonicalize().ok()).collect();
        let mut env = template::environment(Roots::new(roots.clone()), shared.artifacts.waiter());
        super::memory::register(
            &mut env,
            shared.memory.clone(),
            plan.workflow.name.value.clone(),
            shared.run.id.clone(),
        );
        let mut agents = Vec::new();
        for a in &plan.workflow.agents {
            agents.push(agent_config(a, plan, sources)?);
        }
        // A resume starts each `auto` agent at the mode an earlier process stepped down to.
        if shared.opts.resume.is_some() {
            for (agent, mode) in stepped_down(shared) {
                if let Some(cfg) = agents.iter_mut().find(|c| c.name == agent) {
                    cfg.resumed_mode = Some(mode);
                }
            }
        }
        // Only stages with an `output` table get one: without it, an agent's output is
        // `{text}` and a command's the built-in object, with no extractor to hold.
        let mut extractors = HashMap::new();
        for (i, node) in plan.nodes.iter().enumerate() {
            let id = NodeId(i);
            if matches!(
                node.kind,
                StageKind::Agent | StageKind::Command | StageKind::Check
            ) && plan.stage(id).keys().output.is_some()
            {
                let st = plan.stage(id);
                let declared = st.keys().output.as_ref().and_then(|o| o.schema.as_ref());
                let schema = declared.and(plan.schemas.get(&id).map(|s| s.as_ref()));
                let ex = Extractor::new(st.keys().output.as_deref(), schema).map_err(|e| {
                    RunError::Stage {
                        stage: node.name.clone(),
                        source: e,
                    }
                })?;
                extractors.insert(id, ex);
            }
        }
        let mut resources = Vec::new();
        for r in &plan.workflow.resources {
            let cap = resolve_count(&r.capacity.value, &plan.params).map_err(|source| {
                RunError::Resource {
                    resource: r.name.value.clone(),
                    source,
                }
            })?;
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
            params: to_value(&plan.params),
            roots: roots.into(),
        })
    }

    /// The full scope of a frame (with a subflow's prefix).
    pub(super) fn scope(&self, frame: &Frame<'_>) -> String {
        match (self.prefix.is_empty(), frame.scope.is_empty()) {
            (true, _) => frame.scope.clone(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{}", self.prefix, frame.scope),
        }
    }

    /// Tells whether the run is stopping (an exit taken, Ctrl-C, a store failure): nothing
    /// new may start.
    pub(super) fn halted(&self) -> bool {
        *self.stop.borrow()
            || *self.shared.interrupt.borrow()
            || self.shared.store_error.borrow().is_some()
    }

    /// Completes when the run stops (an exit taken, Ctrl-C, a store failure).
    pub(super) async fn stopped(&self) {
        let mut a = self.stop.subscribe();
        let mut b = self.shared.interrupt.subscribe();
        tokio::select! {
            _ = a.wait_for(|v| *v) => {},
            _ = b.wait_for(|v| *v) => {},
        }
    }

    /// Ends the run with an exit: stops everything else.
    pub(super) fn take_exit(&self, i: usize) {
        if self.exit.get().is_none() {
            self.exit.set(Some(i));
        }
        let _ = self.stop.send(true);
    }

    /// Writes an action as stored.
    pub(super) fn action_text(&self, t: &Target) -> String {
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
    pub(super) fn parse_action(&self, s: &str) -> Option<Target> {
        self.plan.target(&Action::parse(s)?)
    }

    /// Resolves an action of the model.
    pub(super) fn target_of(&self, a: &Action) -> Target {
        self.plan.target(a).unwrap_or(Target::Fail)
    }

    /// The labels a worker needs to carry out a stage's work, besides the run's.
    pub(super) fn stage_labels(&self, n: NodeId) -> Vec<String> {
        self.plan
            .stage(n)
            .keys()
            .labels
            .iter()
            .map(|l| l.value.clone())
            .collect()
    }

    /// The resource a stage holds while it runs, as the store names it (the subflow's
    /// prefix, the resource), with its capacity.
    pub(super) fn held_resource(&self, n: NodeId) -> Option<(String, i64)> {
        let r = &self.plan.workflow.resources[self.plan.node(n).resource?];
        let capacity = resolve_count(&r.capacity.value, &self.plan.params).unwrap_or(1);
        let capacity = i64::try_from(capacity).unwrap_or(i64::MAX);
        Some((format!("{}/{}", self.prefix, r.name.value), capacity))
    }

    /// A node that fails before it starts (a limit that cannot be resolved, a template).
    pub(super) fn fail_now(&self, started: i64, message: String) -> Outcome {
        Outcome::Settled(Settled::error(
            NodeState::Failed,
            message,
            Target::Fail,
            started,
        ))
    }

    /// Builds (once) and returns the backend of an agent.
    /// Fails with why the backend cannot be built; the caller names the agent.
    pub(super) fn backend(
        &self,
        agent: usize,
    ) -> Result<Arc<dyn Backend>, crate::backend::BuildError> {
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
pub(super) fn agent_config(
    a: &crate::model::Agent,
    plan: &Plan,
    sources: &Sources,
) -> Result<AgentConfig, RunError> {
    let failed = |source: crate::params::ParamError| RunError::Agent {
        agent: a.name.value.clone(),
        source: Box::new(source),
    };
    let r = |t: &crate::model::Text| {
        crate::params::render_params(&t.value, &plan.params).map_err(failed)
    };
    let opt = |t: &Option<crate::model::Text>| t.as_ref().map(r).transpose();
    // `permissions`: a level or a policy, resolved with where it is declared. An agent CLI
    // is told the level the rules are (the checker refuses what it cannot enforce).
    let policy = crate::model::policy::resolve_shared(
        a.permissions.as_ref().map(|p| p.value.as_str()),
        &plan.workflow.policies,
        &|span| sources.locate(span),
    );
    let permissions = crate::model::policy::level_of(&policy)
        .and_then(crate::model::Permissions::parse)
        .unwrap_or_default();
    Ok(AgentConfig {
        name: a.name.value.clone(),
        kind: a.kind.value,
        model: opt(&a.model)?,
        args: a.args.iter().map(r).collect::<Result<_, _>>()?,
        env: a
            .env
            .iter()
            .map(|(k, v)| Ok((k.value.clone(), r(v)?)))
            .collect::<Result<_, RunError>>()?,
        command: a.command.iter().map(r).collect::<Result<_, _>>()?,
        prompt_via: a.prompt_via.as_ref().map(|p| p.value).unwrap_or_default(),
        base_url: opt(&a.base_url)?,
        api_key_env: opt(&a.api_key_env)?,
        api: a.api.as_ref().map(|p| p.value).unwrap_or_default(),
        max_tokens: a
            .max_tokens
            .as_ref()
            .map(|m| resolve_count(&m.value, &plan.params))
            .transpose()
            .map_err(failed)?,
        file: a
            .file
            .as_ref()
            .map(|f| crate::fs::base_dir(sources, f.span).join(&f.value)),
        program: None,
        permissions,
        policy,
        structured_output: a
            .structured_output
            .as_ref()
            .map(|m| m.value)
            .unwrap_or_default(),
        resumed_mode: None,
    })
}

/// The event that keeps the structured-output mode an agent stepped down to, run-wide (its
/// message is `AGENT: MODE`): a resume starts the agent there.
pub(super) const STEPPED_DOWN: &str = "structured_output";

/// The modes the agents of a run stepped down to in its earlier processes, from their
/// events (the last one of each agent).
fn stepped_down(shared: &Shared) -> Vec<(String, crate::model::StructuredOutput)> {
    let events = shared
        .store
        .borrow()
        .events(&shared.run.id, Some(""))
        .unwrap_or_default();
    let mut out: Vec<(String, crate::model::StructuredOutput)> = Vec::new();
    for e in events.iter().filter(|e| e.kind == STEPPED_DOWN) {
        if let Some((agent, mode)) = e.message.split_once(": ") {
            if let Some(mode) = crate::model::StructuredOutput::parse(mode) {
                out.retain(|(a, _)| a != agent);
                out.push((agent.to_string(), mode));
            }
        }
    }
    out
}

/// A JSON value shortened for a message.
pub(super) fn short_json(j: &Json) -> String {
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

/// A stage's timeout (or idle timeout): the stage's own, else its agent's.
pub(super) fn timeout_of(
    stage: Option<&crate::source::Spanned<crate::model::Dur>>,
    agent: Option<&crate::source::Spanned<crate::model::Dur>>,
    plan: &Plan,
) -> Option<Duration> {
    stage
        .or(agent)
        .and_then(|d| resolve_duration(&d.value, &plan.params).ok())
}

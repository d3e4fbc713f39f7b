//! Many machines on one PostgreSQL store: `run --detach` queues a run ([`enqueue`]) with
//! the files of its workflow and where it works (the directory, or the git repository and
//! commit), and `ralph-flow worker` ([`work`]) claims queued runs, and running runs whose
//! lease expired (a dead worker's), up to a number at once, and carries each out with
//! [`execute`] as `resume` does: settled stages never run again, the stage that was running
//! runs again (at least once). A run that stops on a gate is released (waiting, no lease);
//! answering the gate queues it again. Workers wake on `LISTEN/NOTIFY` and poll as well.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::sync::watch;

use super::error::{Halt, RunError};
use super::{Prepared, RunEnd, RunOptions, execute, now_ms};
use crate::compile::PrepareFn;
use crate::fs::FileSystem;
use crate::store::{
    Accept, AcceptUnit, Event, Location, LockOwner, OpenOptions, RunRecord, RunStatus, SharedStore,
    StoreError, Unit, Write,
};

/// The worker's handle on its shared store, which its runs and units use in turn.
type WorkerStore = Rc<RefCell<Box<dyn SharedStore>>>;

/// Why a run could not be queued, or a worker could not go on.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `--detach` and `worker` need a store that other machines reach.
    #[error(
        "{0} needs a PostgreSQL store that the workers share: give --store postgres://... \
         (or set RALPH_FLOW_STORE)"
    )]
    NotShared(&'static str),
    /// A git command on the run's repository failed.
    #[error("cannot {what}: git said: {said}")]
    Git { what: String, said: String },
    /// The workflow stored with a run does not prepare on the worker.
    #[error("the workflow stored with run {run} does not check here:\n{diagnostics}")]
    Prepare { run: String, diagnostics: String },
    /// The run's working directory is not on this machine.
    #[error(
        "run {run} works in {dir}, which is not on this machine, and is not in a git \
         repository a worker could check out; run a worker where that directory is"
    )]
    NoWorkspace { run: String, dir: String },
    #[error(transparent)]
    Run(#[from] RunError),
}

/// Where a detached run works: recorded by `run --detach` in the run's `options`.
#[derive(Clone, Debug, PartialEq)]
pub struct Workspace {
    /// The submitter's working directory.
    pub cwd: PathBuf,
    /// Its git repository, if it is in one.
    pub git: Option<GitPlace>,
}

/// A git checkout as a worker finds it again.
#[derive(Clone, Debug, PartialEq)]
pub struct GitPlace {
    /// `remote.origin.url`, else the checkout as a `file://` URL.
    pub url: String,
    /// The commit checked out (HEAD) when the run was queued.
    pub commit: String,
    /// The working directory below the checkout's top (`""` at the top).
    pub subdir: String,
}

fn git(cwd: &Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(cwd)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

impl Workspace {
    /// Where a run queued from `cwd` works: the directory, and its git checkout (origin's
    /// URL, else the checkout's path as a file URL; HEAD) when it is in one.
    pub fn of(cwd: &Path) -> Workspace {
        let git = (|| {
            let top = PathBuf::from(git(cwd, &["rev-parse", "--show-toplevel"])?);
            let commit = git(cwd, &["rev-parse", "--verify", "HEAD^{commit}"])?;
            let url = git(cwd, &["config", "--get", "remote.origin.url"])
                .unwrap_or_else(|| format!("file://{}", top.display()));
            let real = std::fs::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
            let subdir = real
                .strip_prefix(std::fs::canonicalize(&top).unwrap_or(top))
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            Some(GitPlace {
                url,
                commit,
                subdir,
            })
        })();
        Workspace {
            cwd: cwd.to_path_buf(),
            git,
        }
    }

    /// As recorded in a run's options.
    pub fn to_json(&self) -> Json {
        let mut o = json!({ "cwd": self.cwd.to_string_lossy() });
        if let Some(g) = &self.git {
            o["git"] = json!({ "url": g.url, "commit": g.commit, "subdir": g.subdir });
        }
        o
    }

    /// From a run's options (`None` for a run that was not queued with `--detach`).
    pub fn from_options(options: &Json) -> Option<Workspace> {
        let w = options.get("workspace")?;
        let git = w.get("git").and_then(|g| {
            Some(GitPlace {
                url: g.get("url")?.as_str()?.to_string(),
                commit: g.get("commit")?.as_str()?.to_string(),
                subdir: g
                    .get("subdir")
                    .and_then(Json::as_str)
                    .unwrap_or_default()
                    .to_string(),
            })
        });
        Some(Workspace {
            cwd: PathBuf::from(w.get("cwd")?.as_str()?),
            git,
        })
    }

    /// Whether a worker on this machine can work there: a git checkout it can clone, or a
    /// directory that is here.
    pub fn reachable(&self) -> bool {
        match &self.git {
            Some(g) => super::units::repository_here(&g.url),
            None => self.cwd.is_dir(),
        }
    }
}

/// Queues a prepared workflow as a detached run in the shared store `opts.store`, with its
/// files, its params, `--replay`/`--record`, where it works and the labels a worker needs.
/// Returns the run's id.
pub fn enqueue(
    prepared: &Prepared,
    opts: &RunOptions,
    labels: &[String],
) -> Result<String, WorkerError> {
    let Some(mut store) = opts.location().open_shared(&OpenOptions::default())? else {
        return Err(WorkerError::NotShared("--detach"));
    };
    let started = now_ms();
    let id = super::new_run_id(started);
    let absolute = |p: &Option<PathBuf>| {
        p.as_ref()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
    };
    let mut options = serde_json::Map::new();
    if let Some(p) = absolute(&opts.replay) {
        options.insert("replay".into(), Json::String(p.to_string_lossy().into()));
    }
    if let Some(p) = absolute(&opts.record) {
        options.insert("record".into(), Json::String(p.to_string_lossy().into()));
    }
    options.insert("workspace".into(), Workspace::of(&opts.cwd).to_json());
    options.insert("labels".into(), json!(labels));
    options.insert(
        super::trace::OPTIONS_KEY.into(),
        super::trace::TraceIds::new_json(),
    );
    let path = std::path::absolute(&prepared.path).unwrap_or_else(|_| prepared.path.clone());
    let run = RunRecord {
        id: id.clone(),
        workflow: prepared.plan.workflow.name.value.clone(),
        file: path.to_string_lossy().into_owned(),
        workflow_hash: prepared.hash.clone(),
        params: super::params_json(&prepared.plan.params),
        status: RunStatus::Queued,
        exit: None,
        started_at: started,
        updated_at: started,
        dir: String::new(),
        options: Json::Object(options),
    };
    // By absolute path: the loader names files relative to the current directory, which a
    // worker does not share. The subflows compiled with the plan bring theirs (their prompt
    // files among them), each file once.
    let mut sources: Vec<(String, String)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![prepared];
    while let Some(p) = stack.pop() {
        for (_, f) in p.sources.iter() {
            let path = if f.path.is_absolute() {
                crate::fs::normalize(&f.path)
            } else {
                crate::fs::normalize(&opts.cwd.join(&f.path))
            };
            let path = path.to_string_lossy().into_owned();
            if seen.insert(path.clone()) {
                sources.push((path, f.text.to_string()));
            }
        }
        stack.extend(
            p.subflows
                .ahead
                .iter()
                .filter_map(|a| a.prepared.as_deref().ok()),
        );
    }
    // A drawn id may be taken (runs queued in the same second): draw again.
    let mut run = run;
    let mut draws = 1;
    loop {
        match store.enqueue(&run, &sources, labels) {
            Err(StoreError::RunExists(_)) if draws < 16 => {
                draws += 1;
                run.id = super::new_run_id(now_ms());
            }
            other => break other?,
        }
    }
    let id = run.id.clone();
    store.commit(&[Write::Event(Event {
        run: id.clone(),
        at: now_ms(),
        scope: String::new(),
        node: String::new(),
        kind: "queued".into(),
        message: format!(
            "run of {} queued by pid {} on {}{}",
            path.display(),
            std::process::id(),
            crate::store::host_name(),
            if labels.is_empty() {
                String::new()
            } else {
                format!(" for workers labelled {}", labels.join(", "))
            }
        ),
    })])?;
    Ok(id)
}

/// How a worker works.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The shared store (`postgres://...`).
    pub store: Location,
    /// The worker's labels: it claims runs that need no label it lacks.
    pub labels: Vec<String>,
    /// The most units of work (agent calls, programs) carried out at once.
    pub max_concurrency: usize,
    /// The most runs coordinated at once.
    pub max_runs: usize,
    /// The worker's state directory: runs' artifacts (`runs/ID`) and checkouts
    /// (`workspaces/ID`).
    pub state_dir: PathBuf,
    /// How often it looks for runs without being woken (notifications are lost while its
    /// listening connection is down).
    pub poll: Duration,
    /// The settings each run is carried out with (lease, backoff, retries, progress).
    pub run: RunOptions,
    /// Prepares a claimed run's workflow from its files in the store (`crate::prepare`:
    /// the layers that load and check are above this one).
    pub prepare: PrepareFn,
}

/// What a worker tells as it goes (one line each).
pub type Report = Rc<dyn Fn(&str)>;

/// How a worker ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerEnd {
    /// Runs it carried to an end (finished, waiting, handed back).
    pub runs: u64,
}

/// Claims and carries out runs until `stop` turns true; then stops claiming, stops its
/// runs as Ctrl-C stops a run (each is queued again for another worker) and returns.
/// Must run inside a [`tokio::task::LocalSet`] (the executor is not `Send`).
pub async fn work(
    opts: WorkerOptions,
    mut stop: watch::Receiver<bool>,
    report: Report,
) -> Result<WorkerEnd, WorkerError> {
    let Some(store) = opts.store.open_shared(&OpenOptions::default())? else {
        return Err(WorkerError::NotShared("a worker"));
    };
    let store: WorkerStore = Rc::new(RefCell::new(store));
    let wake = Arc::new(tokio::sync::Notify::new());
    let stop_listening = Arc::new(AtomicBool::new(false));
    // A coordinator waiting for a unit wakes on the notifications that name it.
    let unit_wake = super::units::UnitWakes::new();
    let listener = {
        let (wake, unit_wake) = (wake.clone(), unit_wake.clone());
        store.borrow().listen(
            stop_listening.clone(),
            Box::new(move |payload| {
                wake.notify_one();
                unit_wake.notified(payload);
            }),
        )?
    };
    let mut opts = opts;
    opts.run.unit_wake = Some(unit_wake);
    let runs_dir = opts.state_dir.join("runs");
    std::fs::create_dir_all(&runs_dir).map_err(|e| RunError::io("create", &runs_dir, e))?;
    let mut worker = Worker::new(store, opts, stop.clone(), report);
    worker.started();
    let mut running = tokio::task::JoinSet::new();
    let mut units = tokio::task::JoinSet::new();
    let mut done = 0u64;
    loop {
        if *stop.borrow() {
            break;
        }
        worker.seen();
        worker.prune();
        worker.claim_units(&mut units);
        worker.claim_runs(&mut running, &runs_dir);
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(worker.opts.poll) => {}
            Some(_) = running.join_next(), if !running.is_empty() => done += 1,
            Some(_) = units.join_next(), if !units.is_empty() => {}
            r = stop.changed() => if r.is_err() { break },
        }
    }
    (worker.report)(&format!(
        "stopping: {} run{} to hand back",
        running.len(),
        if running.len() == 1 { "" } else { "s" }
    ));
    while running.join_next().await.is_some() {
        done += 1;
    }
    while units.join_next().await.is_some() {}
    if let Err(e) = worker
        .store
        .borrow_mut()
        .worker_gone(crate::store::holder_id())
    {
        tracing::warn!(
            "cannot record that this worker stopped: {}",
            crate::diag::error_chain(&e)
        );
    }
    stop_listening.store(true, Ordering::Relaxed);
    let _ = listener.join();
    Ok(WorkerEnd { runs: done })
}

/// A worker as it goes: its store, its settings, and what it keeps between claims.
struct Worker {
    store: WorkerStore,
    opts: WorkerOptions,
    stop: watch::Receiver<bool>,
    report: Report,
    /// Whether it can carry a run out here.
    accept: Accept,
    /// Repositories this worker could not clone lately: it claims no unit there for a while.
    unreachable: Unreachable,
    /// Whether it can carry a unit out here.
    accept_unit: AcceptUnit,
    /// The runs whose workflows it has prepared for their units.
    prepared: PreparedRuns,
    /// When it last said it is here.
    seen: Option<std::time::Instant>,
    /// When it last removed unused unit files.
    pruned: Option<std::time::Instant>,
}

impl Worker {
    fn new(
        store: WorkerStore,
        opts: WorkerOptions,
        stop: watch::Receiver<bool>,
        report: Report,
    ) -> Worker {
        let unreachable: Unreachable = Arc::default();
        let accept_unit: AcceptUnit = {
            let unreachable = unreachable.clone();
            Arc::new(move |place: &Json| accepts(place, &unreachable))
        };
        let prepare = opts.prepare;
        Worker {
            store,
            opts,
            stop,
            report,
            accept: Arc::new(|run: &RunRecord| {
                Workspace::from_options(&run.options).is_some_and(|w| w.reachable())
            }),
            unreachable,
            accept_unit,
            prepared: Rc::new(Prepare {
                prepare,
                runs: RefCell::default(),
            }),
            seen: None,
            pruned: None,
        }
    }

    /// Says that it started, and how much it takes on.
    fn started(&self) {
        let opts = &self.opts;
        (self.report)(&format!(
            "worker {} started: at most {} unit{} of work and {} run{} at once{}",
            crate::store::holder_id(),
            opts.max_concurrency,
            if opts.max_concurrency == 1 { "" } else { "s" },
            opts.max_runs,
            if opts.max_runs == 1 { "" } else { "s" },
            if opts.labels.is_empty() {
                String::new()
            } else {
                format!(", labels {}", opts.labels.join(", "))
            }
        ));
    }

    /// Says that this worker, with its labels, is here (at most once a second), so that
    /// `status` and the monitor can tell why work none of the live workers can take waits.
    fn seen(&mut self) {
        if self
            .seen
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        let said = self.store.borrow_mut().worker_seen(
            crate::store::holder_id(),
            &crate::store::host_name(),
            std::process::id(),
            &self.opts.labels,
            live_for(self.opts.poll),
        );
        if let Err(e) = said {
            tracing::warn!(
                "cannot record this worker in the store: {}",
                crate::diag::error_chain(&e)
            );
        }
        self.seen = Some(std::time::Instant::now());
    }

    /// Removes the unit files unused for a day, once every [`PRUNE_EVERY`].
    fn prune(&mut self) {
        if self.pruned.is_some_and(|t| t.elapsed() < PRUNE_EVERY) {
            return;
        }
        let gone = prune_units(&self.opts.state_dir, UNIT_FILES_KEPT);
        if gone > 0 {
            (self.report)(&format!(
                "removed {gone} unit clone{} and output director{} unused for a day",
                if gone == 1 { "" } else { "s" },
                if gone == 1 { "y" } else { "ies" }
            ));
        }
        self.pruned = Some(std::time::Instant::now());
    }

    /// Claims units of work while it has room for them, each carried out on its own task.
    fn claim_units(&self, units: &mut tokio::task::JoinSet<()>) {
        while units.len() < self.opts.max_concurrency.max(1) {
            let owner = crate::store::current_owner().with_lease(self.opts.run.lease);
            let claimed = self.store.borrow_mut().claim_unit(
                &owner,
                &self.opts.labels,
                self.accept_unit.clone(),
            );
            let unit = match claimed {
                Ok(Some(u)) => u,
                Ok(None) => break,
                Err(e) => {
                    (self.report)(&format!(
                        "! cannot claim a unit of work: {}",
                        crate::diag::error_chain(&e)
                    ));
                    break;
                }
            };
            (self.report)(&format!(
                "claimed unit {} ({}) of run {}",
                unit.id, unit.key, unit.run
            ));
            units.spawn_local(carry_unit(UnitJob {
                unit,
                owner,
                store: self.store.clone(),
                opts: self.opts.clone(),
                stop: self.stop.clone(),
                prepared: self.prepared.clone(),
                unreachable: self.unreachable.clone(),
                report: self.report.clone(),
            }));
        }
    }

    /// Claims runs while it has room for them, each carried out on its own task.
    fn claim_runs(&self, running: &mut tokio::task::JoinSet<()>, runs_dir: &Path) {
        while running.len() < self.opts.max_runs.max(1) {
            let owner = crate::store::current_owner().with_lease(self.opts.run.lease);
            let claimed = self.store.borrow_mut().claim(
                &owner,
                &self.opts.labels,
                runs_dir,
                self.accept.clone(),
            );
            let run = match claimed {
                Ok(Some(run)) => run,
                Ok(None) => break,
                Err(e) => {
                    (self.report)(&format!(
                        "! cannot claim a run: {}",
                        crate::diag::error_chain(&e)
                    ));
                    break;
                }
            };
            (self.report)(&format!("claimed run {} ({})", run.id, run.workflow));
            let job = carry(
                run,
                owner,
                self.store.clone(),
                self.opts.clone(),
                self.stop.clone(),
                self.report.clone(),
            );
            running.spawn_local(job);
        }
    }
}

/// How long a worker that polls every `poll` counts as live after it was last seen: three
/// of its polls (a wake-up may come late), and never less than 30 s.
fn live_for(poll: Duration) -> Duration {
    (poll * 3).max(Duration::from_secs(30))
}

/// Carries out one claimed run to its end, reporting how it ended; a run that could not
/// be carried out is left interrupted with why in its log (`resume` continues it where its
/// workflow is), a run whose lease was lost is left to its new holder.
async fn carry(
    run: RunRecord,
    owner: LockOwner,
    store: WorkerStore,
    opts: WorkerOptions,
    stop: watch::Receiver<bool>,
    report: Report,
) {
    let id = run.id.clone();
    let result = carry_out(&run, &owner, &store, &opts, stop).await;
    let line = match result {
        Ok(RunEnd::Exit { name, code, .. }) => format!("run {id} ended: {name} (exit code {code})"),
        Ok(RunEnd::Waiting(gates)) => {
            // A gate answered before the run said it waits queued nothing: look again.
            let again = store.borrow_mut().requeue_if_answered(&id);
            format!(
                "run {id} waits on {}; released{}",
                gates.join(", "),
                match again {
                    Ok(true) => " and queued again (a gate was answered meanwhile)".to_string(),
                    Ok(false) => String::new(),
                    Err(e) => format!(
                        " (cannot tell whether a gate was answered meanwhile: {})",
                        crate::diag::error_chain(&e)
                    ),
                }
            )
        }
        Ok(RunEnd::Cancelled(c)) => {
            format!(
                "run {id} was cancelled {}; its stages were stopped",
                c.text()
            )
        }
        // Cancelled before it started here: nothing ran; the claim's lock is let go.
        Err(WorkerError::Run(RunError::Cancelled { how, .. })) => {
            let released = store.borrow_mut().unlock(&id, &owner);
            format!(
                "run {id} was cancelled {how} before it started here{}",
                match released {
                    Ok(()) => String::new(),
                    Err(e) => format!(
                        " (its lock could not be released: {})",
                        crate::diag::error_chain(&e)
                    ),
                }
            )
        }
        Ok(RunEnd::Interrupted) => match store.borrow_mut().requeue(&id, &owner) {
            Ok(()) => format!("run {id} stopped and handed back to the queue"),
            Err(e) => format!(
                "! run {id} stopped, but could not be queued again: {}",
                crate::diag::error_chain(&e)
            ),
        },
        Err(
            WorkerError::Store(e @ StoreError::LeaseLost { .. })
            | WorkerError::Run(
                RunError::Store(e @ StoreError::LeaseLost { .. })
                | RunError::Halted(Halt::Store(e @ StoreError::LeaseLost { .. })),
            ),
        ) => format!("! run {id}: {}", crate::diag::error_chain(&e)),
        // The store failed under the run (out of reach past the lease, say), or refused it
        // (another tenure holds it): the run is not marked anything because of it. Its lock
        // is released if this tenure still holds it (else its lease ends by itself), and a
        // worker takes it over and goes on.
        Err(
            WorkerError::Store(e)
            | WorkerError::Run(RunError::Store(e) | RunError::Halted(Halt::Store(e))),
        ) => {
            let released = store.borrow_mut().unlock(&id, &owner);
            format!(
                "! run {id} stopped on the store: {}\n  it is left as it is, for a worker to \
                 take over{}",
                crate::diag::error_chain(&e),
                match released {
                    Ok(()) => String::new(),
                    Err(_) => " once its lease ends".into(),
                }
            )
        }
        Err(e) => {
            let why = crate::diag::error_chain(&e);
            // Fenced by this claim's tenure: nothing is recorded once another holds the run
            // (a finished run's status never goes back).
            let mut s = store.borrow().fenced(&id, &owner);
            let noted = s
                .commit(&[Write::Event(Event {
                    run: id.clone(),
                    at: now_ms(),
                    scope: String::new(),
                    node: String::new(),
                    kind: "error".into(),
                    message: format!(
                        "worker {} could not carry the run out: {why}",
                        crate::store::holder_id()
                    ),
                })])
                .and_then(|()| s.set_status(&id, RunStatus::Interrupted, None))
                .and_then(|()| s.unlock(&id, &owner));
            format!(
                "! run {id} could not be carried out here: {why}{}",
                match noted {
                    Ok(()) => format!(
                        "\n  it is left interrupted; `ralph-flow resume {id}` continues it where \
                         its workflow is"
                    ),
                    Err(e) => format!(
                        "\n  and that could not be recorded: {}",
                        crate::diag::error_chain(&e)
                    ),
                }
            )
        }
    };
    report(&line);
}

async fn carry_out(
    run: &RunRecord,
    owner: &LockOwner,
    store: &WorkerStore,
    opts: &WorkerOptions,
    stop: watch::Receiver<bool>,
) -> Result<RunEnd, WorkerError> {
    let sources = store.borrow().sources(&run.id)?;
    let fs: Arc<dyn FileSystem + Send + Sync> = Arc::new(crate::fs::MemFs::over_disk(
        sources.into_iter().map(|(p, t)| (PathBuf::from(p), t)),
    ));
    let prepared = (opts.prepare)(&fs, Path::new(&run.file), &run.param_sets()).map_err(|e| {
        WorkerError::Prepare {
            run: run.id.clone(),
            diagnostics: e.render(),
        }
    })?;
    let place = Workspace::from_options(&run.options).ok_or_else(|| WorkerError::NoWorkspace {
        run: run.id.clone(),
        dir: "(not recorded)".into(),
    })?;
    let cwd = match &place.git {
        Some(g) => checkout(&opts.state_dir, &run.id, g).await?,
        None if place.cwd.is_dir() => place.cwd.clone(),
        None => {
            return Err(WorkerError::NoWorkspace {
                run: run.id.clone(),
                dir: place.cwd.display().to_string(),
            });
        }
    };
    let mut o = opts.run.clone();
    o.cwd = cwd;
    o.state_dir = opts.state_dir.clone();
    o.store = Some(opts.store.clone());
    o.wait = false;
    o.resume = Some(run.id.clone());
    // The executor goes on under the claim's tenure: one holder from claim to end.
    o.owner = Some(owner.clone());
    o.stop = Some(stop);
    o.publish = place.git.as_ref().map(|g| g.url.clone());
    o.spread = Some(store.borrow().labels(&run.id)?);
    Ok(execute(&prepared, o).await?.end)
}

/// The run's checkout on this worker, `STATE_DIR/workspaces/ID` on a branch
/// `ralph-flow/ID` at the queued commit: cloned the first time, kept as it is when the run
/// comes back to this worker. Returns the run's working directory in it.
async fn checkout(state_dir: &Path, id: &str, g: &GitPlace) -> Result<PathBuf, WorkerError> {
    let dir = state_dir.join("workspaces").join(id);
    let branch = format!("ralph-flow/{id}");
    let run_git = |args: Vec<String>, what: String| async move {
        let out = tokio::process::Command::new("git")
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|e| WorkerError::Git {
                what: what.clone(),
                said: e.to_string(),
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(WorkerError::Git {
                what,
                said: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    };
    let d = dir.to_string_lossy().into_owned();
    if !dir.join(".git").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| RunError::io("create", parent, e))?;
        }
        run_git(
            vec![
                "clone".into(),
                "--quiet".into(),
                "--no-checkout".into(),
                "--".into(),
                g.url.clone(),
                d.clone(),
            ],
            format!("clone {} into {d}", g.url),
        )
        .await?;
    }
    // The repository's branches as local branches, as in the checkout the run was queued
    // from: a worktree's `base = "main"` names one, and a branch that exists is reused.
    run_git(
        vec![
            "-C".into(),
            d.clone(),
            "fetch".into(),
            "--quiet".into(),
            "--no-tags".into(),
            "--update-head-ok".into(),
            "origin".into(),
            "+refs/heads/*:refs/heads/*".into(),
        ],
        format!("fetch the branches of {}", g.url),
    )
    .await?;
    // The branch as the last worker that carried the run out published it (after its last
    // settled stage), uncommitted changes included; else the queued commit.
    let published = super::publish::restore(&dir, &g.url, &branch)
        .await
        .map_err(|e| WorkerError::Git {
            what: format!("restore branch {branch} from {}", g.url),
            said: crate::diag::error_chain(&e),
        })?;
    let at = |dir: PathBuf| {
        if g.subdir.is_empty() {
            dir
        } else {
            dir.join(&g.subdir)
        }
    };
    if published.head.is_some() {
        return Ok(at(dir));
    }
    let has_branch = run_git(
        vec![
            "-C".into(),
            d.clone(),
            "rev-parse".into(),
            "--verify".into(),
            "--quiet".into(),
            format!("refs/heads/{branch}"),
        ],
        String::new(),
    )
    .await
    .is_ok();
    if !has_branch {
        let present = run_git(
            vec![
                "-C".into(),
                d.clone(),
                "cat-file".into(),
                "-e".into(),
                format!("{}^{{commit}}", g.commit),
            ],
            String::new(),
        )
        .await
        .is_ok();
        if !present {
            run_git(
                vec![
                    "-C".into(),
                    d.clone(),
                    "fetch".into(),
                    "--quiet".into(),
                    "origin".into(),
                    g.commit.clone(),
                ],
                format!(
                    "fetch commit {} from {} (push it, so that workers can reach it)",
                    g.commit, g.url
                ),
            )
            .await?;
        }
        run_git(
            vec![
                "-C".into(),
                d.clone(),
                "checkout".into(),
                "--quiet".into(),
                "-B".into(),
                branch.clone(),
                g.commit.clone(),
            ],
            format!("check out {} in {d}", g.commit),
        )
        .await?;
    }
    Ok(at(dir))
}

/// How long a unit's clone or output directory is kept unused before a worker removes it.
const UNIT_FILES_KEPT: Duration = Duration::from_secs(24 * 3600);

/// How often a worker looks for them.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Removes the unit clones (`units/clones/*`) and output directories
/// (`units/attempts/RUN`) not used for `age`; returns how many. A clone is marked used
/// each time a unit works in it.
fn prune_units(state_dir: &Path, age: Duration) -> usize {
    let mut gone = 0;
    for sub in ["clones", "attempts"] {
        let Ok(entries) = std::fs::read_dir(state_dir.join("units").join(sub)) else {
            continue;
        };
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|d| d >= age);
            if old && std::fs::remove_dir_all(e.path()).is_ok() {
                gone += 1;
            }
        }
    }
    gone
}

/// Marks a directory used now (its modification time), for [`prune_units`].
fn touch(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// Repositories a worker could not clone, and when.
type Unreachable = Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>>;

/// Whether a worker takes a unit that works at `place` (as JSON): it can work there, and
/// it has not failed to clone its repository lately.
fn accepts(place: &Json, unreachable: &Unreachable) -> bool {
    let Some(place) = super::units::Place::from_json(place) else {
        return false;
    };
    if let super::units::Place::Git { url, .. } = &place {
        let shut = unreachable
            .lock()
            .ok()
            .and_then(|m| m.get(url).copied())
            .is_some_and(|at| at.elapsed() < UNREACHABLE_FOR);
        if shut {
            return false;
        }
    }
    place.reachable()
}

/// How long a worker claims no unit in a repository it could not clone.
const UNREACHABLE_FOR: Duration = Duration::from_secs(600);

/// The variable that tags a unit's programs with its id (see `stop_leftovers`).
const UNIT_ENV: &str = "RALPH_FLOW_UNIT";

/// The runs whose workflows this worker has prepared (for their agents' settings), by id.
type PreparedRuns = Rc<Prepare>;

/// How this worker prepares runs' workflows, and those it prepared.
struct Prepare {
    prepare: PrepareFn,
    runs: RefCell<std::collections::HashMap<String, Rc<Prepared>>>,
}

/// Why a run's workflow could not be prepared for its units here.
#[derive(Debug, thiserror::Error)]
enum PrepareError {
    /// The store failed (said as its whole chain, as the unit's result says it).
    #[error("{}", crate::diag::error_chain(.0))]
    Store(#[from] StoreError),
    #[error("there is no run {0}")]
    NoRun(String),
    #[error("the run's workflow does not check here:\n{0}")]
    Check(String),
}

/// A run's workflow as stored with it, prepared once per worker; its secrets registered
/// (`run::register_secrets`) before any unit of the run is carried out here.
fn prepared_run(
    store: &WorkerStore,
    cache: &PreparedRuns,
    run: &str,
) -> Result<Rc<Prepared>, PrepareError> {
    if let Some(p) = cache.runs.borrow().get(run) {
        return Ok(p.clone());
    }
    let record = store
        .borrow()
        .run(run)?
        .ok_or_else(|| PrepareError::NoRun(run.to_string()))?;
    let sources = store.borrow().sources(run)?;
    let fs: Arc<dyn FileSystem + Send + Sync> = Arc::new(crate::fs::MemFs::over_disk(
        sources.into_iter().map(|(p, t)| (PathBuf::from(p), t)),
    ));
    let prepared = (cache.prepare)(&fs, Path::new(&record.file), &record.param_sets())
        .map_err(|e| PrepareError::Check(e.render()))?;
    super::register_secrets(&prepared);
    let prepared = Rc::new(prepared);
    cache
        .runs
        .borrow_mut()
        .insert(run.to_string(), prepared.clone());
    Ok(prepared)
}

/// A claimed unit of work, and what its worker carries it out with.
struct UnitJob {
    unit: Unit,
    /// The claim's tenure.
    owner: LockOwner,
    store: WorkerStore,
    opts: WorkerOptions,
    stop: watch::Receiver<bool>,
    prepared: PreparedRuns,
    unreachable: Unreachable,
    report: Report,
}

/// Renews a unit's lease every third of it while its work goes on; returns why once it is
/// lost (cancelled, taken over, or not renewed for a whole lease).
async fn renew_unit(job: &UnitJob) -> String {
    let lease = job.opts.run.lease;
    let mut last_ok = std::time::Instant::now();
    loop {
        tokio::time::sleep(lease / 3).await;
        match job.store.borrow_mut().renew_unit(job.unit.id, &job.owner) {
            Ok(true) => last_ok = std::time::Instant::now(),
            Ok(false) => return "it was cancelled or taken over".to_string(),
            Err(e) if last_ok.elapsed() >= lease => {
                return format!(
                    "its lease could not be renewed: {}",
                    crate::diag::error_chain(&e)
                );
            }
            Err(_) => {}
        }
    }
}

/// ` (failed: WHY)` for a store call that failed, else nothing.
fn failed_note(r: crate::store::Result<()>) -> String {
    match r {
        Ok(()) => String::new(),
        Err(e) => format!(" (failed: {})", crate::diag::error_chain(&e)),
    }
}

/// Carries out one claimed unit of work, renewing its lease, and records what came of it.
/// A unit whose lease is lost (cancelled, taken over) is dropped, which stops its program
/// or call; one whose worker is told to stop is handed back to the queue.
async fn carry_unit(job: UnitJob) {
    let (id, key, owner, report) = (job.unit.id, &job.unit.key, &job.owner, &job.report);
    let mut stop = job.stop.clone();
    let result = tokio::select! {
        r = unit_work(&job) => match r {
            Ok(r) => r,
            // Lost before its work started: nothing ran here, nothing is recorded.
            Err(UnitNotDone::Lost(why)) => {
                report(&format!("unit {id} ({key}) not started: {why}"));
                return;
            }
            // No access to its repository here: another worker may have it.
            Err(UnitNotDone::Unreachable(url, why)) => {
                if let Ok(mut m) = job.unreachable.lock() {
                    m.insert(url.clone(), std::time::Instant::now());
                }
                let back = job.store.borrow_mut().release_unit(id, owner);
                report(&format!(
                    "! unit {id} ({key}): cannot clone {url}: {why}; handed back{}, and no unit \
                     there is claimed here for {}",
                    failed_note(back),
                    crate::text::duration(UNREACHABLE_FOR)
                ));
                return;
            }
        },
        why = renew_unit(&job) => {
            // The work was dropped with its future: its programs are stopped.
            let noted = job.store.borrow_mut().unit_stopped(id, owner);
            report(&format!(
                "unit {id} ({key}) stopped: {why}{}",
                match noted {
                    Ok(()) => String::new(),
                    Err(e) => format!(" (not recorded: {})", crate::diag::error_chain(&e)),
                }
            ));
            return;
        }
        _ = stop.wait_for(|s| *s) => {
            let back = job.store.borrow_mut().release_unit(id, owner);
            report(&format!(
                "unit {id} ({key}) stopped{}",
                match back {
                    Ok(()) => " and handed back to the queue".to_string(),
                    Err(e) => format!(", but could not be handed back: {}", crate::diag::error_chain(&e)),
                }
            ));
            return;
        }
    };
    // What the program printed or the agent answered: stored masked, as the run's own
    // records are.
    let mut value = serde_json::to_value(&result).unwrap_or(Json::Null);
    crate::secrets::redact_json(&mut value);
    match job.store.borrow_mut().finish_unit(id, owner, &value) {
        Ok(true) => report(&format!("unit {id} ({key}) done")),
        Ok(false) => report(&format!(
            "unit {id} ({key}) done, but another worker holds it now: its result is dropped"
        )),
        Err(e) => report(&format!(
            "! unit {id} ({key}): cannot record its result: {}",
            crate::diag::error_chain(&e)
        )),
    }
}

/// Why a claimed unit's work was not done here.
enum UnitNotDone {
    /// Its repository (the URL) cannot be cloned here (why).
    Unreachable(String, String),
    /// This worker no longer holds it (why): its lease lapsed before the work started
    /// (the store out of reach), and another worker may be doing it.
    Lost(String),
}

/// Where a unit works here: its directory and, in a git run, the publisher of its branch.
type UnitPlace = (PathBuf, Option<super::publish::Publisher>);

/// Does a unit's work where it says: a clone of its repository on its branch as published
/// (`STATE_DIR/units/clones/HASH`), published again afterwards; or its directory.
async fn unit_work(job: &UnitJob) -> Result<super::units::UnitResult, UnitNotDone> {
    use super::units::UnitResult;
    let (unit, opts) = (&job.unit, &job.opts);
    let (cwd, publisher) = match unit_place(unit, opts).await? {
        Ok(place) => place,
        Err(failed) => return Ok(failed),
    };
    let files = opts
        .state_dir
        .join("units")
        .join("attempts")
        .join(&unit.run)
        .join(unit.id.to_string());
    if let Err(e) = std::fs::create_dir_all(&files) {
        let what = || format!("cannot create {}", files.display());
        return Ok(match crate::backend::process::LimitHit::of(what, e) {
            Ok(hit) => limit_here(hit.limit, &hit.to_string()),
            Err(e) => UnitResult::Failed(format!("{}: {e}", what())),
        });
    }
    if let Some(run_dir) = files.parent() {
        touch(run_dir);
    }
    // Only while this worker still holds the unit: its lease may have lapsed while the
    // store was out of reach, and then what is stopped next may be the copy of the worker
    // that holds it now.
    match job.store.borrow_mut().renew_unit(unit.id, &job.owner) {
        Ok(true) => {}
        Ok(false) => return Err(UnitNotDone::Lost("another worker holds it now".into())),
        Err(e) => {
            return Err(UnitNotDone::Lost(format!(
                "its lease could not be renewed: {}",
                crate::diag::error_chain(&e)
            )));
        }
    }
    // A unit taken over on this machine: what its earlier holder (killed) left running of
    // it is stopped first, so that its work never runs beside an earlier copy of itself.
    let tag = unit.id.to_string();
    {
        let tag = tag.clone();
        let _ = tokio::task::spawn_blocking(move || {
            crate::backend::process::stop_leftovers(Some((UNIT_ENV, &tag)), &[], &[])
        })
        .await;
    }
    let result = match unit.kind.as_str() {
        "command" => command_unit(job, &cwd, &files, &tag).await,
        "agent" => agent_unit(job, &cwd, &files, &tag).await,
        other => UnitResult::Failed(format!("a unit of an unknown kind `{other}`")),
    };
    if let Some(p) = publisher {
        if let Err(e) = p.publish(&cwd).await {
            return Ok(UnitResult::Failed(format!(
                "the work was done, but what it left cannot be published to {}: {}",
                p.url(),
                crate::diag::error_chain(&e)
            )));
        }
    }
    Ok(result)
}

/// Where a unit works here: a clone of its repository, on its branch as the run published
/// it; or its directory. `Ok(Err(result))` when it cannot work there (its result says why).
async fn unit_place(
    unit: &Unit,
    opts: &WorkerOptions,
) -> Result<Result<UnitPlace, super::units::UnitResult>, UnitNotDone> {
    use super::units::{Place, UnitResult};
    let Some(place) = Place::from_json(&unit.place) else {
        return Ok(Err(UnitResult::Failed(format!(
            "unit {}: an unreadable place",
            unit.id
        ))));
    };
    let (url, branch, subdir) = match place {
        Place::Git {
            url,
            branch,
            subdir,
        } => (url, branch, subdir),
        Place::Dir(d) => return Ok(Ok((d, None))),
    };
    let hash: String =
        <sha2::Sha256 as sha2::Digest>::digest(format!("{}\n{url}\n{branch}", unit.run).as_bytes())
            [..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
    let dir = opts.state_dir.join("units").join("clones").join(hash);
    if let Err(e) = clone_into(&url, &dir).await {
        return Err(UnitNotDone::Unreachable(url, crate::diag::error_chain(&e)));
    }
    touch(&dir);
    let p = super::publish::Publisher::new(url.clone());
    match p.restore(&dir, &branch).await {
        Ok(true) => Ok(Ok((dir.join(subdir), Some(p)))),
        Ok(false) => Ok(Err(UnitResult::Failed(format!(
            "the branch {branch} is not on {url}: the run did not publish it"
        )))),
        Err(e) => Ok(Err(UnitResult::Failed(format!(
            "cannot check out {branch} from {url}: {}",
            crate::diag::error_chain(&e)
        )))),
    }
}

/// Runs a command unit's program in `cwd`, its output kept in `files`, tagged with `tag`.
async fn command_unit(
    job: &UnitJob,
    cwd: &Path,
    files: &Path,
    tag: &str,
) -> super::units::UnitResult {
    use super::units::{CommandWork, ProgramDone, UnitResult};
    let w: CommandWork = match serde_json::from_value(job.unit.payload.clone()) {
        Ok(w) => w,
        Err(e) => return UnitResult::Failed(format!("an unreadable program: {e}")),
    };
    // The run's secrets are registered (with its workflow prepared), so that its
    // program's files and its result are masked as on the run's own executor.
    if let Err(e) = prepared_run(&job.store, &job.prepared, &job.unit.run) {
        return UnitResult::Failed(e.to_string());
    }
    let mut env = w.env;
    env.push((UNIT_ENV.to_string(), tag.to_string()));
    let spec = crate::backend::process::ProcSpec {
        argv: w.argv,
        cwd: cwd.to_path_buf(),
        env,
        stdin: w.stdin.map(String::into_bytes),
        timeout: w.timeout_ms.map(Duration::from_millis),
        idle_timeout: w.idle_ms.map(Duration::from_millis),
        stdout_path: Some(files.join("stdout")),
        stderr_path: Some(files.join("stderr")),
        ..Default::default()
    };
    match crate::backend::process::run(&spec).await {
        Ok(out) => UnitResult::Program(ProgramDone::of(&out)),
        Err(crate::backend::process::SpawnError::Limit(hit)) => {
            limit_here(hit.limit, &hit.to_string())
        }
        Err(e) => UnitResult::Failed(e.message(spec.argv.first().map_or("", String::as_str))),
    }
}

/// The workflow a unit's stage is written in: the run's, or the subflow compiled with it
/// that the unit's scope names (`sub>/say#1.1@...`, `l#2/sub>/inner>/x#1.1@...`: a segment
/// ending in `>` is a subflow stage's). A subflow prepared during the run (params from
/// outputs) is not among them: its stages' agents are looked up in the nearest workflow.
fn workflow_of<'p>(prepared: &'p Prepared, key: &str) -> &'p Prepared {
    let scope = key.split('@').next().unwrap_or(key);
    let mut current = prepared;
    for stage in scope.split('/').filter_map(|seg| seg.strip_suffix('>')) {
        let written = current.plan.written_subflows(&current.sources);
        let child = written
            .iter()
            .find(|(name, _)| name == stage)
            .and_then(|(_, key)| current.subflows.ahead.iter().find(|a| &a.key == key))
            .and_then(|a| a.prepared.as_deref().ok());
        match child {
            Some(c) => current = c,
            None => break,
        }
    }
    current
}

/// Makes an agent unit's call in `cwd`, its files in `files`, tagged with `tag`: the agent
/// built from the workflow its stage is written in, with this machine's keys.
async fn agent_unit(
    job: &UnitJob,
    cwd: &Path,
    files: &Path,
    tag: &str,
) -> super::units::UnitResult {
    use super::units::{AgentWork, UnitResult};
    let w: AgentWork = match serde_json::from_value(job.unit.payload.clone()) {
        Ok(w) => w,
        Err(e) => return UnitResult::Failed(format!("an unreadable agent call: {e}")),
    };
    let prepared = match prepared_run(&job.store, &job.prepared, &job.unit.run) {
        Ok(p) => p,
        Err(e) => return UnitResult::Failed(e.to_string()),
    };
    // The agent of a subflow's stage is the subflow's own.
    let workflow = workflow_of(&prepared, &job.unit.key);
    let plan = &workflow.plan;
    let Some(agent) = plan
        .workflow
        .agents
        .iter()
        .find(|a| a.name.value == w.agent)
    else {
        return UnitResult::Failed(format!("the run's workflow has no agent `{}`", w.agent));
    };
    let cfg = match super::exec::agent_config(agent, plan, &workflow.sources) {
        Ok(c) => c,
        Err(e) => return UnitResult::Failed(e.message()),
    };
    let backend = match crate::backend::build(&cfg) {
        Ok(b) => b,
        Err(e) => {
            return UnitResult::Agent(Err(crate::backend::CallError::Missing {
                message: crate::diag::error_chain(&e),
            }));
        }
    };
    let mut call = w.into_call(cwd.to_path_buf(), files.to_path_buf());
    call.env.push((UNIT_ENV.to_string(), tag.to_string()));
    let answer = if backend.watches() {
        // What the agent does is written as the run's events from here, as the run's own
        // process writes them for a call it makes (`run::watch`).
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        call.watch = Some(tx);
        let call = &call;
        super::watch::watching_with(
            backend.call(call),
            rx,
            |step| {
                let Some((kind, message)) = step.event else {
                    return;
                };
                let event = crate::store::Event {
                    run: job.unit.run.clone(),
                    at: crate::store::now_ms(),
                    scope: call.scope.clone(),
                    node: call.stage.clone(),
                    kind: kind.to_string(),
                    message: crate::secrets::redact(&message).into_owned(),
                };
                let kept = job
                    .store
                    .borrow_mut()
                    .commit(&[crate::store::Write::Event(event)]);
                if let Err(e) = kept {
                    tracing::warn!(error = %e, "cannot keep an agent's activity");
                }
            },
            call,
        )
        .await
    } else {
        backend.call(&call).await
    };
    match answer {
        Err(crate::backend::CallError::Limit { limit, message }) => limit_here(limit, &message),
        answer => UnitResult::Agent(answer),
    }
}

/// A unit's result for a limit of this machine that its work met (`what`: what could not be
/// done, with the system's error), naming this worker: the coordinator stops the run as
/// resumable.
fn limit_here(limit: crate::backend::process::Limit, what: &str) -> super::units::UnitResult {
    super::units::UnitResult::Limit {
        limit,
        message: format!("worker {}: {what}", crate::store::holder_id()),
    }
}

/// A clone of `url` at `dir` (without a checkout), unless there is one.
async fn clone_into(url: &str, dir: &Path) -> Result<(), WorkerError> {
    if dir.join(".git").exists() {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(dir);
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| RunError::io("create", parent, e))?;
    }
    let out = tokio::process::Command::new("git")
        .args(["clone", "--quiet", "--no-checkout", "--"])
        .arg(url)
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| WorkerError::Git {
            what: format!("clone {url}"),
            said: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(WorkerError::Git {
            what: format!("clone {url} into {}", dir.display()),
            said: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_is_taken_where_its_place_is_and_not_in_a_repository_that_failed_lately() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let unreachable: Unreachable = Arc::default();
        let git = |url: &str| json!({"git": {"url": url, "branch": "b", "subdir": ""}});
        let here = format!("file://{}", tmp.path().display());
        assert!(accepts(&git(&here), &unreachable));
        assert!(!accepts(&git("file:///no/such/repository"), &unreachable));
        assert!(accepts(&git("https://git.example/r.git"), &unreachable));
        assert!(accepts(&json!({"dir": tmp.path()}), &unreachable));
        assert!(!accepts(&json!({"dir": "/no/such/dir"}), &unreachable));
        assert!(!accepts(&json!({"elsewhere": 1}), &unreachable));
        unreachable.lock().unwrap_or_else(|e| panic!("{e}")).insert(
            "https://git.example/r.git".into(),
            std::time::Instant::now(),
        );
        assert!(!accepts(&git("https://git.example/r.git"), &unreachable));
        unreachable.lock().unwrap_or_else(|e| panic!("{e}")).insert(
            here.clone(),
            std::time::Instant::now() - UNREACHABLE_FOR - Duration::from_secs(1),
        );
        assert!(accepts(&git(&here), &unreachable), "only for a while");
    }

    #[test]
    fn unit_files_unused_for_a_while_are_pruned_and_used_ones_kept() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let clones = tmp.path().join("units/clones");
        for d in ["old", "used"] {
            std::fs::create_dir_all(clones.join(d).join(".git")).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::create_dir_all(tmp.path().join("units/attempts/run1/7"))
            .unwrap_or_else(|e| panic!("{e}"));
        let past = std::time::SystemTime::now() - Duration::from_secs(3 * 24 * 3600);
        for d in [
            clones.join("old"),
            clones.join("used"),
            tmp.path().join("units/attempts/run1"),
        ] {
            std::fs::File::open(&d)
                .and_then(|f| f.set_modified(past))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        touch(&clones.join("used"));
        assert_eq!(prune_units(tmp.path(), UNIT_FILES_KEPT), 2);
        assert!(!clones.join("old").exists());
        assert!(clones.join("used").exists());
        assert!(!tmp.path().join("units/attempts/run1").exists());
        assert_eq!(prune_units(tmp.path(), UNIT_FILES_KEPT), 0);
    }
}

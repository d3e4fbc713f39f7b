//! Units of work: how one run's agent calls and programs spread over many machines.
//!
//! A run that workers carry out (`run --detach`) is coordinated by one worker, which holds
//! its lease, renders every prompt and argv, keeps the frames and commits every settlement.
//! The work itself, each agent call and each program of a command or check stage, becomes
//! a *unit* in the store that any worker whose labels suffice claims, carries out in its
//! own copy of the stage's workspace and answers (see `store::shared::UnitQueue`). So a
//! fan-out's items, a subflow's stages and single stages run wherever there is room, and a
//! stage that needs labels (an agent's CLI, a toolchain) runs only where they are.
//!
//! Where a unit works:
//! - in a git run, on the branch of the stage's workspace as the run published it (see
//!   [`super::publish`]): the claiming worker restores it in a clone of its own, runs the
//!   work, and publishes what the work left; the coordinator then restores its own copy.
//!   Units of one workspace run one at a time (each starts from what the last left);
//! - otherwise in the stage's directory, which must be on the claiming machine (the same
//!   machine, or a shared file system).
//!
//! A unit is keyed by the stage, attempt and call and a hash of what it asks for: a
//! coordinator that takes a run over and asks for the same thing adopts the unit (waits
//! for it while it runs, uses its result when done) instead of starting the work again.
//!
//! How a coordinator learns that a unit finished: the store's notifications name the unit
//! (`unit:ID:done`), and the worker's listener hands each to [`UnitWakes`], which wakes only
//! the waiter of that unit; that waiter reads only that unit. A notification can be lost
//! (sent while the listening connection was down): after a reconnection every waiter looks,
//! and each coordinator also reads all the units it waits for in one query every
//! [`SWEEP`], the safety net. Without a listener, a waiter polls its unit (every 250 ms at
//! most).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

use crate::backend::process::{Ended, ProcOutput, ProcSpec};
use crate::backend::{AgentCall, AgentReply, CallError};
use crate::store::{SharedStore, Unit, UnitRequest, UnitState};

/// How often a coordinator that listens reads all the units it waits for (one query), in
/// case a notification was lost.
pub const SWEEP: Duration = Duration::from_secs(5);

/// The waiters of each unit: (a waiter's token, its wake-up).
type Waiters = HashMap<i64, Vec<(u64, Arc<tokio::sync::Notify>)>>;

/// A sweep: when it was made, and what it read of each unit waited for then (`None`: gone).
type Sweep = (Instant, HashMap<i64, Option<Unit>>);

/// Routes the store's notifications to the coordinators waiting for the units they name
/// (one per worker process, fed by its listener; shared by the runs it coordinates).
#[derive(Debug, Default)]
pub struct UnitWakes {
    /// Who waits for which unit: (the waiter's token, its wake-up).
    waiting: Mutex<Waiters>,
    /// The next waiter's token.
    next: AtomicU64,
    /// Bumped by each reconnection of the listener (`notified(None)`).
    lost: AtomicU64,
}

/// Why a [`UnitWatch::wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woken {
    /// A notification named the unit.
    Named,
    /// The listener reconnected: notifications sent while it was away are lost, so the
    /// unit may have changed unannounced.
    Lost,
    /// The time was up (the safety net's period).
    TimeUp,
}

/// A waiter's registration for one unit's notifications; dropping it unregisters.
#[derive(Debug)]
pub struct UnitWatch {
    wakes: Arc<UnitWakes>,
    id: i64,
    token: u64,
    notify: Arc<tokio::sync::Notify>,
    /// [`UnitWakes::lost`] as this waiter last saw it.
    lost_seen: AtomicU64,
}

impl UnitWakes {
    pub fn new() -> Arc<UnitWakes> {
        Arc::new(UnitWakes::default())
    }

    /// The unit a notification's payload names for its coordinator: `unit:ID` or
    /// `unit:ID:STATE`, except `unit:ID:queued` (a unit to claim, which its coordinator
    /// does not wait on). `None` for anything else (a run's id).
    pub fn named(payload: &str) -> Option<i64> {
        let rest = payload.strip_prefix("unit:")?;
        let (id, state) = match rest.split_once(':') {
            Some((id, state)) => (id, Some(state)),
            None => (rest, None),
        };
        if state == Some("queued") {
            return None;
        }
        id.parse().ok()
    }

    /// Hands a notification on: `Some(payload)` wakes the waiters of the unit it names (if
    /// any, in this process); `None` (the listener reconnected: what was sent meanwhile is
    /// lost) wakes every waiter.
    pub fn notified(&self, payload: Option<&str>) {
        let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        match payload {
            Some(p) => {
                if let Some(list) = Self::named(p).and_then(|id| waiting.get(&id)) {
                    for (_, n) in list {
                        n.notify_one();
                    }
                }
            }
            None => {
                self.lost.fetch_add(1, Ordering::SeqCst);
                for (_, n) in waiting.values().flatten() {
                    n.notify_one();
                }
            }
        }
    }

    /// Registers a waiter for unit `id`: a notification that names it from now on wakes
    /// [`UnitWatch::wait`] (one that comes before the wait is kept for it).
    pub fn watch(self: &Arc<Self>, id: i64) -> UnitWatch {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(tokio::sync::Notify::new());
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id)
            .or_default()
            .push((token, notify.clone()));
        UnitWatch {
            wakes: self.clone(),
            id,
            token,
            notify,
            lost_seen: AtomicU64::new(self.lost.load(Ordering::SeqCst)),
        }
    }

    /// How many units have waiters now.
    pub fn watched(&self) -> usize {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl UnitWatch {
    /// Waits until a notification names the unit, notifications may have been lost, or
    /// `at_most` has passed.
    pub async fn wait(&self, at_most: Duration) -> Woken {
        let timed_out = tokio::time::timeout(at_most, self.notify.notified())
            .await
            .is_err();
        let lost = self.wakes.lost.load(Ordering::SeqCst);
        if self.lost_seen.swap(lost, Ordering::SeqCst) != lost {
            Woken::Lost
        } else if timed_out {
            Woken::TimeUp
        } else {
            Woken::Named
        }
    }

    /// The unit watched.
    pub fn id(&self) -> i64 {
        self.id
    }
}

impl Drop for UnitWatch {
    fn drop(&mut self) {
        let mut waiting = self.wakes.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = waiting.get_mut(&self.id) {
            list.retain(|(t, _)| *t != self.token);
            if list.is_empty() {
                waiting.remove(&self.id);
            }
        }
    }
}

/// The program of a command or check stage, as a unit asks for it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct CommandWork {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<String>,
    pub timeout_ms: Option<u64>,
    pub idle_ms: Option<u64>,
}

/// An agent call, as a unit asks for it: the agent by name (the worker builds its backend
/// from the run's workflow, with its own environment's keys) and the call, without its
/// directories (the worker's own). Serialized as `{"agent": ..., "stage": ..., ...}`, the
/// call's fields beside the agent's name, as stored units hold it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct AgentWork {
    pub agent: String,
    #[serde(flatten)]
    pub call: AgentCall,
}

/// What a program did, as a unit answers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct ProgramDone {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_cut: u64,
    pub stderr_cut: u64,
    pub ended: String,
    pub elapsed_ms: u64,
}

/// What came of a unit.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum UnitResult {
    Program(ProgramDone),
    Agent(Result<AgentReply, CallError>),
    /// The work could not be done there (its workspace, its program could not start).
    Failed(String),
    /// A limit of the worker's machine was reached (too many open files, a full disk, the
    /// file size limit) where it started the program or kept its files: not the stage's
    /// failure, so the coordinator stops the run as resumable, as for a limit met where it
    /// runs. `message`: what could not be done, on which worker, with the system's error.
    Limit {
        limit: crate::backend::process::Limit,
        message: String,
    },
}

impl ProgramDone {
    pub(super) fn of(out: &ProcOutput) -> ProgramDone {
        ProgramDone {
            code: out.code,
            signal: out.signal,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            stdout_cut: out.stdout_cut,
            stderr_cut: out.stderr_cut,
            ended: match out.ended {
                Ended::Exited => "exited",
                Ended::Timeout => "timeout",
                Ended::Idle => "idle",
                Ended::AfterResult => "after_result",
            }
            .into(),
            elapsed_ms: out.elapsed.as_millis().try_into().unwrap_or(u64::MAX),
        }
    }

    pub(super) fn output(self) -> ProcOutput {
        ProcOutput {
            code: self.code,
            signal: self.signal,
            stdout: self.stdout.into_bytes(),
            stderr: self.stderr.into_bytes(),
            stdout_cut: self.stdout_cut,
            stderr_cut: self.stderr_cut,
            ended: match self.ended.as_str() {
                "timeout" => Ended::Timeout,
                "idle" => Ended::Idle,
                "after_result" => Ended::AfterResult,
                _ => Ended::Exited,
            },
            elapsed: Duration::from_millis(self.elapsed_ms),
        }
    }
}

impl CommandWork {
    pub(super) fn of(spec: &ProcSpec) -> CommandWork {
        CommandWork {
            argv: spec.argv.clone(),
            env: spec.env.clone(),
            stdin: spec
                .stdin
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned()),
            timeout_ms: spec.timeout.map(ms),
            idle_ms: spec.idle_timeout.map(ms),
        }
    }
}

impl AgentWork {
    pub(super) fn of(agent: &str, call: &AgentCall) -> AgentWork {
        AgentWork {
            agent: agent.to_string(),
            call: call.clone(),
        }
    }

    /// The call, made in `cwd` with its files in `dir`.
    pub(super) fn into_call(self, cwd: PathBuf, dir: PathBuf) -> AgentCall {
        AgentCall {
            cwd,
            dir,
            ..self.call
        }
    }
}

/// Whether a repository URL can be reached from this machine, as far as can be told
/// without the network: a `file://` URL or a path must exist here.
pub(super) fn repository_here(url: &str) -> bool {
    if let Some(path) = url.strip_prefix("file://") {
        return Path::new(path).exists();
    }
    if url.starts_with('/') {
        return Path::new(url).exists();
    }
    true
}

fn ms(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

/// Where a unit works.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// A branch of a git repository, and the directory below its top.
    Git {
        url: String,
        branch: String,
        subdir: String,
    },
    /// A directory (on the claiming machine).
    Dir(PathBuf),
}

impl Place {
    pub(super) fn to_json(&self) -> Json {
        match self {
            Place::Git {
                url,
                branch,
                subdir,
            } => json!({"git": {"url": url, "branch": branch, "subdir": subdir}}),
            Place::Dir(d) => json!({"dir": d.to_string_lossy()}),
        }
    }

    pub(super) fn from_json(j: &Json) -> Option<Place> {
        if let Some(g) = j.get("git") {
            return Some(Place::Git {
                url: g.get("url")?.as_str()?.to_string(),
                branch: g.get("branch")?.as_str()?.to_string(),
                subdir: g.get("subdir")?.as_str()?.to_string(),
            });
        }
        Some(Place::Dir(PathBuf::from(j.get("dir")?.as_str()?)))
    }

    /// Whether a worker on this machine can work there: a directory that is here, or a
    /// repository it can reach (one on the file system must be here; a network one is
    /// assumed reachable, and a failed clone fails the unit).
    pub(super) fn reachable(&self) -> bool {
        match self {
            Place::Git { url, .. } => repository_here(url),
            Place::Dir(d) => d.is_dir(),
        }
    }
}

/// How one coordinator waits for its units: with [`UnitWakes`] (a worker's listener), each
/// waiter reads its unit once at once, then again only when a notification names it; when
/// notifications may have been lost (the listener reconnected) or every `sweep` in any case,
/// it takes its unit from a sweep, one read of all the units the coordinator waits for
/// (made at most once per half `sweep`). Without a listener, each waiter polls its unit,
/// every 5 ms at first, then less often, every 250 ms at most.
pub struct UnitWaits {
    wakes: Option<Arc<UnitWakes>>,
    sweep: Duration,
    /// The units waited for now, which a sweep reads.
    waiting: RefCell<BTreeSet<i64>>,
    /// The last sweep: when, and what it read of each unit waited for then (`None`: gone).
    swept: RefCell<Option<Sweep>>,
    reads: std::cell::Cell<WaitReads>,
}

/// What a coordinator's waits read so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitReads {
    /// Reads of one unit (after a notification that named it, or a poll).
    pub units: u64,
    /// Sweeps: reads of all the units waited for, in one query.
    pub sweeps: u64,
}

/// Takes a unit out of the waits' set when its waiter is done.
struct Waiting<'a>(&'a UnitWaits, i64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.borrow_mut().remove(&self.1);
    }
}

impl UnitWaits {
    /// Waits woken by `wakes` (with a sweep every `sweep`), or polling without.
    pub fn new(wakes: Option<Arc<UnitWakes>>, sweep: Duration) -> UnitWaits {
        UnitWaits {
            wakes,
            sweep,
            waiting: RefCell::default(),
            swept: RefCell::default(),
            reads: std::cell::Cell::default(),
        }
    }

    /// What the waits have read so far.
    pub fn reads(&self) -> WaitReads {
        self.reads.get()
    }

    /// Waits until unit `id` is done or cancelled (returned as then read), or gone from the
    /// store (`None`). `store` is borrowed only while it reads.
    pub async fn settled(
        &self,
        store: &RefCell<Box<dyn SharedStore>>,
        id: i64,
    ) -> Result<Option<Unit>, crate::store::StoreError> {
        // Registered before the first read: a notification that comes after it is kept for
        // this waiter, and what came before it is read.
        let watch = self.wakes.as_ref().map(|w| w.watch(id));
        self.waiting.borrow_mut().insert(id);
        let _waiting = Waiting(self, id);
        let mut delay = Duration::from_millis(5);
        let mut woken = Woken::Named;
        let mut first = true;
        loop {
            match &watch {
                Some(w) if !first => woken = w.wait(self.sweep).await,
                Some(_) => {}
                None => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(250));
                }
            }
            first = false;
            let unit = match woken {
                Woken::Named => {
                    let mut r = self.reads.get();
                    r.units += 1;
                    self.reads.set(r);
                    store.borrow().unit(id)?
                }
                Woken::Lost | Woken::TimeUp => self.swept(store, id)?,
            };
            match unit {
                None => return Ok(None),
                Some(u) if matches!(u.state, UnitState::Done | UnitState::Cancelled) => {
                    return Ok(Some(u));
                }
                Some(_) => {}
            }
        }
    }

    /// Unit `id` as a sweep read it: the last one, if it read this unit less than half a
    /// sweep ago; else a new one (one read of every unit waited for).
    fn swept(
        &self,
        store: &RefCell<Box<dyn SharedStore>>,
        id: i64,
    ) -> Result<Option<Unit>, crate::store::StoreError> {
        let mut swept = self.swept.borrow_mut();
        let fresh = swept
            .as_ref()
            .is_some_and(|(at, got)| at.elapsed() < self.sweep / 2 && got.contains_key(&id));
        if !fresh {
            let ids: Vec<i64> = self.waiting.borrow().iter().copied().collect();
            let mut got: HashMap<i64, Option<Unit>> = ids.iter().map(|i| (*i, None)).collect();
            for u in store.borrow().units(&ids)? {
                got.insert(u.id, Some(u));
            }
            let mut r = self.reads.get();
            r.sweeps += 1;
            self.reads.set(r);
            *swept = Some((Instant::now(), got));
        }
        Ok(swept
            .as_ref()
            .and_then(|(_, got)| got.get(&id).cloned().flatten()))
    }
}

/// A unit of work a stage asks for ([`Units::work`]).
pub(crate) struct UnitAsk<'a> {
    /// Where the run's git workspaces are published, in a git run.
    pub publisher: Option<&'a super::publish::Publisher>,
    /// Where the work is done.
    pub cwd: &'a Path,
    /// The stage (`SCOPE/STAGE#`).
    pub stage_key: &'a str,
    /// The call within it (`ATTEMPT.CALL`).
    pub call_key: &'a str,
    /// `agent` or `command`.
    pub kind: &'a str,
    /// What to do ([`AgentWork`], [`CommandWork`]).
    pub payload: Json,
    /// What the stage needs besides the run's labels.
    pub labels: &'a [String],
    /// The run's resource the unit holds while it runs, with its capacity.
    pub hold: Option<(&'a str, i64)>,
}

/// Why a unit of work gave no result.
#[derive(Debug, thiserror::Error)]
pub(super) enum UnitError {
    #[error("cannot publish the workspace {} for another machine: {why}", workspace.display())]
    Publish { workspace: PathBuf, why: String },
    /// The store failed (said as its whole chain, as the stage's error shows it).
    #[error("{}", crate::diag::error_chain(.0))]
    Store(#[from] crate::store::StoreError),
    #[error("unit {0} vanished from the store")]
    Vanished(i64),
    #[error("cannot bring {} up to what another machine left: {why}", workspace.display())]
    Restore { workspace: PathBuf, why: String },
    #[error("unit {id}: an unreadable result: {source}")]
    Unreadable { id: i64, source: serde_json::Error },
}

/// The coordinator's side: dispatches units and waits for their results.
pub(crate) struct Units {
    /// A handle on the executor's connection ([`SharedStore::handle`]).
    store: RefCell<Box<dyn SharedStore>>,
    run: String,
    /// The coordinator's lease holder id: only it may ask for units of the run.
    holder: String,
    /// The labels every unit of the run needs (the run's own).
    labels: Vec<String>,
    /// One unit at a time per git workspace (by its top).
    turns: RefCell<HashMap<PathBuf, std::sync::Arc<tokio::sync::Mutex<()>>>>,
    /// Calls made so far per stage attempt (their keys).
    calls: RefCell<HashMap<String, u32>>,
    /// How it waits for its units: woken by the notifications that name them (a worker's
    /// listener), or polling.
    waits: UnitWaits,
    /// Whether the run is interrupted (Ctrl-C, a worker told to stop that hands its runs
    /// back): then the units under way are left to run, for the next coordinator to adopt.
    interrupted: tokio::sync::watch::Receiver<bool>,
}

/// Cancels a unit whose waiter went away (a timeout, an exit taken, a sibling that failed
/// a fan-out), unless the run is interrupted: a unit under way on another worker is then
/// left to finish, and the coordinator that resumes the run adopts it (its result is used,
/// it does not start again).
struct CancelOnDrop<'a> {
    units: &'a Units,
    id: Option<i64>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if *self.units.interrupted.borrow() {
            return;
        }
        if let Some(id) = self.id {
            let cancelled = self
                .units
                .store
                .borrow_mut()
                .cancel_unit(id, &self.units.holder);
            if let Err(e) = cancelled {
                tracing::warn!("cannot cancel unit {id}: {}", crate::diag::error_chain(&e));
            }
        }
    }
}

impl Units {
    /// Units of `run` through `store` (a handle on the executor's connection).
    pub(super) fn new(
        store: Box<dyn SharedStore>,
        run: &str,
        holder: &str,
        labels: Vec<String>,
        wake: Option<Arc<UnitWakes>>,
        interrupted: tokio::sync::watch::Receiver<bool>,
    ) -> Units {
        Units {
            store: RefCell::new(store),
            run: run.to_string(),
            holder: holder.to_string(),
            labels,
            turns: RefCell::default(),
            calls: RefCell::default(),
            waits: UnitWaits::new(wake, SWEEP),
            interrupted,
        }
    }

    /// Withdraws every unit of the run that has not finished (the run was cancelled):
    /// queued ones are cancelled, and the workers that run the others stop them when they
    /// next renew their lease.
    pub(super) fn cancel_all(&self) {
        if let Err(e) = self
            .store
            .borrow_mut()
            .cancel_units(&self.run, &self.holder)
        {
            tracing::warn!(
                "cannot cancel the units of run {}: {}",
                self.run,
                crate::diag::error_chain(&e)
            );
        }
    }

    /// Waits for the turn of the git workspace `cwd` is in (none outside git, or without a
    /// publisher): a unit there, or a program the coordinator runs there itself, works
    /// alone, since the workspace is brought up to what each unit left.
    pub(super) async fn turn(
        &self,
        publisher: Option<&super::publish::Publisher>,
        cwd: &Path,
    ) -> (Option<PathBuf>, Option<tokio::sync::OwnedMutexGuard<()>>) {
        let top = match publisher {
            Some(p) => p.top(cwd).await,
            None => None,
        };
        let turn = top.as_ref().map(|t| {
            self.turns
                .borrow_mut()
                .entry(t.clone())
                .or_default()
                .clone()
        });
        let guard = match turn {
            Some(t) => Some(t.lock_owned().await),
            None => None,
        };
        (top, guard)
    }

    /// The next call's number in a stage's attempt.
    pub(super) fn next_call(&self, attempt_key: &str) -> u32 {
        let mut calls = self.calls.borrow_mut();
        let n = calls.entry(attempt_key.to_string()).or_insert(0);
        *n += 1;
        *n
    }

    /// Has a unit of work done where `ask.cwd` is and returns its result.
    pub(super) async fn work(&self, ask: UnitAsk<'_>) -> Result<UnitResult, UnitError> {
        let UnitAsk {
            publisher,
            cwd,
            stage_key,
            call_key,
            kind,
            payload,
            labels,
            hold,
        } = ask;
        // One unit at a time per git workspace: each starts from what the last left.
        let (top, _turn) = self.turn(publisher, cwd).await;
        // Where: the workspace's branch as published now, or the directory.
        let place = match (publisher, &top) {
            (Some(p), Some(_)) => match p.publish(cwd).await {
                Ok(Some((top, branch))) => Place::Git {
                    url: p.url().to_string(),
                    branch,
                    subdir: cwd
                        .strip_prefix(&top)
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                },
                Ok(None) => Place::Dir(cwd.to_path_buf()),
                Err(e) => {
                    return Err(UnitError::Publish {
                        workspace: cwd.to_path_buf(),
                        why: crate::diag::error_chain(&e),
                    });
                }
            },
            _ => Place::Dir(cwd.to_path_buf()),
        };
        let place = place.to_json();
        let mut labels: Vec<String> = self.labels.iter().chain(labels).cloned().collect();
        labels.sort();
        labels.dedup();
        let mut h = Sha256::new();
        h.update(kind.as_bytes());
        h.update(payload.to_string().as_bytes());
        h.update(place.to_string().as_bytes());
        let hash: String = h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let key = format!("{stage_key}{call_key}@{hash}");
        let request = UnitRequest {
            coordinator: &self.holder,
            run: &self.run,
            key: &key,
            stage_prefix: stage_key,
            kind,
            payload: &payload,
            labels: &labels,
            place: &place,
            hold,
        };
        let dispatch = || self.store.borrow_mut().dispatch(&request);
        let id = dispatch()?;
        let mut guard = CancelOnDrop {
            units: self,
            id: Some(id),
        };
        let mut again = Duration::from_millis(5);
        let result = loop {
            let unit = self.waits.settled(&self.store, id).await?;
            let Some(unit) = unit else {
                guard.id = None;
                return Err(UnitError::Vanished(id));
            };
            match unit.state {
                UnitState::Done => break unit.result.unwrap_or(Json::Null),
                // Cancelled by an earlier coordinator of the run that stopped (its holder
                // may still be stopping it): asked for again, it is queued once stopped.
                UnitState::Cancelled => {
                    tokio::time::sleep(again).await;
                    again = (again * 2).min(Duration::from_millis(250));
                    dispatch()?;
                }
                UnitState::Queued | UnitState::Running => {}
            }
        };
        guard.id = None;
        if let Err(e) = self.store.borrow_mut().forget_unit(id, &self.holder) {
            tracing::warn!("cannot forget unit {id}: {}", crate::diag::error_chain(&e));
        }
        // The coordinator's copy of the workspace: what the unit left.
        if let (Some(p), Some(top), Place::Git { branch, .. }) = (
            publisher,
            top,
            Place::from_json(&place).unwrap_or(Place::Dir(PathBuf::new())),
        ) {
            p.restore(&top, &branch)
                .await
                .map_err(|e| UnitError::Restore {
                    workspace: top.clone(),
                    why: crate::diag::error_chain(&e),
                })?;
        }
        serde_json::from_value(result).map_err(|source| UnitError::Unreadable { id, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each payload the store sends names for a coordinator: a result (`unit:ID:done`,
    /// and `unit:ID` as stores before named units sent it), not a unit to claim, not a run.
    #[test]
    fn a_payload_names_a_unit_for_its_coordinator_only_when_its_result_may_be_there() {
        assert_eq!(UnitWakes::named("unit:42:done"), Some(42));
        assert_eq!(UnitWakes::named("unit:42"), Some(42));
        assert_eq!(UnitWakes::named("unit:42:queued"), None);
        assert_eq!(UnitWakes::named("20261127-abc"), None);
        assert_eq!(UnitWakes::named("unit:x:done"), None);
        assert_eq!(UnitWakes::named(""), None);
    }

    /// A notification wakes the waiters of the unit it names and no other; one that comes
    /// before the wait is kept for it; a reconnection wakes every waiter as `Lost`; a
    /// dropped watch is no longer in the map.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_notification_wakes_only_the_waiters_of_its_unit() {
        let wakes = UnitWakes::new();
        let (one, two, also_one) = (wakes.watch(1), wakes.watch(2), wakes.watch(1));
        assert_eq!(wakes.watched(), 2);
        wakes.notified(Some("unit:1:done"));
        wakes.notified(Some("unit:2:queued"));
        wakes.notified(Some("some-run"));
        let at_most = Duration::from_secs(5);
        assert_eq!(one.wait(at_most).await, Woken::Named);
        assert_eq!(also_one.wait(at_most).await, Woken::Named);
        let t = tokio::time::Instant::now();
        assert_eq!(two.wait(at_most).await, Woken::TimeUp);
        assert_eq!(t.elapsed(), at_most);
        wakes.notified(None);
        for w in [&one, &two, &also_one] {
            assert_eq!(w.wait(at_most).await, Woken::Lost);
        }
        drop(two);
        assert_eq!(wakes.watched(), 1);
        drop((one, also_one));
        assert_eq!(wakes.watched(), 0);
    }

    /// An agent unit's payload as stored since units exist (each field of the call beside
    /// the agent's name, in this order): rows written before `AgentWork` held the call itself
    /// still read, and a call is written the same way, byte for byte (the unit's key hashes
    /// it, so a coordinator that takes a run over adopts what its predecessor asked for).
    #[test]
    fn an_agent_units_payload_keeps_its_stored_format() {
        let stored = json!({
            "agent": "coder", "stage": "fix", "scope": "items#2", "attempt": 3,
            "prompt": "do it", "model": "m", "args": ["--x"], "env": [["K", "v"]],
            "timeout_ms": 60000, "idle_ms": null, "schema": {"type": "object"},
            "max_tokens": 100
        });
        let w: AgentWork = serde_json::from_value(stored.clone()).expect("an old row reads");
        let call = w
            .clone()
            .into_call(PathBuf::from("/cwd"), PathBuf::from("/files"));
        assert_eq!(call.stage, "fix");
        assert_eq!(call.attempt, 3);
        assert_eq!(call.timeout, Some(Duration::from_secs(60)));
        assert_eq!(call.idle_timeout, None);
        assert_eq!(call.env, vec![("K".to_string(), "v".to_string())]);
        assert_eq!(
            (call.cwd.as_path(), call.dir.as_path()),
            (Path::new("/cwd"), Path::new("/files"))
        );
        let written = serde_json::to_value(AgentWork::of("coder", &call)).expect("writes");
        assert_eq!(written, stored);
        assert_eq!(written.to_string(), stored.to_string(), "the same order");
    }
}

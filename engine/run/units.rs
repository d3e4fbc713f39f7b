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

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

use crate::backend::process::{Ended, ProcOutput, ProcSpec};
use crate::backend::{AgentCall, AgentReply, CallError};
use crate::store::{SharedStore, UnitRequest, UnitState};

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
    /// Woken by the store's notifications (a unit done), besides the polling.
    wake: Option<std::sync::Arc<tokio::sync::Notify>>,
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
        wake: Option<std::sync::Arc<tokio::sync::Notify>>,
        interrupted: tokio::sync::watch::Receiver<bool>,
    ) -> Units {
        Units {
            store: RefCell::new(store),
            run: run.to_string(),
            holder: holder.to_string(),
            labels,
            turns: RefCell::default(),
            calls: RefCell::default(),
            wake,
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
        let mut delay = Duration::from_millis(5);
        let result = loop {
            match &self.wake {
                Some(w) => {
                    tokio::select! {
                        () = w.notified() => {}
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                None => tokio::time::sleep(delay).await,
            }
            delay = (delay * 2).min(Duration::from_millis(250));
            let unit = self.store.borrow().unit(id)?;
            let Some(unit) = unit else {
                guard.id = None;
                return Err(UnitError::Vanished(id));
            };
            match unit.state {
                UnitState::Done => break unit.result.unwrap_or(Json::Null),
                // Cancelled by an earlier coordinator of the run that stopped (its holder
                // may still be stopping it): asked for again, it is queued once stopped.
                UnitState::Cancelled => {
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

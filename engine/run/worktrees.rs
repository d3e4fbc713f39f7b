//! The git worktrees of a run, a loop or a for_each item.
//!
//! A worktree a run keeps (its `cleanup` says so, or the run stopped) stays under
//! `STATE_DIR/worktrees/RUN/`, with its branch checked out. A later run that needs that branch
//! takes the worktree over (see [`super::worktree::Claim`]): only one in this state directory,
//! made by another run that is not running and will not go on by itself (finished, failed
//! or stopped: its lock is free or its holder dead, and it is neither queued for a worker nor
//! waiting on a gate, after whose answer it would work there again), and holding no
//! uncommitted change but those its run recorded leaving there (`@left:PATH`, written when it
//! keeps a worktree). Anything else is left alone, and the stage fails saying why and what
//! to do.

use std::path::{Path, PathBuf};

use minijinja::Value;
use serde_json::{Value as Json, json};

use super::RunEnd;
use super::context::*;
use super::error::WorktreeError;
use super::exec::*;
use super::frame::*;
use super::worktree::{Claim, Leftover};
use crate::compile::NodeId;
use crate::model::Cleanup;
use crate::store::RunStatus;

impl Exec<'_> {
    pub(super) async fn enter_worktree(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        scope: &str,
    ) -> Result<PathBuf, StageError> {
        let ctx = self.context(frame, &[]);
        self.make_worktree(n, scope, &ctx).await
    }

    pub(super) async fn enter_worktree_item(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        scope: &str,
        var: &str,
        item: &Json,
        index: usize,
    ) -> Result<PathBuf, StageError> {
        let ctx = self.context(
            frame,
            &[(var, to_value(item)), ("index", Value::from(index))],
        );
        self.make_worktree(n, scope, &ctx).await
    }

    pub(super) async fn make_worktree(
        &self,
        n: NodeId,
        scope: &str,
        ctx: &Value,
    ) -> Result<PathBuf, StageError> {
        let name = &self.plan.node(n).name;
        let branch = self.render(&format!("{name}/worktree/branch"), ctx)?;
        let base = if self.has_template(&format!("{name}/worktree/base")) {
            self.render(&format!("{name}/worktree/base"), ctx)?
        } else {
            "HEAD".to_string()
        };
        let full = if self.prefix.is_empty() {
            scope.to_string()
        } else {
            format!("{}/{scope}", self.prefix)
        };
        let path = self.worktree_path(&full.split('/').map(sanitize).collect::<Vec<_>>().join("/"));
        self.ensure_worktree(scope, name, &path, branch.trim(), base.trim())
            .await
            .map_err(|source| StageError::Worktree {
                stage: name.clone(),
                source,
            })?;
        // A run on workers: the branch as the last machine that worked on it left it.
        if let Some(p) = &self.shared.publisher {
            p.restore(&path, branch.trim())
                .await
                .map_err(|source| StageError::Publish {
                    stage: name.clone(),
                    source,
                })?;
        }
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
    pub(super) fn worktree_path(&self, rel: &str) -> PathBuf {
        self.shared
            .opts
            .state_dir
            .join("worktrees")
            .join(&self.shared.run.id)
            .join(rel)
    }

    /// Makes the run's own worktree (`worktree` at the top of the workflow), if it has one:
    /// `STATE_DIR/worktrees/RUN/@run`, on its branch; a resume finds it again.
    pub(super) async fn enter_run_worktree(&self) -> Result<Option<PathBuf>, RunError> {
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
        self.ensure_worktree("", "", &path, branch.trim(), base.trim())
            .await
            .map_err(RunError::RunWorktree)?;
        if let Some(p) = &self.shared.publisher {
            p.restore(&path, branch.trim()).await.map_err(|source| {
                RunError::Halted(super::error::Halt::Publish {
                    path: path.clone(),
                    url: p.url().to_string(),
                    source,
                })
            })?;
        }
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
    pub(super) async fn leave_run_worktree(&self, path: &Path, end: &RunEnd) {
        let RunEnd::Exit { code, .. } = end else {
            return;
        };
        let cleanup = self
            .plan
            .workflow
            .worktree
            .as_ref()
            .and_then(|w| w.cleanup.as_ref())
            .map(|c| c.value)
            .unwrap_or_default();
        self.leave(path, cleanup, *code == 0).await;
    }

    pub(super) async fn leave_worktree(&self, frame: &Frame<'_>, n: NodeId, cwd: &Path, ok: bool) {
        if cwd != frame.cwd {
            self.leave_worktree_at(n, cwd, ok).await;
        }
    }

    pub(super) async fn leave_worktree_at(&self, n: NodeId, path: &Path, ok: bool) {
        let Some(w) = self.plan.stage(n).body.worktree() else {
            return;
        };
        let cleanup = w.cleanup.as_ref().map(|c| c.value).unwrap_or_default();
        self.leave(path, cleanup, ok).await;
    }

    /// Makes sure the worktree at `path` exists on `branch` (from `base`), taking over one an
    /// earlier run left on that branch when this run's claim lets it, and saying so.
    async fn ensure_worktree(
        &self,
        scope: &str,
        node: &str,
        path: &Path,
        branch: &str,
        base: &str,
    ) -> Result<(), WorktreeError> {
        let taken =
            super::worktree::ensure(&self.shared.opts.cwd, path, branch, base, self).await?;
        if let Some((from, leftover)) = taken {
            self.took_over(scope, node, &from, &leftover, path, branch);
        }
        Ok(())
    }

    /// Leaves a worktree as its `cleanup` says, given whether its loop, item or run
    /// succeeded: removes it (a failure is noted, not fatal), or keeps it and records what it
    /// holds.
    async fn leave(&self, path: &Path, cleanup: Cleanup, ok: bool) {
        let remove = match cleanup {
            Cleanup::Always => true,
            Cleanup::Never => false,
            Cleanup::OnSuccess => ok,
        };
        if !remove {
            self.record_left(path).await;
        } else if let Err(e) = super::worktree::remove(&self.shared.opts.cwd, path).await {
            self.shared.progress.note(&format!(
                "! could not remove {}: {}",
                path.display(),
                crate::diag::error_chain(&e)
            ));
        }
    }

    /// Records what a worktree this run keeps holds as it leaves it (`@left:REL`, REL its
    /// path under the run's worktrees): a later run may take it over with the uncommitted
    /// changes it holds now, and with no others.
    async fn record_left(&self, path: &Path) {
        let Ok(rel) = path.strip_prefix(self.worktree_path("")) else {
            return;
        };
        if !path.join(".git").exists() {
            return;
        }
        match super::worktree::state(path).await {
            Ok(st) => self.record_decision(
                "",
                &format!("@left:{}", rel.to_string_lossy()),
                json!({ "digest": st.digest }),
            ),
            Err(e) => self.shared.progress.note(&format!(
                "! could not record what {} holds (a later run takes it over only when it \
                 is clean): {}",
                path.display(),
                crate::diag::error_chain(&e)
            )),
        }
    }

    /// Says that the worktree an earlier run left at `from` was moved to `to`, and removes
    /// the directories it leaves empty in that run's worktrees.
    fn took_over(
        &self,
        scope: &str,
        node: &str,
        from: &Path,
        leftover: &Leftover,
        to: &Path,
        branch: &str,
    ) {
        let text = format!(
            "took over the worktree of {branch} that run {} left at {}: it is now {}",
            leftover.run,
            from.display(),
            to.display()
        );
        self.shared.progress.note(&format!("⎇ {text}"));
        self.shared.event(scope, node, "worktree", text);
        let root = canonical(&self.shared.opts.state_dir.join("worktrees"));
        let mut dir = from.parent().map(canonical);
        while let Some(d) = dir {
            if !d.starts_with(&root) || d == root || std::fs::remove_dir(&d).is_err() {
                break;
            }
            dir = d.parent().map(Path::to_path_buf);
        }
    }
}

/// A path with its symbolic links resolved, else as it is made absolute.
fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

impl Claim for Exec<'_> {
    /// A worktree may be taken when it lies in this state directory's `worktrees/RUN/`, RUN
    /// being another run of this store that is not running and will not go on by itself:
    /// neither queued for a worker nor waiting on a gate (answered, it goes on in its
    /// worktrees), and its lock free or lapsed (its lease expired, or its holder is provably
    /// gone: `LockOwner::lapsed`, as for taking the run over).
    fn leftover(&self, path: &Path) -> Result<Leftover, String> {
        let root = self.shared.opts.state_dir.join("worktrees");
        let shown = path.display();
        let outside = || {
            format!(
                "it is outside ralph-flow's worktrees ({}), so not one ralph-flow made; check \
                 out another branch there or remove it (`git worktree remove {shown}`), then \
                 run again",
                root.display()
            )
        };
        let canon = canonical(path);
        let rel = canon
            .strip_prefix(canonical(&root))
            .map_err(|_| outside())?;
        let mut parts = rel.components();
        let run = parts
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .ok_or_else(outside)?;
        let inner = parts.as_path().to_string_lossy().into_owned();
        if inner.is_empty() {
            return Err(outside());
        }
        if run == self.shared.run.id {
            return Err(
                "this run works in it already (two worktrees of one run cannot share a branch: \
                 give each its own `branch`)"
                    .to_string(),
            );
        }
        let unreadable = |e: crate::store::StoreError| {
            format!(
                "the store cannot say whether run `{run}`, which made it, is running: {}",
                crate::diag::error_chain(&e)
            )
        };
        let store = self.shared.store.borrow();
        let record = store.run(&run).map_err(unreadable)?.ok_or_else(|| {
            format!(
                "run `{run}`, which made it, is not in this store; remove it (`git worktree \
                 remove {shown}`) once nothing in it is needed, then run again"
            )
        })?;
        match record.status {
            RunStatus::Queued => {
                return Err(format!(
                    "run `{run}`, which made it, is queued for a worker that will work in it"
                ));
            }
            RunStatus::Waiting => {
                return Err(format!(
                    "run `{run}`, which made it, waits on a gate and works in it again once the \
                     gate is answered; answer it (`ralph-flow status {run}` names it) and let \
                     the run end, or remove the worktree (`git worktree remove {shown}`) once \
                     nothing in it is needed, then run again"
                ));
            }
            _ => {}
        }
        if let Some(holder) = store.lock_holder(&run).map_err(unreadable)? {
            if !holder.lapsed(&crate::store::host_name(), super::now_ms()) {
                return Err(format!(
                    "run `{run}`, which made it, is running (pid {} on {}); wait for it to end \
                     or stop it, then run again",
                    holder.pid, holder.host
                ));
            }
        }
        let left = store
            .output(&run, "", &format!("@left:{inner}"))
            .map_err(unreadable)?
            .and_then(|v| v.get("digest").and_then(Json::as_str).map(str::to_string));
        Ok(Leftover {
            run,
            resumable: record.status != RunStatus::Finished,
            left,
        })
    }
}

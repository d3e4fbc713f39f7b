//! The git worktrees of a run, a loop or a for_each item.

use std::path::{Path, PathBuf};

use minijinja::Value;
use serde_json::{Value as Json, json};

use super::RunEnd;
use super::context::*;
use super::exec::*;
use super::frame::*;
use crate::check::StageId as NodeId;
use crate::model::Cleanup;

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
        super::worktree::ensure(&self.shared.opts.cwd, &path, branch.trim(), base.trim())
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
        super::worktree::ensure(&self.shared.opts.cwd, &path, branch.trim(), base.trim())
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
        let remove = match cleanup {
            Cleanup::Always => true,
            Cleanup::Never => false,
            Cleanup::OnSuccess => *code == 0,
        };
        if remove {
            if let Err(e) = super::worktree::remove(&self.shared.opts.cwd, path).await {
                self.shared.progress.note(&format!(
                    "! could not remove {}: {}",
                    path.display(),
                    crate::diag::error_chain(&e)
                ));
            }
        }
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
        let remove = match cleanup {
            Cleanup::Always => true,
            Cleanup::Never => false,
            Cleanup::OnSuccess => ok,
        };
        if remove {
            if let Err(e) = super::worktree::remove(&self.shared.opts.cwd, path).await {
                self.shared.progress.note(&format!(
                    "! could not remove {}: {}",
                    path.display(),
                    crate::diag::error_chain(&e)
                ));
            }
        }
    }
}

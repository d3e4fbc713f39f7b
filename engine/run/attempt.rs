//! What every leaf stage does: its attempts (artifact directory, record), and how it settles
//! (routes, feedback).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use minijinja::Value;
use serde_json::Value as Json;

use super::context::*;
use super::exec::*;
use super::frame::*;
use super::now_ms;
use crate::backend::Usage;
use crate::compile::NodeId;
use crate::compile::Target;
use crate::store::{AttemptRecord, AttemptState, NodeState, Write};

/// Which attempt a record is about: stage, scope, number, artifact directory, start.
pub(super) struct AttemptAt<'a> {
    pub node: NodeId,
    pub scope: &'a str,
    pub stage: &'a str,
    pub attempt: u32,
    pub dir: PathBuf,
    /// When this attempt started.
    pub started: i64,
    /// When the stage's first attempt started.
    pub stage_started: i64,
}

/// The most bytes of a command's stdout or stderr kept in its output (the files keep all).
pub(super) const MAX_STREAM_IN_OUTPUT: usize = 256 * 1024;

/// The most bytes of feedback handed to the next iteration.
pub(super) const MAX_FEEDBACK: usize = 16 * 1024;

pub(super) use crate::text::{tail, text_of};

impl Exec<'_> {
    /// Starts an attempt: its artifact directory, and the template context with `attempt`
    /// and `run.stage_dir`.
    pub(super) fn begin_attempt<'a>(
        &'a self,
        frame: &Frame<'_>,
        n: NodeId,
        scope: &'a str,
        attempt: u32,
        stage_started: i64,
    ) -> Result<(AttemptAt<'a>, Value), Arc<IoFailure>> {
        let stage = self.plan.node(n).name.as_str();
        if let Some(m) = self.shared.artifacts.failure() {
            return Err(m);
        }
        let dir = self.attempt_dir(scope, stage, attempt);
        let ctx = self.context(
            frame,
            &[
                ("attempt", Value::from(attempt)),
                ("stage_dir", Value::from(dir.to_string_lossy().into_owned())),
            ],
        );
        let at = AttemptAt {
            node: n,
            scope,
            stage,
            attempt,
            dir,
            started: now_ms(),
            stage_started,
        };
        Ok((at, ctx))
    }

    /// The artifact directory of an attempt (`RUN_DIR/SCOPE.../STAGE/attempt-N`); it is made
    /// by [`Self::ready_to_start`] when a program or an agent writes in it.
    pub(super) fn attempt_dir(&self, scope: &str, stage: &str, attempt: u32) -> PathBuf {
        let mut dir = PathBuf::from(&self.shared.run.dir);
        for part in scope.split('/').filter(|p| !p.is_empty()) {
            dir.push(sanitize(part));
        }
        dir.push(sanitize(stage));
        dir.push(format!("attempt-{attempt}"));
        dir
    }

    /// Before a program or an agent starts: the attempt's directory made when it will write
    /// there (`dir`), and every record so far on disk (a program may read them). When either
    /// cannot be written the run stops as on a store failure, and this returns `false`.
    pub(super) fn ready_to_start(&self, dir: Option<&Path>) -> bool {
        if let Some(dir) = dir {
            if let Err(e) = std::fs::create_dir_all(dir) {
                self.shared
                    .io_failed(std::sync::Arc::new(IoFailure::new("create", dir, e)));
                return false;
            }
        }
        self.shared.artifacts.hand_over();
        match self.shared.artifacts.failure() {
            Some(m) => {
                self.shared.io_failed(m);
                false
            }
            None => true,
        }
    }

    /// Queues an artifact of an attempt, a record of the run's `artifacts.jsonl` (its secrets
    /// are masked when it is written; `ralph-flow export` writes it as `DIR/NAME`).
    pub(super) fn artifact(&self, dir: &Path, name: &str, text: &str) {
        self.shared.artifacts.file(&dir.join(name), text);
    }

    pub(super) fn attempt_record(
        &self,
        at: &AttemptAt<'_>,
        state: AttemptState,
        agent: Option<&str>,
        error: Option<String>,
        usage: &Usage,
    ) {
        self.shared.write(Write::Attempt(AttemptRecord {
            run: self.shared.run.id.clone(),
            scope: at.scope.to_string(),
            node: at.stage.to_string(),
            attempt: at.attempt,
            state,
            agent: agent.map(str::to_string),
            dir: at.dir.to_string_lossy().into_owned(),
            error,
            usage: usage.clone(),
            started_at: at.started,
            finished_at: (state != AttemptState::Running).then(now_ms),
        }));
    }

    /// Ends a stage whose attempt failed for good: records the attempt, then settles the
    /// stage.
    pub(super) fn fail_attempt(
        &self,
        at: &AttemptAt<'_>,
        state: NodeState,
        agent: Option<&str>,
        message: String,
        usage: Usage,
    ) -> Outcome {
        self.attempt_record(
            at,
            AttemptState::ended(state),
            agent,
            Some(message.clone()),
            &usage,
        );
        self.failed(at.node, at.stage_started, state, message, usage, at.attempt)
    }

    /// Settles a stage as failed (or timed out); its `on_fail` is taken.
    pub(super) fn failed(
        &self,
        n: NodeId,
        started: i64,
        state: NodeState,
        message: String,
        usage: Usage,
        attempts: u32,
    ) -> Outcome {
        let feedback = tail(&message, MAX_FEEDBACK);
        let mut s = Settled::failed(
            Json::Null,
            message,
            self.plan.node(n).on_fail.clone(),
            started,
        )
        .with_feedback(Some(feedback))
        .spent(attempts, usage);
        s.state = state;
        Outcome::Settled(s)
    }

    /// Settles a stage that produced its output: routes, feedback.
    pub(super) fn done(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        started: i64,
        output: Json,
        usage: Usage,
        attempts: u32,
    ) -> Outcome {
        let mut s = Settled::done(output, started).spent(attempts, usage);
        match self.route(n, &s.output) {
            Ok(Some((Target::Fail, why))) => {
                s.state = NodeState::Failed;
                s.feedback = Some(why.clone());
                s.message = Some(why);
                s.action = Some(Target::Fail);
                return Outcome::Settled(s);
            }
            Ok(a) => s.action = a.map(|(t, _)| t).or_else(|| self.plan.node(n).then.clone()),
            Err(e) => {
                let m = e.message();
                s.state = NodeState::Failed;
                s.feedback = Some(m.clone());
                s.message = Some(m);
                s.action = Some(self.plan.node(n).on_fail.clone());
                return Outcome::Settled(s);
            }
        }
        if let Some(f) = self.feedback_template(frame, n, &s.output) {
            s.feedback = Some(f);
        } else if matches!(s.action, Some(Target::Continue)) {
            let text = match s.output.get("text").and_then(Json::as_str) {
                Some(t) => t.to_string(),
                None => serde_json::to_string_pretty(&s.output).unwrap_or_default(),
            };
            s.feedback = Some(tail(&text, MAX_FEEDBACK));
        }
        Outcome::Settled(s)
    }

    /// Renders the stage's `feedback` template over its output, if it has one that gives
    /// something.
    pub(super) fn feedback_template(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        output: &Json,
    ) -> Option<String> {
        let name = format!("{}/feedback", self.plan.node(n).name);
        if !self.has_template(&name) {
            return None;
        }
        let ctx = self.context(frame, &[("output", to_value(output))]);
        match self.render(&name, &ctx) {
            Ok(f) if !f.trim().is_empty() => Some(tail(f.trim(), MAX_FEEDBACK)),
            Ok(_) => None,
            Err(e) => Some(format!("(its feedback template failed: {e})")),
        }
    }

    /// Chooses a route case by the output: the target, and a sentence saying why.
    pub(super) fn route(
        &self,
        n: NodeId,
        output: &Json,
    ) -> Result<Option<(Target, String)>, StageError> {
        let node = self.plan.node(n);
        let Some(route) = &self.plan.stage(n).keys().route else {
            return Ok(None);
        };
        let mut cur = output;
        for part in route.on.value.split('.') {
            cur = cur.get(part).unwrap_or(&Json::Null);
        }
        let value = match cur {
            Json::String(s) => s.clone(),
            other => other.to_string(),
        };
        let target = match node.routes().iter().find(|(k, _)| *k == value) {
            Some((_, t)) => t,
            None => node
                .route_default()
                .ok_or_else(|| StageError::NoRouteCase {
                    on: route.on.value.clone(),
                    value: value.clone(),
                })?,
        };
        let why = format!(
            "its route on `{}` gave `{value}`, which leads to `{}`",
            route.on.value,
            self.action_text(target)
        );
        Ok(Some((target.clone(), why)))
    }
}

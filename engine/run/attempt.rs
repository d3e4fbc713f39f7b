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
        let record = AttemptRecord {
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
        };
        if let Some(t) = &self.shared.trace {
            t.attempt(&record);
        }
        self.shared.write(Write::Attempt(record));
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

/// How an attempt's program or agent starts (see [`Exec::drive`]).
pub(super) struct Launch<'a> {
    /// Whether anything starts: a check without a command runs nothing, and only shows
    /// that it started.
    pub starts: bool,
    /// The agent the attempt's record names.
    pub agent: Option<&'a str>,
    /// Whether what starts writes in the attempt's directory (which is made first).
    pub writes: bool,
    /// How the progress shows the attempt starting.
    pub label: String,
}

/// A step of an attempt that ends the stage instead of going on: what the stage settles
/// with, or [`Outcome::Stopped`] (boxed: a settlement is large, and a step's usual result
/// is not).
pub(super) type Ends = Box<Outcome>;

/// What follows an attempt whose answer was committed.
pub(super) enum Judged {
    /// The stage settles (or the run stops) with this.
    Settle(Outcome),
    /// The answer was not accepted: the next attempt, if any, tries again.
    Again,
}

/// What a leaf stage kind (an agent, a command or check) does of its own in an attempt;
/// [`Exec::drive`] does the rest, the same for every kind: it starts each attempt (its
/// directory, its template context), records and announces what starts, and goes on to
/// the next attempt or settles.
///
/// Every step may end the stage: `Err(outcome)` is what it settles with (or the run stops,
/// see [`Ends`]).
pub(super) trait Attempt {
    /// What an attempt sends (an agent's prompt, a program's argv and streams).
    type Request;
    /// What comes back from the call.
    type Reply;
    /// The reply read into the stage's output, with what is wrong with it.
    type Answer;

    /// How many attempts the stage has.
    fn attempts(&self) -> u32;

    /// Renders what the attempt sends, over the attempt's context.
    fn render(&mut self, at: &AttemptAt<'_>, ctx: &Value) -> Result<Self::Request, Ends>;

    /// How what the request starts is recorded and shown.
    fn launch(&self, request: &Self::Request) -> Launch<'_>;

    /// Makes the call (runs the program, calls the agent with its policy).
    async fn call(
        &mut self,
        at: &AttemptAt<'_>,
        request: Self::Request,
    ) -> Result<Self::Reply, Ends>;

    /// Reads the reply into the stage's output and validates it.
    async fn extract(
        &mut self,
        at: &AttemptAt<'_>,
        reply: Self::Reply,
    ) -> Result<Self::Answer, Ends>;

    /// Decides on the answer and commits it: the attempt's record and artifacts, and the
    /// stage's settlement when the answer is accepted (or no other attempt may follow).
    fn commit(&mut self, at: &AttemptAt<'_>, answer: Self::Answer) -> Judged;

    /// Before the next attempt, after attempt `attempt` was not accepted (a backoff).
    async fn retry(&mut self, _attempt: u32) {}

    /// Settles the stage when no attempt was accepted.
    fn exhausted(self, started: i64) -> Outcome;
}

impl Exec<'_> {
    /// The attempt driver of the leaf stages: each attempt is rendered, started, called,
    /// extracted and validated, then committed; a rejected one is tried again while the
    /// stage has attempts left (see [`Attempt`]).
    pub(super) async fn drive<A: Attempt>(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        started: i64,
        mut kind: A,
    ) -> Outcome {
        let scope = self.scope(frame);
        let max_attempts = kind.attempts();
        for attempt in 1..=max_attempts {
            let (at, ctx) = match self.begin_attempt(frame, n, &scope, attempt, started) {
                Ok(x) => x,
                // The state directory cannot be written: like a store failure, the run
                // stops and stays resumable.
                Err(e) => return self.shared.io_failed(e),
            };
            let request = match kind.render(&at, &ctx) {
                Ok(r) => r,
                Err(o) => return *o,
            };
            if !self.launch(&at, kind.launch(&request)).await {
                return Outcome::Stopped;
            }
            let reply = match kind.call(&at, request).await {
                Ok(r) => r,
                Err(o) => return *o,
            };
            let answer = match kind.extract(&at, reply).await {
                Ok(a) => a,
                Err(o) => return *o,
            };
            match kind.commit(&at, answer) {
                Judged::Settle(o) => return o,
                Judged::Again if attempt < max_attempts => kind.retry(attempt).await,
                Judged::Again => {}
            }
        }
        kind.exhausted(started)
    }

    /// Records an attempt as running, makes its record durable and its directory, and
    /// shows it starting; `false` when the run is stopping (nothing starts).
    async fn launch(&self, at: &AttemptAt<'_>, launch: Launch<'_>) -> bool {
        if launch.starts {
            self.attempt_record(
                at,
                AttemptState::Running,
                launch.agent,
                None,
                &Usage::default(),
            );
            self.shared.durable().await;
            if self.halted() {
                // The attempt could not be recorded (or the run is stopping).
                return false;
            }
            if !self.ready_to_start(launch.writes.then_some(at.dir.as_path())) {
                return false;
            }
        }
        self.shared
            .progress
            .started(at.scope, at.stage, at.attempt, &launch.label);
        true
    }
}

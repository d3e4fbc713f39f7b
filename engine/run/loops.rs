//! Loops: bounded repetitions of a body, with `until`, `stuck` and give-up actions.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use minijinja::Value;
use serde_json::{Value as Json, json};

use super::context::*;
use super::exec::*;
use super::frame::*;
use super::now_ms;
use crate::compile::NodeId;
use crate::compile::Target;
use crate::model::LoopBody;
use crate::params::resolve_count;
use crate::store::NodeState;

/// A loop being run: its settings, and what iterations see of the ones before them.
struct LoopRun<'x> {
    n: NodeId,
    name: &'x str,
    started: i64,
    max: u64,
    /// Where the body runs (the loop's worktree, if it has one).
    cwd: PathBuf,
    /// The key under which the loop's usage is summed.
    usage_key: String,
    until: Option<&'x crate::model::Text>,
    on_exhausted: Option<&'x crate::source::Spanned<crate::model::Action>>,
    stuck: Option<&'x crate::model::Stuck>,
    /// How many times in a row the same findings make the loop stuck.
    repeats: u64,
    /// What iterations see of the ones before them (`stages.ID.last`, `.history`).
    earlier_hist: BTreeMap<String, Vec<Value>>,
    earlier: Arc<HashMap<String, Value>>,
    history: Vec<Value>,
    /// Whether the loop's output carries its history, whatever ends it (something reads it).
    keep_history: bool,
    feedback: Option<String>,
    /// The last findings of `stuck.on`, and how many times in a row they came.
    stuck_prev: Option<Json>,
    stuck_count: u64,
}

impl LoopRun<'_> {
    /// The loop's output: how many iterations ran and how it ended, with its history when
    /// something reads it (a learnings or report stage after it, whatever the ending).
    fn outcome(&self, s: &str, it: u64) -> Json {
        let mut out = json!({"iterations": it, "outcome": s});
        if self.keep_history {
            out["history"] = self.history_json();
        }
        out
    }

    fn history_json(&self) -> Json {
        serde_json::to_value(&self.history).unwrap_or_else(|_| Json::Array(Vec::new()))
    }

    /// Keeps a finished iteration for the ones after it: its feedback, its entry in the
    /// history, and its outputs as earlier values.
    fn record(&mut self, it: u64, iter_feedback: Option<String>, snapshot: BTreeMap<String, Json>) {
        self.feedback = iter_feedback.clone();
        let mut entry: BTreeMap<&str, Value> = BTreeMap::new();
        entry.insert("iteration", Value::from(it));
        entry.insert(
            "feedback",
            iter_feedback.map(Value::from).unwrap_or(Value::from("")),
        );
        entry.insert("outputs", to_value(&snapshot));
        self.history.push(Value::from(entry));
        for (k, v) in &snapshot {
            self.earlier_hist
                .entry(k.clone())
                .or_default()
                .push(to_value(v));
        }
        self.earlier = Arc::new(earlier_view(&self.earlier_hist, Some(&snapshot)));
    }
}

/// The outputs of an iteration: its snapshot for the loop's history (what did not skip),
/// and the latest outputs outside, updated.
fn keep_outputs(
    outs: &BTreeMap<String, View>,
    latest: &mut BTreeMap<String, View>,
) -> BTreeMap<String, Json> {
    let mut snapshot = BTreeMap::new();
    for (k, v) in outs {
        if v.state != NodeState::Skipped {
            snapshot.insert(k.clone(), v.output());
        }
        if v.state != NodeState::Skipped || !latest.contains_key(k) {
            latest.insert(k.clone(), v.clone());
        }
    }
    snapshot
}

/// The feedback an iteration hands to the next: its `continue`'s, its failure's (not one
/// outside the work), else what its stages said.
fn iteration_feedback(end: &BodyEnd, outs: &BTreeMap<String, View>) -> Option<String> {
    match end {
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
            for (k, v) in outs {
                if let Some(f) = &v.feedback {
                    parts.push(format!("{k}: {f}"));
                }
            }
            (!parts.is_empty()).then(|| parts.join("\n\n"))
        }
    }
}

impl Exec<'_> {
    /// Runs a loop. Its body's outputs become visible outside (their latest values) when
    /// the loop ends, so an iteration never sees a value left over from the one before.
    pub(super) async fn run_loop(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let mut latest: BTreeMap<String, View> = BTreeMap::new();
        let outcome = self.run_loop_inner(frame, n, &mut latest).await;
        frame.outputs.borrow().extend(latest);
        outcome
    }

    pub(super) async fn run_loop_inner(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        latest: &mut BTreeMap<String, View>,
    ) -> Outcome {
        let started = now_ms();
        let mut lp = match self.start_loop(frame, n, started).await {
            Ok(lp) => lp,
            Err(o) => return o,
        };
        for it in 1..=lp.max {
            let iframe = self.iteration_frame(frame, &lp, it);
            // An iteration replayed from the store (a resume) is not announced again.
            let scope = self.scope(&iframe);
            if !self.shared.resumed_scopes.contains(&scope) {
                self.shared
                    .progress
                    .note(&format!("↻ {scope} iteration {it} of {}", lp.max));
            }
            let end = self.run_body(&iframe).await;
            // The iteration's outputs: the loop's history, and the latest outputs outside.
            let outs: BTreeMap<String, View> = iframe.outputs.take();
            let snapshot = keep_outputs(&outs, latest);
            let iter_feedback = iteration_feedback(&end, &outs);
            // Kept before anything ends the loop: its output's `history` has every iteration.
            lp.record(it, iter_feedback, snapshot);
            if let Some(o) = self.iteration_ended(frame, &lp, it, end).await {
                return o;
            }
            // `until` and `stuck` see the iteration's outputs.
            let end_frame = Frame {
                parent: Some(frame),
                region: Some(n),
                scope: iframe.scope.clone(),
                cwd: lp.cwd.clone(),
                vars: iframe.vars.clone(),
                loop_vars: iframe.loop_vars.clone(),
                earlier: iframe.earlier.clone(),
                usage_key: None,
                outputs: Outputs::new(outs),
                limit: None,
                siblings: None,
            };
            if let Some(o) = self.loop_rules(frame, &mut lp, it, &end_frame).await {
                return o;
            }
        }
        self.leave_worktree(frame, n, &lp.cwd, false).await;
        let then = lp
            .on_exhausted
            .map(|a| self.target_of(&a.value))
            .unwrap_or(Target::Fail);
        let message = format!(
            "no success after {} iterations{}",
            lp.max,
            self.denied_note(&lp.usage_key)
        );
        Outcome::Settled(self.loop_end(&lp, "exhausted", lp.max, then, message))
    }
}

impl<'p> Exec<'p> {
    /// A loop's settings, and its worktree entered (`Err`: the loop settles, or the run
    /// stops at a limit of the machine).
    async fn start_loop(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        started: i64,
    ) -> Result<LoopRun<'p>, Outcome> {
        let plan: &'p crate::compile::Plan = self.plan;
        let node = plan.node(n);
        let Some(LoopBody {
            max_iterations,
            until,
            on_exhausted,
            stuck,
            worktree,
            ..
        }) = plan.stage(n).body.as_loop()
        else {
            return Err(Outcome::Settled(Settled::new(
                NodeState::Failed,
                Json::Null,
                started,
            )));
        };
        let max = match max_iterations
            .as_ref()
            .map(|m| resolve_count(&m.value, &plan.params))
        {
            Some(Ok(m)) => m,
            Some(Err(e)) => return Err(self.fail_now(started, format!("max_iterations: {e}"))),
            None => 1,
        };
        let cwd = match worktree {
            Some(_) => match self
                .enter_worktree(frame, n, &frame.child_scope(&node.name))
                .await
            {
                Ok(p) => p,
                // A limit of the machine (git or the worktree's files met it): the run
                // stops as resumable, the loop does not fail.
                Err(e) => {
                    return Err(match e.limit() {
                        Some(limit) => {
                            self.shared
                                .limit_reached(Some(node.name.clone()), limit, e.message())
                        }
                        None => self.fail_now(started, e.message()),
                    });
                }
            },
            None => frame.cwd.clone(),
        };
        Ok(LoopRun {
            n,
            name: &node.name,
            started,
            max,
            cwd,
            usage_key: format!("{}#{}", self.scope(frame), node.name),
            until: until.as_ref(),
            on_exhausted: on_exhausted.as_ref(),
            stuck: stuck.as_deref(),
            repeats: stuck
                .as_ref()
                .and_then(|s| s.repeats.as_ref())
                .and_then(|r| resolve_count(&r.value, &plan.params).ok())
                .unwrap_or(2),
            earlier_hist: BTreeMap::new(),
            earlier: Arc::default(),
            history: Vec::new(),
            keep_history: plan.history_read.contains(&n),
            feedback: None,
            stuck_prev: None,
            stuck_count: 0,
        })
    }
}

impl Exec<'_> {
    /// The frame of an iteration: its scope, the loop's variables, what it sees of the
    /// iterations before it.
    fn iteration_frame<'f>(&self, frame: &'f Frame<'f>, lp: &LoopRun<'_>, it: u64) -> Frame<'f> {
        let scope = frame.child_scope(&format!("{}#{it}", lp.name));
        let mut loop_vars: BTreeMap<&str, Value> = BTreeMap::new();
        loop_vars.insert("iteration", Value::from(it));
        loop_vars.insert("max_iterations", Value::from(lp.max));
        loop_vars.insert(
            "feedback",
            lp.feedback
                .clone()
                .map(Value::from)
                .unwrap_or(Value::from("")),
        );
        loop_vars.insert("history", Value::from(lp.history.clone()));
        let loop_value = Value::from(loop_vars.clone());
        Frame {
            parent: Some(frame),
            region: Some(lp.n),
            scope,
            cwd: lp.cwd.clone(),
            vars: loop_vars
                .iter()
                .map(|(k, v)| ((*k).to_string(), v.clone()))
                .collect(),
            loop_vars: Some((lp.name.to_string(), loop_value)),
            earlier: lp.earlier.clone(),
            usage_key: Some((lp.usage_key.clone(), lp.n)),
            outputs: Arc::default(),
            limit: None,
            siblings: None,
        }
    }

    /// What an iteration's end means for the loop: `Some` when the loop ends with it (a
    /// stop, a wait, an exit, a break, a failure), `None` when the next iteration may run.
    async fn iteration_ended(
        &self,
        frame: &Frame<'_>,
        lp: &LoopRun<'_>,
        it: u64,
        end: BodyEnd,
    ) -> Option<Outcome> {
        let (n, started) = (lp.n, lp.started);
        Some(match end {
            BodyEnd::Stopped => Outcome::Stopped,
            BodyEnd::Waiting => Outcome::Waiting,
            BodyEnd::Exit(i) => Outcome::Settled(
                Settled::done(lp.outcome("exit", it), started).with_action(Target::Exit(i)),
            ),
            BodyEnd::Break => {
                self.leave_worktree(frame, n, &lp.cwd, true).await;
                Outcome::Settled(Settled::done(lp.outcome("break", it), started))
            }
            BodyEnd::Failed {
                node: failed,
                message,
                feedback,
                infra,
            } => {
                self.leave_worktree(frame, n, &lp.cwd, false).await;
                Outcome::Settled(self.region_failed(
                    n,
                    lp.outcome("failed", it),
                    started,
                    format!("`{failed}` failed in iteration {it}: {message}"),
                    feedback,
                    infra,
                ))
            }
            BodyEnd::Completed | BodyEnd::Continue(_) => return None,
        })
    }

    /// The loop's rules over an iteration's outputs: `until` ends it, and `stuck` when the
    /// same findings come too many times in a row (`Some`: the loop ends so).
    async fn loop_rules(
        &self,
        frame: &Frame<'_>,
        lp: &mut LoopRun<'_>,
        it: u64,
        end_frame: &Frame<'_>,
    ) -> Option<Outcome> {
        let (n, started) = (lp.n, lp.started);
        let ctx = self.context(end_frame, &[]);
        if let Some(u) = lp.until {
            match self.eval(&u.value, &ctx) {
                Ok(v) if v.is_true() => {
                    self.leave_worktree(frame, n, &lp.cwd, true).await;
                    return Some(Outcome::Settled(Settled::done(
                        lp.outcome("until", it),
                        started,
                    )));
                }
                Ok(_) => {}
                Err(e) => return Some(self.fail_now(started, format!("its `until` failed: {e}"))),
            }
        }
        let rule = lp.stuck?;
        let v = match self.eval(&rule.on.value, &ctx) {
            Ok(v) => v,
            Err(e) => return Some(self.fail_now(started, format!("its `stuck.on` failed: {e}"))),
        };
        let j: Json = serde_json::to_value(&v).unwrap_or(Json::Null);
        let empty = j.is_null()
            || j.as_array().is_some_and(Vec::is_empty)
            || j.as_str().is_some_and(str::is_empty);
        if !empty && lp.stuck_prev.as_ref() == Some(&j) {
            lp.stuck_count += 1;
        } else {
            lp.stuck_count = 1;
        }
        lp.stuck_prev = Some(j);
        if empty || lp.stuck_count < lp.repeats {
            return None;
        }
        let count = lp.stuck_count;
        self.shared.progress.note(&format!(
            "⟳ {} is stuck: the same findings {count} times in a row",
            lp.name
        ));
        self.leave_worktree(frame, n, &lp.cwd, false).await;
        let then = rule
            .then
            .as_ref()
            .map(|a| self.target_of(&a.value))
            .unwrap_or(Target::Fail);
        let message = format!(
            "stuck: the same findings {count} iterations in a row{}",
            self.denied_note(&lp.usage_key)
        );
        Some(Outcome::Settled(
            self.loop_end(lp, "stuck", it, then, message),
        ))
    }

    /// The settlement of a loop, for_each or group whose body failed: a failure that is not
    /// the work's takes the region's `on_error` and hands no feedback on (the loop does not
    /// go on as if it were a verdict); any other takes its `on_fail` with the feedback.
    pub(super) fn region_failed(
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

    /// The settlement of a loop that ended by a rule (`stuck`, exhausted) with an action; the
    /// loop's output carries its `history` for the stage that handles giving up (a report, a
    /// block with context) to read.
    fn loop_end(
        &self,
        lp: &LoopRun<'_>,
        outcome: &str,
        it: u64,
        then: Target,
        message: String,
    ) -> Settled {
        let (n, started) = (lp.n, lp.started);
        let mut output = lp.outcome(outcome, it);
        if matches!(then, Target::Stage(_)) && !lp.keep_history {
            output["history"] = lp.history_json();
        }
        match then {
            Target::Fail => {
                Settled::failed(output, message, self.plan.node(n).on_fail.clone(), started)
            }
            other => {
                let mut s = Settled::done(output, started);
                s.message = Some(message);
                if other != Target::Break {
                    s.action = Some(other);
                }
                s
            }
        }
    }
}

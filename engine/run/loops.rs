//! Loops: bounded repetitions of a body, with `until`, `stuck` and give-up actions.

use std::collections::{BTreeMap, HashMap};
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
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let Some(LoopBody {
            max_iterations,
            until,
            on_exhausted,
            stuck,
            worktree,
            ..
        }) = st.body.as_loop()
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
                // A limit of the machine (git or the worktree's files met it): the run
                // stops as resumable, the loop does not fail.
                Err(e) => match e.limit() {
                    Some(limit) => {
                        return self.shared.limit_reached(
                            Some(node.name.clone()),
                            limit,
                            e.message(),
                        );
                    }
                    None => return self.fail_now(started, e.message()),
                },
            },
            None => frame.cwd.clone(),
        };
        let usage_key = format!("{}#{}", self.scope(frame), node.name);
        // What iterations see of the ones before them (`stages.ID.last`, `.history`).
        let mut earlier_hist: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut earlier: Arc<HashMap<String, Value>> = Arc::default();
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
            let mut loop_vars: BTreeMap<&str, Value> = BTreeMap::new();
            loop_vars.insert("iteration", Value::from(it));
            loop_vars.insert("max_iterations", Value::from(max));
            loop_vars.insert(
                "feedback",
                feedback.clone().map(Value::from).unwrap_or(Value::from("")),
            );
            loop_vars.insert("history", Value::from(history.clone()));
            let loop_value = Value::from(loop_vars.clone());
            let iframe = Frame {
                parent: Some(frame),
                region: Some(n),
                scope,
                cwd: cwd.clone(),
                vars: loop_vars
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), v.clone()))
                    .collect(),
                loop_vars: Some((node.name.clone(), loop_value)),
                earlier: earlier.clone(),
                usage_key: Some((usage_key.clone(), n)),
                outputs: Arc::default(),
                limit: None,
                siblings: None,
            };
            // An iteration replayed from the store (a resume) is not announced again.
            let scope = self.scope(&iframe);
            let replayed = self.shared.resumed_scopes.contains(&scope);
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
                    snapshot.insert(k.clone(), v.output());
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
                    return Outcome::Settled(
                        Settled::done(outcome_of("exit", it), started).with_action(Target::Exit(i)),
                    );
                }
                BodyEnd::Break => {
                    self.leave_worktree(frame, n, &cwd, true).await;
                    return Outcome::Settled(Settled::done(outcome_of("break", it), started));
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
                outputs: Outputs::new(outs),
                limit: None,
                siblings: None,
            };
            let ctx = self.context(&end_frame, &[]);
            if let Some(u) = until {
                match self.eval(&u.value, &ctx) {
                    Ok(v) if v.is_true() => {
                        self.leave_worktree(frame, n, &cwd, true).await;
                        return Outcome::Settled(Settled::done(outcome_of("until", it), started));
                    }
                    Ok(_) => {}
                    Err(e) => return self.fail_now(started, format!("its `until` failed: {e}")),
                }
            }
            if let Some(rule) = stuck {
                match self.eval(&rule.on.value, &ctx) {
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
                            let then = rule
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
                                    "stuck: the same findings {stuck_count} iterations in a row{}",
                                    self.denied_note(&usage_key)
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
            let mut entry: BTreeMap<&str, Value> = BTreeMap::new();
            entry.insert("iteration", Value::from(it));
            entry.insert(
                "feedback",
                iter_feedback.map(Value::from).unwrap_or(Value::from("")),
            );
            entry.insert("outputs", to_value(&snapshot));
            history.push(Value::from(entry));
            for (k, v) in &snapshot {
                earlier_hist.entry(k.clone()).or_default().push(to_value(v));
            }
            earlier = Arc::new(earlier_view(&earlier_hist, Some(&snapshot)));
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
            format!(
                "no success after {max} iterations{}",
                self.denied_note(&usage_key)
            ),
            &history,
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

    /// The settlement of a loop that ended by a rule (`stuck`, exhausted) with an action.
    /// When the action runs a stage (one that handles giving up: a report, a block with
    /// context), the loop's output carries its `history` for that stage to read.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn loop_end(
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

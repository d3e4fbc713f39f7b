//! Gates: a person approves or rejects; timeouts.

use std::time::Duration;

use serde_json::json;

use super::exec::*;
use super::frame::*;
use super::now_ms;
use crate::compile::NodeId;
use crate::compile::Target;
use crate::model::StageBody;
use crate::params::resolve_duration;
use crate::store::{Approval, GateRequest, NodeState, Write, rfc3339};

/// A gate being waited on: which, its timeout and what its answers lead to.
struct Gate<'x> {
    name: &'x str,
    scope: String,
    started: i64,
    timeout: Option<Duration>,
    on_timeout: Option<&'x crate::source::Spanned<crate::model::Action>>,
    on_reject: Target,
    /// When its request was made, when known here (for its span).
    requested: Option<i64>,
}

impl Exec<'_> {
    /// Runs a gate: its request (made once, kept in the store), then its answer, waited
    /// for while the run waits (`--wait`), else the gate is left waiting.
    pub(super) async fn run_gate(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let StageBody::Gate {
            show,
            on_timeout,
            on_reject,
            ..
        } = &st.body
        else {
            return self.fail_now(started, "not a gate".into());
        };
        let mut gate = Gate {
            name: &node.name,
            scope: self.scope(frame),
            started,
            timeout: st
                .keys()
                .timeout
                .as_ref()
                .and_then(|d| resolve_duration(&d.value, &self.plan.params).ok()),
            on_timeout: on_timeout.as_ref(),
            on_reject: on_reject
                .as_ref()
                .map(|a| self.target_of(&a.value))
                .unwrap_or_else(|| node.on_fail.clone()),
            requested: None,
        };
        let pending = self
            .shared
            .store
            .borrow()
            .pending_gates(&self.shared.run.id)
            .unwrap_or_default();
        let request = pending
            .into_iter()
            .find(|g| g.scope == gate.scope && g.gate == node.name);
        let answered = self.answer_to(&gate.scope, gate.name);
        let request = match (request, &answered) {
            (Some(r), None) => {
                self.announce_if_never_tried(&r);
                Some(r)
            }
            (Some(r), Some(_)) => Some(r),
            (None, Some(_)) => None,
            (None, None) => match self.ask(frame, &gate, show.len()) {
                Ok(req) => Some(req),
                Err(o) => return *o,
            },
        };
        if let Some(req) = &request {
            self.show_waiting(req);
            gate.requested = Some(req.requested_at);
        }
        let deadline = request.as_ref().and_then(|r| r.deadline);
        self.await_answer(&gate, deadline, answered).await
    }

    /// Asks a gate's question: its request is written to the store and announced.
    fn ask(
        &self,
        frame: &Frame<'_>,
        gate: &Gate<'_>,
        shown: usize,
    ) -> Result<GateRequest, Box<Outcome>> {
        let ctx = self.context(frame, &[]);
        let name = format!("{}/message", gate.name);
        let message = if self.has_template(&name) {
            self.render(&name, &ctx).map_err(|e| {
                Box::new(self.fail_now(
                    gate.started,
                    format!("its message could not be rendered: {e}"),
                ))
            })?
        } else {
            format!("Approve `{}`?", gate.name)
        };
        let mut files = Vec::new();
        for i in 0..shown {
            if let Ok(f) = self.render(&format!("{}/show/{i}", gate.name), &ctx) {
                files.push(f);
            }
        }
        let now = now_ms();
        let req = GateRequest {
            run: self.shared.run.id.clone(),
            scope: gate.scope.clone(),
            gate: gate.name.to_string(),
            message,
            show: files,
            requested_at: now,
            deadline: gate
                .timeout
                .map(|t| now.saturating_add(i64::try_from(t.as_millis()).unwrap_or(i64::MAX))),
        };
        self.shared.write(Write::Gate(req.clone()));
        self.shared
            .event(&gate.scope, gate.name, "waiting", req.message.clone());
        self.shared.flush();
        self.announce_gate(&req);
        Ok(req)
    }

    /// Announces a gate that starts waiting to the run's notifiers (once: when its request
    /// is made, so a resume that finds the request does not announce it again).
    fn announce_gate(&self, req: &GateRequest) {
        use super::notify::{Announcement, GateInfo};
        use crate::model::NotifyEvent;
        let Some(notifier) = &self.shared.notifier else {
            return;
        };
        if !notifier.wants(NotifyEvent::Gate) {
            return;
        }
        let target = self.answer_target(req);
        notifier.announce(&Announcement {
            event: NotifyEvent::Gate,
            run: self.shared.run.id.clone(),
            workflow: self.shared.run.workflow.clone(),
            gate: Some(GateInfo {
                name: req.gate.clone(),
                qualified: req.qualified(),
                scope: req.scope.clone(),
                message: req.message.clone(),
                files: req.show.clone(),
                approve: format!("ralph-flow approve {target}"),
                reject: format!("ralph-flow reject {target} --comment '...'"),
            }),
            status: "waiting",
            exit: None,
        });
    }

    /// Announces a gate whose request an earlier executor of the run made, unless a
    /// delivery of it was recorded (tried, whether it reached its receiver or not): a
    /// resume does not announce a gate again, but one whose executor was killed before any
    /// delivery ended is announced now.
    fn announce_if_never_tried(&self, req: &GateRequest) {
        let Some(notifier) = &self.shared.notifier else {
            return;
        };
        if !notifier.wants(crate::model::NotifyEvent::Gate) {
            return;
        }
        let events = self
            .shared
            .store
            .borrow()
            .events(&self.shared.run.id, Some(&req.gate));
        let Ok(events) = events else {
            return;
        };
        let tried = events
            .iter()
            .any(|e| e.scope == req.scope && super::notify::is_delivery(&e.kind));
        if !tried {
            self.announce_gate(req);
        }
    }

    /// What follows `ralph-flow approve` or `reject` to answer a gate: the run, the gate and
    /// the state directory when it is not the default, each quoted for a shell.
    fn answer_target(&self, req: &GateRequest) -> String {
        let opts = &self.shared.opts;
        let state_dir = if opts.state_dir != opts.cwd.join(".ralph-flow") {
            format!(
                " --state-dir {}",
                crate::shell::quote(&opts.state_dir.to_string_lossy())
            )
        } else {
            String::new()
        };
        format!(
            "{} {}{state_dir}",
            crate::shell::quote(&self.shared.run.id),
            crate::shell::quote(&req.qualified())
        )
    }

    /// Shows how to answer a waiting gate.
    fn show_waiting(&self, req: &GateRequest) {
        let target = self.answer_target(req);
        let mut text = format!(
            "⏸ gate `{}` waits: {}\n    approve: ralph-flow approve {target}\n    reject:  ralph-flow reject {target} --comment \"...\"",
            req.qualified(),
            req.message.trim(),
        );
        for f in &req.show {
            text.push_str(&format!("\n    see: {f}"));
        }
        self.shared.progress.note(&text);
    }

    /// Waits for a gate's answer (polling the store) until its deadline, if any.
    async fn await_answer(
        &self,
        gate: &Gate<'_>,
        deadline: Option<i64>,
        mut answer: Option<Approval>,
    ) -> Outcome {
        loop {
            if let Some(a) = answer.take() {
                return self.gate_answered(gate, a);
            }
            if deadline.is_some_and(|d| now_ms() >= d) {
                match self.gate_timed_out(gate) {
                    Ok(approval) => {
                        answer = Some(approval);
                        continue;
                    }
                    Err(o) => return *o,
                }
            }
            if !self.shared.opts.wait {
                return Outcome::Waiting;
            }
            let mut sleep = self.shared.opts.gate_poll;
            if let Some(d) = deadline {
                let left = Duration::from_millis(u64::try_from(d - now_ms()).unwrap_or(0));
                sleep = sleep.min(left.max(Duration::from_millis(10)));
            }
            tokio::time::sleep(sleep).await;
            answer = self.answer_to(&gate.scope, gate.name);
        }
    }

    /// Settles a gate by its answer: a rejection takes the gate's `on_reject`.
    fn gate_answered(&self, gate: &Gate<'_>, a: Approval) -> Outcome {
        self.trace_wait(gate, a.at, a.approved, a.by == "timeout");
        let output = json!({
            "approved": a.approved,
            "comment": a.comment.clone().unwrap_or_default(),
            "by": a.by,
            "at": rfc3339(a.at),
        });
        let mut s = Settled::new(NodeState::Done, output, gate.started);
        s.attempts = 1;
        if !a.approved {
            s.feedback = Some(format!(
                "The gate `{}` was rejected by {}: {}",
                gate.name,
                a.by,
                a.comment.clone().unwrap_or_else(|| "(no comment)".into())
            ));
            s.message = s.feedback.clone();
            if gate.on_reject == Target::Fail {
                s.state = NodeState::Failed;
            }
            s.action = Some(gate.on_reject.clone());
        }
        Outcome::Settled(s)
    }

    /// A gate's deadline passed: its `on_timeout` answers it (`Ok`, the answer is written
    /// to the store), or settles it.
    fn gate_timed_out(&self, gate: &Gate<'_>) -> Result<Approval, Box<Outcome>> {
        let action = gate
            .on_timeout
            .map(|a| self.target_of(&a.value))
            .unwrap_or(Target::Fail);
        let waited = gate.timeout.map(crate::text::duration).unwrap_or_default();
        match action {
            Target::Approve | Target::Reject => {
                let approval = Approval {
                    run: self.shared.run.id.clone(),
                    scope: gate.scope.clone(),
                    gate: gate.name.to_string(),
                    approved: action == Target::Approve,
                    comment: Some(format!("no answer within {waited}")),
                    by: "timeout".into(),
                    at: now_ms(),
                };
                if let Err(e) = self.shared.store.borrow_mut().answer(&approval) {
                    tracing::warn!("gate timeout: {}", crate::diag::error_chain(&e));
                }
                self.shared.event(
                    &gate.scope,
                    gate.name,
                    "timeout",
                    format!("no answer within {waited}: {action:?}"),
                );
                Ok(approval)
            }
            other => {
                self.trace_wait(gate, now_ms(), false, true);
                let msg = format!("gate `{}` had no answer within {waited}", gate.name);
                let mut s = Settled::new(
                    if other == Target::Fail {
                        NodeState::Failed
                    } else {
                        NodeState::Done
                    },
                    json!({"approved": false, "comment": "", "by": "timeout", "at": rfc3339(now_ms())}),
                    gate.started,
                );
                s.message = Some(msg.clone());
                s.feedback = Some(msg);
                s.action = Some(other);
                Err(Box::new(Outcome::Settled(s)))
            }
        }
    }

    /// The span of a gate's wait, from its request (read from its `waiting` event when an
    /// earlier process made it and it was answered since) to `answered`.
    fn trace_wait(&self, gate: &Gate<'_>, answered: i64, approved: bool, by_timeout: bool) {
        let Some(t) = &self.shared.trace else {
            return;
        };
        let requested = gate.requested.or_else(|| {
            let events = self
                .shared
                .store
                .borrow()
                .events(&self.shared.run.id, Some(gate.name))
                .ok()?;
            events
                .iter()
                .rev()
                .find(|e| e.scope == gate.scope && e.kind == "waiting")
                .map(|e| e.at)
        });
        if let Some(requested) = requested {
            t.gate_wait(
                &gate.scope,
                gate.name,
                (requested, answered),
                approved,
                by_timeout,
            );
        }
    }

    /// The answer to a gate, if it has one (a store that cannot be read counts as none yet:
    /// the gate asks again).
    fn answer_to(&self, scope: &str, gate: &str) -> Option<Approval> {
        self.shared
            .store
            .borrow()
            .approval(&self.shared.run.id, scope, gate)
            .ok()
            .flatten()
    }
}

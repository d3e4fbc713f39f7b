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
use crate::store::{GateRequest, NodeState, Write, rfc3339};

impl Exec<'_> {
    pub(super) async fn run_gate(&self, frame: &Frame<'_>, n: NodeId) -> Outcome {
        let started = now_ms();
        let st = self.plan.stage(n);
        let node = self.plan.node(n);
        let scope = self.scope(frame);
        let run = self.shared.run.id.clone();
        let StageBody::Gate {
            show,
            on_timeout,
            on_reject,
            ..
        } = &st.body
        else {
            return self.fail_now(started, "not a gate".into());
        };
        let timeout = st
            .keys()
            .timeout
            .as_ref()
            .and_then(|d| resolve_duration(&d.value, &self.plan.params).ok());
        let on_reject = on_reject
            .as_ref()
            .map(|a| self.target_of(&a.value))
            .unwrap_or_else(|| node.on_fail.clone());
        let pending = self
            .shared
            .store
            .borrow()
            .pending_gates(&run)
            .unwrap_or_default();
        let request = pending
            .into_iter()
            .find(|g| g.scope == scope && g.gate == node.name);
        let answered = self.answer_to(&scope, &node.name);
        let request = match (request, &answered) {
            (Some(r), _) => Some(r),
            (None, Some(_)) => None,
            (None, None) => {
                let ctx = self.context(frame, &[]);
                let name = format!("{}/message", node.name);
                let message = if self.has_template(&name) {
                    match self.render(&name, &ctx) {
                        Ok(m) => m,
                        Err(e) => {
                            return self.fail_now(
                                started,
                                format!("its message could not be rendered: {e}"),
                            );
                        }
                    }
                } else {
                    format!("Approve `{}`?", node.name)
                };
                let mut files = Vec::new();
                for i in 0..show.len() {
                    if let Ok(f) = self.render(&format!("{}/show/{i}", node.name), &ctx) {
                        files.push(f);
                    }
                }
                let now = now_ms();
                let req = GateRequest {
                    run: run.clone(),
                    scope: scope.clone(),
                    gate: node.name.clone(),
                    message,
                    show: files,
                    requested_at: now,
                    deadline: timeout.map(|t| {
                        now.saturating_add(i64::try_from(t.as_millis()).unwrap_or(i64::MAX))
                    }),
                };
                self.shared.write(Write::Gate(req.clone()));
                self.shared
                    .event(&scope, &node.name, "waiting", req.message.clone());
                self.shared.flush();
                Some(req)
            }
        };
        if let Some(req) = &request {
            let state_dir =
                if self.shared.opts.state_dir != self.shared.opts.cwd.join(".ralph-flow") {
                    format!(
                        " --state-dir {}",
                        crate::shell::quote(&self.shared.opts.state_dir.to_string_lossy())
                    )
                } else {
                    String::new()
                };
            let target = format!(
                "{} {}{state_dir}",
                crate::shell::quote(&run),
                crate::shell::quote(&req.qualified())
            );
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
        let mut answer = answered;
        loop {
            if let Some(a) = answer.take() {
                let output = json!({
                    "approved": a.approved,
                    "comment": a.comment.clone().unwrap_or_default(),
                    "by": a.by,
                    "at": rfc3339(a.at),
                });
                let mut s = Settled::new(NodeState::Done, output, started);
                s.attempts = 1;
                if !a.approved {
                    s.feedback = Some(format!(
                        "The gate `{}` was rejected by {}: {}",
                        node.name,
                        a.by,
                        a.comment.clone().unwrap_or_else(|| "(no comment)".into())
                    ));
                    s.message = s.feedback.clone();
                    if on_reject == Target::Fail {
                        s.state = NodeState::Failed;
                    }
                    s.action = Some(on_reject.clone());
                }
                return Outcome::Settled(s);
            }
            let deadline = request.as_ref().and_then(|r| r.deadline);
            if deadline.is_some_and(|d| now_ms() >= d) {
                let action = on_timeout
                    .as_ref()
                    .map(|a| self.target_of(&a.value))
                    .unwrap_or(Target::Fail);
                let waited = timeout.map(crate::text::duration).unwrap_or_default();
                match action {
                    Target::Approve | Target::Reject => {
                        let approval = crate::store::Approval {
                            run: run.clone(),
                            scope: scope.clone(),
                            gate: node.name.clone(),
                            approved: action == Target::Approve,
                            comment: Some(format!("no answer within {waited}")),
                            by: "timeout".into(),
                            at: now_ms(),
                        };
                        if let Err(e) = self.shared.store.borrow_mut().answer(&approval) {
                            tracing::warn!("gate timeout: {}", crate::diag::error_chain(&e));
                        }
                        self.shared.event(
                            &scope,
                            &node.name,
                            "timeout",
                            format!("no answer within {waited}: {action:?}"),
                        );
                        answer = Some(approval);
                        continue;
                    }
                    other => {
                        let msg = format!("gate `{}` had no answer within {waited}", node.name);
                        let mut s = Settled::new(
                            if other == Target::Fail {
                                NodeState::Failed
                            } else {
                                NodeState::Done
                            },
                            json!({"approved": false, "comment": "", "by": "timeout", "at": rfc3339(now_ms())}),
                            started,
                        );
                        s.message = Some(msg.clone());
                        s.feedback = Some(msg);
                        s.action = Some(other);
                        return Outcome::Settled(s);
                    }
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
            answer = self.answer_to(&scope, &node.name);
        }
    }

    /// The answer to a gate, if it has one (a store that cannot be read counts as none yet:
    /// the gate asks again).
    fn answer_to(&self, scope: &str, gate: &str) -> Option<crate::store::Approval> {
        self.shared
            .store
            .borrow()
            .approval(&self.shared.run.id, scope, gate)
            .ok()
            .flatten()
    }
}

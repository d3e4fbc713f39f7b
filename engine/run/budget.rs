//! Budgets: usage summed per run and per loop, and what happens when one is spent.

use serde_json::Value as Json;

use super::exec::*;
use super::frame::*;
use crate::backend::Usage;
use crate::check::StageId as NodeId;
use crate::compile::Target;
use crate::params::resolve_count;
use crate::store::NodeState;

/// How many denials a loop keeps for its outcome's message.
const DENIALS_KEPT: usize = 5;

impl Exec<'_> {
    pub(super) fn budget_outcome(
        &self,
        started: i64,
        t: Target,
        msg: String,
        usage: Usage,
        attempts: u32,
    ) -> Outcome {
        let state = if t == Target::Fail {
            NodeState::Failed
        } else {
            NodeState::Done
        };
        Outcome::Settled(
            Settled::new(state, Json::Null, started)
                .spent(attempts, usage)
                .with_verdict(msg)
                .with_action(t),
        )
    }

    /// Adds a call's usage (by `agent`, for stage `n`) to the run's and the enclosing loops'
    /// sums. A call that reported no usage under a tokens budget is said once per agent,
    /// in the progress and as a `warning` event: its tokens are not counted.
    pub(super) fn add_usage(&self, frame: &Frame<'_>, n: NodeId, agent: &str, u: &Usage) {
        {
            let mut all = self.shared.usage.borrow_mut();
            all.entry(String::new()).or_default().add(u);
            let mut cur = Some(frame);
            while let Some(f) = cur {
                if let Some((key, _)) = &f.usage_key {
                    all.entry(key.clone()).or_default().add(u);
                }
                cur = f.parent;
            }
        }
        if u.unreported > 0 {
            self.note_unreported(frame, n, agent);
        }
    }

    /// Says, once per agent, that a call under a tokens budget reported no usage.
    fn note_unreported(&self, frame: &Frame<'_>, n: NodeId, agent: &str) {
        let Some(budget) = self.tokens_budget(frame, n) else {
            return;
        };
        if !self
            .shared
            .unreported_noted
            .borrow_mut()
            .insert(agent.to_string())
        {
            return;
        }
        let text = format!(
            "agent `{agent}` reported no token usage for a call of stage `{}` (the answer \
             carried none), so the tokens budget of {budget} cannot count its calls that \
             report none; their usage shows as unknown",
            self.plan.node(n).name
        );
        tracing::warn!("{text}");
        self.shared.progress.note(&format!("! {text}"));
        self.shared.event("", "", "warning", text);
    }

    /// The innermost tokens budget over stage `n` in `frame`: the stage's own, an enclosing
    /// loop's, the run's (`stage `x``, `loop `l``, `the run`).
    fn tokens_budget(&self, frame: &Frame<'_>, n: NodeId) -> Option<String> {
        let has_tokens =
            |b: &Option<Box<crate::model::Budget>>| b.as_ref().is_some_and(|b| b.tokens.is_some());
        if has_tokens(&self.plan.stage(n).keys().budget) {
            return Some(format!("stage `{}`", self.plan.node(n).name));
        }
        let mut cur = Some(frame);
        while let Some(f) = cur {
            if let Some((_, l)) = &f.usage_key {
                if has_tokens(&self.plan.stage(*l).keys().budget) {
                    return Some(format!("loop `{}`", self.plan.node(*l).name));
                }
            }
            cur = f.parent;
        }
        self.plan
            .workflow
            .budget
            .as_ref()
            .is_some_and(|b| b.tokens.is_some())
            .then(|| String::from("the run"))
    }

    /// Keeps a stage's denied actions for the loops around it, whose outcome names them
    /// when they give up (at most [`DENIALS_KEPT`] a loop).
    pub(super) fn note_denied(&self, frame: &Frame<'_>, stage: &str, text: &str) {
        let mut all = self.shared.denied.borrow_mut();
        let mut cur = Some(frame);
        while let Some(f) = cur {
            if let Some((key, _)) = &f.usage_key {
                let kept = all.entry(key.clone()).or_default();
                let entry = format!("stage `{stage}`: {text}");
                if kept.len() < DENIALS_KEPT && !kept.contains(&entry) {
                    kept.push(entry);
                }
            }
            cur = f.parent;
        }
    }

    /// What a loop that gives up says of its agents' denied actions: `""` when none were.
    pub(super) fn denied_note(&self, loop_key: &str) -> String {
        match self.shared.denied.borrow().get(loop_key) {
            Some(d) if !d.is_empty() => format!(
                "; its agents were denied actions, which may be why (see the agents' \
                 `permissions`): {}",
                d.join("; ")
            ),
            _ => String::new(),
        }
    }

    /// Tells whether a budget (the stage's, an enclosing loop's, the run's) is spent, with
    /// the action it declares.
    pub(super) fn over_budget(
        &self,
        frame: &Frame<'_>,
        n: NodeId,
        stage_usage: &Usage,
    ) -> Option<(Target, String)> {
        let check =
            |b: &crate::model::Budget, u: &Usage, what: String| -> Option<(Target, String)> {
                let tokens = b
                    .tokens
                    .as_ref()
                    .and_then(|t| resolve_count(&t.value, &self.plan.params).ok());
                let over_tokens = tokens.is_some_and(|t| u.tokens() >= t);
                let over_cost = b
                    .cost_usd
                    .as_ref()
                    .is_some_and(|c| u.cost_usd.unwrap_or(0.0) >= c.value);
                if !(over_tokens || over_cost) {
                    return None;
                }
                let t = b
                    .on_exceeded
                    .as_ref()
                    .map(|a| self.target_of(&a.value))
                    .unwrap_or(Target::Fail);
                let spent = if over_tokens {
                    format!("{} tokens of {}", u.tokens(), tokens.unwrap_or(0))
                } else {
                    format!(
                        "${:.4} of ${:.4}",
                        u.cost_usd.unwrap_or(0.0),
                        b.cost_usd.as_ref().map_or(0.0, |c| c.value)
                    )
                };
                Some((t, format!("the budget of {what} is spent ({spent})")))
            };
        if let Some(b) = &self.plan.stage(n).keys().budget {
            if let Some(r) = check(
                b,
                stage_usage,
                format!("stage `{}`", self.plan.node(n).name),
            ) {
                return Some(r);
            }
        }
        let all = self.shared.usage.borrow();
        let mut cur = Some(frame);
        while let Some(f) = cur {
            if let Some((key, l)) = &f.usage_key {
                if let Some(b) = &self.plan.stage(*l).keys().budget {
                    let u = all.get(key).cloned().unwrap_or_default();
                    if let Some(r) = check(b, &u, format!("loop `{}`", self.plan.node(*l).name)) {
                        return Some(r);
                    }
                }
            }
            cur = f.parent;
        }
        if let Some(b) = &self.plan.workflow.budget {
            let u = all.get("").cloned().unwrap_or_default();
            if let Some(r) = check(b, &u, "the run".to_string()) {
                return Some(r);
            }
        }
        None
    }

    /// Builds every agent's backend (a bad setting fails the run before anything starts)
    /// and says loudly when a budget cannot be enforced because a backend does not report
    /// what it counts (cost, or tokens).
    pub(super) fn warn_unenforceable_budgets(&self) -> Result<(), RunError> {
        let budgets = self.plan.workflow.budget.iter().chain(
            (0..self.plan.nodes.len())
                .filter_map(|i| self.plan.stage(NodeId(i)).keys().budget.as_deref()),
        );
        let (mut cost, mut tokens) = (false, false);
        for b in budgets {
            cost |= b.cost_usd.is_some();
            tokens |= b.tokens.is_some();
        }
        for (i, a) in self.agents.iter().enumerate() {
            let caps = self
                .backend(i)
                .map_err(|e| RunError::Agent {
                    agent: a.name.clone(),
                    source: Box::new(e),
                })?
                .capabilities();
            let mut missing = Vec::new();
            if cost && !caps.cost {
                missing.push("cost");
            }
            if tokens && !caps.usage {
                missing.push("tokens");
            }
            if !missing.is_empty() {
                let text = format!(
                    "agent `{}` ({}) does not report {}, so its calls do not count against the {} budgets",
                    a.name,
                    a.kind.as_str(),
                    missing.join(" or "),
                    missing.join(" and ")
                );
                tracing::warn!("{text}");
                self.shared.progress.note(&format!("! {text}"));
                self.shared.event("", "", "warning", text);
            }
        }
        Ok(())
    }
}

//! Budgets: usage summed per run and per loop, and what happens when one is spent.

use serde_json::Value as Json;

use super::exec::*;
use super::frame::*;
use crate::backend::Usage;
use crate::check::StageId as NodeId;
use crate::compile::Target;
use crate::params::resolve_count;
use crate::store::NodeState;

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

    /// Adds a call's usage to the run's and the enclosing loops' sums.
    pub(super) fn add_usage(&self, frame: &Frame<'_>, u: &Usage) {
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

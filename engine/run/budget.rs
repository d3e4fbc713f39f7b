//! Budgets: usage summed per run and per loop, and what happens when one is spent.

use serde_json::Value as Json;

use super::exec::*;
use super::frame::*;
use crate::backend::Usage;
use crate::compile::NodeId;
use crate::compile::Target;
use crate::model::Budget;
use crate::params::resolve_count;
use crate::store::NodeState;

/// How many denials a loop keeps for its outcome's message.
const DENIALS_KEPT: usize = 5;

/// Whose a budget is: the stage's own, an enclosing loop's (its usage summed under `key`),
/// the run's.
#[derive(Clone, Copy)]
enum Whose<'a> {
    Stage(NodeId),
    Loop { key: &'a str, node: NodeId },
    Run,
}

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
        if self.shared.unreported_noted.borrow().contains(agent) {
            return;
        }
        let Some((_, whose)) = self
            .budgets_over(frame, n)
            .find(|(b, _)| b.tokens.is_some())
        else {
            return;
        };
        self.shared
            .unreported_noted
            .borrow_mut()
            .insert(agent.to_string());
        self.shared.warn(format!(
            "agent `{agent}` reported no token usage for a call of stage `{}` (the answer \
             carried none), so the tokens budget of {} cannot count its calls that report \
             none; their usage shows as unknown",
            self.plan.node(n).name,
            self.whose_name(whose)
        ));
    }

    /// The budgets over stage `n` in `frame`, innermost first: the stage's own, the
    /// enclosing loops' (each summed under its usage key), the run's.
    fn budgets_over<'f>(
        &'f self,
        frame: &'f Frame<'f>,
        n: NodeId,
    ) -> impl Iterator<Item = (&'f Budget, Whose<'f>)> {
        let stage = self.plan.stage(n).keys().budget.as_deref();
        let loops = std::iter::successors(Some(frame), |f| f.parent).filter_map(|f| {
            let (key, l) = f.usage_key.as_ref()?;
            let b = self.plan.stage(*l).keys().budget.as_deref()?;
            Some((b, Whose::Loop { key, node: *l }))
        });
        let run = self.plan.workflow.budget.as_ref();
        (stage.map(|b| (b, Whose::Stage(n))).into_iter())
            .chain(loops)
            .chain(run.map(|b| (b, Whose::Run)))
    }

    /// A budget's owner as messages name it: `stage `x``, `loop `l``, `the run`.
    fn whose_name(&self, whose: Whose<'_>) -> String {
        match whose {
            Whose::Stage(n) => format!("stage `{}`", self.plan.node(n).name),
            Whose::Loop { node, .. } => format!("loop `{}`", self.plan.node(node).name),
            Whose::Run => String::from("the run"),
        }
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
        let all = self.shared.usage.borrow();
        let nothing = Usage::default();
        self.budgets_over(frame, n).find_map(|(b, whose)| {
            let u = match whose {
                Whose::Stage(_) => stage_usage,
                Whose::Loop { key, .. } => all.get(key).unwrap_or(&nothing),
                Whose::Run => all.get("").unwrap_or(&nothing),
            };
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
            let what = self.whose_name(whose);
            Some((t, format!("the budget of {what} is spent ({spent})")))
        })
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
                self.shared.warn(text);
            }
        }
        Ok(())
    }
}

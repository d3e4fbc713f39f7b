//! What a template can see: which stages have run where, and which may have been skipped.

use std::collections::BTreeSet;

use petgraph::visit::{Bfs, Reversed};

use super::graph::{body_graph, route_targets};
use super::{Checked, StageId};
use crate::model::StageKind;

/// Where a template or expression is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// While a stage runs (its prompt, argv, condition).
    Stage(StageId),
    /// After an iteration of a loop's body (its `until` and `stuck` rule).
    BodyEnd(StageId),
    /// When a region starts (a for_each's `over`, a worktree's branch).
    Region(StageId),
}

impl Site {
    /// Returns the stage the site belongs to.
    pub fn stage(self) -> StageId {
        match self {
            Site::Stage(s) | Site::BodyEnd(s) | Site::Region(s) => s,
        }
    }
}

/// Returns every stage whose output is ready at a site.
pub fn upstream(c: &Checked<'_>, site: Site) -> BTreeSet<StageId> {
    let mut out = BTreeSet::new();
    let mut cur = match site {
        Site::Stage(s) | Site::Region(s) => s,
        Site::BodyEnd(l) => {
            for child in &c.info(l).children {
                add_with_body(c, *child, &mut out);
            }
            l
        }
    };
    loop {
        let region = c.info(cur).parent;
        let g = body_graph(c, region);
        if let Some(start) = g.node_indices().find(|n| g[*n] == cur) {
            let rev = Reversed(&g);
            let mut bfs = Bfs::new(rev, start);
            while let Some(n) = bfs.next(rev) {
                if n != start {
                    add_with_body(c, g[n], &mut out);
                }
            }
        }
        match region {
            Some(r) => cur = r,
            None => break,
        }
    }
    out
}

/// Adds a stage and, for loops and groups, the stages of its body (their latest outputs).
fn add_with_body(c: &Checked<'_>, id: StageId, out: &mut BTreeSet<StageId>) {
    out.insert(id);
    if matches!(
        c.info(id).stage.kind.value,
        StageKind::Loop | StageKind::Group
    ) {
        for child in &c.info(id).children {
            add_with_body(c, *child, out);
        }
    }
}

/// Tells whether a stage may be skipped in a run: it has a condition, is reached only by a
/// route or an escalation rule, sits in a body that may be skipped, or needs only stages that
/// may be skipped. Computed once for all stages by [`compute_conditional`].
pub fn conditional(c: &Checked<'_>, id: StageId) -> bool {
    c.conditional.get(id.0).copied().unwrap_or(false)
}

/// Computes [`conditional`] for every stage, as a fixpoint over needs and parents.
pub fn compute_conditional(c: &Checked<'_>) -> Vec<bool> {
    let n = c.stages.len();
    let mut targets = vec![false; n];
    for i in 0..n {
        for t in route_targets(c, StageId(i)) {
            targets[t.0] = true;
        }
    }
    let mut cond: Vec<bool> = (0..n)
        .map(|i| c.stages[i].stage.when.is_some() || targets[i] || is_escalated(c, StageId(i)))
        .collect();
    loop {
        let mut changed = false;
        for i in 0..n {
            if cond[i] {
                continue;
            }
            let info = &c.stages[i];
            let from_parent = info.parent.is_some_and(|p| cond[p.0]);
            let from_needs = !info.needs.is_empty() && info.needs.iter().all(|x| cond[x.0]);
            if from_parent || from_needs {
                cond[i] = true;
                changed = true;
            }
        }
        if !changed {
            return cond;
        }
    }
}

/// Tells whether some route of the same body goes to this stage.
pub fn is_route_target(c: &Checked<'_>, id: StageId) -> bool {
    c.body(c.info(id).parent)
        .iter()
        .any(|s| route_targets(c, *s).contains(&id))
}

/// Tells whether an escalation rule of the enclosing loop runs this stage.
pub fn is_escalated(c: &Checked<'_>, id: StageId) -> bool {
    let Some(parent) = c.info(id).parent else {
        return false;
    };
    match &c.info(parent).stage.body {
        crate::model::StageBody::Loop { escalation, .. } => {
            let name = &c.info(id).stage.id.value;
            escalation
                .iter()
                .any(|r| r.run.iter().any(|t| t.value == *name))
        }
        _ => false,
    }
}

/// Tells whether two stages share an enclosing loop (so one can read the other's history).
pub fn share_loop(c: &Checked<'_>, a: StageId, b: StageId) -> bool {
    let la: Vec<StageId> = c
        .ancestors(a)
        .into_iter()
        .filter(|x| c.info(*x).stage.kind.value == StageKind::Loop)
        .collect();
    let lb = c.ancestors(b);
    la.iter().any(|l| lb.contains(l))
        || (c.info(a).stage.kind.value == StageKind::Loop && lb.contains(&a))
}

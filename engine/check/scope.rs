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
        .map(|i| {
            c.stages[i].stage.keys().when.is_some() || targets[i] || is_escalated(c, StageId(i))
        })
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
    match c.info(parent).stage.body.as_loop() {
        Some(l) => {
            let name = &c.info(id).stage.id.value;
            l.escalation
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

/// Tells whether a stage may have been skipped when a site reads it: it may be skipped for a
/// reason inside the regions around the site (its condition, a route or escalation that
/// alone starts it, needs that may all be skipped, or such a reason of a region between it
/// and the site). A loop's own `when` does not make its body's outputs uncertain inside it.
pub fn maybe_skipped_at(c: &Checked<'_>, target: StageId, site: Site) -> bool {
    let mut around = c.ancestors(site.stage());
    if matches!(site, Site::BodyEnd(_) | Site::Region(_)) {
        around.push(site.stage());
    }
    let mut x = Some(target);
    while let Some(id) = x {
        if around.contains(&id) {
            return false;
        }
        if skipped_locally(c, id, &mut Vec::new()) {
            return true;
        }
        x = c.info(id).parent;
    }
    false
}

/// Tells whether a stage may be skipped within its own body.
fn skipped_locally(c: &Checked<'_>, id: StageId, seen: &mut Vec<StageId>) -> bool {
    if seen.contains(&id) {
        return false; // a cycle, reported on its own
    }
    seen.push(id);
    let info = c.info(id);
    info.stage.keys().when.is_some()
        || is_route_target(c, id)
        || is_escalated(c, id)
        || (!info.needs.is_empty() && info.needs.iter().all(|n| skipped_locally(c, *n, seen)))
}

/// Tells whether a stage can run only after `target` ran: it is `target`, every stage it
/// needs runs only after `target` ran (a stage whose needs were all skipped is skipped), or
/// its enclosing region does.
pub fn runs_only_after(c: &Checked<'_>, at: StageId, target: StageId) -> bool {
    fn go(c: &Checked<'_>, at: StageId, target: StageId, depth: usize) -> bool {
        if at == target {
            return true;
        }
        if depth > c.stages.len() {
            return false; // a cycle, reported on its own
        }
        let info = c.info(at);
        (!info.needs.is_empty() && info.needs.iter().all(|n| go(c, *n, target, depth + 1)))
            || info.parent.is_some_and(|p| go(c, p, target, depth + 1))
    }
    go(c, at, target, 0)
}

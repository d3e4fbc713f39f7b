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
/// route or an escalation rule, or needs only stages that may be skipped.
pub fn conditional(c: &Checked<'_>, id: StageId) -> bool {
    let mut seen = BTreeSet::new();
    conditional_inner(c, id, &mut seen)
}

fn conditional_inner(c: &Checked<'_>, id: StageId, seen: &mut BTreeSet<StageId>) -> bool {
    if !seen.insert(id) {
        return false;
    }
    let info = c.info(id);
    if info.stage.when.is_some() || is_route_target(c, id) || is_escalated(c, id) {
        return true;
    }
    if let Some(p) = info.parent {
        if conditional_inner(c, p, seen) {
            return true;
        }
    }
    !info.needs.is_empty() && info.needs.iter().all(|n| conditional_inner(c, *n, seen))
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

//! Graph checks: no dependency cycles outside loops, and no stage that can never run.

use petgraph::algo::tarjan_scc;
use petgraph::graph::DiGraph;

use super::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::Action;

/// Builds the dependency graph of one body: an edge from each need (and each routing stage)
/// to the stage that waits for it.
pub fn body_graph(c: &Checked<'_>, region: Option<StageId>) -> DiGraph<StageId, ()> {
    let body = c.body(region);
    let mut g = DiGraph::new();
    let nodes: Vec<_> = body.iter().map(|id| g.add_node(*id)).collect();
    let index = |id: StageId| body.iter().position(|b| *b == id);
    for (i, id) in body.iter().enumerate() {
        for need in &c.info(*id).needs {
            if let Some(j) = index(*need) {
                g.add_edge(nodes[j], nodes[i], ());
            }
        }
        for target in route_targets(c, *id) {
            if let Some(j) = index(target) {
                if j != i {
                    g.add_edge(nodes[i], nodes[j], ());
                }
            }
        }
    }
    g
}

/// Returns the stages a stage's route can go to.
pub fn route_targets(c: &Checked<'_>, id: StageId) -> Vec<StageId> {
    let Some(route) = &c.info(id).stage.route else {
        return Vec::new();
    };
    route
        .cases
        .iter()
        .map(|(_, a)| a)
        .chain(route.default.iter())
        .filter_map(|a| match &a.value {
            Action::Goto(t) => c.find(t),
            _ => None,
        })
        .collect()
}

pub fn check(c: &Checked<'_>, diags: &mut Diagnostics) {
    let mut regions = vec![None];
    regions.extend(
        (0..c.stages.len())
            .map(StageId)
            .filter(|id| c.info(*id).stage.kind.value.is_region())
            .map(Some),
    );
    for region in regions {
        let g = body_graph(c, region);
        for scc in tarjan_scc(&g) {
            if scc.len() < 2 {
                continue;
            }
            let mut ids: Vec<StageId> = scc.iter().map(|n| g[*n]).collect();
            ids.sort();
            let names: Vec<&str> = ids
                .iter()
                .map(|id| c.info(*id).stage.id.value.as_str())
                .collect();
            let first = c.info(ids[0]).stage;
            let mut d = Diagnostic::new(
                Code::Cycle,
                first.id.span,
                format!("stages {} depend on each other in a cycle", names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")),
            )
            .label("part of the cycle")
            .help("iteration belongs in a loop: put these stages in a `kind = \"loop\"` stage with max_iterations, and remove the edge that goes back");
            for id in &ids[1..] {
                d = d.related(c.info(*id).stage.id.span, "also in the cycle");
            }
            diags.push(d);
        }
    }
    let mut never = vec![false; c.stages.len()];
    for (i, info) in c.stages.iter().enumerate() {
        let Some(when) = &info.stage.when else {
            continue;
        };
        if is_constant_false(&when.value) {
            never[i] = true;
            diags.push(
                Diagnostic::new(
                    Code::Unreachable,
                    when.span,
                    format!(
                        "stage `{}` can never run: its condition is always false",
                        info.stage.id.value
                    ),
                )
                .help("remove the stage or fix the condition"),
            );
        }
    }
    // A stage whose needs can all never run can never run either (skips propagate).
    loop {
        let mut changed = false;
        for (i, info) in c.stages.iter().enumerate() {
            if !never[i] && !info.needs.is_empty() && info.needs.iter().all(|n| never[n.0]) {
                never[i] = true;
                changed = true;
                diags.push(
                    Diagnostic::new(
                        Code::Unreachable,
                        info.stage.id.span,
                        format!(
                            "stage `{}` can never run: every stage it needs is never run",
                            info.stage.id.value
                        ),
                    )
                    .help("fix the conditions of the stages it needs"),
                );
            }
        }
        if !changed {
            break;
        }
    }
}

fn is_constant_false(expr: &str) -> bool {
    let env = minijinja::Environment::new();
    let Ok(e) = env.compile_expression(expr) else {
        return false;
    };
    if !e.undeclared_variables(false).is_empty() {
        return false;
    }
    e.eval(()).is_ok_and(|v| !v.is_true())
}

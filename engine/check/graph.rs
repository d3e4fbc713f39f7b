//! Graph checks: no dependency cycles outside loops, and no stage that can never run.

use petgraph::algo::kosaraju_scc;
use petgraph::graph::DiGraph;

use super::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::Action;

/// Builds the dependency graph of one body: an edge from each need (and each routing stage)
/// to the stage that waits for it.
pub(super) fn body_graph(c: &Checked<'_>, region: Option<StageId>) -> DiGraph<StageId, ()> {
    let body = c.body(region);
    let mut g = DiGraph::new();
    let nodes: Vec<_> = body.iter().map(|id| g.add_node(*id)).collect();
    // A stage's place in the body by a map, not a search of the body per need: that made
    // a chain quadratic (2.5% of a 10,000-stage run, most of `check` at 100,000).
    let places: std::collections::HashMap<StageId, usize> =
        body.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let index = |id: StageId| places.get(&id).copied();
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
/// Returns the stages a stage's route can go to, and those it runs when it gives up (a
/// loop's `on_exhausted` or `stuck.then`, a gate's `on_timeout` naming a stage): both run
/// only when chosen.
pub(super) fn route_targets(c: &Checked<'_>, id: StageId) -> Vec<StageId> {
    let stage = c.info(id).stage;
    let routes = stage
        .keys()
        .route
        .iter()
        .flat_map(|r| r.cases.iter().map(|(_, a)| a).chain(r.default.iter()));
    routes
        .chain(stage.give_up_targets().into_iter().map(|(_, a)| a))
        .filter_map(|a| match &a.value {
            Action::Goto(t) => c.find(t),
            _ => None,
        })
        .collect()
}

pub(super) fn check(c: &Checked<'_>, diags: &mut Diagnostics) {
    let mut regions = vec![None];
    regions.extend(
        (0..c.stages.len())
            .map(StageId)
            .filter(|id| c.info(*id).stage.kind().value.is_region())
            .map(Some),
    );
    for region in regions {
        let g = body_graph(c, region);
        // Kosaraju's walk keeps its own stack: Tarjan's recursion overflowed the thread's stack
        // on a chain of 100,000 stages.
        for scc in kosaraju_scc(&g) {
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
                format!(
                    "stages {} depend on each other in a cycle",
                    names
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
            .label("part of the cycle");
            d = match region.map(|r| c.info(r).stage) {
                Some(r) if r.kind().value == crate::model::StageKind::Loop => d.help(format!(
                    "the body of loop `{}` runs once per iteration and must itself be acyclic: remove the edge that goes back; the loop already repeats the body (read the previous iteration with `stages.NAME.last`)",
                    r.id.value
                )),
                Some(r) => d.help(format!(
                    "the body of `{}` must be acyclic: remove the edge that goes back",
                    r.id.value
                )),
                None => d.help_syntax(
                    "iteration belongs in a loop: put these stages in a `kind = \"loop\"` stage with max_iterations, and remove the edge that goes back",
                    "iteration belongs in a loop: put these stages in a `kind=\"loop\"` stage with max_iterations, and remove the edge that goes back",
                ),
            };
            for id in &ids[1..] {
                d = d.related(c.info(*id).stage.id.span, "also in the cycle");
            }
            if let Some((span, label)) = closing_edge(c, &ids) {
                d = d.related(span, label);
            }
            diags.push(d);
        }
    }
    let mut never = vec![false; c.stages.len()];
    for (i, info) in c.stages.iter().enumerate() {
        let Some(when) = &info.stage.keys().when else {
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
    // A condition that the enclosing loop's literal bound makes false on every iteration.
    for (i, info) in c.stages.iter().enumerate() {
        if never[i] {
            continue;
        }
        let Some(when) = &info.stage.keys().when else {
            continue;
        };
        let Some((l, max)) = literal_loop_bound(c, StageId(i)) else {
            continue;
        };
        if false_on_every_iteration(&when.value, max) {
            never[i] = true;
            diags.push(
                Diagnostic::new(
                    Code::Unreachable,
                    when.span,
                    format!(
                        "stage `{}` can never run: its condition is false on every iteration of loop `{}` (iterations 1 to {max})",
                        info.stage.id.value,
                        c.info(l).stage.id.value
                    ),
                )
                .label("false for every iteration")
                .help("fix the condition, or raise the loop's max_iterations"),
            );
        }
    }
    // A stage that needs a stage whose every route leaves (the run, the loop or the
    // iteration) never runs: the frame ends before its needs settle.
    for (i, info) in c.stages.iter().enumerate() {
        if never[i] {
            continue;
        }
        let Some((need, span, how)) = info.needs.iter().enumerate().find_map(|(k, n)| {
            // The walk of `needs_reach` costs the size of the graph: only for the rare stage
            // whose every route leaves (a chain of thousands would otherwise check in
            // quadratic time).
            let how = always_leaves(c.info(*n).stage)?;
            if needs_reach(c, *n, StageId(i)) {
                return None; // a cycle, reported as such
            }
            Some((*n, info.stage.needs.get(k)?.span, how))
        }) else {
            continue;
        };
        never[i] = true;
        let need_stage = c.info(need).stage;
        let mut d = Diagnostic::new(
            Code::Unreachable,
            span,
            format!(
                "stage `{}` can never run: `{}`, which it needs, {how}",
                info.stage.id.value, need_stage.id.value
            ),
        )
        .label("needed here");
        if let Some(r) = &need_stage.keys().route {
            d = d.related(r.span, "every route leaves");
        }
        diags.push(d.help(format!(
            "route one of the cases of `{}` to this stage instead of needing it, or remove the stage",
            need_stage.id.value
        )));
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

/// Finds the entry that closes a cycle (of stages `ids`, in file order): the first `needs`
/// entry naming a stage written after its own, or route to a stage written before its own.
fn closing_edge(c: &Checked<'_>, ids: &[StageId]) -> Option<(crate::source::Span, String)> {
    for (i, id) in ids.iter().enumerate() {
        let stage = c.info(*id).stage;
        for need in &stage.needs {
            if let Some(j) = c
                .find(&need.value)
                .and_then(|t| ids.iter().position(|x| *x == t))
            {
                if j > i {
                    return Some((
                        need.span,
                        format!(
                            "`{}` needs `{}`: this closes the cycle",
                            stage.id.value, need.value
                        ),
                    ));
                }
            }
        }
        if let Some(route) = &stage.keys().route {
            let actions = route
                .cases
                .iter()
                .map(|(_, a)| a)
                .chain(route.default.iter());
            for a in actions {
                let Action::Goto(t) = &a.value else { continue };
                if let Some(j) = c.find(t).and_then(|t| ids.iter().position(|x| *x == t)) {
                    if j <= i {
                        return Some((
                            a.span,
                            format!(
                                "`{}` routes back to `{t}`: this closes the cycle",
                                stage.id.value
                            ),
                        ));
                    }
                }
            }
        }
    }
    None
}

/// Tells how a stage's route always leaves its frame, when every case and the default (or
/// the failure of an unmatched value) end the run, the loop or the iteration.
fn always_leaves(stage: &crate::model::Stage) -> Option<&'static str> {
    let route = stage.keys().route.as_ref()?;
    let actions: Vec<&Action> = route
        .cases
        .iter()
        .map(|(_, a)| &a.value)
        .chain(route.default.iter().map(|a| &a.value))
        .collect();
    if actions.is_empty()
        || !actions.iter().all(|a| {
            matches!(
                a,
                Action::Exit(_) | Action::Break | Action::Continue | Action::Fail
            )
        })
    {
        return None;
    }
    let all = |f: fn(&Action) -> bool| actions.iter().all(|a| f(a));
    Some(if all(|a| matches!(a, Action::Exit(_))) {
        "always ends the run (every route is `exit:`)"
    } else if all(|a| matches!(a, Action::Break)) {
        "always leaves the loop (every route is `break`)"
    } else if all(|a| matches!(a, Action::Continue)) {
        "always starts the next iteration (every route is `continue`)"
    } else {
        "always leaves (every route exits, fails, breaks or continues)"
    })
}

/// Tells whether `from` needs `to`, directly or through other needs.
fn needs_reach(c: &Checked<'_>, from: StageId, to: StageId) -> bool {
    let mut seen = vec![false; c.stages.len()];
    let mut stack = vec![from];
    while let Some(x) = stack.pop() {
        if x == to {
            return true;
        }
        if !std::mem::replace(&mut seen[x.0], true) {
            stack.extend(c.info(x).needs.iter().copied());
        }
    }
    false
}

/// Returns the innermost loop around a stage and its `max_iterations`, when that is a literal.
fn literal_loop_bound(c: &Checked<'_>, id: StageId) -> Option<(StageId, u64)> {
    let l = c.enclosing_loop(id)?;
    match c.info(l).stage.body.as_loop() {
        Some(crate::model::LoopBody {
            max_iterations: Some(m),
            ..
        }) => match m.value {
            crate::model::Count::Literal(n) if (1..=10_000).contains(&n) => Some((l, n)),
            _ => None,
        },
        _ => None,
    }
}

/// Tells whether a condition over `iteration` and `max_iterations` only (and literals) is
/// false for every iteration from 1 to `max`.
fn false_on_every_iteration(expr: &str, max: u64) -> bool {
    let env = minijinja::Environment::new();
    let Ok(e) = env.compile_expression(expr) else {
        return false;
    };
    let vars = e.undeclared_variables(false);
    if !vars.contains("iteration")
        || vars
            .iter()
            .any(|v| v != "iteration" && v != "max_iterations")
    {
        return false;
    }
    (1..=max).all(|i| {
        e.eval(minijinja::context! { iteration => i, max_iterations => max })
            .is_ok_and(|v| !v.is_true())
    })
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

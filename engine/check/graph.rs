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
            // Reported at the edge that closes the cycle, the other edges of the cycle shown
            // beside it: the entries to change are the edges, not the stages.
            let mut edges = cycle_edges(c, &ids);
            let closing = edges.iter().position(|e| e.closes).unwrap_or(0);
            let (span, label) = if edges.is_empty() {
                (
                    c.info(ids[0]).stage.id.span,
                    "part of the cycle".to_string(),
                )
            } else {
                let e = edges.remove(closing);
                (e.span, format!("{}: this closes the cycle", e.label))
            };
            let mut d = Diagnostic::new(
                Code::Cycle,
                span,
                format!(
                    "stages {} depend on each other in a cycle",
                    names
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
            .label(label);
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
            for e in edges {
                d = d.related(e.span, e.label);
            }
            diags.push(d);
        }
    }
    let mut never = vec![false; c.stages.len()];
    // Where each stage that never runs says why (its `when`, or the `needs` entry).
    let mut why: Vec<Option<crate::source::Span>> = vec![None; c.stages.len()];
    for (i, info) in c.stages.iter().enumerate() {
        let Some(when) = &info.stage.keys().when else {
            continue;
        };
        if is_constant_false(&when.value) {
            never[i] = true;
            why[i] = Some(when.span);
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
    // A condition that the enclosing loop's bound makes false on every iteration (iterations
    // count from 1), the bound and the params as they are in force.
    for (i, info) in c.stages.iter().enumerate() {
        if never[i] {
            continue;
        }
        let Some(when) = &info.stage.keys().when else {
            continue;
        };
        let Some((l, max)) = loop_bound(c, StageId(i)) else {
            continue;
        };
        let Some(reads_params) = false_on_every_iteration(&when.value, max, &c.params) else {
            continue;
        };
        never[i] = true;
        why[i] = Some(when.span);
        let lp = c.info(l).stage;
        let bound = match lp.body.as_loop().and_then(|b| b.max_iterations.as_ref()) {
            // A literal bound is in the message already; a template's value is shown where
            // it is written.
            Some(m) if matches!(m.value, crate::model::Count::Template(_)) => Some((
                m.span,
                format!("max_iterations is {max} with the params in force"),
            )),
            _ => None,
        };
        let params_note = if reads_params || bound.is_some() {
            ", with the params in force (their defaults and --set values)"
        } else {
            ""
        };
        let mut d = Diagnostic::new(
            Code::Unreachable,
            when.span,
            format!(
                "stage `{}` can never run: its condition is false on every iteration of loop `{}` (iterations 1 to {max}){params_note}",
                info.stage.id.value, lp.id.value
            ),
        )
        .label("false for every iteration");
        if let Some((span, label)) = bound {
            d = d.related(span, label);
        }
        diags.push(d.help(iteration_help(&when.value, max, &c.params)));
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
        why[i] = Some(span);
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
    // A stage whose needs can all never run can never run either (skips propagate): reported
    // at its `needs` entries, each beside what makes that stage never run.
    loop {
        let mut changed = false;
        for (i, info) in c.stages.iter().enumerate() {
            if never[i] || info.needs.is_empty() || !info.needs.iter().all(|n| never[n.0]) {
                continue;
            }
            never[i] = true;
            changed = true;
            let entries: Vec<(&crate::model::Text, StageId)> = info
                .stage
                .needs
                .iter()
                .filter_map(|t| Some((t, c.find(&t.value)?)))
                .collect();
            let names: Vec<String> = entries
                .iter()
                .map(|(t, _)| format!("`{}`", t.value))
                .collect();
            let span = entries.first().map_or(info.stage.id.span, |(t, _)| t.span);
            why[i] = Some(span);
            let what = match names.as_slice() {
                [one] => format!("the only stage it needs, {one}, never runs"),
                _ => format!("no stage it needs ({}) ever runs", names.join(", ")),
            };
            let mut d = Diagnostic::new(
                Code::Unreachable,
                span,
                format!("stage `{}` can never run: {what}", info.stage.id.value),
            )
            .label(entries.first().map_or_else(
                || "never runs".to_string(),
                |(t, _)| format!("`{}` never runs", t.value),
            ));
            for (k, (t, n)) in entries.iter().enumerate() {
                if k > 0 {
                    d = d.related(t.span, format!("`{}` never runs either", t.value));
                }
                if let Some(w) = why[n.0] {
                    d = d.related(w, format!("why `{}` never runs", t.value));
                }
            }
            diags.push(d.help("fix the conditions of the stages it needs, or remove the stage"));
        }
        if !changed {
            break;
        }
    }
}

/// One edge of a dependency cycle, where it is written.
struct Edge {
    span: crate::source::Span,
    label: String,
    /// Whether it closes the cycle: a `needs` entry naming a stage written after its own, or
    /// a route (or give-up target) to a stage written before its own or to itself.
    closes: bool,
}

/// Returns the edges between the stages `ids` (a cycle's, in file order): their `needs`
/// entries, routes and give-up targets naming each other, in file order.
fn cycle_edges(c: &Checked<'_>, ids: &[StageId]) -> Vec<Edge> {
    let place = |name: &str| c.find(name).and_then(|t| ids.iter().position(|x| *x == t));
    let mut edges = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let stage = c.info(*id).stage;
        for need in &stage.needs {
            if let Some(j) = place(&need.value) {
                edges.push(Edge {
                    span: need.span,
                    label: format!("`{}` needs `{}`", stage.id.value, need.value),
                    closes: j > i,
                });
            }
        }
        let routes = stage.keys().route.iter().flat_map(|r| {
            r.cases
                .iter()
                .map(|(_, a)| (a, "routes to"))
                .chain(r.default.iter().map(|a| (a, "routes to")))
        });
        let give_up = stage
            .give_up_targets()
            .into_iter()
            .map(|(_, a)| (a, "runs when it gives up"));
        for (a, how) in routes.chain(give_up) {
            let Action::Goto(t) = &a.value else { continue };
            if let Some(j) = place(t) {
                edges.push(Edge {
                    span: a.span,
                    label: format!("`{}` {how} `{t}`", stage.id.value),
                    closes: j <= i,
                });
            }
        }
    }
    edges
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

/// Returns the innermost loop around a stage and its `max_iterations`: a literal, or a
/// template over params rendered with the params in force.
fn loop_bound(c: &Checked<'_>, id: StageId) -> Option<(StageId, u64)> {
    let l = c.enclosing_loop(id)?;
    let m = c.info(l).stage.body.as_loop()?.max_iterations.as_ref()?;
    let n = crate::params::resolve_count(&m.value, &c.params).ok()?;
    (1..=10_000).contains(&n).then_some((l, n))
}

/// Tells whether a condition over `iteration`, `max_iterations`, params and literals only is
/// false for every iteration from 1 to `max`; when it is, says whether it reads params.
fn false_on_every_iteration(
    expr: &str,
    max: u64,
    params: &crate::params::ParamValues,
) -> Option<bool> {
    let env = minijinja::Environment::new();
    let e = env.compile_expression(expr).ok()?;
    let vars = e.undeclared_variables(false);
    if !vars.contains("iteration")
        || vars
            .iter()
            .any(|v| !matches!(v.as_str(), "iteration" | "max_iterations" | "params"))
    {
        return None;
    }
    let reads_params = vars.contains("params");
    if reads_params {
        // A param without a value (required, not set) leaves the condition undecided.
        for v in e.undeclared_variables(true) {
            if let Some(name) = v.strip_prefix("params.") {
                let name = name.split('.').next().unwrap_or(name);
                if !params.contains_key(name) {
                    return None;
                }
            }
        }
    }
    let params = minijinja::Value::from(minijinja::value::Serde(params));
    (1..=max)
        .all(|i| {
            e.eval(minijinja::context! { iteration => i, max_iterations => max, params => params.clone() })
                .is_ok_and(|v| !v.is_true())
        })
        .then_some(reads_params)
}

/// Advice for a condition false on every iteration: where it would hold, when it holds at
/// iteration 0 (iterations count from 1) or after the last iteration.
fn iteration_help(expr: &str, max: u64, params: &crate::params::ParamValues) -> String {
    let env = minijinja::Environment::new();
    let Ok(e) = env.compile_expression(expr) else {
        return "fix the condition: `iteration` counts from 1 to max_iterations".to_string();
    };
    let params = minijinja::Value::from(minijinja::value::Serde(params));
    let holds = |i: u64| {
        e.eval(minijinja::context! {
            iteration => i,
            max_iterations => max,
            params => params.clone(),
        })
        .is_ok_and(|v| v.is_true())
    };
    if holds(0) {
        return "iterations count from 1: the first iteration is `iteration == 1`".to_string();
    }
    let reads_max = expr.contains("max_iterations");
    match (max + 1..=max.saturating_add(10_000)).find(|i| holds(*i)) {
        Some(n) if !reads_max => format!(
            "it holds only from iteration {n} on: raise the loop's max_iterations to at least {n}, or fix the condition"
        ),
        _ => "fix the condition: `iteration` counts from 1 to max_iterations".to_string(),
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

#[cfg(test)]
mod tests {
    use crate::diag::Code;

    /// Checks a workflow held in memory; returns each diagnostic of `code` as
    /// `line:col label`, in order, with its related places as `line:col label` too.
    fn placed(name: &str, text: &str, code: Code) -> Vec<(String, Vec<String>)> {
        let path = std::env::temp_dir().join(name);
        let fs = crate::fs::MemFs::new([(path.clone(), text.to_string())]);
        let mut sources = crate::source::Sources::new();
        let mut diags = crate::diag::Diagnostics::default();
        let mut loader = crate::load::Loader::new(&fs, &mut sources, &mut diags);
        let wf = loader.load(&path, None).expect("the workflow loads");
        let mut found = crate::diag::Diagnostics::default();
        let _ = crate::check::check(&wf, &mut loader, &[], false, &mut found);
        let at = |span: crate::source::Span, label: &str| {
            let (line, col) = sources.get(span.file).line_col(span.start as usize);
            format!("{line}:{col} {label}")
        };
        found
            .into_sorted()
            .into_iter()
            .filter(|d| d.code == code)
            .map(|d| {
                let span = d.span.expect("a place");
                (
                    at(span, d.label.as_deref().unwrap_or("")),
                    d.related.iter().map(|(s, l)| at(*s, l)).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_cycle_is_reported_at_the_entry_that_closes_it() {
        let toml = r#"name = "w"

[stages.a]
kind = "command"
needs = ["c"]
argv = ["./a.sh"]

[stages.b]
kind = "command"
needs = ["a"]
argv = ["./b.sh"]

[stages.c]
kind = "command"
needs = ["b"]
argv = ["./c.sh"]
"#;
        let found = placed("rf020-needs.toml", toml, Code::Cycle);
        assert_eq!(found.len(), 1, "{found:?}");
        let (primary, related) = &found[0];
        assert_eq!(primary, "5:10 `a` needs `c`: this closes the cycle");
        assert_eq!(related, &["10:10 `b` needs `a`", "15:10 `c` needs `b`"]);

        let kdl = r##"name "w"
stage "draft" kind="command" {
    argv "./draft.sh"
}
stage "critique" kind="command" {
    needs "draft"
    argv "./critique.sh"
    output extract="regex" pattern=#"(?P<verdict>\w+)"#
    route on="verdict" default="exit:success" {
        cases redo="draft"
    }
}
"##;
        let found = placed("rf020-route.kdl", kdl, Code::Cycle);
        assert_eq!(found.len(), 1, "{found:?}");
        let (primary, related) = &found[0];
        assert!(
            primary.starts_with("10:15 `critique` routes to `draft`: this closes the cycle"),
            "{primary}"
        );
        assert_eq!(related, &["6:11 `critique` needs `draft`"]);
    }

    #[test]
    fn a_stage_that_never_runs_is_reported_at_what_makes_it_so() {
        let toml = r#"name = "w"

[stages.legacy]
kind = "command"
when = "false"
argv = ["./legacy.sh"]

[stages.after]
kind = "command"
needs = ["legacy"]
argv = ["./after.sh"]

[stages.rounds]
kind = "loop"
max_iterations = 3
until = "stages.review.output.exit_code == 0"

[stages.rounds.stages.review]
kind = "command"
argv = ["./review.sh"]

[stages.rounds.stages.deep]
kind = "command"
when = "iteration == 0"
argv = ["./deep.sh"]
"#;
        let found = placed("rf021.toml", toml, Code::Unreachable);
        let primaries: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            primaries,
            [
                "5:8 ",
                "10:10 `legacy` never runs",
                "24:8 false for every iteration"
            ]
        );
        assert_eq!(found[1].1, ["5:8 why `legacy` never runs"]);
        assert!(found[2].1.is_empty(), "{:?}", found[2].1);
    }
}

//! Drawing a plan as Mermaid or Graphviz DOT: loops and fan-outs as clusters, gates as
//! distinct shapes, routes and conditions on edges.

use std::fmt::Write;

use super::{Body, Edge, NodeId, Plan, Target};
use crate::model::{StageBody, StageKind};

/// Output formats of `ralph-flow graph`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphFormat {
    Mermaid,
    Dot,
}

/// Renders a plan in the given format.
pub fn render(plan: &Plan, format: GraphFormat) -> String {
    match format {
        GraphFormat::Mermaid => draw(plan, &Mermaid),
        GraphFormat::Dot => draw(plan, &Dot),
    }
}

fn ident(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The title of a region (loop, for_each, group) as drawings show it.
pub fn region_label(plan: &Plan, id: NodeId) -> String {
    let s = plan.stage(id);
    match &s.body {
        StageBody::Loop(l) => {
            let crate::model::LoopBody {
                max_iterations,
                until,
                ..
            } = &**l;
            let max = max_iterations
                .as_ref()
                .map_or("?".into(), |m| plan.count_text(&m.value));
            let until = until
                .as_ref()
                .map(|u| format!(" until {}", u.value))
                .unwrap_or_default();
            format!("loop {} (at most {max}){until}", s.id.value)
        }
        StageBody::ForEach(f) => {
            let crate::model::ForEachBody {
                over,
                max_concurrency,
                ..
            } = &**f;
            let over = over.as_ref().map_or(String::new(), |o| o.value.clone());
            let conc = max_concurrency.as_ref().map_or(String::new(), |m| {
                format!(", {} at once", plan.count_text(&m.value))
            });
            format!("for each in {over}{conc}: {}", s.id.value)
        }
        _ => format!("group {}", s.id.value),
    }
}

/// The label of a stage as drawings show it: its id, then what it runs, then the resource it holds.
pub fn node_label(plan: &Plan, id: NodeId) -> String {
    let s = plan.stage(id);
    let detail = match &s.body {
        StageBody::Agent { agent, .. } => agent.as_ref().map_or("agent".into(), |a| {
            let name = if a.value.contains("{{") {
                crate::params::render_params(&a.value, &plan.params)
                    .unwrap_or_else(|_| a.value.clone())
            } else {
                a.value.clone()
            };
            format!("agent: {name}")
        }),
        StageBody::Command(c) => format!("$ {}", c.display()),
        StageBody::Check {
            command, expect, ..
        } => match (command, expect) {
            (Some(c), _) => format!("check $ {}", c.display()),
            (None, Some(e)) => format!("check {}", e.value),
            _ => "check".into(),
        },
        StageBody::Gate { .. } => "human approval".into(),
        StageBody::Subflow { workflow, .. } => format!(
            "subflow {}",
            workflow.as_ref().map_or("", |w| w.value.as_str())
        ),
        _ => String::new(),
    };
    let mut label = s.id.value.clone();
    if !detail.is_empty() {
        label.push('\n');
        label.push_str(&truncate(&detail, 60));
    }
    if let Some(r) = &s.keys().resource {
        let _ = write!(label, "\nholds {}", r.value);
    }
    if s.keys().is_optional() {
        label.push_str("\noptional");
    }
    label
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

fn target_name(plan: &Plan, t: &Target) -> Option<String> {
    match t {
        Target::Exit(e) => Some(format!("exit_{}", ident(&plan.exits[*e].name))),
        _ => None,
    }
}

/// The label of a need's edge into `b`: its `when`, or that a skip spreads along it (`b` is
/// skipped when all its needs are), or nothing.
pub fn needs_label(plan: &Plan, b: NodeId) -> String {
    match &plan.stage(b).keys().when {
        Some(w) => format!("when {}", w.value),
        None if plan.node(b).skips_with_needs => "skipped with it".to_string(),
        None => String::new(),
    }
}

/// Every edge to draw, as (from, to, label, dashed).
fn edges(plan: &Plan) -> Vec<(String, String, String, bool)> {
    let mut out = Vec::new();
    let entry = |id: NodeId| {
        if plan.node(id).body.is_some() {
            format!("{}__entry", ident(&plan.node(id).name))
        } else {
            ident(&plan.node(id).name)
        }
    };
    let mut bodies: Vec<&Body> = vec![&plan.top];
    bodies.extend(plan.nodes.iter().filter_map(|n| n.body.as_deref()));
    for body in bodies {
        for e in body.graph.edge_indices() {
            let Some((a, b)) = body.graph.edge_endpoints(e) else {
                continue;
            };
            let (a, b) = (body.graph[a], body.graph[b]);
            let label = match &body.graph[e] {
                Edge::Needs => needs_label(plan, b),
                Edge::Route(values) => values.join(" | "),
            };
            out.push((entry(a), entry(b), label, false));
        }
    }
    for (i, node) in plan.nodes.iter().enumerate() {
        let id = NodeId(i);
        let from = entry(id);
        let mut actions: Vec<(String, &Target)> =
            node.routes().iter().map(|(k, t)| (k.clone(), t)).collect();
        if let Some(d) = node.route_default() {
            actions.push(("*".into(), d));
        }
        let s = plan.stage(id);
        if s.keys().on_fail.is_some() || node.kind == StageKind::Check {
            actions.push(("fail".into(), &node.on_fail));
        }
        if s.keys().on_error.is_some() {
            actions.push(("error".into(), &node.on_error));
        }
        for (label, t) in actions {
            match t {
                Target::Exit(_) => out.push((
                    from.clone(),
                    target_name(plan, t).unwrap_or_default(),
                    label,
                    true,
                )),
                Target::Continue => {
                    if let Some(l) = plan
                        .nodes
                        .iter()
                        .enumerate()
                        .find(|(j, n)| n.kind == StageKind::Loop && is_inside(plan, id, NodeId(*j)))
                        .map(|(j, _)| j)
                    {
                        out.push((
                            from.clone(),
                            entry(NodeId(l)),
                            format!("{label}: next iteration"),
                            true,
                        ));
                    }
                }
                _ => {}
            }
        }
        if let Some(crate::model::LoopBody {
            on_exhausted: Some(a),
            ..
        }) = s.body.as_loop()
        {
            if let crate::model::Action::Exit(n) = &a.value {
                out.push((
                    from.clone(),
                    format!("exit_{}", ident(n)),
                    "exhausted".into(),
                    true,
                ));
            }
        }
        if let Some(crate::model::LoopBody {
            stuck: Some(st), ..
        }) = s.body.as_loop()
        {
            if let Some(crate::model::Action::Exit(n)) = st.then.as_ref().map(|t| &t.value) {
                out.push((
                    from.clone(),
                    format!("exit_{}", ident(n)),
                    "stuck".into(),
                    true,
                ));
            }
        }
        if let StageBody::Gate {
            on_reject: Some(a), ..
        } = &s.body
        {
            if let crate::model::Action::Exit(n) = &a.value {
                out.push((
                    from.clone(),
                    format!("exit_{}", ident(n)),
                    "rejected".into(),
                    true,
                ));
            }
        }
    }
    out
}

/// Tells whether `id` is (transitively) in the body of `region`, taking the innermost loop.
fn is_inside(plan: &Plan, id: NodeId, region: NodeId) -> bool {
    let mut cur = plan.node(id).parent;
    while let Some(p) = cur {
        if plan.node(p).kind == StageKind::Loop {
            return p == region;
        }
        cur = plan.node(p).parent;
    }
    false
}

fn used_exits(plan: &Plan, edges: &[(String, String, String, bool)]) -> Vec<usize> {
    (0..plan.exits.len())
        .filter(|e| {
            edges
                .iter()
                .any(|(_, to, _, _)| *to == format!("exit_{}", ident(&plan.exits[*e].name)))
        })
        .collect()
}

/// One drawing syntax: how each piece of the plan is written. [`draw`] walks the plan once
/// for every syntax.
trait Syntax {
    fn header(&self, plan: &Plan, out: &mut String);
    fn open_region(&self, pad: &str, name: &str, kind: StageKind, label: &str, out: &mut String);
    fn close_region(&self, pad: &str, out: &mut String);
    fn node(&self, pad: &str, name: &str, kind: StageKind, label: &str, out: &mut String);
    fn exit(&self, name: &str, label: &str, code: i64, out: &mut String);
    fn edge(&self, from: &str, to: &str, label: &str, dashed: bool, out: &mut String);
    fn footer(&self, out: &mut String);
}

fn draw(plan: &Plan, syntax: &impl Syntax) -> String {
    fn body(
        plan: &Plan,
        region: Option<NodeId>,
        depth: usize,
        syntax: &impl Syntax,
        out: &mut String,
    ) {
        let pad = "  ".repeat(depth);
        for id in &plan.body(region).order {
            let n = plan.node(*id);
            let name = ident(&n.name);
            if n.body.is_some() {
                syntax.open_region(&pad, &name, n.kind, &region_label(plan, *id), out);
                body(plan, Some(*id), depth + 1, syntax, out);
                syntax.close_region(&pad, out);
            } else {
                syntax.node(&pad, &name, n.kind, &node_label(plan, *id), out);
            }
        }
    }
    let mut out = String::new();
    syntax.header(plan, &mut out);
    body(plan, None, 1, syntax, &mut out);
    let edges = edges(plan);
    for e in used_exits(plan, &edges) {
        let x = &plan.exits[e];
        syntax.exit(&ident(&x.name), &x.name, x.code, &mut out);
    }
    for (from, to, label, dashed) in &edges {
        syntax.edge(from, to, label, *dashed, &mut out);
    }
    syntax.footer(&mut out);
    out
}

fn mermaid_text(s: &str) -> String {
    s.replace('"', "#quot;").replace('\n', "<br/>")
}

struct Mermaid;

impl Syntax for Mermaid {
    fn header(&self, _: &Plan, out: &mut String) {
        out.push_str("flowchart TD\n");
    }

    fn open_region(&self, pad: &str, name: &str, _: StageKind, label: &str, out: &mut String) {
        let _ = writeln!(out, "{pad}subgraph {name}[\"{}\"]", mermaid_text(label));
        let _ = writeln!(out, "{pad}  {name}__entry((\" \"))");
    }

    fn close_region(&self, pad: &str, out: &mut String) {
        let _ = writeln!(out, "{pad}end");
    }

    fn node(&self, pad: &str, name: &str, kind: StageKind, label: &str, out: &mut String) {
        let label = mermaid_text(label);
        let shape = match kind {
            StageKind::Gate => format!("{{{{\"{label}\"}}}}"),
            StageKind::Check => format!("{{\"{label}\"}}"),
            StageKind::Command => format!("[/\"{label}\"/]"),
            StageKind::Subflow => format!("[[\"{label}\"]]"),
            _ => format!("[\"{label}\"]"),
        };
        let _ = writeln!(out, "{pad}{name}{shape}");
    }

    fn exit(&self, name: &str, label: &str, code: i64, out: &mut String) {
        let _ = writeln!(
            out,
            "  exit_{name}([\"exit {} · code {code}\"])",
            mermaid_text(label)
        );
    }

    fn edge(&self, from: &str, to: &str, label: &str, dashed: bool, out: &mut String) {
        let arrow = if dashed { "-.->" } else { "-->" };
        if label.is_empty() {
            let _ = writeln!(out, "  {from} {arrow} {to}");
        } else {
            let _ = writeln!(
                out,
                "  {from} {arrow}|\"{}\"| {to}",
                mermaid_text(&truncate(label, 50))
            );
        }
    }

    fn footer(&self, _: &mut String) {}
}

fn dot_text(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Dot;

impl Syntax for Dot {
    fn header(&self, plan: &Plan, out: &mut String) {
        let _ = writeln!(
            out,
            "digraph \"{}\" {{",
            dot_text(&plan.workflow.name.value)
        );
        out.push_str("  compound=true;\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n  edge [fontname=\"Helvetica\", fontsize=9];\n");
    }

    fn open_region(&self, pad: &str, name: &str, kind: StageKind, label: &str, out: &mut String) {
        let style = if kind == StageKind::Loop {
            "rounded,dashed"
        } else {
            "rounded"
        };
        let _ = writeln!(out, "{pad}subgraph cluster_{name} {{");
        let _ = writeln!(
            out,
            "{pad}  label=\"{}\"; style=\"{style}\";",
            dot_text(label)
        );
        let _ = writeln!(
            out,
            "{pad}  {name}__entry [label=\"\", shape=point, width=0.1];"
        );
    }

    fn close_region(&self, pad: &str, out: &mut String) {
        let _ = writeln!(out, "{pad}}}");
    }

    fn node(&self, pad: &str, name: &str, kind: StageKind, label: &str, out: &mut String) {
        let shape = match kind {
            StageKind::Gate => "hexagon, style=filled, fillcolor=\"#ffe9a8\"",
            StageKind::Check => "diamond",
            StageKind::Command => "box, style=\"rounded\"",
            StageKind::Subflow => "box3d",
            _ => "box",
        };
        let _ = writeln!(
            out,
            "{pad}{name} [label=\"{}\", shape={shape}];",
            dot_text(label)
        );
    }

    fn exit(&self, name: &str, label: &str, code: i64, out: &mut String) {
        let _ = writeln!(
            out,
            "  exit_{name} [label=\"exit {}\\ncode {code}\", shape=doublecircle];",
            dot_text(label)
        );
    }

    fn edge(&self, from: &str, to: &str, label: &str, dashed: bool, out: &mut String) {
        let mut attrs = Vec::new();
        if !label.is_empty() {
            attrs.push(format!("label=\"{}\"", dot_text(&truncate(label, 50))));
        }
        if dashed {
            attrs.push("style=dashed".into());
        }
        let _ = writeln!(out, "  {from} -> {to} [{}];", attrs.join(", "));
    }

    fn footer(&self, out: &mut String) {
        out.push_str("}\n");
    }
}

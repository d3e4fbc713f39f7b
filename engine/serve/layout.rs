//! The plan drawn as SVG, laid out here (layered, top to bottom), so the monitor needs no
//! Graphviz and loads nothing from elsewhere.
//!
//! It walks the plan as `ralph-flow graph` does: each body (the top level, each loop's,
//! for_each's and group's) is its petgraph DAG. A body is laid out in layers by longest
//! path, each layer ordered by the mean position of its predecessors (ties in the order the
//! stages are declared, left to right); a region is drawn as a box around its own body's
//! layout. Gates are hexagons; a stage that holds a resource says so on a third line; a
//! `when` is written on the edges into its stage, or, on a stage nothing in its body comes
//! before (the first stage of a loop), on a short dashed stub above it. Edge labels are
//! placed last, each where it meets no stage and no other label. The layout is computed
//! once per plan; each refresh only colours it ([`svg`]) with the nodes' live states.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;

use super::view::NodeLive;
use crate::compile::render::{node_label, region_label};
use crate::compile::{Body, Edge, NodeId, Plan};
use crate::model::StageKind;

const NODE_W: i32 = 200;
const NODE_H: i32 = 50;
/// The extra height of a stage that holds a resource (its third line).
const RESOURCE_H: i32 = 14;
/// How far a hexagon's corners come in from its box.
const HEX_INSET: i32 = 12;
/// The room above a body's first row for the stubs that carry a `when`.
const WHEN_STUB: i32 = 30;
/// The height of an edge label's box, and the rough width of one of its characters (11 px).
const LABEL_H: i32 = 14;
const LABEL_CHAR_W: i32 = 7;
const GAP_X: i32 = 28;
const GAP_Y: i32 = 44;
const PAD: i32 = 16;
const HEADER: i32 = 28;
/// The narrowest body of a region, so that its title has room.
const REGION_MIN_W: i32 = 300;
/// Characters of a label that fit in a box.
const FIT: usize = 30;

/// A box of the drawing: a stage, or a region around its body.
#[derive(Clone, Debug, Serialize)]
pub struct Placed {
    pub name: String,
    pub region: bool,
    /// A gate, drawn as a hexagon.
    pub gate: bool,
    pub x: i32,
    pub y: i32,
    pub w: i32,
    pub h: i32,
    /// The first line (a stage's id, a region's title).
    pub title: String,
    /// The second line (what the stage runs).
    pub detail: String,
    /// The whole label, for the tooltip.
    pub full: String,
    /// The resource the stage holds (empty when none), on a third line.
    pub resource: String,
}

/// An arrow between two boxes of one body.
#[derive(Clone, Debug, Serialize)]
pub struct Arrow {
    pub path: String,
    pub label: String,
    pub label_x: i32,
    pub label_y: i32,
    pub route: bool,
    /// The stub that carries the `when` of a stage nothing in its body comes before.
    pub when: bool,
    /// Where the label may go (its text's start), best first; the first where it meets no
    /// stage and no other label is taken.
    #[serde(skip)]
    spots: Vec<(i32, i32)>,
}

impl Arrow {
    /// The box an edge label covers: x, y, width, height.
    pub fn label_box(&self) -> (i32, i32, i32, i32) {
        label_box(&self.label, self.label_x, self.label_y)
    }
}

fn label_box(label: &str, x: i32, y: i32) -> (i32, i32, i32, i32) {
    let chars = i32::try_from(label.chars().count()).unwrap_or(i32::MAX / LABEL_CHAR_W);
    (x - 2, y - 11, chars * LABEL_CHAR_W + 4, LABEL_H)
}

fn boxes_meet(a: (i32, i32, i32, i32), b: (i32, i32, i32, i32)) -> bool {
    a.0 < b.0 + b.2 && b.0 < a.0 + a.2 && a.1 < b.1 + b.3 && b.1 < a.1 + a.3
}

/// A plan's layout.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Drawing {
    pub width: i32,
    pub height: i32,
    pub boxes: Vec<Placed>,
    pub arrows: Vec<Arrow>,
    /// Why there is no drawing, or what to know about it (the file changed since the run).
    pub note: Option<String>,
}

struct Sub {
    w: i32,
    h: i32,
    boxes: Vec<Placed>,
    arrows: Vec<Arrow>,
}

fn fit(s: &str) -> String {
    if s.chars().count() <= FIT {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(FIT - 1).collect::<String>())
    }
}

/// Lays a plan out.
pub fn draw(plan: &Plan) -> Drawing {
    let sub = lay(plan, &plan.top);
    let mut d = Drawing {
        width: sub.w.max(NODE_W) + 2 * PAD,
        height: sub.h.max(NODE_H) + 2 * PAD,
        boxes: sub
            .boxes
            .into_iter()
            .map(|b| Placed {
                x: b.x + PAD,
                y: b.y + PAD,
                ..b
            })
            .collect(),
        arrows: sub
            .arrows
            .into_iter()
            .map(|a| shift_arrow(a, PAD, PAD))
            .collect(),
        note: None,
    };
    place_labels(&mut d);
    d
}

/// Puts each edge label on the first of its spots where it meets no stage, no region's
/// title and no label placed before it; when every spot is taken, below its first spot,
/// as far down as it takes to meet no other label. The drawing grows to hold them.
fn place_labels(d: &mut Drawing) {
    let obstacles: Vec<(i32, i32, i32, i32)> = d
        .boxes
        .iter()
        .map(|b| {
            if b.region {
                (b.x, b.y, b.w, HEADER)
            } else {
                (b.x, b.y, b.w, b.h)
            }
        })
        .collect();
    // Points along every edge, by grid cell, to keep labels off other edges where they can.
    let mut grid: HashMap<(i32, i32), Vec<EdgePoint>> = HashMap::new();
    for (i, a) in d.arrows.iter().enumerate() {
        for (x, y) in path_points(&a.path) {
            grid.entry((x.div_euclid(CELL), y.div_euclid(CELL)))
                .or_default()
                .push((i, x, y));
        }
    }
    let crosses_edge = |r: (i32, i32, i32, i32), own: usize| {
        let cells_x = r.0.div_euclid(CELL)..=(r.0 + r.2).div_euclid(CELL);
        cells_x.into_iter().any(|cx| {
            (r.1.div_euclid(CELL)..=(r.1 + r.3).div_euclid(CELL)).any(|cy| {
                grid.get(&(cx, cy)).is_some_and(|pts| {
                    pts.iter().any(|&(i, x, y)| {
                        i != own && x >= r.0 && x <= r.0 + r.2 && y >= r.1 && y <= r.1 + r.3
                    })
                })
            })
        })
    };
    let mut placed: Vec<(i32, i32, i32, i32)> = Vec::new();
    for (i, a) in d.arrows.iter_mut().enumerate() {
        if a.label.is_empty() {
            continue;
        }
        let free = |x: i32, y: i32, placed: &[(i32, i32, i32, i32)], nodes: bool, edges: bool| {
            let r = label_box(&a.label, x, y);
            !placed.iter().any(|p| boxes_meet(r, *p))
                && (!nodes || !obstacles.iter().any(|o| boxes_meet(r, *o)))
                && (!edges || !crosses_edge(r, i))
        };
        let first = a.spots.first().copied().unwrap_or((a.label_x, a.label_y));
        let (_, _, w, _) = label_box(&a.label, 0, 0);
        // Near the first spot: up and down by half a label, a little left or right.
        let near = (1..=24).flat_map(|k| {
            [0, -w / 2, w / 2]
                .into_iter()
                .flat_map(move |dx| [k, -k].map(|k| (first.0 + dx, first.1 + k * LABEL_H / 2)))
        });
        let candidates: Vec<(i32, i32)> = a
            .spots
            .iter()
            .copied()
            .chain(near)
            .filter(|&(x, y)| x >= 2 && y >= 11)
            .collect();
        // Clear of the stages, the labels and the other edges; else of the first two.
        let spot = candidates
            .iter()
            .find(|&&(x, y)| free(x, y, &placed, true, true))
            .or_else(|| {
                candidates
                    .iter()
                    .find(|&&(x, y)| free(x, y, &placed, true, false))
            })
            .copied();
        let (x, y) = match spot {
            Some(spot) => spot,
            None => {
                let mut y = first.1;
                while !free(first.0, y, &placed, false, false) {
                    y += LABEL_H;
                }
                (first.0, y)
            }
        };
        a.label_x = x;
        a.label_y = y;
        let r = a.label_box();
        d.width = d.width.max(r.0 + r.2 + PAD);
        d.height = d.height.max(r.1 + r.3 + PAD);
        placed.push(r);
    }
}

/// A point of an edge: the edge's index among the arrows, x, y.
type EdgePoint = (usize, i32, i32);

/// The side of a cell of the grid that finds the points of edges near a label.
const CELL: i32 = 32;

/// Points along a path made by [`curve`], [`detour`] or a `when` stub (`M`, `C` and `L`
/// commands), every few pixels.
fn path_points(path: &str) -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    let mut tokens = path.split(' ');
    let mut at = (0.0_f64, 0.0_f64);
    let num = |t: &mut std::str::Split<'_, char>| -> Option<f64> {
        t.next().and_then(|v| v.parse::<i32>().ok()).map(f64::from)
    };
    let push = |out: &mut Vec<(i32, i32)>, (x, y): (f64, f64)| {
        // Whole pixels, which the drawing is in.
        #[allow(clippy::cast_possible_truncation)]
        out.push((x.round() as i32, y.round() as i32));
    };
    while let Some(cmd) = tokens.next() {
        match cmd {
            "M" => {
                let (Some(x), Some(y)) = (num(&mut tokens), num(&mut tokens)) else {
                    break;
                };
                at = (x, y);
                push(&mut out, at);
            }
            "L" => {
                let (Some(x), Some(y)) = (num(&mut tokens), num(&mut tokens)) else {
                    break;
                };
                let steps = ((x - at.0).abs().max((y - at.1).abs()) / 8.0)
                    .ceil()
                    .max(1.0);
                for k in 1..=(steps as usize) {
                    let t = k as f64 / steps;
                    push(&mut out, (at.0 + (x - at.0) * t, at.1 + (y - at.1) * t));
                }
                at = (x, y);
            }
            "C" => {
                let mut p = [0.0; 6];
                for v in &mut p {
                    match num(&mut tokens) {
                        Some(n) => *v = n,
                        None => return out,
                    }
                }
                for k in 1..=16 {
                    let t = f64::from(k) / 16.0;
                    let u = 1.0 - t;
                    let (a, b, c, e) = (u * u * u, 3.0 * u * u * t, 3.0 * u * t * t, t * t * t);
                    push(
                        &mut out,
                        (
                            a * at.0 + b * p[0] + c * p[2] + e * p[4],
                            a * at.1 + b * p[1] + c * p[3] + e * p[5],
                        ),
                    );
                }
                at = (p[4], p[5]);
            }
            _ => {}
        }
    }
    out
}

fn shift_arrow(a: Arrow, dx: i32, dy: i32) -> Arrow {
    Arrow {
        path: shift_path(&a.path, dx, dy),
        label_x: a.label_x + dx,
        label_y: a.label_y + dy,
        spots: a.spots.iter().map(|(x, y)| (x + dx, y + dy)).collect(),
        ..a
    }
}

/// Moves every point of a path made by [`curve`].
fn shift_path(path: &str, dx: i32, dy: i32) -> String {
    let mut out = String::new();
    let mut x_next = true;
    for tok in path.split(' ') {
        if !out.is_empty() {
            out.push(' ');
        }
        match tok.parse::<i32>() {
            Ok(v) => {
                let _ = write!(out, "{}", if x_next { v + dx } else { v + dy });
                x_next = !x_next;
            }
            Err(_) => out.push_str(tok),
        }
    }
    out
}

fn curve(x1: i32, y1: i32, x2: i32, y2: i32) -> String {
    let dy = curve_dy(y1, y2);
    format!("M {x1} {y1} C {x1} {} {x2} {} {x2} {y2}", y1 + dy, y2 - dy)
}

fn curve_dy(y1: i32, y2: i32) -> i32 {
    ((y2 - y1) / 2).max(12)
}

/// Where a label of [`curve`] may go: beside points along it, the middle first.
fn curve_spots(x1: i32, y1: i32, x2: i32, y2: i32) -> Vec<(i32, i32)> {
    let dy = curve_dy(y1, y2);
    let (p0, p1, p2, p3) = (
        (f64::from(x1), f64::from(y1)),
        (f64::from(x1), f64::from(y1 + dy)),
        (f64::from(x2), f64::from(y2 - dy)),
        (f64::from(x2), f64::from(y2)),
    );
    let at = |t: f64| {
        let u = 1.0 - t;
        let (a, b, c, d) = (u * u * u, 3.0 * u * u * t, 3.0 * u * t * t, t * t * t);
        (
            a * p0.0 + b * p1.0 + c * p2.0 + d * p3.0,
            a * p0.1 + b * p1.1 + c * p2.1 + d * p3.1,
        )
    };
    let mut spots = Vec::new();
    for t in [0.5, 0.35, 0.65, 0.2, 0.8] {
        let (x, y) = at(t);
        // Rounded to whole pixels, which the drawing is in.
        #[allow(clippy::cast_possible_truncation)]
        let (x, y) = (x.round() as i32, y.round() as i32);
        spots.push((x + 4, y + 4));
    }
    spots
}

/// An edge that leaves down, runs along `lane` and comes back in from above.
fn detour(x1: i32, y1: i32, lane: i32, x2: i32, y2: i32) -> String {
    format!(
        "M {x1} {y1} C {x1} {a} {lane} {b} {lane} {c} L {lane} {d} C {lane} {e} {x2} {f} {x2} {y2}",
        a = y1 + 16,
        b = y1 + 8,
        c = y1 + 28,
        d = y2 - 28,
        e = y2 - 8,
        f = y2 - 16,
    )
}

fn lay(plan: &Plan, body: &Body) -> Sub {
    // The size of each node, laying regions out first.
    let mut inner: HashMap<NodeId, Sub> = HashMap::new();
    let mut size: HashMap<NodeId, (i32, i32)> = HashMap::new();
    for &n in &body.order {
        match &plan.node(n).body {
            Some(b) => {
                let sub = lay(plan, b);
                size.insert(
                    n,
                    (
                        sub.w.max(REGION_MIN_W) + 2 * PAD,
                        sub.h.max(NODE_H / 2) + HEADER + PAD,
                    ),
                );
                inner.insert(n, sub);
            }
            None => {
                let extra = if plan.stage(n).keys().resource.is_some() {
                    RESOURCE_H
                } else {
                    0
                };
                size.insert(n, (NODE_W, NODE_H + extra));
            }
        }
    }
    // Layers by longest path from the body's sources.
    let mut layer: HashMap<NodeId, usize> = HashMap::new();
    for &n in &body.order {
        let ix = plan.node(n).local;
        let l = body
            .graph
            .neighbors_directed(ix, petgraph::Direction::Incoming)
            .filter_map(|p| layer.get(&body.graph[p]).map(|l| l + 1))
            .max()
            .unwrap_or(0);
        layer.insert(n, l);
    }
    let depth = layer.values().max().map_or(0, |m| m + 1);
    let mut rows: Vec<Vec<NodeId>> = vec![Vec::new(); depth];
    for &n in &body.order {
        if let Some(&l) = layer.get(&n) {
            rows[l].push(n);
        }
    }
    // Order each row by the mean place of its predecessors in the rows above, ties in the
    // order the stages are declared (a topological order lists them the other way round).
    let mut place: HashMap<NodeId, f64> = HashMap::new();
    for row in &mut rows {
        let key = |n: &NodeId| -> f64 {
            let ix = plan.node(*n).local;
            let ps: Vec<f64> = body
                .graph
                .neighbors_directed(ix, petgraph::Direction::Incoming)
                .filter_map(|p| place.get(&body.graph[p]).copied())
                .collect();
            if ps.is_empty() {
                f64::MAX
            } else {
                ps.iter().sum::<f64>() / ps.len() as f64
            }
        };
        let mut keyed: Vec<(f64, usize, NodeId)> = row
            .iter()
            .map(|n| (key(n), plan.node(*n).local.index(), *n))
            .collect();
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        *row = keyed.into_iter().map(|(_, _, n)| n).collect();
        let count = row.len().max(1) as f64;
        for (i, n) in row.iter().enumerate() {
            place.insert(*n, (i as f64 + 0.5) / count);
        }
    }
    let row_w = |row: &[NodeId]| -> i32 {
        row.iter().map(|n| size[n].0).sum::<i32>()
            + GAP_X * i32::try_from(row.len().saturating_sub(1)).unwrap_or(0)
    };
    let width = rows.iter().map(|r| row_w(r)).max().unwrap_or(0);
    let mut pos: HashMap<NodeId, (i32, i32)> = HashMap::new();
    // A stage nothing in its body comes before is in the first row; its `when` needs a stub.
    let when_of = |n: NodeId| plan.stage(n).keys().when.as_ref().map(|w| w.value.clone());
    let stubs = rows
        .first()
        .is_some_and(|row| row.iter().any(|n| when_of(*n).is_some()));
    // Labelled edges into a row from the row above: more than one gets the gap more room.
    let mut labelled = vec![0_i32; rows.len()];
    for e in body.graph.edge_indices() {
        let Some((a, b)) = body.graph.edge_endpoints(e) else {
            continue;
        };
        let (a, b) = (body.graph[a], body.graph[b]);
        let has_label = match &body.graph[e] {
            Edge::Needs => !crate::compile::render::needs_label(plan, b).is_empty(),
            Edge::Route(_) => true,
        };
        if has_label && layer[&a] + 1 == layer[&b] {
            labelled[layer[&b]] += 1;
        }
    }
    let mut y = if stubs { WHEN_STUB } else { 0 };
    for (l, row) in rows.iter().enumerate() {
        if l > 0 {
            y += (labelled[l] - 1).clamp(0, 3) * LABEL_H;
        }
        let h = row.iter().map(|n| size[n].1).max().unwrap_or(0);
        let mut x = (width - row_w(row)) / 2;
        for n in row {
            let (w, nh) = size[n];
            pos.insert(*n, (x, y + (h - nh) / 2));
            x += w + GAP_X;
        }
        y += h + GAP_Y;
    }
    let height = (y - GAP_Y).max(0);
    // Where each row ends on the right, for the edges that go around rows.
    let row_right: Vec<i32> = rows
        .iter()
        .map(|row| {
            row.iter()
                .filter_map(|n| pos.get(n).map(|(x, _)| x + size[n].0))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut lanes = 0;
    let mut extra = 0;
    let mut boxes = Vec::new();
    let mut arrows = Vec::new();
    for &n in &body.order {
        let Some(&(x, y)) = pos.get(&n) else {
            continue;
        };
        let (w, h) = size[&n];
        let node = plan.node(n);
        if layer[&n] == 0
            && let Some(when) = when_of(n)
        {
            let cx = x + w / 2;
            arrows.push(Arrow {
                path: format!("M {cx} {} L {cx} {y}", y - WHEN_STUB + 4),
                label: fit(&format!("when {when}")),
                label_x: cx + 6,
                label_y: y - 10,
                route: false,
                when: true,
                spots: vec![(cx + 6, y - 10), (cx + 6, y - WHEN_STUB + 14)],
            });
        }
        if let Some(sub) = inner.remove(&n) {
            let title = region_label(plan, n);
            boxes.push(Placed {
                name: node.name.clone(),
                region: true,
                gate: false,
                x,
                y,
                w,
                h,
                title: fit_width(&title, w - 100),
                detail: String::new(),
                full: title,
                resource: String::new(),
            });
            let (dx, dy) = (x + (w - sub.w) / 2, y + HEADER);
            boxes.extend(sub.boxes.into_iter().map(|b| Placed {
                x: b.x + dx,
                y: b.y + dy,
                ..b
            }));
            arrows.extend(sub.arrows.into_iter().map(|a| shift_arrow(a, dx, dy)));
        } else {
            let label = node_label(plan, n);
            let mut lines = label.lines();
            let title = lines.next().unwrap_or_default().to_string();
            let detail = lines.next().unwrap_or_default().to_string();
            boxes.push(Placed {
                name: node.name.clone(),
                region: false,
                gate: node.kind == StageKind::Gate,
                x,
                y,
                w,
                h,
                title: fit(&title),
                detail: fit(&detail),
                full: label,
                resource: plan
                    .stage(n)
                    .keys()
                    .resource
                    .as_ref()
                    .map(|r| fit(&format!("holds {}", r.value)))
                    .unwrap_or_default(),
            });
        }
    }
    for e in body.graph.edge_indices() {
        let Some((a, b)) = body.graph.edge_endpoints(e) else {
            continue;
        };
        let (a, b) = (body.graph[a], body.graph[b]);
        let (Some(&(ax, ay)), Some(&(bx, by))) = (pos.get(&a), pos.get(&b)) else {
            continue;
        };
        let (aw, ah) = size[&a];
        let bw = size[&b].0;
        let (x1, y1, x2, y2) = (ax + aw / 2, ay + ah, bx + bw / 2, by);
        let (la, lb) = (layer[&a], layer[&b]);
        let (label, route) = match &body.graph[e] {
            Edge::Needs => (crate::compile::render::needs_label(plan, b), false),
            Edge::Route(values) => (values.join(" | "), true),
        };
        if lb > la + 1 {
            // An edge past a row goes around it, on the right of the rows it passes.
            let lane = (la + 1..lb).map(|l| row_right[l]).max().unwrap_or(x1) + GAP_X / 2 + lanes;
            lanes += 6;
            let label = fit(&label);
            let label_w = i32::try_from(label.chars().count()).unwrap_or(0) * 6;
            extra = extra.max(lane + 8 + label_w - width);
            let mid = (y1 + y2) / 2;
            let spots = [0, -LABEL_H, LABEL_H, -2 * LABEL_H, 2 * LABEL_H]
                .iter()
                .map(|d| (lane + 4, mid + d))
                .collect();
            arrows.push(Arrow {
                path: detour(x1, y1, lane, x2, y2),
                label,
                label_x: lane + 4,
                label_y: mid,
                route,
                when: false,
                spots,
            });
            continue;
        }
        arrows.push(Arrow {
            path: curve(x1, y1, x2, y2),
            label: fit(&label),
            label_x: (x1 + x2) / 2 + 4,
            label_y: (y1 + y2) / 2,
            route,
            when: false,
            spots: curve_spots(x1, y1, x2, y2),
        });
    }
    Sub {
        w: width + extra,
        h: height,
        boxes,
        arrows,
    }
}

/// A gate's hexagon: its box with the corners of the short sides drawn in to points.
fn hexagon(b: &Placed) -> String {
    let (x, y, w, h, i) = (b.x, b.y, b.w, b.h, HEX_INSET);
    format!(
        r#"<polygon points="{} {y} {} {y} {} {} {} {} {} {} {x} {}"/>"#,
        x + i,
        x + w - i,
        x + w,
        y + h / 2,
        x + w - i,
        y + h,
        x + i,
        y + h,
        y + h / 2,
    )
}

/// A region's title cut to the width of its box (about 7 px a character).
fn fit_width(s: &str, w: i32) -> String {
    let n = usize::try_from((w - 16) / 7).unwrap_or(8).max(8);
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

/// What [`url_part`] leaves as it is: RFC 3986's unreserved characters (section 2.3),
/// `A-Za-z0-9-._~`; everything else, each byte of a non-ASCII character too, is
/// percent-encoded.
const URL_PART: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes a URL path segment or query value (everything but `A-Za-z0-9-._~`, as
/// upper-case `%XX` of the UTF-8 bytes).
pub fn url_part(s: &str) -> String {
    utf8_percent_encode(s, URL_PART).to_string()
}

/// Escapes text for SVG (XML 1.0), in an element's text or a quoted attribute's value:
/// `&`, `<`, `>`, `"` and `'` as references; tab, line feed and carriage return as
/// character references, which an attribute's value keeps (XML 1.0 section 3.3.3 turns
/// them into spaces) and a parser's line-end handling leaves alone; and a character XML 1.0
/// cannot carry even as a reference (the other C0 controls, U+FFFE, U+FFFF; section 2.2,
/// `Char`) as U+FFFD.
pub fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            '\0'..='\u{1f}' | '\u{fffe}' | '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// The drawing alone, as an SVG file with its style sheet: `ralph-flow graph --format svg`.
pub fn standalone(d: &Drawing) -> String {
    let svg = svg(d, None, &BTreeMap::new());
    let style = format!(
        "<style>{}</style>",
        include_str!("assets/plan.css").replace("]]>", "")
    );
    match svg.find('>') {
        Some(end) => format!("{}{style}{}\n", &svg[..=end], &svg[end + 1..]),
        None => svg,
    }
}

/// The drawing as SVG, each box coloured by its node's live state (`s-running`, ...) and,
/// given a run, linked to its stage page; `data-node` and `data-state` name them for scripts
/// and tests.
pub fn svg(d: &Drawing, run: Option<&str>, live: &BTreeMap<String, NodeLive>) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="plan" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="the plan">"#,
        w = d.width,
        h = d.height
    );
    out.push_str(r#"<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" class="arrowhead"/></marker></defs>"#);
    let pending = NodeLive {
        state: "pending",
        badge: String::new(),
    };
    for b in d.boxes.iter().filter(|b| b.region) {
        let l = live.get(&b.name).unwrap_or(&pending);
        let _ = write!(
            out,
            r#"<g class="region s-{state}" data-node="{name}" data-state="{state}"><title>{full}</title><rect x="{x}" y="{y}" width="{w}" height="{h}" rx="10"/><text class="region-title" x="{tx}" y="{ty}">{title}</text><text class="badge" x="{bx}" y="{ty}" text-anchor="end">{badge}</text></g>"#,
            state = l.state,
            name = xml(&b.name),
            full = xml(&b.full),
            x = b.x,
            y = b.y,
            w = b.w,
            h = b.h,
            tx = b.x + 10,
            ty = b.y + 18,
            bx = b.x + b.w - 10,
            title = xml(&b.title),
            badge = xml(&l.badge),
        );
    }
    for a in &d.arrows {
        let _ = write!(
            out,
            r#"<path class="edge{}" d="{}" marker-end="url(#arrow)"/>"#,
            if a.route {
                " route"
            } else if a.when {
                " when"
            } else {
                ""
            },
            a.path
        );
        if !a.label.is_empty() {
            let _ = write!(
                out,
                r#"<text class="edge-label" x="{}" y="{}">{}</text>"#,
                a.label_x,
                a.label_y,
                xml(&a.label)
            );
        }
    }
    for b in d.boxes.iter().filter(|b| !b.region) {
        let l = live.get(&b.name).unwrap_or(&pending);
        let (open, close) = match run {
            Some(run) => (
                format!(
                    r#"<a href="{}">"#,
                    xml(&format!(
                        "/runs/{}/stage?node={}",
                        url_part(run),
                        url_part(&b.name)
                    ))
                ),
                "</a>",
            ),
            None => (String::new(), ""),
        };
        let (shape, inset) = if b.gate {
            (hexagon(b), HEX_INSET)
        } else {
            (
                format!(
                    r#"<rect x="{}" y="{}" width="{}" height="{}" rx="6"/>"#,
                    b.x, b.y, b.w, b.h
                ),
                0,
            )
        };
        let resource = if b.resource.is_empty() {
            String::new()
        } else {
            format!(
                r#"<text class="resource" x="{}" y="{}">{}</text>"#,
                b.x + 10 + inset / 2,
                b.y + 38 + RESOURCE_H,
                xml(&b.resource)
            )
        };
        let _ = write!(
            out,
            r#"{open}<g class="node{gate} s-{state}" data-node="{name}" data-state="{state}"><title>{full}</title>{shape}<text class="title" x="{tx}" y="{t1}">{title}</text><text class="detail" x="{tx}" y="{t2}">{detail}</text>{resource}<text class="badge" x="{bx}" y="{t1}" text-anchor="end">{badge}</text></g>{close}"#,
            gate = if b.gate { " gate" } else { "" },
            state = l.state,
            name = xml(&b.name),
            full = xml(&b.full),
            tx = b.x + 10 + inset / 2,
            t1 = b.y + 20,
            t2 = b.y + 38,
            bx = b.x + b.w - 8 - inset / 2,
            title = xml(&b.title),
            detail = xml(&b.detail),
            badge = xml(&l.badge),
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inside(inner: &Placed, outer: &Placed) -> bool {
        inner.x >= outer.x
            && inner.y >= outer.y
            && inner.x + inner.w <= outer.x + outer.w
            && inner.y + inner.h <= outer.y + outer.h
    }

    fn overlap(a: &Placed, b: &Placed) -> bool {
        a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h
    }

    #[test]
    fn every_preset_lays_out_with_stages_inside_their_regions_and_apart() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("workflows");
        for (preset, sets) in [
            ("spider.toml", vec![]),
            ("wiggum-review.toml", vec![]),
            ("ticket-pipeline.toml", vec![]),
            ("council.kdl", vec![]),
            (
                "cairo-driver-reviewer.toml",
                vec![
                    ("prompt".to_string(), "fix it".to_string()),
                    ("rubric".to_string(), "rubric.md".to_string()),
                ],
            ),
            ("task-loop.toml", vec![]),
        ] {
            let path = root.join(preset);
            let prepared = crate::prepare::prepare(&path, &sets)
                .unwrap_or_else(|e| panic!("{preset}: {}", e.render()));
            let plan = &prepared.plan;
            let d = draw(plan);
            assert_eq!(d.boxes.len(), plan.nodes.len(), "{preset}: a box per stage");
            for b in &d.boxes {
                assert!(
                    b.x >= 0 && b.y >= 0 && b.x + b.w <= d.width && b.y + b.h <= d.height,
                    "{preset}: {} within the drawing",
                    b.name
                );
                let id = plan.find(&b.name).unwrap_or_else(|| panic!("{}", b.name));
                if let Some(parent) = plan.node(id).parent {
                    let outer = d
                        .boxes
                        .iter()
                        .find(|o| o.name == plan.node(parent).name)
                        .unwrap_or_else(|| panic!("{preset}: the region of {}", b.name));
                    assert!(
                        inside(b, outer),
                        "{preset}: {} inside {}",
                        b.name,
                        outer.name
                    );
                }
                for o in &d.boxes {
                    let oid = plan.find(&o.name).unwrap_or_else(|| panic!("{}", o.name));
                    if o.name != b.name && plan.node(oid).parent == plan.node(id).parent {
                        assert!(
                            !overlap(b, o),
                            "{preset}: {} and {} overlap",
                            b.name,
                            o.name
                        );
                    }
                }
            }
            let svg = svg(&d, Some("run-1"), &BTreeMap::new());
            assert_eq!(
                svg.matches("data-state=\"pending\"").count(),
                plan.nodes.len()
            );
            assert_eq!(
                svg.matches("<a href=").count(),
                d.boxes.iter().filter(|b| !b.region).count()
            );
            let file = standalone(&d);
            assert!(file.starts_with("<svg") && file.contains("<style>"));
            assert!(!file.contains("<a href="));
        }
    }

    #[test]
    fn points_follow_every_kind_of_path() {
        let pts = path_points(&curve(0, 0, 100, 100));
        assert_eq!(pts.first(), Some(&(0, 0)));
        assert_eq!(pts.last(), Some(&(100, 100)));
        assert!(pts.contains(&(50, 50)), "{pts:?}");
        let pts = path_points("M 10 0 L 10 40");
        assert_eq!(
            pts,
            vec![(10, 0), (10, 8), (10, 16), (10, 24), (10, 32), (10, 40)]
        );
        let pts = path_points(&detour(0, 0, 300, 0, 200));
        assert!(pts.iter().any(|&(x, y)| x == 300 && y == 100), "{pts:?}");
        assert_eq!(pts.last(), Some(&(0, 200)));
        assert!(path_points("M 1").is_empty());
    }

    #[test]
    fn paths_move_as_a_whole() {
        assert_eq!(
            shift_path(&curve(0, 0, 10, 100), 5, 7),
            "M 5 7 C 5 57 15 57 15 107"
        );
    }

    #[test]
    fn text_is_escaped_for_xml_text_and_attributes() {
        assert_eq!(
            xml("<a href='x'>&\""),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;"
        );
        assert_eq!(xml("]]>"), "]]&gt;");
        // What an attribute's value would turn into spaces, or a parser's line-end handling
        // into LF, stays what it was.
        assert_eq!(xml("a\tb\nc\r\nd"), "a&#9;b&#10;c&#13;&#10;d");
        // XML 1.0 cannot carry these at all, not even as references.
        assert_eq!(
            xml("\0\u{1}\u{8}\u{b}\u{c}\u{e}\u{1b}[1m\u{1f}\u{fffe}\u{ffff}"),
            "\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}[1m\u{fffd}\u{fffd}\u{fffd}"
        );
        // Everything else XML 1.0 allows is kept as it is.
        let kept = " ~\u{7f}\u{85}\u{a0}é\u{d7ff}\u{e000}\u{fffd}\u{10000}\u{10ffff}";
        assert_eq!(xml(kept), kept);
    }

    #[test]
    fn url_parts_keep_only_the_unreserved_characters() {
        assert_eq!(url_part("a b/c#1?é"), "a%20b%2Fc%231%3F%C3%A9");
        let unreserved = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~";
        assert_eq!(url_part(unreserved), unreserved);
        // Every other ASCII character, reserved or not, is `%XX` in upper case.
        for b in (0u8..0x80).filter(|b| !unreserved.as_bytes().contains(b)) {
            let c = char::from(b).to_string();
            assert_eq!(url_part(&c), format!("%{b:02X}"), "{c:?}");
        }
        assert_eq!(url_part("\u{7f}\u{10ffff}"), "%7F%F4%8F%BF%BF");
        assert_eq!(url_part(""), "");
    }
}

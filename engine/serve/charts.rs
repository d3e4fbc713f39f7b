//! The run page's charts, as SVG drawn here: the timeline of stages, tokens and cost per
//! stage, and tokens over time.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::layout::xml;
use super::view::{RunDetail, attempt_usage_text, cost_text, qualified};
use crate::store::{AttemptState, Usage, now_ms};
use crate::text::duration_ms;

/// The most bars of the timeline (the latest are kept).
const TIMELINE_MAX: usize = 80;
const WIDTH: i32 = 960;
const LABEL_W: i32 = 260;
const BAR_H: i32 = 16;

/// One bar of the timeline.
struct Span {
    label: String,
    state: &'static str,
    start: i64,
    end: i64,
}

/// The stages on a time axis: each settled stage from its start to its end, each running
/// attempt to now.
pub(super) fn timeline(run: &RunDetail) -> String {
    let mut spans: Vec<Span> = run
        .nodes()
        .map(|n| Span {
            label: qualified(&n.scope, &n.node),
            state: n.state.as_str(),
            start: n.started_at,
            end: n.finished_at.max(n.started_at),
        })
        .collect();
    let live = run.summary.state == "running" || run.summary.state == "waiting";
    for a in run.attempts() {
        if a.state == AttemptState::Running && live {
            spans.push(Span {
                label: format!("{} (attempt {})", qualified(&a.scope, &a.node), a.attempt),
                state: "running",
                start: a.started_at,
                end: now_ms(),
            });
        }
    }
    if spans.is_empty() {
        return r#"<p class="empty">No stage has started yet.</p>"#.into();
    }
    spans.sort_by_key(|s| (s.start, s.end));
    let cut = spans.len().saturating_sub(TIMELINE_MAX);
    let spans = &spans[cut..];
    let t0 = spans.iter().map(|s| s.start).min().unwrap_or(0);
    let t1 = spans.iter().map(|s| s.end).max().unwrap_or(t0).max(t0 + 1);
    let scale = f64::from(WIDTH - LABEL_W - 20) / (t1 - t0) as f64;
    let rows = i32::try_from(spans.len()).unwrap_or(i32::MAX);
    let height = rows * (BAR_H + 4) + 24;
    let mut out = String::new();
    if cut > 0 {
        let _ = write!(
            out,
            r#"<p class="note">The latest {TIMELINE_MAX} of {} stages.</p>"#,
            cut + spans.len()
        );
    }
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="timeline" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" aria-label="timeline">"#
    );
    for (i, s) in spans.iter().enumerate() {
        let y = i32::try_from(i).unwrap_or(0) * (BAR_H + 4);
        let x = LABEL_W + ((s.start - t0) as f64 * scale) as i32;
        let w = (((s.end - s.start) as f64 * scale) as i32).max(2);
        let _ = write!(
            out,
            r#"<g class="span s-{state}"><title>{label}: {took}</title><text class="label" x="{lx}" y="{ty}" text-anchor="end">{short}</text><rect x="{x}" y="{y}" width="{w}" height="{BAR_H}" rx="3"/></g>"#,
            state = s.state,
            label = xml(&s.label),
            took = duration_ms(s.end - s.start),
            lx = LABEL_W - 8,
            ty = y + BAR_H - 4,
            short = xml(&shorten(&s.label, 36)),
        );
    }
    let _ = write!(
        out,
        r#"<text class="axis" x="{LABEL_W}" y="{}">0</text><text class="axis" x="{}" y="{}" text-anchor="end">{}</text></svg>"#,
        height - 4,
        WIDTH - 20,
        height - 4,
        duration_ms(t1 - t0)
    );
    out
}

fn shorten(s: &str, n: usize) -> String {
    let count = s.chars().count();
    if count <= n {
        s.to_string()
    } else {
        format!("…{}", s.chars().skip(count - n + 1).collect::<String>())
    }
}

/// Tokens (input and output) and cost per stage, as bars, and tokens over time, as a line.
/// A stage whose calls reported no usage shows `unknown` and no bar; counts that leave out
/// calls which reported none are shown as lower bounds (`≥`).
pub(super) fn usage(run: &RunDetail) -> String {
    let mut per_stage: BTreeMap<&str, Usage> = BTreeMap::new();
    for a in run.attempts() {
        per_stage.entry(&a.node).or_default().add(&a.usage);
    }
    per_stage.retain(|_, u| !u.is_empty());
    if per_stage.is_empty() {
        return r#"<p class="empty">No tokens used yet.</p>"#.into();
    }
    let max = per_stage
        .values()
        .map(Usage::tokens)
        .max()
        .unwrap_or(1)
        .max(1);
    let bar_w = f64::from(WIDTH - LABEL_W - 160) / max as f64;
    let rows = i32::try_from(per_stage.len()).unwrap_or(i32::MAX);
    let height = rows * (BAR_H + 6) + 8;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="usage" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" aria-label="tokens per stage">"#
    );
    for (i, (stage, u)) in per_stage.iter().enumerate() {
        let y = i32::try_from(i).unwrap_or(0) * (BAR_H + 6);
        let wi = (u.input_tokens as f64 * bar_w) as i32;
        let wo = (u.output_tokens as f64 * bar_w) as i32;
        let _ = write!(
            out,
            r#"<g data-stage="{name}"><title>{name}: {detail}, {cost}</title><text class="label" x="{lx}" y="{ty}" text-anchor="end">{short}</text><rect class="in" x="{LABEL_W}" y="{y}" width="{wi}" height="{BAR_H}"/><rect class="out" x="{ox}" y="{y}" width="{wo}" height="{BAR_H}"/><text class="value" x="{vx}" y="{ty}">{tokens} tokens · {cost}</text></g>"#,
            name = xml(stage),
            detail = xml(&attempt_usage_text(u)),
            cost = cost_text(u.cost_usd),
            lx = LABEL_W - 8,
            ty = y + BAR_H - 4,
            short = xml(&shorten(stage, 36)),
            ox = LABEL_W + wi,
            vx = LABEL_W + wi + wo + 6,
            tokens = xml(&u.known().to_string()),
        );
    }
    out.push_str("</svg>");
    // Tokens over time: the running total at the end of each attempt.
    let mut points: Vec<(i64, u64)> = run
        .attempts()
        .iter()
        .filter_map(|a| a.finished_at.map(|f| (f, a.usage.tokens())))
        .collect();
    // Calls that reported no usage make the total a lower bound.
    let at_least = if per_stage.values().any(|u| u.unreported > 0) {
        "≥ "
    } else {
        ""
    };
    points.sort_unstable();
    // No line when no call counted a token (nothing known to draw).
    let total: u64 = points.iter().map(|p| p.1).sum();
    if points.len() >= 2 && total > 0 {
        let t0 = run.summary.started_at.min(points[0].0);
        let t1 = points.last().map_or(t0 + 1, |p| p.0).max(t0 + 1);
        let (w, h) = (WIDTH - 60, 120);
        let mut acc = 0u64;
        let mut d = format!("M 40 {}", h + 10);
        for (t, tokens) in &points {
            acc += tokens;
            let x = 40 + ((t - t0) as f64 / (t1 - t0) as f64 * f64::from(w)) as i32;
            let y = 10 + h - (acc as f64 / total as f64 * f64::from(h)) as i32;
            let _ = write!(d, " L {x} {y}");
        }
        let _ = write!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" class="over-time" viewBox="0 0 {WIDTH} {vh}" width="{WIDTH}" height="{vh}" role="img" aria-label="tokens over time"><path class="line" d="{d}"/><text class="axis" x="40" y="{ly}">0</text><text class="axis" x="{rx}" y="{ly}" text-anchor="end">{span}</text><text class="axis" x="44" y="20">{at_least}{total} tokens</text></svg>"#,
            vh = h + 30,
            ly = h + 26,
            rx = 40 + w,
            span = duration_ms(t1 - t0),
        );
    }
    out
}

//! Skips that spread: a stage whose every need may be skipped is skipped with them. When a
//! `when` skips a gate or a check (a stage that holds the work back rather than doing it)
//! that others need only to come after it (they read nothing of it), the skip usually takes
//! them along by accident: "no sign-off needed" then skips the deploy after it (RF026). The
//! warning points at the need that carries the skip, and names the stages that go with it.
//! After an agent or command skipped by its `when`, the stages after it usually work on what
//! it did, so their skip is meant; `explain` and the graphs show every spreading skip.

use std::collections::HashSet;

use super::scope::{skips_on_its_own, skips_with_needs};
use super::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{BodyText, StageBody, StageKind};

pub(super) fn check(c: &Checked<'_>, diags: &mut Diagnostics) {
    let n = c.stages.len();
    // The stages a spreading skip reaches first, from a need skipped by its own `when`.
    let mut warned = vec![false; n];
    for (i, w) in warned.iter_mut().enumerate() {
        let id = StageId(i);
        if !skips_with_needs(c, id) {
            continue;
        }
        let needs = &c.info(id).needs;
        if !needs.iter().any(|x| barrier_with_when(c, *x)) {
            continue;
        }
        let causes = causes(c, id);
        let read = reads(c, id);
        if needs.iter().chain(&causes).any(|x| read.contains(x)) {
            continue; // it reads what skips it: the skip is the point
        }
        *w = true;
    }
    for i in (0..n).filter(|i| warned[*i]) {
        diags.push(diagnostic(c, StageId(i), &warned));
    }
}

fn diagnostic(c: &Checked<'_>, id: StageId, warned: &[bool]) -> Diagnostic {
    let info = c.info(id);
    let me = &info.stage.id.value;
    let when_needs: Vec<StageId> = info
        .needs
        .iter()
        .copied()
        .filter(|x| barrier_with_when(c, *x))
        .collect();
    let first = when_needs[0];
    let first_name = &c.info(first).stage.id.value;
    let names = |ids: &[StageId]| {
        ids.iter()
            .map(|x| format!("`{}`", c.info(*x).stage.id.value))
            .collect::<Vec<_>>()
            .join(" and ")
    };
    let whose = if info.needs.len() == 1 {
        format!("`{first_name}` is")
    } else {
        format!("{} are all", names(&info.needs))
    };
    let after = followers(c, id, warned);
    let along = match after.len() {
        0 => String::new(),
        k => {
            let shown: Vec<String> = after
                .iter()
                .take(4)
                .map(|x| format!("`{}`", c.info(*x).stage.id.value))
                .collect();
            let more = if k > 4 {
                format!(" and {} more", k - 4)
            } else {
                String::new()
            };
            format!(", and with it {}{more}", shown.join(", "))
        }
    };
    let what = match info.stage.body {
        StageBody::Loop(_) | StageBody::ForEach(_) | StageBody::Group { .. } => {
            format!("`{me}` and its whole body are")
        }
        _ => format!("`{me}` is"),
    };
    let span = info
        .stage
        .needs
        .iter()
        .find(|t| t.value == *first_name)
        .map_or(info.stage.id.span, |t| t.span);
    let mut d = Diagnostic::new(
        Code::SkipSpreads,
        span,
        format!("{what} skipped whenever {whose} skipped{along}"),
    )
    .label(format!("skipped when `{first_name}` is"));
    for x in &when_needs {
        if let Some(w) = &c.info(*x).stage.keys().when {
            d = d.related(
                w.span,
                format!(
                    "`{}` is skipped when this is false",
                    c.info(*x).stage.id.value
                ),
            );
        }
    }
    let them = names(&when_needs);
    let help = |optional: &str, keep: &str| {
        format!(
            "`{me}` reads nothing of {them}, so it probably needs it only to come after it: if `{me}` should run either way, mark {them} `{optional}` (its skip then counts as done); if the skip is meant, say so with `{keep}` on `{me}`"
        )
    };
    d.help_syntax(
        help(
            "optional = true",
            &format!("when = \"stages.{first_name}.ran\""),
        ),
        help(
            "optional #true",
            &format!("when \"stages.{first_name}.ran\""),
        ),
    )
}

/// Tells whether a stage holds work back (a gate or a check) and has a `when`.
fn barrier_with_when(c: &Checked<'_>, x: StageId) -> bool {
    let s = c.info(x).stage;
    matches!(s.kind().value, StageKind::Gate | StageKind::Check) && s.keys().when.is_some()
}

/// The stages whose own `when` (or route, or escalation) a spreading skip comes from.
fn causes(c: &Checked<'_>, id: StageId) -> Vec<StageId> {
    let mut out = Vec::new();
    let mut seen: HashSet<StageId> = HashSet::new();
    let mut stack: Vec<StageId> = c.info(id).needs.clone();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) {
            continue;
        }
        if skips_on_its_own(c, x) {
            out.push(x);
        } else {
            stack.extend(c.info(x).needs.iter().copied());
        }
    }
    out
}

/// The stages of the same body that are skipped only because `id` is (through needs), each
/// once; a stage that is warned of itself is not followed.
fn followers(c: &Checked<'_>, id: StageId, warned: &[bool]) -> Vec<StageId> {
    let body = c.body(c.info(id).parent);
    let mut out: Vec<StageId> = Vec::new();
    let mut reached: HashSet<StageId> = HashSet::from([id]);
    // A body is short next to the cost of a warning's words; a pass per new member is fine.
    loop {
        let before = reached.len();
        for &s in body {
            if reached.contains(&s) || warned[s.0] || !skips_with_needs(c, s) {
                continue;
            }
            let needs = &c.info(s).needs;
            if needs.iter().all(|x| reached.contains(x) || !spreads(c, *x))
                && needs.iter().any(|x| reached.contains(x))
            {
                reached.insert(s);
                out.push(s);
            }
        }
        if reached.len() == before {
            break;
        }
    }
    out
}

/// Tells whether a need may be skipped and its skip spreads.
fn spreads(c: &Checked<'_>, x: StageId) -> bool {
    c.skippable.get(x.0).copied().unwrap_or(false) && !c.info(x).stage.keys().is_optional()
}

/// The stages a stage (with its body and prompt file) names as `stages.NAME`.
fn reads(c: &Checked<'_>, id: StageId) -> HashSet<StageId> {
    let mut out = HashSet::new();
    for t in texts_of(c, id) {
        for (name, _) in stage_mentions(t) {
            if let Some(x) = c.find(name) {
                out.insert(x);
            }
        }
    }
    out
}

/// Every template and expression of a stage and of its body, with its prompt file's text
/// (read by the template check before).
pub fn texts_of<'c>(c: &'c Checked<'_>, id: StageId) -> Vec<&'c str> {
    let mut texts: Vec<&str> = Vec::new();
    let mut todo = vec![id];
    while let Some(s) = todo.pop() {
        let info = c.info(s);
        let st = info.stage;
        let k = st.keys();
        texts.extend(k.when.iter().map(|t| t.value.as_str()));
        texts.extend(k.feedback.iter().map(|t| t.value.as_str()));
        texts.extend(k.priority.iter().map(|t| t.value.as_str()));
        if let Some(o) = &k.output {
            texts.extend(o.files.iter().map(|t| t.value.as_str()));
        }
        for t in st.body.texts() {
            match t {
                BodyText::Template(x)
                | BodyText::Argv(x)
                | BodyText::Verdict(x)
                | BodyText::AgentName(x) => texts.push(&x.value),
            }
        }
        if let Some(l) = st.body.as_loop() {
            texts.extend(l.until.iter().map(|t| t.value.as_str()));
            texts.extend(l.stuck.iter().map(|t| t.on.value.as_str()));
            texts.extend(l.escalation.iter().map(|r| r.when.value.as_str()));
        }
        if let Some(f) = st.body.as_for_each() {
            texts.extend(f.over.iter().map(|t| t.value.as_str()));
            texts.extend(f.key.iter().map(|t| t.value.as_str()));
        }
        if let Some((_, p)) = c.prompt_files.get(&s) {
            texts.push(p);
        }
        todo.extend(info.children.iter().copied());
    }
    texts
}

/// The `stages.NAME` a text writes, each with what follows the name.
pub fn stage_mentions(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.match_indices("stages.").filter_map(|(at, m)| {
        let after = &text[at + m.len()..];
        let end = after
            .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '-'))
            .unwrap_or(after.len());
        (end > 0).then(|| (&after[..end], &after[end..]))
    })
}

//! `stages.X...` in a template: the stage exists, has the attribute, has run (or may have been
//! skipped) where it is read, and its output has the field.

use super::Text;
use super::scan::{Guards, locate};
use super::variables::STAGE_ATTRS;
use crate::check::scope::{Site, is_upstream, maybe_skipped_at, runs_only_after, share_loop};
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::StageKind;
use crate::source::Sources;

pub(super) fn stage_ref(
    c: &Checked<'_>,
    src: &Sources,
    text: &Text<'_>,
    parts: &[&str],
    site: Option<Site>,
    guards: &Guards,
    diags: &mut Diagnostics,
) {
    let Some(name) = parts.get(1) else { return };
    let span = locate(src, text, &format!("stages.{name}"));
    let Some(target) = c.find(name) else {
        diags.push(Diagnostic::unknown(
            Code::UnknownStage,
            span,
            "stage",
            name,
            c.by_id.keys().copied(),
        ));
        return;
    };
    let Some(attr) = parts.get(2) else { return };
    if !STAGE_ATTRS.contains(attr) {
        diags.push(
            Diagnostic::new(
                Code::UnknownVariable,
                locate(src, text, &parts[..3].join(".")),
                format!("a stage has no `{attr}`"),
            )
            .suggest(attr, STAGE_ATTRS.iter().copied())
            .help_or(format!("stages have: {}", STAGE_ATTRS.join(", "))),
        );
        return;
    }
    let Some(site) = site else { return }; // exit messages see every stage
    let at = site.stage();
    let upstream = is_upstream(c, site, target);
    let in_foreach_body = |x: StageId| {
        c.ancestors(x)
            .into_iter()
            .find(|a| c.info(*a).stage.kind().value == StageKind::ForEach)
            .filter(|f| {
                !(c.ancestors(at).contains(f) || matches!(site, Site::BodyEnd(_)) && *f == at)
            })
    };
    match *attr {
        "output" | "feedback" | "attempts" => {
            if let Some(f) = in_foreach_body(target) {
                diags.push(
                    Diagnostic::new(Code::NotUpstream, span, format!("stage `{name}` runs once per item of `{}`; there is no single output here", c.info(f).stage.id.value))
                        .help(format!("use `stages.{}.output.results`, the fan-in of the items", c.info(f).stage.id.value)),
                );
                return;
            }
            if !upstream {
                let me = &c.info(at).stage.id.value;
                let mut d = Diagnostic::new(
                    Code::NotUpstream,
                    span,
                    format!("stage `{name}` has not run when `{me}` uses its {attr}"),
                )
                .label("not upstream of this place");
                d = if share_loop(c, at, target) {
                    d.help(format!("add `{name}` to needs, or read the previous iteration with `stages.{name}.last`"))
                } else {
                    d.help(format!(
                        "add `{name}` (or a stage after it) to `needs` of `{me}`"
                    ))
                };
                diags.push(d);
                return;
            }
            // A stage's own `when` is no guard for what it reads itself.
            let own_when = c
                .info(at)
                .stage
                .keys()
                .when
                .as_ref()
                .is_some_and(|w| w.span == text.span);
            let guard = guards.ran.contains(*name) || when_mentions(c, at, name, own_when);
            let implied =
                matches!(site, Site::Stage(_) | Site::Region(_)) && runs_only_after(c, at, target);
            if *attr == "output" && maybe_skipped_at(c, target, site) && !guard && !implied {
                diags.push(
                    Diagnostic::new(Code::MaybeSkipped, span, format!("stage `{name}` may have been skipped here, leaving its output empty"))
                        .label("may not have run")
                        .help(if guards.weak.contains(*name) {
                            format!("a skipped stage's output is `none`, which is defined: test `stages.{name}.ran`, `stages.{name}.output is none`, or a field (`stages.{name}.output.FIELD is defined`, `stages.{name}.output.FIELD | default(...)`)")
                        } else if text.source.contains("{{") || text.source.contains("{%") {
                            format!("guard the use with `{{% if stages.{name}.ran %}}` (or in `when`), or give a field a default: `stages.{name}.output.FIELD | default(...)`")
                        } else {
                            format!("guard it in the expression: `stages.{name}.ran and ...` (a skipped stage's output is empty, so the rest would read nothing)")
                        }),
                );
            }
            if *attr == "output" && parts.len() > 3 {
                let full = format!("stages.{name}.output.{}", parts[3..].join("."));
                field(c, src, text, target, &parts[3..], &full, false, diags);
            }
        }
        "settled"
            if c.info(target).stage.kind().value != StageKind::ForEach
                || !c.ancestors(at).contains(&target) =>
        {
            diags.push(
                Diagnostic::new(
                    Code::NotUpstream,
                    span,
                    format!("`stages.{name}.settled` is only read inside the body of the for_each `{name}`"),
                )
                .help("`settled` lists the items of a for_each that have settled, for the items that run after them; after the for_each, read `stages.NAME.output.results`"),
            );
        }
        "history" | "last" if !upstream && !share_loop(c, at, target) => {
            diags.push(
                Diagnostic::new(Code::NotUpstream, span, format!("stage `{name}` is not upstream and not in the same loop, so it has no {attr} here"))
                    .help("history is available for stages upstream or in an enclosing loop's body"),
            );
        }
        _ => {}
    }
}

fn when_mentions(c: &Checked<'_>, at: StageId, name: &str, skip_own: bool) -> bool {
    let needle = format!("stages.{name}.");
    let own = (!skip_own).then_some(at);
    own.into_iter().chain(c.ancestors(at)).any(|s| {
        c.info(s)
            .stage
            .keys()
            .when
            .as_ref()
            .is_some_and(|w| w.value.contains(&needle))
    })
}

/// Checks that the output of `target` has the field `path` (written as `full` in the text);
/// `own` when a stage reads its own output (`output.x` in its `feedback`, `files` or `expect`).
#[allow(clippy::too_many_arguments)]
pub(super) fn field(
    c: &Checked<'_>,
    src: &Sources,
    text: &Text<'_>,
    target: StageId,
    path: &[&str],
    full: &str,
    own: bool,
    diags: &mut Diagnostics,
) {
    let Some(schema) = c.schemas.get(&target) else {
        return;
    };
    if let Err((bad, known)) = crate::check::outputs::walk_schema(schema, path) {
        let name = &c.info(target).stage.id.value;
        let whose = if own {
            format!("this stage's output (`{name}`)")
        } else {
            format!("the output of `{name}`")
        };
        diags.push(
            Diagnostic::new(
                Code::UnknownField,
                locate(src, text, full),
                format!("{whose} has no field `{bad}`"),
            )
            .label("not in the output schema")
            .suggest(&bad, known.iter().map(String::as_str))
            .help_or(if known.is_empty() {
                "the schema defines no fields here".to_string()
            } else {
                format!("its fields are: {}", known.join(", "))
            }),
        );
    }
}

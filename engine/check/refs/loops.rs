//! A loop: bounded by `max_iterations` (at least 1), its give-up actions in place, escalation
//! rules that run stages of its body, and a way to end early.

use super::actions::action_ok;
use super::stage::{mistyped, require};
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Action, Count, LoopBody, Stage, StageBody};

/// Checks a loop stage.
pub(super) fn check(c: &Checked<'_>, id: StageId, diags: &mut Diagnostics) {
    let s = c.info(id).stage;
    let Some(LoopBody {
        max_iterations,
        on_exhausted,
        stuck,
        escalation,
        until,
        stages,
        ..
    }) = s.body.as_loop()
    else {
        return;
    };
    require(c, s, "max_iterations", max_iterations.is_some(), diags);
    if let Some(m) = max_iterations {
        // A template counts too, when the params in force resolve it to 0.
        if crate::params::resolve_count(&m.value, &c.params).is_ok_and(|n| n == 0) {
            diags.push(
                Diagnostic::new(
                    Code::UnboundedLoop,
                    m.span,
                    "max_iterations must be at least 1",
                )
                .help("set max_iterations to the most attempts you accept"),
            );
        }
    }
    action_ok(c, Some(id), on_exhausted.as_ref(), "on_exhausted", diags);
    if let Some(st) = stuck {
        action_ok(c, Some(id), st.then.as_ref(), "stuck.then", diags);
        if st
            .repeats
            .as_ref()
            .is_some_and(|r| matches!(r.value, Count::Literal(0 | 1)))
        {
            if let Some(r) = &st.repeats {
                diags.push(
                    Diagnostic::new(
                        Code::InvalidValue,
                        r.span,
                        "stuck.repeats must be at least 2",
                    )
                    .help("2 means: the same findings twice in a row"),
                );
            }
        }
    }
    for rule in escalation {
        for target in &rule.run {
            match c.find(&target.value) {
                Some(t) if c.info(t).parent == Some(id) => {}
                Some(_) => diags.push(
                    Diagnostic::new(
                        Code::CrossRegionNeed,
                        target.span,
                        format!(
                            "stage `{}` is not in the body of loop `{}`",
                            target.value, s.id.value
                        ),
                    )
                    .help("escalation rules run stages of their own loop's body"),
                ),
                None => diags.push(Diagnostic::unknown(
                    Code::UnknownStage,
                    target.span,
                    "stage",
                    &target.value,
                    stages.iter().map(|b| b.id.value.as_str()),
                )),
            }
        }
    }
    let leaves = until.is_some()
        || stuck.is_some()
        || mistyped(c, s, "until")
        || mistyped(c, s, "stuck")
        || body_leaves(stages);
    if !leaves {
        diags.push(
            Diagnostic::new(
                Code::LoopNeverEndsEarly,
                s.kind().span,
                format!(
                    "loop `{}` can only end by running out of iterations",
                    s.id.value
                ),
            )
            .help_syntax(
                "add `until = \"...\"`, a `stuck` rule, or a route to `break` or `exit:NAME`",
                "add `until \"...\"`, a `stuck` rule, or a route to `break` or `exit:NAME`",
            ),
        );
    }
    if stages.is_empty() {
        diags.push(
            Diagnostic::new(
                Code::MissingKey,
                s.kind().span,
                format!("loop `{}` has no stages", s.id.value),
            )
            .help("add stages to its body"),
        );
    }
}

fn body_leaves(stages: &[Stage]) -> bool {
    stages.iter().any(|s| {
        let leaves = |a: &Action| matches!(a, Action::Break | Action::Exit(_));
        s.keys().route.as_ref().is_some_and(|r| {
            r.cases.iter().any(|(_, a)| leaves(&a.value))
                || r.default.as_ref().is_some_and(|a| leaves(&a.value))
        }) || s.keys().on_fail.as_ref().is_some_and(|a| leaves(&a.value))
            || s.keys().on_error.as_ref().is_some_and(|a| leaves(&a.value))
            || match &s.body {
                StageBody::Gate {
                    on_reject,
                    on_timeout,
                    ..
                } => {
                    on_reject.as_ref().is_some_and(|a| leaves(&a.value))
                        || on_timeout.as_ref().is_some_and(|a| leaves(&a.value))
                }
                StageBody::Group { stages, .. } => body_leaves(stages),
                _ => false,
            }
    })
}

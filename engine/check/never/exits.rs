//! A loop's exit condition (`until`) or stuck rule (`stuck.on`) that reads nothing the loop
//! changes: only params, stages outside the loop and the like. It is the same after every
//! iteration, as when it was copied from another loop: `until` ends the loop after the first
//! iteration or never, and `stuck` finds the loop stuck as soon as it can.

use super::{expression_vars, root};
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::Text;

pub(super) fn check(c: &Checked<'_>, diags: &mut Diagnostics) {
    for (i, info) in c.stages.iter().enumerate() {
        let id = StageId(i);
        let Some(l) = info.stage.body.as_loop() else {
            continue;
        };
        if let Some(u) = &l.until {
            one(
                c,
                id,
                u,
                "until",
                "so the loop ends after its first iteration, or only when it runs out of iterations",
                diags,
            );
        }
        if let Some(st) = &l.stuck {
            one(
                c,
                id,
                &st.on,
                "stuck.on",
                "so the loop is found stuck as soon as `repeats` iterations have run, whatever they did",
                diags,
            );
        }
    }
}

fn one(
    c: &Checked<'_>,
    l: StageId,
    expr: &Text,
    key: &str,
    consequence: &str,
    diags: &mut Diagnostics,
) {
    let Some(vars) = expression_vars(&expr.value) else {
        return;
    };
    if vars.is_empty() || vars.iter().any(|v| changes(c, l, v)) {
        return;
    }
    let lp = c.info(l).stage;
    let mut vars: Vec<&String> = vars.iter().collect();
    vars.sort();
    let mut outside: Vec<StageId> = vars.iter().filter_map(|v| stage_of(c, v)).collect();
    outside.dedup();
    let read = vars
        .iter()
        .map(|v| format!("`{v}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut d = Diagnostic::new(
        Code::ConstantLoopCondition,
        expr.span,
        format!(
            "the `{key}` of loop `{}` reads only values that no iteration changes ({read}): it is the same after every iteration, {consequence}",
            lp.id.value
        ),
    )
    .label("the same on every iteration");
    for s in &outside {
        d = d.related(
            c.info(*s).stage.id.span,
            format!(
                "`{}` is outside loop `{}`",
                c.info(*s).stage.id.value,
                lp.id.value
            ),
        );
    }
    let body: Vec<String> = c
        .info(l)
        .children
        .iter()
        .map(|s| format!("`stages.{}.output`", c.info(*s).stage.id.value))
        .collect();
    let help = format!(
        "was `{key}` copied from another loop? Read what this loop's body produces{}",
        if body.is_empty() {
            String::new()
        } else {
            format!(": {}", body.join(", "))
        }
    );
    diags.push(d.help(help));
}

/// Whether a variable read by a loop's condition can change from one iteration of loop `l`
/// to the next. Anything not known to stay the same counts as changing.
fn changes(c: &Checked<'_>, l: StageId, var: &str) -> bool {
    let parts: Vec<&str> = var.split('.').collect();
    match root(var) {
        "params" | "run" | "max_iterations" | "true" | "false" | "none" | "True" | "False"
        | "None" => false,
        "stages" => match (parts.get(1), parts.get(2)) {
            // `settled` grows while the items of a fan-out end.
            (Some(_), Some(&"settled")) | (None, _) => true,
            (Some(name), _) => match c.find(name) {
                Some(s) => s == l || c.ancestors(s).contains(&l),
                None => true,
            },
        },
        // An outer loop's variables stay the same while this loop runs.
        "loops" => parts.get(1).is_none_or(|n| *n == c.info(l).stage.id.value),
        r => !is_item_var(c, l, r),
    }
}

/// Whether `name` is the item variable (or `index`) of a for_each around loop `l`: the same
/// for every iteration of the loop.
fn is_item_var(c: &Checked<'_>, l: StageId, name: &str) -> bool {
    c.ancestors(l).into_iter().any(|a| {
        c.info(a).stage.body.as_for_each().is_some_and(|f| {
            name == "index" || name == f.as_name.as_ref().map_or("item", |n| n.value.as_str())
        })
    })
}

/// The stage a `stages.NAME...` variable reads.
fn stage_of(c: &Checked<'_>, var: &str) -> Option<StageId> {
    let rest = var.strip_prefix("stages.")?;
    c.find(rest.split('.').next()?)
}

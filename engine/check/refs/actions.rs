//! Actions in their place: `continue` and `break` only in loops, `approve` and `reject` only
//! on a gate's timeout, exits that are declared, and stages only where an action may go to one
//! (route cases, and what a loop or gate does when it gives up), in the same body.

use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::Action;
use crate::source::Spanned;

fn exit_names(c: &Checked<'_>) -> Vec<String> {
    let mut names: Vec<String> = c
        .workflow
        .exits
        .iter()
        .map(|e| e.name.value.clone())
        .collect();
    for (n, _) in crate::exit::IMPLICIT {
        if !names.iter().any(|x| x == n) {
            names.push((*n).to_string());
        }
    }
    names
}

/// The keys whose action runs a stage instead of giving up.
const GIVE_UP_KEYS: &[&str] = &["on_exhausted", "stuck.then", "on_timeout"];

/// Tells whether a key's action may name a stage: route cases and defaults, and what a loop
/// or a gate does when it gives up.
fn goes_to_stages(key: &str) -> bool {
    key == "cases" || key == "default" || GIVE_UP_KEYS.contains(&key)
}

/// Checks an action written on stage `at` (or at the top level for `None`).
pub(super) fn action_ok(
    c: &Checked<'_>,
    at: Option<StageId>,
    action: Option<&Spanned<Action>>,
    key: &str,
    diags: &mut Diagnostics,
) {
    let Some(action) = action else { return };
    let in_loop = at.is_some_and(|s| c.enclosing_loop(s).is_some());
    match &action.value {
        Action::Continue | Action::Break if !in_loop => diags.push(
            Diagnostic::new(
                Code::ActionOutOfPlace,
                action.span,
                format!("`{}` is only possible inside a loop", action.value),
            )
            .help("use `fail` or `exit:NAME` outside loops"),
        ),
        Action::Approve | Action::Reject if key != "on_timeout" => diags.push(
            Diagnostic::new(
                Code::ActionOutOfPlace,
                action.span,
                format!("`{}` is only possible as a gate's on_timeout", action.value),
            )
            .help("use `continue`, `break`, `fail`, `exit:NAME` or a stage id"),
        ),
        Action::Exit(name) => {
            let names = exit_names(c);
            if !names.iter().any(|n| n == name) {
                diags.push(
                    Diagnostic::unknown(
                        Code::UnknownExit,
                        action.span,
                        "exit",
                        name,
                        names.iter().map(String::as_str),
                    )
                    .help_or_syntax(
                        format!("declare it under [exits.{name}] with its code"),
                        format!("declare it with exit \"{name}\" code=N"),
                    ),
                );
            }
        }
        // Only route cases and defaults go to stages: elsewhere a bare word is a misspelt
        // or invented action, not a stage to look for.
        Action::Goto(target) if !goes_to_stages(key) && c.find(target).is_none() => {
            let mut actions = Vec::new();
            if in_loop {
                actions.extend(["continue", "break"]);
            }
            if key == "on_timeout" {
                actions.extend(["approve", "reject"]);
            }
            actions.push("fail");
            let exits = exit_names(c)
                .iter()
                .map(|n| format!("exit:{n}"))
                .collect::<Vec<_>>();
            let list = actions
                .iter()
                .map(|a| format!("`{a}`"))
                .chain(exits.iter().map(|e| format!("`{e}`")))
                .collect::<Vec<_>>()
                .join(", ");
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    action.span,
                    format!("`{target}` is not an action `{key}` can take"),
                )
                .label("not an action")
                .suggest(
                    target,
                    actions
                        .iter()
                        .copied()
                        .chain(exits.iter().map(String::as_str)),
                )
                .help_or(format!("`{key}` here takes one of: {list}")),
            );
        }
        Action::Goto(target) => match c.find(target) {
            None => diags.push(Diagnostic::unknown(
                Code::UnknownStage,
                action.span,
                "stage",
                target,
                c.by_id.keys().copied(),
            )),
            Some(t) => {
                let here = at.and_then(|s| c.info(s).parent);
                if !goes_to_stages(key) {
                    diags.push(
                        Diagnostic::new(Code::ActionOutOfPlace, action.span, format!("`{key}` cannot go to a stage"))
                            .help("only route cases and what a loop or gate does when it gives up (`on_exhausted`, `stuck.then`, `on_timeout`) go to stages; use `continue`, `break`, `fail` or `exit:NAME`"),
                    );
                } else if GIVE_UP_KEYS.contains(&key)
                    && c.info(t).parent == here
                    && Some(t) != at
                    && c.info(t).stage.keys().route.is_none()
                    && c.info(t).stage.keys().then.is_none()
                {
                    diags.push(
                        Diagnostic::new(
                            Code::ActionOutOfPlace,
                            action.span,
                            format!("stage `{target}` runs when this gives up, but does not say how the run goes on"),
                        )
                        .label("gives up to this stage")
                        .help_or_syntax(
                            format!("add then = \"exit:NAME\" (or \"fail\") to [stages.{target}], or a route"),
                            format!("add then=\"exit:NAME\" (or \"fail\") to stage \"{target}\", or a route"),
                        ),
                    );
                } else if c.info(t).parent != here {
                    let (what, help) = if GIVE_UP_KEYS.contains(&key) {
                        (
                            "this stage",
                            "the stage run on giving up stands beside the loop or gate (in the same body), not inside it",
                        )
                    } else {
                        (
                            "this route",
                            "a route goes to a stage of the same body; to leave a loop, use `break` or `exit:NAME`",
                        )
                    };
                    diags.push(
                        Diagnostic::new(
                            Code::CrossRegionNeed,
                            action.span,
                            format!("stage `{target}` is in another body than {what}"),
                        )
                        .help(help),
                    );
                } else if Some(t) == at {
                    diags.push(
                        Diagnostic::new(
                            Code::Cycle,
                            action.span,
                            format!("stage `{target}` routes to itself"),
                        )
                        .help("to run it again, put it in a loop and use `continue`"),
                    );
                }
            }
        },
        _ => {}
    }
}

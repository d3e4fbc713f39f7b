//! Which variables a template may name where: params, run, stages, loop and item variables.

use super::scan::{Guards, locate};
use super::stage_refs::stage_ref;
use super::{Scope, Text};
use crate::check::scope::Site;
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::StageKind;
use crate::source::{Sources, Span};

/// Helper functions templates may call; the run side provides them.
pub(crate) const HELPERS: &[&str] = &[
    "read_file",
    "glob",
    "git_diff",
    "git_status",
    "tail",
    "file_exists",
    "earlier_runs",
];
/// Functions minijinja itself provides.
const BUILTINS: &[&str] = &[
    "range",
    "dict",
    "namespace",
    "debug",
    "true",
    "false",
    "none",
    "True",
    "False",
    "None",
];
/// The attributes of `stages.ID`.
pub(crate) const STAGE_ATTRS: &[&str] = &[
    "output", "history", "last", "status", "ran", "feedback", "attempts", "usage", "settled",
];
/// The attributes of `run`.
pub(crate) const RUN_ATTRS: &[&str] = &[
    "id",
    "dir",
    "workflow",
    "started_at",
    "stage_dir",
    "cwd",
    "root",
];
/// The loop variables.
pub(crate) const LOOP_VARS: &[&str] = &["iteration", "max_iterations", "feedback", "history"];

pub(super) fn variable(
    c: &Checked<'_>,
    src: &Sources,
    text: &Text<'_>,
    var: &str,
    scope: Scope,
    guards: &Guards,
    diags: &mut Diagnostics,
) {
    let parts: Vec<&str> = var.split('.').collect();
    let root = parts[0];
    let span = locate(src, text, var);
    let site = match scope {
        Scope::At(s) | Scope::WithOutput(s) => Some(s),
        Scope::Params | Scope::End => None,
    };
    if HELPERS.contains(&root) || BUILTINS.contains(&root) {
        return;
    }
    match root {
        "params" => {
            if let Some(name) = parts.get(1) {
                if !c.workflow.params.iter().any(|p| p.name.value == *name) {
                    diags.push(
                        Diagnostic::unknown(
                            Code::UnknownParam,
                            locate(src, text, &format!("params.{name}")),
                            "param",
                            name,
                            c.workflow.params.iter().map(|p| p.name.value.as_str()),
                        )
                        .help_or_syntax(
                            format!("declare it under [params.{name}] with its type"),
                            format!("declare it with param \"{name}\" type=\"...\""),
                        ),
                    );
                }
            }
            return;
        }
        "run" => {
            if let Some(attr) = parts.get(1) {
                if !RUN_ATTRS.contains(attr) {
                    diags.push(
                        Diagnostic::new(
                            Code::UnknownVariable,
                            span,
                            format!("`run` has no `{attr}`"),
                        )
                        .suggest(attr, RUN_ATTRS.iter().copied())
                        .help_or(format!("run has: {}", RUN_ATTRS.join(", "))),
                    );
                }
            }
            return;
        }
        _ => {}
    }
    if matches!(scope, Scope::Params) {
        if crate::suggest::closest(root, ["params", "run"]).is_some() {
            diags.push(unknown(var, span, &["params", "run"]));
            return;
        }
        diags.push(
            Diagnostic::new(
                Code::NotParamsOnly,
                span,
                format!("`{root}` is not known when the run starts"),
            )
            .label("only params and run are available here")
            .help("limits and agent settings are fixed when the run starts; use params"),
        );
        return;
    }
    if root == "stages" {
        stage_ref(c, src, text, &parts, site, guards, diags);
        return;
    }
    let Some(site) = site else {
        diags.push(unknown(var, span, &["params", "stages", "run"]));
        return;
    };
    let at = site.stage();
    let loops: Vec<StageId> = {
        let mut l: Vec<StageId> = c
            .ancestors(at)
            .into_iter()
            .filter(|a| c.info(*a).stage.kind().value == StageKind::Loop)
            .collect();
        if matches!(site, Site::BodyEnd(_)) {
            l.insert(0, at);
        }
        l
    };
    let items: Vec<(String, StageId)> = {
        let mut anc = c.ancestors(at);
        if matches!(site, Site::BodyEnd(_)) {
            anc.insert(0, at);
        }
        anc.into_iter()
            .filter_map(|a| {
                let f = c.info(a).stage.body.as_for_each()?;
                Some((
                    f.as_name
                        .as_ref()
                        .map_or("item".to_string(), |n| n.value.clone()),
                    a,
                ))
            })
            .collect()
    };
    match root {
        "attempt" => {
            if let Some(attr) = parts.get(1) {
                diags.push(
                    Diagnostic::new(Code::UnknownVariable, span, format!("`attempt` is a number, so it has no `{attr}`"))
                        .label("not a field")
                        .help("`attempt` is this stage's attempt number (1, 2, ...); its output is `output`"),
                );
            }
        }
        "output" if matches!(scope, Scope::WithOutput(_)) => {
            if parts.len() > 1 {
                super::stage_refs::field(c, src, text, at, &parts[1..], var, true, diags);
            }
        }
        "output" => diags.push(
            Diagnostic::new(Code::UnknownVariable, span, "`output` is only available in a stage's `feedback`, `files` and a check's `expect`")
                .help(format!("use `stages.{}.output` after the stage has run", c.info(at).stage.id.value)),
        ),
        r if LOOP_VARS.contains(&r) => {
            if loops.is_empty() {
                diags.push(
                    Diagnostic::new(Code::LoopVarOutsideLoop, span, format!("`{r}` is a loop variable, but this is not inside a loop"))
                        .help_syntax("loop variables exist only in the body of a `kind = \"loop\"` stage", "loop variables exist only in the body of a `kind=\"loop\"` stage"),
                );
            }
        }
        "loops" => match parts.get(1) {
            Some(name) if loops.iter().any(|l| c.info(*l).stage.id.value == *name) => {
                if let Some(attr) = parts.get(2) {
                    if !LOOP_VARS.contains(attr) {
                        diags.push(Diagnostic::new(Code::UnknownVariable, span, format!("a loop has no `{attr}`")).help(format!("loops have: {}", LOOP_VARS.join(", "))));
                    }
                }
            }
            Some(name) => diags.push(
                Diagnostic::new(Code::LoopVarOutsideLoop, span, format!("`{name}` is not a loop around this place"))
                    .suggest(name, loops.iter().map(|l| c.info(*l).stage.id.value.as_str()))
                    .help_or("`loops.NAME` names an enclosing loop"),
            ),
            None => {}
        },
        "index" if !items.is_empty() => {}
        r if items.iter().any(|(n, _)| n == r) => {}
        r => {
            let mut known: Vec<&str> = vec!["params", "stages", "run", "attempt"];
            if !loops.is_empty() {
                known.extend(LOOP_VARS);
                known.push("loops");
            }
            known.extend(items.iter().map(|(n, _)| n.as_str()));
            let in_some_foreach = c.stages.iter().any(|s| {
                s.stage.body.as_for_each().is_some_and(|f| {
                    f.as_name.as_ref().map_or("item", |n| n.value.as_str()) == r
                })
            });
            if r == "item" && !items.is_empty() {
                let (name, fe) = &items[0];
                let fe = c.info(*fe).stage;
                let rest = var.strip_prefix("item").unwrap_or("");
                diags.push(
                    Diagnostic::new(Code::UnknownVariable, span, format!("there is no `item` here: the for_each `{}` names its item `{name}`", fe.id.value))
                        .label(format!("write `{name}{rest}`"))
                        .help(format!("`as` names the item variable; it is `item` only when `as` is left out (did you mean `{name}{rest}`?)")),
                );
            } else if in_some_foreach || r == "index" {
                diags.push(
                    Diagnostic::new(Code::LoopVarOutsideLoop, span, format!("`{r}` is a for_each variable, but this is not inside that for_each"))
                        .help("item variables exist only in the body of their for_each"),
                );
            } else {
                diags.push(unknown(var, span, &known));
            }
        }
    }
}

/// Reports a variable `var` (`root.rest...`) whose root names nothing, suggesting the closest
/// of the `known` roots with the rest of the path kept (`param.x` → `params.x`).
fn unknown(var: &str, span: Span, known: &[&str]) -> Diagnostic {
    let (name, rest) = var.split_once('.').map_or((var, ""), |(r, t)| (r, t));
    let d = Diagnostic::new(
        Code::UnknownVariable,
        span,
        format!("unknown variable `{name}`"),
    )
    .label("names no param, loop variable, stage or helper");
    let d = match crate::suggest::closest(name, known.iter().copied()) {
        Some(best) if !rest.is_empty() => d.help(format!("did you mean `{best}.{rest}`?")),
        Some(best) => d.help(format!("did you mean `{best}`?")),
        None => d,
    };
    d.help_or("templates see params.*, stages.*, run.*, attempt, loop variables, item variables and helper functions")
}

//! One stage's references and required keys: its needs (same body, not itself), resource,
//! actions, and what its kind needs (an agent and a prompt, an argv, a gate's message and
//! timeout policy, a subflow's workflow); loops and regions go on in `loops.rs` and
//! `regions.rs`.

use super::actions::action_ok;
use super::{agent_ref, loops, regions};
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Stage, StageBody};

/// Tells whether a stage has `key` with a value of the wrong type (reported once, by the shape
/// check): the key counts as present.
pub(super) fn mistyped(c: &Checked<'_>, stage: &Stage, key: &str) -> bool {
    c.workflow.is_broken(&crate::model::lower::mistyped(
        "stages",
        &stage.id.value,
        key,
    ))
}

pub(super) fn require(
    c: &Checked<'_>,
    stage: &Stage,
    key: &str,
    present: bool,
    diags: &mut Diagnostics,
) {
    if !present && !mistyped(c, stage, key) {
        let code = if key == "max_iterations" {
            Code::UnboundedLoop
        } else {
            Code::MissingKey
        };
        let mut d = Diagnostic::new(
            code,
            stage.kind().span,
            format!(
                "{} stage needs `{key}`",
                crate::diag::article(stage.kind().value.as_str())
            ),
        )
        .label(format!("stage `{}` has no `{key}`", stage.id.value));
        d = match key {
            "max_iterations" => d.help_syntax(
                "every loop is bounded: add max_iterations = N",
                "every loop is bounded: add max_iterations=N",
            ),
            "prompt" => d.help_syntax(
                "add `prompt = \"...\"` or `prompt_file = \"prompts/....md.j2\"`",
                "add `prompt \"...\"` or `prompt_file \"prompts/....md.j2\"`",
            ),
            _ => d.help(format!("add `{key}`")),
        };
        // What to write until the author writes the right value.
        let value = match key {
            "max_iterations" => "3".to_string(),
            "agent" => c
                .workflow
                .agents
                .first()
                .map_or_else(|| "\"\"".to_string(), |a| format!("\"{}\"", a.name.value)),
            _ => "\"\"".to_string(),
        };
        diags.push(d.adding_key(Some(stage.span), key, value));
    }
}

pub(super) fn stage(c: &mut Checked<'_>, id: StageId, diags: &mut Diagnostics) {
    let s = c.info(id).stage;
    let parent = c.info(id).parent;
    // needs
    let mut resolved = Vec::new();
    for need in &s.needs {
        match c.find(&need.value) {
            None => diags.push(Diagnostic::unknown(
                Code::UnknownStage,
                need.span,
                "stage",
                &need.value,
                c.body(parent)
                    .iter()
                    .map(|b| c.info(*b).stage.id.value.as_str()),
            )),
            Some(n) if n == id => diags.push(
                Diagnostic::new(
                    Code::Cycle,
                    need.span,
                    format!("stage `{}` needs itself", need.value),
                )
                .help("remove it from needs"),
            ),
            Some(n) if c.info(n).parent != parent => {
                let where_ = match c.info(n).parent {
                    Some(p) => format!("in the body of `{}`", c.info(p).stage.id.value),
                    None => "at the top level".to_string(),
                };
                diags.push(
                    Diagnostic::new(Code::CrossRegionNeed, need.span, format!("stage `{}` is {where_}, not in the same body as `{}`", need.value, s.id.value))
                        .help("needs name stages of the same body; a body's stages already run after everything its loop or fan-out needs"),
                );
            }
            Some(n) => resolved.push(n),
        }
    }
    c.stages[id.0].needs = resolved;
    if let Some(r) = &s.keys().resource {
        if !c.workflow.resources.iter().any(|x| x.name.value == r.value) {
            diags.push(
                Diagnostic::unknown(
                    Code::UnknownResource,
                    r.span,
                    "resource",
                    &r.value,
                    c.workflow.resources.iter().map(|x| x.name.value.as_str()),
                )
                .help_or(format!(
                    "declare it under [resources.{}] with a capacity",
                    r.value
                )),
            );
        }
    }
    if s.keys().priority.is_some() && s.keys().resource.is_none() {
        if let Some(p) = &s.keys().priority {
            diags.push(
                Diagnostic::new(
                    Code::KeyNotForKind,
                    p.span,
                    "`priority` has no effect without `resource`",
                )
                .help_syntax(
                    "add `resource = \"NAME\"` or remove priority",
                    "add `resource \"NAME\"` or remove priority",
                ),
            );
        }
    }
    action_ok(c, Some(id), s.keys().on_fail.as_ref(), "on_fail", diags);
    action_ok(c, Some(id), s.keys().on_error.as_ref(), "on_error", diags);
    action_ok(c, Some(id), s.keys().then.as_ref(), "then", diags);
    if let Some(b) = &s.keys().budget {
        action_ok(c, Some(id), b.on_exceeded.as_ref(), "on_exceeded", diags);
    }
    if let Some(route) = &s.keys().route {
        for (_, a) in &route.cases {
            action_ok(c, Some(id), Some(a), "cases", diags);
        }
        action_ok(c, Some(id), route.default.as_ref(), "default", diags);
    }
    match &s.body {
        StageBody::Agent {
            agent,
            prompt,
            prompt_file,
        } => {
            require(c, s, "agent", agent.is_some(), diags);
            require(
                c,
                s,
                "prompt",
                prompt.is_some() || prompt_file.is_some() || mistyped(c, s, "prompt_file"),
                diags,
            );
            if let (Some(p), Some(_)) = (prompt, prompt_file) {
                diags.push(
                    Diagnostic::new(
                        Code::Duplicate,
                        p.span,
                        "a stage has either `prompt` or `prompt_file`, not both",
                    )
                    .help("keep one of them"),
                );
            }
            if let Some(a) = agent {
                agent_ref(c, a, diags);
            }
        }
        StageBody::Command(cmd) => require(c, s, "argv", !cmd.argv.is_empty(), diags),
        StageBody::Check {
            command, expect, ..
        } => {
            if command.is_none() && expect.is_none() && !mistyped(c, s, "expect") {
                diags.push(
                    Diagnostic::new(
                        Code::MissingKey,
                        s.kind().span,
                        "a check stage needs `argv`, `expect` or both",
                    )
                    .help_syntax(
                        "add argv = [...] to run a command, or expect = \"...\" to test outputs",
                        "add argv \"...\" to run a command, or expect \"...\" to test outputs",
                    ),
                );
            }
            if let Some(cmd) = command {
                require(c, s, "argv", !cmd.argv.is_empty(), diags);
            }
        }
        StageBody::Gate {
            message,
            on_timeout,
            on_reject,
            ..
        } => {
            require(c, s, "message", message.is_some(), diags);
            action_ok(c, Some(id), on_timeout.as_ref(), "on_timeout", diags);
            action_ok(c, Some(id), on_reject.as_ref(), "on_reject", diags);
            // A value of the wrong type or shape was reported on its own: it counts as there.
            let timeout = s.keys().timeout.is_some() || mistyped(c, s, "timeout");
            let on_timeout = on_timeout.is_some() || mistyped(c, s, "on_timeout");
            if !timeout || !on_timeout {
                let what = match (timeout, on_timeout) {
                    (false, false) => "neither `timeout` nor `on_timeout`",
                    (false, true) => "`on_timeout` but no `timeout`",
                    _ => "`timeout` but no `on_timeout`",
                };
                diags.push(
                    Diagnostic::new(Code::GateNoTimeout, s.kind().span, format!("gate `{}` has {what}: it may wait forever", s.id.value))
                        .help_syntax(
                            "add timeout = \"24h\" and on_timeout = \"reject\" (or approve, fail, exit:NAME)",
                            "add timeout \"24h\" and on_timeout \"reject\" (or approve, fail, exit:NAME)",
                        ),
                );
            }
        }
        // A preset reference that could not be resolved was reported by the loader, which
        // dropped it and marked the stage broken.
        StageBody::Subflow { workflow, .. } => require(
            c,
            s,
            "workflow",
            workflow.is_some() || c.workflow.is_broken(&s.id.value),
            diags,
        ),
        StageBody::Loop { .. } => loops::check(c, id, diags),
        StageBody::ForEach { .. } => regions::for_each(c, id, diags),
        StageBody::Group {
            result,
            stages,
            max_concurrency,
            ..
        } => {
            regions::region_common(
                c,
                id,
                result.as_ref(),
                max_concurrency.as_ref(),
                stages,
                diags,
            );
        }
    }
}

//! Reference checks: stages, agents, resources, exits and actions name things that exist and
//! fit where they are used; each kind of stage has what it needs.
//!
//! Here: the workflow-level definitions (its name, exits, agents, resources, budget) and
//! references to agents. `stage.rs` checks a stage (its needs, resource, actions and the keys
//! its kind requires, gates included), `loops.rs` a loop's bounds and ways out, `regions.rs`
//! what for_each and group bodies need, and `actions.rs` every action in its place.

mod actions;
mod loops;
mod regions;
mod stage;

use super::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::Count;
use crate::source::Spanned;
use actions::action_ok;
pub(super) use actions::meant_targets;

pub(super) fn check(c: &mut Checked<'_>, diags: &mut Diagnostics) {
    let wf = c.workflow;
    if !wf.name.value.is_empty()
        && !wf
            .name
            .value
            .chars()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-' || ch == '_')
    {
        diags.push(
            Diagnostic::new(
                Code::InvalidValue,
                wf.name.span,
                format!(
                    "workflow name `{}` has characters other than a-z, 0-9, `-` and `_`",
                    wf.name.value
                ),
            )
            .help(
                "names are used in paths and run ids; use lowercase letters, digits, `-` and `_`",
            ),
        );
    }
    for e in &wf.exits {
        if let Some((_, what)) = crate::exit::ENGINE
            .iter()
            .find(|(code, _)| i64::from(*code) == e.code.value)
        {
            diags.push(
                Diagnostic::new(
                    Code::ReservedExitCode,
                    e.code.span,
                    format!(
                        "exit code {} is what ralph-flow itself returns for a {what}",
                        e.code.value
                    ),
                )
                .help("choose another code so the two can be told apart"),
            );
        }
        if !(0..=255).contains(&e.code.value) {
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    e.code.span,
                    "exit codes are between 0 and 255",
                )
                .help("choose a code from 0 to 255"),
            );
        }
    }
    for a in &wf.agents {
        for fb in &a.fallbacks {
            agent_ref(c, fb, diags);
        }
        if let Some(mode) = &a.structured_output {
            if crate::model::schema_delivery(a.kind.value, mode.value, true).is_none() {
                diags.push(
                    Diagnostic::new(
                        Code::ModeNotForAgent,
                        mode.span,
                        format!(
                            "`structured_output = \"{}\"` is not a mode of {} agents",
                            mode.value.as_str(),
                            a.kind.value.as_str()
                        ),
                    )
                    .label("not a mode of this kind")
                    .help(if a.kind.value == crate::model::AgentKind::Acp {
                        "an `acp` agent has no schema mode of its own: it takes `prompt` (the \
                         schema in the prompt, what `auto` does) or `off`"
                    } else {
                        "a CLI agent takes `auto` (its schema flag, where it has one), \
                         `json_schema` (the flag), `prompt` (the schema in the prompt) or `off`"
                    }),
                );
            }
        }
        let missing = match a.kind.value {
            crate::model::AgentKind::Command | crate::model::AgentKind::Acp
                if a.command.is_empty() =>
            {
                Some("command")
            }
            crate::model::AgentKind::Replay if a.file.is_none() => Some("file"),
            crate::model::AgentKind::OpenAi | crate::model::AgentKind::Anthropic
                if a.model.is_none() =>
            {
                Some("model")
            }
            _ => None,
        };
        let mistyped_key = |key: &str| {
            c.workflow
                .is_broken(&crate::model::lower::mistyped("agents", &a.name.value, key))
        };
        if let Some(key) = missing.filter(|key| !mistyped_key(key)) {
            diags.push(
                Diagnostic::new(
                    Code::AgentIncomplete,
                    a.kind.span,
                    format!(
                        "agent `{}` of kind `{}` needs `{key}`",
                        a.name.value,
                        a.kind.value.as_str()
                    ),
                )
                .help(format!("add `{key}` to the agent")),
            );
        }
    }
    for r in &wf.resources {
        if r.capacity.value == Count::Literal(0) {
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    r.capacity.span,
                    "a resource's capacity must be at least 1",
                )
                .help_syntax("set capacity = 1 for a queue", "set capacity=1 for a queue"),
            );
        }
    }
    if let Some(b) = &wf.budget {
        action_ok(c, None, b.on_exceeded.as_ref(), "on_exceeded", diags);
    }
    for i in 0..c.stages.len() {
        stage::stage(c, StageId(i), diags);
    }
}

pub(super) fn agent_ref(c: &Checked<'_>, name: &Spanned<String>, diags: &mut Diagnostics) {
    if name.value.contains("{{") {
        return; // checked against param choices by the template check
    }
    if !c.workflow.agents.iter().any(|a| a.name.value == name.value) {
        diags.push(
            Diagnostic::unknown(
                Code::UnknownAgent,
                name.span,
                "agent",
                &name.value,
                c.workflow.agents.iter().map(|a| a.name.value.as_str()),
            )
            .help_or(agent_list(c)),
        );
    }
}

fn agent_list(c: &Checked<'_>) -> String {
    let names: Vec<&str> = c
        .workflow
        .agents
        .iter()
        .map(|a| a.name.value.as_str())
        .collect();
    if names.is_empty() {
        "define it under [agents.NAME]".into()
    } else {
        format!("the agents are: {}", names.join(", "))
    }
}

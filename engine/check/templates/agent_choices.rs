//! An agent named by a param (`agent = "{{ params.X }}"`): every choice of the param must name
//! an agent.

use crate::check::Checked;
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::source::Spanned;

pub(super) fn agent_choices(c: &Checked<'_>, a: &Spanned<String>, diags: &mut Diagnostics) {
    // `{{ params.X }}` naming an agent, possibly with text around it (`driver_{{ params.X }}`):
    // every choice of X, with that text around it, must be an agent.
    let text = a.value.trim();
    let (Some(open), Some(close)) = (text.find("{{"), text.find("}}")) else {
        return;
    };
    if close < open || text[close + 2..].contains("{{") {
        return;
    }
    let (prefix, suffix) = (&text[..open], &text[close + 2..]);
    let Some(param) = text[open + 2..close].trim().strip_prefix("params.") else {
        return;
    };
    let Some(p) = c.workflow.params.iter().find(|p| p.name.value == param) else {
        return;
    };
    let values: Vec<serde_json::Value> = if p.choices.is_empty() {
        p.default
            .iter()
            .map(crate::syntax::tree::Value::to_json)
            .collect()
    } else {
        p.choices
            .iter()
            .map(crate::syntax::tree::Value::to_json)
            .collect()
    };
    for v in values {
        let value = v.as_str().unwrap_or_default();
        let name = format!("{prefix}{value}{suffix}");
        let name = name.as_str();
        if !c.workflow.agents.iter().any(|x| x.name.value == name) {
            let message = if name == value {
                format!("param `{param}` can be `{name}`, which is not an agent")
            } else {
                format!("param `{param}` can be `{value}`, which names `{name}`: not an agent")
            };
            diags.push(
                Diagnostic::new(Code::UnknownAgent, a.span, message)
                    .suggest(
                        name,
                        c.workflow.agents.iter().map(|x| x.name.value.as_str()),
                    )
                    .help_or("make every choice of the param the name of an agent"),
            );
        }
    }
    if p.choices.is_empty() {
        diags.push(
            Diagnostic::new(
                Code::UnknownAgent,
                a.span,
                format!(
                    "param `{param}` names an agent but has no `choices`, so any value could be set"
                ),
            )
            .severity_warning()
            .help_syntax(
                "add choices = [...] listing the agents it may name",
                "add choices \"...\" \"...\" listing the agents it may name",
            ),
        );
    }
}

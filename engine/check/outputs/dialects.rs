//! A stage's output schema against what each agent it goes to accepts: a schema that an
//! agent's validator or service would refuse (claude's draft-07 Ajv, OpenAI's strict mode) is
//! reported before any token is spent, at the part of the schema at fault (RF060).

use std::collections::HashSet;

use serde_json::Value as Json;

use super::json_locate::pointer_range;
use crate::check::Checked;
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Agent, SchemaDelivery, Stage};
use crate::source::{FileId, Span};

/// Where a stage's schema was written, to point into it.
pub(super) enum Written<'a> {
    Inline(Span),
    File {
        file: FileId,
        text: &'a str,
        /// Where the workflow names the file.
        named: Span,
    },
}

impl Written<'_> {
    /// The span of the value at a JSON pointer (the whole inline schema when inline).
    fn place(&self, pointer: &str) -> Span {
        match self {
            Written::Inline(span) => *span,
            // A field that markers added is not in the file: the file's start.
            Written::File { file, text, .. } => Span::new(*file, pointer_range(text, pointer)),
        }
    }
}

/// How a stage's schema reaches an agent.
pub(super) fn delivery(c: &Checked<'_>, a: &Agent) -> Option<SchemaDelivery> {
    let mode = a
        .structured_output
        .as_ref()
        .map(|m| m.value)
        .unwrap_or_default();
    let base_url = base_url(c, a).map(|(_, url)| url);
    crate::model::schema_delivery(
        a.kind.value,
        mode,
        crate::model::is_openai_itself(base_url.as_deref()),
    )
}

/// An agent's `base_url` with the workflow's params rendered into it (as written when it
/// does not render), and where it is written; `None` when the agent has none.
pub(in crate::check) fn base_url(c: &Checked<'_>, a: &Agent) -> Option<(Span, String)> {
    let url = a.base_url.as_ref()?;
    let rendered =
        crate::params::render_params(&url.value, &c.params).unwrap_or_else(|_| url.value.clone());
    Some((url.span, rendered))
}

/// Reports what each agent of the stage would refuse in its schema; `seen` keeps one report
/// per schema place, agent and rule when stages share a schema file.
pub(super) fn check(
    c: &Checked<'_>,
    stage: &Stage,
    schema: &Json,
    written: &Written<'_>,
    seen: &mut HashSet<(Span, String, String)>,
    diags: &mut Diagnostics,
) {
    for (agent, called_at) in c.stage_agents(stage) {
        let Some(SchemaDelivery::Lowered(dialect)) = delivery(c, agent) else {
            continue;
        };
        let Err(refusals) = crate::dialect::lower(schema, dialect) else {
            continue;
        };
        for r in refusals {
            let span = written.place(&r.pointer);
            if !seen.insert((span, agent.name.value.clone(), r.message.clone())) {
                continue;
            }
            let at = if r.pointer.is_empty() {
                "the schema's root".to_string()
            } else {
                format!("`{}`", r.pointer)
            };
            let mut d = Diagnostic::new(
                Code::SchemaRefused,
                span,
                format!(
                    "agent `{}` ({}) would refuse this output schema: {} (at {at})",
                    agent.name.value,
                    agent.kind.value.as_str(),
                    r.message
                ),
            )
            .label(r.rule)
            .related(
                called_at,
                format!(
                    "stage `{}` calls agent `{}`",
                    stage.id.value, agent.name.value
                ),
            )
            .help(r.fix);
            if let Written::File { named, .. } = written {
                d = d.related(*named, "the schema is used here");
            }
            diags.push(d);
        }
    }
}

//! An extending file's overrides applied to its base's stages, each key only on a stage of a
//! kind that has it.

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Override, StageBody};
use crate::source::Span;

pub(super) fn find_stage<'s>(
    stages: &'s [crate::model::Stage],
    id: &str,
) -> Option<&'s crate::model::Stage> {
    stages.iter().find_map(|s| {
        if s.id.value == id {
            Some(s)
        } else {
            find_stage(s.children(), id)
        }
    })
}

fn find_stage_mut<'s>(
    stages: &'s mut [crate::model::Stage],
    id: &str,
) -> Option<&'s mut crate::model::Stage> {
    for s in stages.iter_mut() {
        if s.id.value == id {
            return Some(s);
        }
        if let Some(children) = s.children_mut() {
            if let Some(found) = find_stage_mut(children, id) {
                return Some(found);
            }
        }
    }
    None
}

pub(super) fn apply_override(
    stages: &mut [crate::model::Stage],
    o: &Override,
    diags: &mut Diagnostics,
) {
    let names: Vec<String> = all_ids(stages);
    let Some(stage) = find_stage_mut(stages, &o.stage.value) else {
        diags.push(
            Diagnostic::new(
                Code::BadOverride,
                o.stage.span,
                format!("the base workflow has no stage `{}`", o.stage.value),
            )
            .label("overrides a stage that does not exist")
            .suggest(&o.stage.value, names.iter().map(String::as_str)),
        );
        return;
    };
    let not_for = |key: &str, span: Span, kind: &str, diags: &mut Diagnostics| {
        diags.push(
            Diagnostic::new(
                Code::BadOverride,
                span,
                format!(
                    "stage `{}` is a {kind} stage; `{key}` cannot be overridden on it",
                    o.stage.value
                ),
            )
            .help("override only keys the stage's kind has"),
        );
    };
    let kind = stage.kind().value.as_str();
    match &mut stage.body {
        StageBody::Agent {
            agent,
            prompt,
            prompt_file,
        } => {
            if let Some(p) = &o.prompt {
                *prompt = Some(p.clone());
                *prompt_file = None;
            }
            if let Some(p) = &o.prompt_file {
                *prompt_file = Some(p.clone());
                *prompt = None;
            }
            if let Some(a) = &o.agent {
                *agent = Some(a.clone());
            }
            if let Some(p) = &o.permissions {
                stage.keys_mut().permissions = Some(p.clone());
            }
        }
        _ => {
            for (key, span) in [
                ("prompt", o.prompt.as_ref().map(|p| p.span)),
                ("prompt_file", o.prompt_file.as_ref().map(|p| p.span)),
                ("agent", o.agent.as_ref().map(|p| p.span)),
                ("permissions", o.permissions.as_ref().map(|p| p.span)),
            ] {
                if let Some(span) = span {
                    not_for(key, span, kind, diags);
                }
            }
        }
    }
    match &mut stage.body {
        StageBody::Loop(l) => {
            if let Some(m) = &o.max_iterations {
                l.max_iterations = Some(m.clone());
            }
        }
        _ => {
            if let Some(m) = &o.max_iterations {
                not_for("max_iterations", m.span, kind, diags);
            }
        }
    }
    match &mut stage.body {
        StageBody::ForEach(f) => {
            if let Some(m) = &o.max_concurrency {
                f.max_concurrency = Some(m.clone());
            }
        }
        StageBody::Group {
            max_concurrency, ..
        } => {
            if let Some(m) = &o.max_concurrency {
                *max_concurrency = Some(m.clone());
            }
        }
        _ => {
            if let Some(m) = &o.max_concurrency {
                not_for("max_concurrency", m.span, kind, diags);
            }
        }
    }
    if o.timeout.is_some() {
        stage.keys_mut().timeout = o.timeout.clone();
    }
    if o.idle_timeout.is_some() {
        stage.keys_mut().idle_timeout = o.idle_timeout.clone();
    }
    if o.retries.is_some() {
        stage.keys_mut().retries = o.retries.clone();
    }
    if o.when.is_some() {
        stage.keys_mut().when = o.when.clone();
    }
    if o.optional.is_some() {
        stage.keys_mut().optional = o.optional.clone();
    }
    if o.budget.is_some() {
        stage.keys_mut().budget = o.budget.clone().map(Box::new);
    }
}

fn all_ids(stages: &[crate::model::Stage]) -> Vec<String> {
    let mut out = Vec::new();
    for s in stages {
        out.push(s.id.value.clone());
        out.extend(all_ids(s.children()));
    }
    out
}

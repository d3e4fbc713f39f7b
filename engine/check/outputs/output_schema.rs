//! A stage's output schema from its `output`: written in a file or inline, made from a regex's
//! named groups, or the built-in one, with the fields of its markers added.

use serde_json::{Value as Json, json};

use super::markers::{marker_props, pattern};
use super::schema::builtin_schema;
use super::validate::{SchemaAt, line_offset, validate_schema};
use crate::check::Checked;
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::fs::base_dir;
use crate::load::Loader;
use std::collections::HashSet;

use super::dialects;
use crate::model::{ExtractMode, OutputSpec, SchemaRef, Stage};
use crate::source::Span;

pub(super) fn output_schema(
    c: &Checked<'_>,
    stage: &Stage,
    o: &OutputSpec,
    loader: &mut Loader<'_>,
    seen: &mut HashSet<(Span, String, String)>,
    diags: &mut Diagnostics,
) -> Option<Json> {
    let kind = stage.kind().value;
    let extract = o.extract.as_ref().map(|e| e.value);
    // Where the schema was written (its file's text), for the agents' dialects below.
    let mut file_text: Option<(crate::source::FileId, std::sync::Arc<str>, Span)> = None;
    let mut schema = match &o.schema {
        Some(SchemaRef::File(path)) => {
            let full = base_dir(loader.sources, path.span).join(&path.value);
            let file = loader.read(
                &full,
                Some(path.span),
                Code::MissingSchemaFile,
                "schema file",
            )?;
            let text = loader.sources.get(file).text.clone();
            file_text = Some((file, text.clone(), path.span));
            match serde_json::from_str::<Json>(&text) {
                Ok(v) => validate_schema(
                    v,
                    SchemaAt::File {
                        file,
                        text: &text,
                        named: path.span,
                        named_at: loader.sources.locate(path.span),
                    },
                    diags,
                ),
                Err(err) => {
                    let offset = line_offset(&text, err.line(), err.column());
                    diags.push(
                        Diagnostic::new(
                            Code::MissingSchemaFile,
                            crate::source::Span::new(file, offset..offset),
                            format!("schema file is not valid JSON: {err}"),
                        )
                        .related(path.span, "named here")
                        .help("fix the JSON"),
                    );
                    None
                }
            }
        }
        Some(SchemaRef::Inline(v)) => {
            validate_schema(v.value.clone(), SchemaAt::Inline(v.span), diags)
        }
        None => None,
    };
    if schema.is_some() && matches!(extract, Some(ExtractMode::Text | ExtractMode::Markers)) {
        if let Some(e) = &o.extract {
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    e.span,
                    format!(
                        "`extract = \"{}\"` makes text, which a schema cannot check",
                        e.value
                    ),
                )
                .help("use json, fenced_json or regex with a schema, or remove the schema"),
            );
        }
    }
    pattern(o, extract, &mut schema, diags);
    let marker_props = marker_props(o, diags);
    let written_schema = schema.is_some();
    let base = schema.or_else(|| match extract {
        Some(ExtractMode::Json | ExtractMode::FencedJson) => Some(json!({})),
        _ => builtin_schema(kind),
    })?;
    let mut merged = base;
    if let Some(obj) = merged.as_object_mut().filter(|_| !marker_props.is_empty()) {
        let props = obj.entry("properties").or_insert_with(|| json!({}));
        if let Some(p) = props.as_object_mut() {
            for (k, v) in marker_props {
                p.insert(k, v);
            }
        }
    }
    // The schema an agent is sent (the written one, with the markers' fields): what each
    // agent the stage calls would refuse of it.
    if written_schema
        && extract.is_none_or(|e| matches!(e, ExtractMode::Json | ExtractMode::FencedJson))
    {
        let written = match (&file_text, &o.schema) {
            (Some((file, text, named)), _) => Some(dialects::Written::File {
                file: *file,
                text,
                named: *named,
            }),
            (None, Some(SchemaRef::Inline(v))) => Some(dialects::Written::Inline(v.span)),
            _ => None,
        };
        if let Some(written) = written {
            dialects::check(c, stage, &merged, &written, seen, diags);
        }
    }
    Some(merged)
}

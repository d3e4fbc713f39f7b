//! A written schema must be a valid, self-contained JSON Schema; its problems are reported
//! where it was written (inline in the workflow, or at the value at fault in its file).

use serde_json::Value as Json;

use super::json_locate::pointer_range;
use crate::diag::{Code, Diagnostic, Diagnostics};

pub(super) fn line_offset(text: &str, line: usize, col: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    (start + col.saturating_sub(1)).min(text.len())
}

/// Where a schema was written: inline in the workflow, or in a file of its own (then its
/// problems are reported in that file, at the value at fault).
pub(super) enum SchemaAt<'a> {
    Inline(crate::source::Span),
    File {
        file: crate::source::FileId,
        text: &'a str,
        named: crate::source::Span,
        /// Where the workflow names the file, as `path:line:column`.
        named_at: String,
    },
}

pub(super) fn validate_schema(
    schema: Json,
    at: SchemaAt<'_>,
    diags: &mut Diagnostics,
) -> Option<Json> {
    let place = |pointer: &str| match &at {
        SchemaAt::Inline(span) => *span,
        SchemaAt::File { file, text, .. } => {
            crate::source::Span::new(*file, pointer_range(text, pointer))
        }
    };
    let named = |d: Diagnostic| match &at {
        SchemaAt::File {
            named, named_at, ..
        } => {
            let help = d.help.clone().unwrap_or_default();
            d.related(*named, "the schema is used here").help(format!(
                "{help} (the workflow names this schema at {named_at})"
            ))
        }
        SchemaAt::Inline(_) => d,
    };
    if let Err(err) = jsonschema::meta::validate(&schema) {
        let pointer = err.instance_path().to_string();
        let keyword = pointer.rsplit('/').next().unwrap_or("");
        let message = if keyword == "type" {
            format!("{} is not a JSON Schema type", err.instance())
        } else if pointer.is_empty() {
            format!("not a valid JSON Schema: {err}")
        } else {
            format!("not a valid JSON Schema: `{keyword}` (at `{pointer}`): {err}")
        };
        let help = if keyword == "type" {
            "a type is one of \"string\", \"number\", \"integer\", \"boolean\", \"object\", \"array\", \"null\", or a list of them".to_string()
        } else {
            "fix the schema; ralph-flow validates outputs with JSON Schema draft 2020-12"
                .to_string()
        };
        diags.push(named(
            Diagnostic::new(Code::InvalidSchema, place(&pointer), message)
                .label("not valid here")
                .help(help),
        ));
        return None;
    }
    if let Err(err) = jsonschema::validator_for(&schema) {
        // A `$ref` that points nowhere: point at the reference as written.
        let span = match &at {
            SchemaAt::File { file, text, .. } => {
                let msg = err.to_string();
                let pointer = msg.split('\'').nth(1).unwrap_or("");
                let needle = format!("\"#{pointer}\"");
                match text.find(&needle).filter(|_| !pointer.is_empty()) {
                    Some(i) => crate::source::Span::new(*file, i..i + needle.len()),
                    None => place(""),
                }
            }
            SchemaAt::Inline(span) => *span,
        };
        diags.push(named(
            Diagnostic::new(
                Code::InvalidSchema,
                span,
                format!("the JSON Schema cannot be used: {err}"),
            )
            .help("schemas must be self-contained: refs point inside the schema"),
        ));
        return None;
    }
    Some(schema)
}

//! The checker's diagnostics as the protocol's: each in the file it points into, with its
//! code, advice and related places; a diagnostic in a built-in file (a preset the workflow
//! extends) or without a place shows at the top of the workflow.

use std::path::Path;

use lsp_types::{
    DiagnosticRelatedInformation, DiagnosticSeverity, Location, NumberOrString, Range,
};

use super::World;
use super::analysis::Analysis;
use crate::diag::{Diagnostic, Severity};
use crate::fs::normalize;

/// The diagnostics to show in one open file: those of every analysis that read it, each
/// once, in the order of their place.
pub(super) fn for_file(world: &World, path: &Path) -> Vec<lsp_types::Diagnostic> {
    let mut out: Vec<lsp_types::Diagnostic> = Vec::new();
    let mut roots: Vec<&Analysis> = world.analyses_of(path).collect();
    roots.sort_by(|a, b| a.root.cmp(&b.root));
    for a in roots {
        for d in &a.diagnostics {
            if let Some(converted) = convert(world, a, d, path) {
                if !out.iter().any(|o| {
                    o.range == converted.range
                        && o.code == converted.code
                        && o.message == converted.message
                }) {
                    out.push(converted);
                }
            }
        }
    }
    out.sort_by_key(|d| (d.range.start.line, d.range.start.character));
    out
}

/// The diagnostic as shown in `path`, or `None` when it belongs to another file.
pub(super) fn convert(
    world: &World,
    a: &Analysis,
    d: &Diagnostic,
    path: &Path,
) -> Option<lsp_types::Diagnostic> {
    let mut d = d.clone();
    d.fit_syntax(&a.sources);
    let mut message = d.message.clone();
    let range = match d.span {
        Some(span) => {
            let file = a.sources.get(span.file);
            let file_path = normalize(&file.path);
            if file_path == path {
                world.range(path, span.range())
            } else if crate::fs::is_builtin(&file.path) && a.root == path {
                // Nobody has the built-in file open: said at the top of the workflow.
                message = format!("{}: {message}", a.sources.locate(span));
                Range::default()
            } else {
                return None;
            }
        }
        None if a.root == path => Range::default(),
        None => return None,
    };
    if let Some(label) = d.label.as_deref().filter(|l| !l.is_empty()) {
        message = format!("{message} ({label})");
    }
    if let Some(help) = &d.help {
        message = format!("{message}\nhelp: {help}");
    }
    let related: Vec<DiagnosticRelatedInformation> = d
        .related
        .iter()
        .filter_map(|(span, label)| {
            let file = normalize(&a.sources.get(span.file).path);
            let uri = world.uri(&file)?;
            let range = if world.docs.get(&file).is_some() {
                world.range(&file, span.range())
            } else {
                let text = &a.sources.get(span.file).text;
                super::lines::LineIndex::new(text).range(text, span.range(), world.encoding)
            };
            Some(DiagnosticRelatedInformation {
                location: Location { uri, range },
                message: label.clone(),
            })
        })
        .collect();
    Some(lsp_types::Diagnostic {
        range,
        severity: Some(match d.severity {
            Severity::Error => DiagnosticSeverity::ERROR,
            Severity::Warning => DiagnosticSeverity::WARNING,
        }),
        code: Some(NumberOrString::String(d.code.as_str().to_string())),
        source: Some("ralph-flow".to_string()),
        message,
        related_information: (!related.is_empty()).then_some(related),
        data: Some(serde_json::json!({
            "help": d.help,
            "subject": d.subject,
        })),
        ..Default::default()
    })
}

//! The checker's diagnostics as the protocol's: each in the file it points into, with its
//! code, advice and related places; a diagnostic in a built-in file (a preset the workflow
//! extends) or without a place shows at the top of the workflow.

use std::collections::HashSet;
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
    // What is already in `out`: two workflows that read one file both report its faults.
    let mut seen: HashSet<(Range, Option<NumberOrString>, String)> = HashSet::new();
    let mut roots: Vec<&Analysis> = world.analyses_of(path).collect();
    roots.sort_by(|a, b| a.root.cmp(&b.root));
    for a in roots {
        for d in &a.diagnostics {
            if let Some(converted) = convert(world, a, d, path) {
                let key = (
                    converted.range,
                    converted.code.clone(),
                    converted.message.clone(),
                );
                if seen.insert(key) {
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
    // Where it shows: in its own file; at the top of the workflow when its file is not open
    // (a built-in preset, a base, a part or a prompt file nobody opened), named with its
    // file, line and column, as `check` names it.
    let (range, elsewhere) = match d.span {
        Some(span) => {
            let file_path = normalize(&a.sources.get(span.file).path);
            if file_path == path {
                (world.range(path, span.range()), None)
            } else if a.root == path && world.docs.get(&file_path).is_none() {
                (Range::default(), Some(a.sources.locate(span)))
            } else {
                return None;
            }
        }
        None if a.root == path => (Range::default(), None),
        None => return None,
    };
    let mut d = d.clone();
    d.fit_syntax(&a.sources);
    let mut message = match elsewhere {
        Some(place) => format!("{place}: {}", d.message),
        None => d.message.clone(),
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

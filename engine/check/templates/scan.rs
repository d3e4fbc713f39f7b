//! Compiling one template or expression, handing its variables and filters to their checks,
//! and mapping a range of the text back to a span in its file.

use std::collections::HashSet;

use super::filter_uses::{filter_or_test, spread_in_place};
use super::syntax::syntax_error;
use super::variables::variable;
use super::{Kind, Scope, Text};
use crate::check::Checked;
use crate::check::filters::{self, UseKind};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::source::{Sources, Span, Spanned};

pub(super) fn inline(
    c: &Checked<'_>,
    src: &Sources,
    env: &minijinja::Environment<'_>,
    t: &Spanned<String>,
    kind: Kind,
    scope: Scope,
    diags: &mut Diagnostics,
) {
    check_text(
        c,
        src,
        env,
        &Text {
            source: &t.value,
            span: t.span,
            in_file: false,
        },
        kind,
        scope,
        diags,
    );
}

/// Maps a byte range of the text to a span in its file.
pub(super) fn map(src: &Sources, text: &Text<'_>, range: std::ops::Range<usize>) -> Span {
    if text.in_file {
        return Span::new(text.span.file, range);
    }
    let raw = src.slice(text.span);
    let kdl = crate::syntax::Format::from_path(&src.get(text.span.file).path)
        == crate::syntax::Format::Kdl;
    if let Some(r) = crate::syntax::strings::map_range(raw, kdl, text.source, range.clone()) {
        let start = text.span.start as usize;
        return Span::new(text.span.file, start + r.start..start + r.end);
    }
    match raw.find(text.source) {
        Some(base) if !text.source.is_empty() => {
            let start = text.span.start as usize + base;
            Span::new(
                text.span.file,
                start + range.start..start + range.end.min(text.source.len()),
            )
        }
        _ => text.span,
    }
}

pub(super) fn locate(src: &Sources, text: &Text<'_>, needle: &str) -> Span {
    match text.source.find(needle) {
        Some(i) => map(src, text, i..i + needle.len()),
        None => text.span,
    }
}

pub(super) fn check_text(
    c: &Checked<'_>,
    src: &Sources,
    env: &minijinja::Environment<'_>,
    text: &Text<'_>,
    kind: Kind,
    scope: Scope,
    diags: &mut Diagnostics,
) {
    let vars: HashSet<String> = match kind {
        Kind::Template => match env.template_from_str(text.source) {
            Ok(t) => t.undeclared_variables(true),
            Err(err) => {
                syntax_error(src, text, &err, Code::TemplateSyntax, diags);
                return;
            }
        },
        Kind::Expr => {
            if text.source.trim().is_empty() {
                diags.push(
                    Diagnostic::new(Code::ExpressionSyntax, text.span, "the expression is empty")
                        .help("write a condition such as `iteration > 1`"),
                );
                return;
            }
            match env.compile_expression(text.source) {
                Ok(e) => e.undeclared_variables(true),
                Err(err) => {
                    syntax_error(src, text, &err, Code::ExpressionSyntax, diags);
                    return;
                }
            }
        }
    };
    let mut vars: Vec<String> = vars.into_iter().collect();
    vars.sort();
    let guarded: HashSet<String> = vars
        .iter()
        .filter_map(|v| {
            let parts: Vec<&str> = v.split('.').collect();
            (parts.len() >= 3 && parts[0] == "stages" && matches!(parts[2], "ran" | "status"))
                .then(|| parts[1].to_string())
        })
        .collect();
    for var in &vars {
        variable(c, src, text, var, scope, &guarded, diags);
    }
    let uses = match kind {
        Kind::Template => filters::in_template(text.source),
        Kind::Expr => filters::in_expression(text.source),
    };
    for u in &uses {
        filter_or_test(src, text, u, diags);
        if u.kind == UseKind::Filter && text.source.get(u.range.clone()) == Some("spread") {
            spread_in_place(src, text, u, diags);
        }
    }
}

//! Compiling one template or expression, handing its variables and filters to their checks,
//! and mapping a range of the text back to a span in its file.

use std::collections::HashSet;

use super::filter_uses::{filter_or_test, spread_in_place};
use super::syntax::syntax_error;
use super::variables::variable;
use super::{Kind, Scope, Text};
use crate::check::Checked;
use crate::check::filters::{self, Use, UseKind};
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
    let uses = match kind {
        Kind::Template => filters::in_template(text.source),
        Kind::Expr => filters::in_expression(text.source),
    };
    let mut guards = Guards::default();
    for v in &vars {
        let parts: Vec<&str> = v.split('.').collect();
        if parts.len() >= 3 && parts[0] == "stages" && matches!(parts[2], "ran" | "status") {
            guards.ran.insert(parts[1].to_string());
        }
    }
    for u in &uses {
        guards.add(text.source, u);
    }
    for var in &vars {
        variable(c, src, text, var, scope, &guards, diags);
    }
    for u in &uses {
        filter_or_test(src, text, u, diags);
        if u.kind == UseKind::Filter && text.source.get(u.range.clone()) == Some("spread") {
            spread_in_place(src, text, u, diags);
        }
    }
}

/// The stages whose output a text guards against their having been skipped.
#[derive(Default)]
pub(super) struct Guards {
    /// Stages the text reads `ran` or `status` of, or tests a field of the output of with
    /// `is defined` or `| default(...)`, or the output of with `is none` (a skipped stage's
    /// output is `none`, and its fields are undefined).
    pub ran: HashSet<String>,
    /// Stages whose whole output the text tests with `is defined` or `| default(...)`, which
    /// does not guard: a skipped stage's output is `none`, which is defined.
    pub weak: HashSet<String>,
}

/// The last argument of a call, given the text after its `(`: up to the matching `)`,
/// past nested brackets and quoted strings; `None` when the call is not closed.
fn last_argument(args: &str) -> Option<&str> {
    let b = args.as_bytes();
    let (mut depth, mut i, mut last) = (0usize, 0, 0);
    while i < b.len() {
        match b[i] {
            q @ (b'"' | b'\'') => {
                i += 1;
                while i < b.len() && b[i] != q {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' if depth == 0 => return args.get(last..i).map(str::trim),
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => last = i + 1,
            _ => {}
        }
        i += 1;
    }
    None
}

impl Guards {
    /// Records what the filter or test `u` guards: the variable path written just before it.
    fn add(&mut self, text: &str, u: &Use) {
        let Some(name) = text.get(u.range.clone()) else {
            return;
        };
        let before = text.get(..u.range.start).unwrap_or_default().trim_end();
        let operand = match u.kind {
            UseKind::Filter if matches!(name, "default" | "d") => before.strip_suffix('|'),
            UseKind::Test if matches!(name, "defined" | "undefined" | "none") => {
                let b = before.strip_suffix("not").map_or(before, str::trim_end);
                b.strip_suffix("is")
            }
            _ => None,
        };
        let Some(operand) = operand.map(str::trim_end) else {
            return;
        };
        let start = operand
            .rfind(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '.'))
            .map_or(0, |i| i + 1);
        let parts: Vec<&str> = operand[start..].split('.').collect();
        let ["stages", stage, "output", rest @ ..] = parts.as_slice() else {
            return;
        };
        // `default(x, true)` replaces `none` too: its last argument is `true` (the first, a
        // default such as `{'a': 1, 'b': 2}` or `f(x)`, may hold commas and parentheses).
        let lax = u.kind == UseKind::Filter
            && text
                .get(u.range.end..)
                .and_then(|r| r.trim_start().strip_prefix('('))
                .and_then(last_argument)
                .is_some_and(|last| last == "true");
        if !rest.is_empty() || name == "none" || lax {
            self.ran.insert((*stage).to_string());
        } else {
            self.weak.insert((*stage).to_string());
        }
    }
}

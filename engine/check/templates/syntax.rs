//! Template and expression syntax errors, pointed at where the mistake is (an unclosed block
//! is reported where it opens) with a hint by what went wrong.

use super::Text;
use super::scan::map;
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::source::Sources;

pub(super) fn syntax_error(
    src: &Sources,
    text: &Text<'_>,
    err: &minijinja::Error,
    code: Code,
    diags: &mut Diagnostics,
) {
    let detail = err
        .detail()
        .map(str::to_string)
        .unwrap_or_else(|| err.kind().to_string());
    let what = if code == Code::TemplateSyntax {
        "template"
    } else {
        "expression"
    };
    let at_end = err
        .range()
        .is_none_or(|r| r.end >= text.source.trim_end().len());
    let mut d = None;
    if code == Code::TemplateSyntax && at_end {
        // The parser found out at the end of the text; the mistake is where the unclosed
        // block or delimiter was opened.
        if let Some((range, opened)) = unclosed(text.source) {
            let closer = match opened.as_str() {
                "{{" => "`}}`".to_string(),
                "{%" => "`%}`".to_string(),
                "{#" => "`#}`".to_string(),
                block => format!("`{{% end{block} %}}`"),
            };
            let label = if opened.starts_with('{') {
                format!("`{opened}` opened here is never closed")
            } else {
                format!("this `{opened}` block is never closed")
            };
            d = Some(
                Diagnostic::new(
                    code,
                    map(src, text, range),
                    format!("invalid {what}: {detail}"),
                )
                .label(label)
                .help(format!("close it with {closer}")),
            );
        }
    }
    let d = d.unwrap_or_else(|| {
        let span = err.range().map_or(text.span, |r| map(src, text, r));
        let help = syntax_hint(code, text.source, &detail);
        Diagnostic::new(code, span, format!("invalid {what}: {detail}"))
            .label("here")
            .help(help)
    });
    diags.push(d);
}

/// A hint for a template or expression syntax error, by what went wrong.
fn syntax_hint(code: Code, source: &str, detail: &str) -> String {
    if code == Code::ExpressionSyntax && (source.contains("{{") || source.contains("{%")) {
        return "conditions and expressions are written without {{ }} or {% %}: `stages.review.output.verdict == \"ok\"`".into();
    }
    if detail.contains("unknown statement") {
        return "a block is `{% if %}`, `{% for %}`, `{% set %}`, `{% with %}`, `{% filter %}` or `{% macro %}`; a value is written `{{ name }}`".into();
    }
    if detail.contains("unexpected end of") || detail.contains("unexpected end") {
        return "something opened is not closed: `{{` needs `}}`, `{%` needs `%}`, a block needs its `{% end... %}`, a string its quote".into();
    }
    if detail.contains("unexpected `}`") || detail.contains("unexpected }") {
        return "a `{{ ... }}` holds one expression; check its brackets and quotes".into();
    }
    if detail.contains("unexpected end of block")
        || detail.contains("endif")
        || detail.contains("endfor")
    {
        return "each `{% if %}` ends with `{% endif %}` and each `{% for %}` with `{% endfor %}`, in order".into();
    }
    if code == Code::ExpressionSyntax {
        return "an expression is minijinja (Jinja2) syntax: `a == \"b\"`, `x and not y`, `n > 2`, `name is defined`".into();
    }
    "templates are minijinja (Jinja2) syntax: `{{ value }}`, `{% if cond %}...{% endif %}`, `{% for x in xs %}...{% endfor %}`".into()
}

/// Finds what a template leaves open at its end: the innermost unclosed block tag (`if`,
/// `for`, ...) or an unclosed `{{`, `{%` or `{#`, with its range in the template.
fn unclosed(source: &str) -> Option<(std::ops::Range<usize>, String)> {
    const BLOCKS: &[&str] = &[
        "if",
        "for",
        "macro",
        "call",
        "filter",
        "with",
        "raw",
        "block",
        "autoescape",
    ];
    let mut stack: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    let mut i = 0;
    while let Some(pos) = source[i..].find('{').map(|p| p + i) {
        let rest = &source[pos..];
        let (open, close) = match rest.get(..2) {
            Some("{{") => ("{{", "}}"),
            Some("{%") => ("{%", "%}"),
            Some("{#") => ("{#", "#}"),
            _ => {
                i = pos + 1;
                continue;
            }
        };
        let Some(end) = rest[2..].find(close).map(|e| pos + 2 + e + 2) else {
            return Some((pos..pos + 2, open.to_string()));
        };
        if open == "{%" {
            let inner = source[pos + 2..end - 2]
                .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
            let word = inner.split_whitespace().next().unwrap_or("");
            if word == "raw" {
                // Everything up to `{% endraw %}` is text.
                match source[end..].find("endraw") {
                    Some(e) => {
                        i = end + e;
                        continue;
                    }
                    None => return Some((pos..end, "raw".into())),
                }
            }
            if let Some(block) = word.strip_prefix("end") {
                if stack.last().is_some_and(|(_, b)| b == block) {
                    stack.pop();
                }
            } else if BLOCKS.contains(&word) || (word == "set" && !inner.contains('=')) {
                stack.push((pos..end, word.to_string()));
            }
        }
        i = end;
    }
    stack.pop()
}

//! Code actions from the checker's advice: each diagnostic with a [`Fix`] (a "did you mean"
//! replacement, quoting KDL text, a missing required key) offers it as a quick fix.
//!
//! The diagnostics answered for are those the client sends in the request's context and
//! those the server has for the requested range (clients differ in what they send); the
//! client's own copy of a diagnostic is attached to the action when it sent one.

use std::collections::HashMap;
use std::ops::Range as Bytes;
use std::path::Path;

use lsp_types::{
    CodeAction, CodeActionKind, CodeActionOrCommand, CodeActionParams, NumberOrString, Range,
    TextEdit, WorkspaceEdit,
};

use super::World;
use super::analysis::Analysis;
use super::docs::uri_path;
use crate::diag::{Code, Diagnostic, Fix};
use crate::fs::normalize;
use crate::source::Span;

pub(super) fn code_actions(
    world: &World,
    params: CodeActionParams,
) -> Option<lsp_types::CodeActionResponse> {
    let quickfix = CodeActionKind::QUICKFIX;
    if let Some(only) = &params.context.only {
        // `only` filters by kind, a kind matching its sub-kinds too.
        let wanted = only.iter().any(|k| {
            quickfix.as_str() == k.as_str()
                || quickfix.as_str().starts_with(&format!("{}.", k.as_str()))
        });
        if !wanted {
            return Some(Vec::new());
        }
    }
    let path = uri_path(&params.text_document.uri)?;
    let uri = world.uri(&path)?;
    let mut analyses: Vec<&Analysis> = world.analyses_of(&path).collect();
    analyses.sort_by(|a, b| a.root.cmp(&b.root));
    let mut out: Vec<CodeActionOrCommand> = Vec::new();
    let mut made: Vec<(Range, String, TextEdit)> = Vec::new();
    for a in analyses {
        for d in &a.diagnostics {
            let Some(fix) = d.fix.as_deref() else {
                continue;
            };
            let Some(shown) = super::publish::convert(world, a, d, &path) else {
                continue;
            };
            // The client's copy when it sent one, else ours when it touches the range.
            let attached = params
                .context
                .diagnostics
                .iter()
                .find(|c| c.range == shown.range && same_code(&c.code, &shown.code))
                .cloned()
                .or_else(|| touches(shown.range, params.range).then(|| shown.clone()));
            let Some(attached) = attached else {
                continue;
            };
            let Some((title, bytes, new_text)) = edit(a, d, fix, &path) else {
                continue;
            };
            let edit = TextEdit {
                range: world.range(&path, bytes),
                new_text,
            };
            // The same fix from two analyses (a file that two workflows read) is offered once.
            if made
                .iter()
                .any(|(r, t, e)| *r == shown.range && *t == title && *e == edit)
            {
                continue;
            }
            made.push((shown.range, title.clone(), edit.clone()));
            out.push(CodeActionOrCommand::CodeAction(CodeAction {
                title,
                kind: Some(quickfix.clone()),
                diagnostics: Some(vec![attached]),
                edit: Some(WorkspaceEdit {
                    changes: Some(HashMap::from([(uri.clone(), vec![edit])])),
                    ..Default::default()
                }),
                // Each diagnostic has one fix: the obvious one.
                is_preferred: Some(true),
                ..Default::default()
            }));
        }
    }
    Some(out)
}

/// Tells whether the client's diagnostic has our code (another server's, at the same place,
/// is not ours).
fn same_code(a: &Option<NumberOrString>, b: &Option<NumberOrString>) -> bool {
    a.is_some() && a == b
}

/// Tells whether two ranges overlap or touch (a cursor at either end of a diagnostic is on
/// it).
fn touches(a: Range, b: Range) -> bool {
    let key = |p: lsp_types::Position| (p.line, p.character);
    key(a.start) <= key(b.end) && key(b.start) <= key(a.end)
}

/// The fix as an edit of the file at `path`: its title, the bytes replaced and the text
/// written; `None` when the fix is not in that file or does not fit its text.
fn edit(
    a: &Analysis,
    d: &Diagnostic,
    fix: &Fix,
    path: &Path,
) -> Option<(String, Bytes<usize>, String)> {
    let text_of = |span: Span| -> Option<&str> {
        let file = a.sources.get(span.file);
        (normalize(&file.path) == path).then_some(&*file.text)
    };
    match fix {
        Fix::Replace { at, old, new } => {
            let (text, bytes) = match at {
                Some(at) => {
                    let text = text_of(*at)?;
                    (text, at.range())
                }
                None => {
                    let span = d.span?;
                    let text = text_of(span)?;
                    let inside = find_name(text.get(span.range())?, old)?;
                    (
                        text,
                        span.start as usize + inside.start..span.start as usize + inside.end,
                    )
                }
            };
            // The text must still read what the checker saw.
            text.get(bytes.clone()).filter(|t| *t == old.as_str())?;
            let title = if d.code == Code::Syntax {
                format!("Quote as {new}")
            } else {
                format!("Replace `{old}` with `{new}`")
            };
            Some((title, bytes, new.clone()))
        }
        Fix::AddKey { table, key, value } => {
            let span = table.or(d.span)?;
            let text = text_of(span)?;
            let kdl = is_kdl(path);
            let (at, insert) = if span.start == 0 && span.end == 0 {
                add_top_level(text, key, value, kdl)
            } else if kdl {
                add_kdl(text, span.range(), key, value)?
            } else {
                add_toml(text, span.range(), key, value)?
            };
            Some((format!("Add `{key}`"), at..at, insert))
        }
    }
}

fn is_kdl(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("kdl"))
}

/// Where the name `old` is written within `hay`: all of it, inside its quotes, or the last
/// place where it stands as a whole name (the misspelt part of `stages.X.output.Y` is
/// its last).
fn find_name(hay: &str, old: &str) -> Option<Bytes<usize>> {
    if old.is_empty() {
        return None;
    }
    if hay == old {
        return Some(0..hay.len());
    }
    for q in ['"', '\''] {
        if hay.len() >= 2 && hay.starts_with(q) && hay.ends_with(q) && &hay[1..hay.len() - 1] == old
        {
            return Some(1..hay.len() - 1);
        }
    }
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-');
    hay.match_indices(old)
        .filter(|(i, _)| {
            !word(hay[..*i].chars().next_back()) && !word(hay[i + old.len()..].chars().next())
        })
        .last()
        .map(|(i, _)| i..i + old.len())
}

/// The start of the line holding `at`.
fn line_start(text: &str, at: usize) -> usize {
    text.get(..at)
        .and_then(|t| t.rfind('\n'))
        .map_or(0, |i| i + 1)
}

/// The offset after the line holding `at` (after its `\n`, or the end of the text).
fn next_line(text: &str, at: usize) -> usize {
    text.get(at..)
        .and_then(|t| t.find('\n'))
        .map_or(text.len(), |i| at + i + 1)
}

/// The indentation of the line starting at `start`.
fn indent_at(text: &str, start: usize) -> &str {
    let line = text.get(start..).unwrap_or_default();
    let n = line.len() - line.trim_start_matches([' ', '\t']).len();
    &line[..n]
}

/// A key at the top of the file: after the comments that open it.
fn add_top_level(text: &str, key: &str, value: &str, kdl: bool) -> (usize, String) {
    let mut at = 0;
    while at < text.len() {
        let line = text[at..].lines().next().unwrap_or_default().trim();
        let comment = line.starts_with('#') || line.starts_with("//");
        if !comment {
            break;
        }
        at = next_line(text, at);
    }
    let line = if kdl {
        format!("{key} {value}\n")
    } else {
        format!("{key} = {value}\n")
    };
    // A file that ends in a comment without a line break.
    if at == text.len() && !text.is_empty() && !text.ends_with('\n') {
        return (at, format!("\n{line}"));
    }
    (at, line)
}

/// A key in a TOML table: a `key = value` line after its `[header]`, indented like the
/// line after it; in an inline table, the first of its keys.
fn add_toml(text: &str, table: Bytes<usize>, key: &str, value: &str) -> Option<(usize, String)> {
    let written = text.get(table.clone())?;
    if written.starts_with('[') {
        let at = next_line(text, table.start);
        let indent =
            if at < text.len() && !text[at..].trim_start_matches([' ', '\t']).starts_with('[') {
                indent_at(text, at)
            } else {
                indent_at(text, line_start(text, table.start))
            };
        let line = format!("{indent}{key} = {value}\n");
        if at == text.len() && !text.ends_with('\n') {
            return Some((at, format!("\n{line}")));
        }
        return Some((at, line));
    }
    if let Some(inner) = written.strip_prefix('{') {
        let at = table.start + 1;
        if inner.trim_start().starts_with('}') {
            return Some((at, format!(" {key} = {value} ")));
        }
        let pad = inner.len() - inner.trim_start_matches([' ', '\t']).len();
        return Some((at + pad, format!("{key} = {value}, ")));
    }
    // A table written with dotted keys: no one place to add to.
    None
}

/// A key in a KDL node: a child node in its block, indented like its first child; a
/// property (`key=value`) when it has no block or the key is its kind.
fn add_kdl(text: &str, node: Bytes<usize>, key: &str, value: &str) -> Option<(usize, String)> {
    let written = text.get(node.clone())?;
    let lead = written.len() - written.trim_start().len();
    let start = node.start + lead;
    let head = node_head(text.get(start..node.end)?);
    let property = |end: usize| {
        // Before the spaces that end the head.
        let before = text.get(start..start + end).unwrap_or_default();
        let at = start + before.trim_end().len();
        Some((at, format!(" {key}={value}")))
    };
    match head {
        Head::Block(open) if key != "kind" => {
            let after = start + open + 1;
            let rest = text.get(after..node.end).unwrap_or_default();
            let line_end = rest.find('\n');
            // `{ ... }` on one line: a property reads better.
            let Some(nl) = line_end.filter(|&i| rest[..i].trim().is_empty()) else {
                return property(open);
            };
            let first_child = after + nl + 1;
            let own = indent_at(text, line_start(text, start));
            let child = indent_at(text, first_child);
            let closes = text
                .get(first_child..)
                .is_some_and(|t| t.trim_start().starts_with('}'));
            let indent = if child.len() > own.len() && !closes {
                child.to_string()
            } else {
                format!("{own}    ")
            };
            Some((first_child, format!("{indent}{key} {value}\n")))
        }
        Head::Block(open) => property(open),
        Head::Ends(end) => property(end),
    }
}

/// Where a node's head (its name, arguments and properties) ends.
enum Head {
    /// At its block's `{` (the offset of the `{`).
    Block(usize),
    /// At the end of its line or its `;` (the offset there).
    Ends(usize),
}

/// Reads a node's head from its text, skipping strings and comments.
fn node_head(node: &str) -> Head {
    let b = node.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'{' => return Head::Block(i),
            b'\n' | b';' => return Head::Ends(i),
            b'\\' => {
                // A line continuation: the head goes on on the next line.
                i = node[i..].find('\n').map_or(b.len(), |n| i + n + 1);
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                return Head::Ends(i);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = node[i + 2..].find("*/").map_or(b.len(), |n| i + 2 + n + 2);
                continue;
            }
            b'#' if b.get(i + 1) == Some(&b'"') => {
                i = node[i + 2..].find("\"#").map_or(b.len(), |n| i + 2 + n + 2);
                continue;
            }
            b'"' => {
                if node[i..].starts_with("\"\"\"") {
                    i = node[i + 3..]
                        .find("\"\"\"")
                        .map_or(b.len(), |n| i + 3 + n + 3);
                    continue;
                }
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Head::Ends(b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_found_whole_inside_quotes_or_at_its_last_place() {
        assert_eq!(find_name("specfy", "specfy"), Some(0..6));
        assert_eq!(find_name("\"specfy\"", "specfy"), Some(1..7));
        assert_eq!(
            find_name("stages.review.output.isues", "isues"),
            Some(21..26)
        );
        // Not a part of a longer name.
        assert_eq!(find_name("stages.plans", "plan"), None);
        assert_eq!(find_name("plan_a.plan", "plan"), Some(7..11));
    }

    #[test]
    fn keys_are_added_where_their_table_is_written() {
        let toml = "[stages.a]\nargv = [\"x\"]\n";
        assert_eq!(
            add_toml(toml, 0..10, "kind", "\"agent\""),
            Some((11, "kind = \"agent\"\n".to_string()))
        );
        let inline = "route = { cases = {} }";
        assert_eq!(
            add_toml(inline, 8..22, "on", "\"\""),
            Some((10, "on = \"\", ".to_string()))
        );
        let kdl = "stage \"a\" {\n    argv \"x\"\n}\n";
        assert_eq!(
            add_kdl(kdl, 0..kdl.len(), "kind", "\"agent\""),
            Some((9, " kind=\"agent\"".to_string()))
        );
        assert_eq!(
            add_kdl(kdl, 0..kdl.len(), "agent", "\"a\""),
            Some((12, "    agent \"a\"\n".to_string()))
        );
        let kdl = "  marker \"x\" many=#true\n";
        assert_eq!(
            add_kdl(kdl, 0..kdl.len(), "prefix", "\"\""),
            Some((23, " prefix=\"\"".to_string()))
        );
        let braces = "stage \"a{\" when=\"{{ x }}\" {\n}\n";
        assert_eq!(
            add_kdl(braces, 0..braces.len(), "kind", "\"agent\""),
            Some((25, " kind=\"agent\"".to_string()))
        );
        assert_eq!(
            add_top_level("# c\n[a]\n", "name", "\"x\"", false),
            (4, "name = \"x\"\n".to_string())
        );
    }
}

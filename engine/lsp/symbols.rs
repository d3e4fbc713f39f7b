//! The outline: stages, with the bodies of loops, fan-outs and groups nested; then the
//! params, agents, exits and overrides, each kind under one symbol.
//!
//! It is read from the document's own text (its syntax tree), not from the merged workflow:
//! a file that extends or includes others shows its own stages and overrides, and a file
//! that others include shows what it adds. A TOML text that does not parse is outlined from
//! its `[stages.ID]` headers; a KDL one has no outline (an empty list); neither ever has a
//! range beyond the text.
//!
//! A symbol's `range` covers its whole text: in KDL its node (with its block), in TOML from
//! its `[header]` to the next header outside it (so a loop's range holds its body's tables);
//! its `selectionRange` is its id, inside its range as the protocol requires.

use std::ops::Range as Bytes;
use std::path::Path;

use lsp_types::{DocumentSymbol, DocumentSymbolResponse, SymbolKind};

use super::World;
use super::docs::uri_path;
use crate::diag::Diagnostics;
use crate::source::FileId;
use crate::syntax::Format;
use crate::syntax::tree::{Entry, Table};

pub(super) fn document_symbols(
    world: &World,
    params: lsp_types::DocumentSymbolParams,
) -> Option<DocumentSymbolResponse> {
    let path = uri_path(&params.text_document.uri)?;
    if !super::is_workflow_file(&path) {
        return Some(DocumentSymbolResponse::Nested(Vec::new()));
    }
    let text = world.text(&path)?;
    let outline = Outline::new(world, &path, &text);
    Some(DocumentSymbolResponse::Nested(outline.symbols()))
}

struct Outline<'a> {
    world: &'a World,
    path: &'a Path,
    text: &'a str,
    format: Format,
    tree: Table,
    /// TOML: each `[header]`: where its line starts and its path.
    headers: Vec<(usize, Vec<String>)>,
}

impl<'a> Outline<'a> {
    fn new(world: &'a World, path: &'a Path, text: &'a str) -> Outline<'a> {
        let format = Format::from_path(path);
        let mut diags = Diagnostics::default();
        // The spans are this text's: the file id is never looked up.
        let tree = crate::syntax::parse(FileId::default(), text, format, &mut diags);
        let headers = match format {
            Format::Toml => toml_headers(text),
            Format::Kdl => Vec::new(),
        };
        Outline {
            world,
            path,
            text,
            format,
            tree,
            headers,
        }
    }

    fn symbols(&self) -> Vec<DocumentSymbol> {
        if self.tree.entries.is_empty() && self.format == Format::Toml {
            return self.headers_outline();
        }
        let mut out = Vec::new();
        if let Some(stages) = self.tree.get("stages").and_then(|v| v.as_table()) {
            out.extend(self.stages(stages));
        }
        let groups: [(&str, SymbolKind, SymbolKind); 4] = [
            ("params", SymbolKind::NAMESPACE, SymbolKind::VARIABLE),
            ("agents", SymbolKind::NAMESPACE, SymbolKind::OBJECT),
            ("exits", SymbolKind::NAMESPACE, SymbolKind::ENUM_MEMBER),
            ("overrides", SymbolKind::NAMESPACE, SymbolKind::PROPERTY),
        ];
        for (key, group_kind, item_kind) in groups {
            let Some(table) = self.tree.get(key).and_then(|v| v.as_table()) else {
                continue;
            };
            let items: Vec<DocumentSymbol> = table
                .entries
                .iter()
                .filter_map(|e| {
                    let detail = self.detail_of(key, e);
                    self.symbol(e, item_kind, detail, Vec::new())
                })
                .collect();
            if let Some(group) = group(key, group_kind, items) {
                out.push(group);
            }
        }
        out.sort_by_key(|s| (s.range.start.line, s.range.start.character));
        out
    }

    /// The stages of a body, each with its own body nested.
    fn stages(&self, stages: &Table) -> Vec<DocumentSymbol> {
        stages
            .entries
            .iter()
            .filter_map(|e| {
                let t = e.value.as_table()?;
                let kind = t.get("kind").and_then(|v| v.as_str()).unwrap_or("stage");
                let children = t
                    .get("stages")
                    .and_then(|v| v.as_table())
                    .map(|body| self.stages(body))
                    .unwrap_or_default();
                let agent = t.get("agent").and_then(|v| v.as_str());
                let detail = match agent {
                    Some(agent) => format!("{kind} · {agent}"),
                    None => kind.to_string(),
                };
                self.symbol(e, stage_kind(kind), detail, children)
            })
            .collect()
    }

    fn detail_of(&self, group: &str, e: &Entry) -> String {
        let t = e.value.as_table();
        let get = |key: &str| -> Option<String> {
            let v = t?.get(key)?;
            match &v.kind {
                crate::syntax::tree::ValueKind::Str(s) => Some(s.clone()),
                crate::syntax::tree::ValueKind::Int(n) => Some(n.to_string()),
                _ => None,
            }
        };
        match group {
            "params" => get("type").unwrap_or_default(),
            "agents" => match (get("kind"), get("model")) {
                (Some(k), Some(m)) => format!("{k} · {m}"),
                (k, _) => k.unwrap_or_default(),
            },
            "exits" => get("code").map(|c| format!("code {c}")).unwrap_or_default(),
            _ => {
                // An override: of the base's stage, whose kind the analysis knows.
                let kind = self
                    .world
                    .analysis_for(self.path)
                    .and_then(|a| a.stage(&e.key))
                    .map(|s| s.kind.as_str());
                match kind {
                    Some(kind) => format!("override of {} stage", crate::diag::article(kind)),
                    None => "override".to_string(),
                }
            }
        }
    }

    /// The symbol of an entry: its whole text, its id selected.
    fn symbol(
        &self,
        e: &Entry,
        kind: SymbolKind,
        detail: String,
        children: Vec<DocumentSymbol>,
    ) -> Option<DocumentSymbol> {
        let whole = self.extent(e)?;
        let id = trim(self.text, e.key_span.range());
        // A TOML key before its inline table (`x = { ... }`) is a part of its text.
        let whole = if id.start < whole.start && id.start < id.end {
            id.start..whole.end
        } else {
            whole
        };
        let id = if id.start >= whole.start && id.end <= whole.end && id.start < id.end {
            id
        } else {
            whole.start..whole.start
        };
        let mut range = self.world.range(self.path, whole);
        // A body written apart from its stage (TOML tables in another order) still lies
        // within it.
        for c in &children {
            if pos(c.range.start) < pos(range.start) {
                range.start = c.range.start;
            }
            if pos(c.range.end) > pos(range.end) {
                range.end = c.range.end;
            }
        }
        #[allow(deprecated)]
        let symbol = DocumentSymbol {
            name: e.key.clone(),
            detail: (!detail.is_empty()).then_some(detail),
            kind,
            tags: None,
            deprecated: None,
            range,
            selection_range: self.world.range(self.path, id),
            children: (!children.is_empty()).then_some(children),
        };
        Some(symbol)
    }

    /// The bytes of an entry's whole text.
    fn extent(&self, e: &Entry) -> Option<Bytes<usize>> {
        let span = e.value.span.range();
        let written = self.text.get(span.clone())?;
        let whole = match self.format {
            Format::Toml if written.starts_with('[') => {
                let path = header_path(written);
                span.start..self.end_of_header(span.start, &path)
            }
            // KDL: the node, with its block; TOML: an inline table.
            _ => span,
        };
        let whole = trim(self.text, whole);
        (whole.start < whole.end).then_some(whole)
    }

    /// Where the tables under the header at `start` (with `path`) end: at the next header
    /// outside them, or the end of the text.
    fn end_of_header(&self, start: usize, path: &[String]) -> usize {
        let after = self.headers.partition_point(|(at, _)| *at <= start);
        self.headers[after..]
            .iter()
            .find(|(_, p)| !p.starts_with(path))
            .map_or(self.text.len(), |(at, _)| *at)
    }

    /// A TOML text that does not parse: the stages its `[stages.ID]` headers name, nested as
    /// their paths are, each with the kind its `kind = "..."` line says, if it has one.
    fn headers_outline(&self) -> Vec<DocumentSymbol> {
        struct Node {
            symbol: DocumentSymbol,
            children: Vec<usize>,
        }
        let mut nodes: Vec<Node> = Vec::new();
        let mut roots = Vec::new();
        let mut by_path: std::collections::HashMap<&[String], usize> = Default::default();
        for (i, (at, path)) in self.headers.iter().enumerate() {
            let is_stage = path.len() >= 2
                && path.len() % 2 == 0
                && path.iter().step_by(2).all(|p| p == "stages");
            if !is_stage {
                continue;
            }
            let id = &path[path.len() - 1];
            let whole = trim(self.text, *at..self.end_of_header(*at, path));
            // Its own lines: up to the next header.
            let own_end = self.headers.get(i + 1).map_or(self.text.len(), |(n, _)| *n);
            let kind = self
                .text
                .get(*at..own_end)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().strip_prefix("kind"))
                .filter_map(|l| l.trim_start().strip_prefix('='))
                .map(|v| v.trim().trim_matches('"').to_string())
                .next();
            let header = self.text[*at..].lines().next().unwrap_or_default();
            let header = &header[..header.find(']').unwrap_or(header.len())];
            let id_at = header.rfind(id.as_str()).map_or(*at, |i| *at + i);
            let selection = id_at..(id_at + id.len()).min(whole.end);
            let selection = if selection.start >= whole.start && selection.start <= selection.end {
                selection
            } else {
                whole.start..whole.start
            };
            #[allow(deprecated)]
            let symbol = DocumentSymbol {
                name: id.clone(),
                detail: kind.clone(),
                kind: stage_kind(kind.as_deref().unwrap_or("")),
                tags: None,
                deprecated: None,
                range: self.world.range(self.path, whole),
                selection_range: self.world.range(self.path, selection),
                children: None,
            };
            let n = nodes.len();
            nodes.push(Node {
                symbol,
                children: Vec::new(),
            });
            match by_path.get(&path[..path.len() - 2]) {
                Some(&parent) => nodes[parent].children.push(n),
                None => roots.push(n),
            }
            by_path.insert(path.as_slice(), n);
        }
        fn build(nodes: &mut [Option<Node>], i: usize) -> Option<DocumentSymbol> {
            let node = nodes.get_mut(i)?.take()?;
            let children: Vec<DocumentSymbol> = node
                .children
                .iter()
                .filter_map(|&c| build(nodes, c))
                .collect();
            let mut symbol = node.symbol;
            symbol.children = (!children.is_empty()).then_some(children);
            Some(symbol)
        }
        let mut nodes: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
        roots.iter().filter_map(|&r| build(&mut nodes, r)).collect()
    }
}

/// The group of a kind of definitions, covering them; `None` when there are none.
fn group(name: &str, kind: SymbolKind, items: Vec<DocumentSymbol>) -> Option<DocumentSymbol> {
    let first = items.first()?;
    let mut range = first.range;
    for s in &items {
        if pos(s.range.start) < pos(range.start) {
            range.start = s.range.start;
        }
        if pos(s.range.end) > pos(range.end) {
            range.end = s.range.end;
        }
    }
    let selection_range = first.selection_range;
    #[allow(deprecated)]
    let symbol = DocumentSymbol {
        name: name.to_string(),
        detail: None,
        kind,
        tags: None,
        deprecated: None,
        range,
        selection_range,
        children: Some(items),
    };
    Some(symbol)
}

fn pos(p: lsp_types::Position) -> (u32, u32) {
    (p.line, p.character)
}

/// The symbol kind of a stage kind: agents are functions, gates events, regions
/// namespaces (a fan-out an array).
fn stage_kind(kind: &str) -> SymbolKind {
    match kind {
        "agent" => SymbolKind::FUNCTION,
        "command" => SymbolKind::METHOD,
        "check" => SymbolKind::OPERATOR,
        "gate" => SymbolKind::EVENT,
        "subflow" => SymbolKind::MODULE,
        "loop" => SymbolKind::NAMESPACE,
        "for_each" => SymbolKind::ARRAY,
        "group" => SymbolKind::STRUCT,
        _ => SymbolKind::FUNCTION,
    }
}

/// A byte range without the blank lines and comments around it (those after a stage are the
/// next one's heading), and never beyond the text.
fn trim(text: &str, r: Bytes<usize>) -> Bytes<usize> {
    let end = r.end.min(text.len());
    let start = r.start.min(end);
    let Some(s) = text.get(start..end) else {
        return start..start;
    };
    let lead = s.len() - s.trim_start().len();
    let mut body = &s[lead..];
    loop {
        let trimmed = body.trim_end();
        let last_line_at = trimmed.rfind('\n').map_or(0, |i| i + 1);
        let last = trimmed[last_line_at..].trim_start();
        if last_line_at > 0 && (last.starts_with('#') || last.starts_with("//")) {
            body = &trimmed[..last_line_at];
            continue;
        }
        body = trimmed;
        break;
    }
    start + lead..start + lead + body.len()
}

/// The keys of a `[header]` or `[[header]]`, unquoted.
fn header_path(header: &str) -> Vec<String> {
    let inner = header.trim_start_matches('[');
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    for ch in inner.chars() {
        match (quote, ch) {
            (None, ']') => break,
            (None, '"' | '\'') => quote = Some(ch),
            (Some(q), c) if c == q => quote = None,
            (None, '.') => parts.push(std::mem::take(&mut cur)),
            (None, c) if c.is_whitespace() => {}
            (_, c) => cur.push(c),
        }
    }
    parts.push(cur);
    parts
}

/// Every `[header]` of a TOML text: the start of its line and its path. Read with the TOML
/// lexer, so that a `[` inside a string or a multi-line array is not taken for one; a line
/// that starts with `[` and a bare key is a header even inside a bracket left open (a
/// half-typed array does not hide the rest of the file).
pub(super) fn toml_headers(text: &str) -> Vec<(usize, Vec<String>)> {
    use toml_parser::lexer::TokenKind as T;
    let tokens: Vec<_> = toml_parser::Source::new(text)
        .lex()
        .filter(|t| !matches!(t.kind(), T::Whitespace | T::Comment))
        .collect();
    let mut out = Vec::new();
    let mut depth: i64 = 0;
    let mut line_begins = true;
    for (i, token) in tokens.iter().enumerate() {
        let span = token.span();
        let kind = token.kind();
        let header = kind == T::LeftSquareBracket
            && line_begins
            && (depth <= 0 || {
                // `[stages.x]` in an open array: a header (an array item is no bare word).
                let next = tokens.get(i + 1).map(|t| t.span());
                let word = next
                    .and_then(|n| text.get(n.start()..n.end()))
                    .unwrap_or("");
                word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && !["true", "false", "inf", "nan"].contains(&word)
            });
        match kind {
            T::Newline => {
                if depth <= 0 {
                    depth = 0;
                    line_begins = true;
                }
            }
            T::LeftSquareBracket if header => {
                line_begins = false;
                let start = span.start();
                let line = text[..start].rfind('\n').map_or(0, |i| i + 1);
                let header = text[start..].lines().next().unwrap_or_default();
                out.push((line, header_path(header)));
                // The rest of the header's line is not a value.
                depth = -1;
            }
            T::LeftSquareBracket | T::LeftCurlyBracket if depth >= 0 => {
                depth += 1;
                line_begins = false;
            }
            T::RightSquareBracket | T::RightCurlyBracket if depth > 0 => {
                depth -= 1;
            }
            T::Eof => {}
            _ => line_begins = false,
        }
        if kind == T::Newline {
            line_begins = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_past_strings_and_arrays() {
        let text = "a = [\n  [1],\n]\n[stages.x]\nprompt = \"\"\"\n[not a header]\n\"\"\"\n[stages.x.stages.y] # c\n";
        let headers = toml_headers(text);
        let paths: Vec<String> = headers.iter().map(|(_, p)| p.join(".")).collect();
        assert_eq!(paths, ["stages.x", "stages.x.stages.y"]);
        assert_eq!(&text[headers[0].0..headers[0].0 + 10], "[stages.x]");
        assert_eq!(header_path("[stages.\"a b\" . c]"), ["stages", "a b", "c"]);
        // An array left open does not hide the headers after it.
        let open = "a = [\n  \"x\",\n  [1],\n[stages.y]\nb = 1\n";
        let paths: Vec<String> = toml_headers(open)
            .iter()
            .map(|(_, p)| p.join("."))
            .collect();
        assert_eq!(paths, ["stages.y"]);
    }

    #[test]
    fn trimming_drops_the_blank_lines_and_comments_after_a_text() {
        let text = "  stage \"a\" {\n}\n\n// next\n\nstage \"b\"";
        let r = trim(text, 0..text.len() - 9);
        assert_eq!(&text[r], "stage \"a\" {\n}");
    }
}

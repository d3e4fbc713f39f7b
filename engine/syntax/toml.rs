//! Reads TOML workflow files into the shared syntax tree, reporting every syntax error.

use std::borrow::Cow;

use toml::de::{DeTable, DeValue};

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::source::{FileId, Span};
use crate::syntax::tree::{Entry, Table, Value, ValueKind};

/// Files at least this long are parsed in pieces of about this many bytes (see
/// [`pieces`]).
const PIECE_BYTES: usize = 64 * 1024;

/// Parses TOML text into a table, recovering from errors where the parser can.
///
/// A long file is parsed a piece at a time, each piece a run of whole `[table]` sections,
/// and the pieces' tables merged: the parser's document of the whole file (its tokens and
/// maps, about 3.5 KB a stage) would be the largest thing a run of a long workflow ever
/// holds. The pieces are cut only where the result cannot differ from parsing the file
/// whole (see [`pieces`]); a piece with any problem sends the whole file through the parser
/// at once, so that every message is the same as it would be.
pub fn parse(file: FileId, text: &str, diags: &mut Diagnostics) -> Table {
    parse_sized(file, text, diags, PIECE_BYTES)
}

/// [`parse`], with pieces of about `size` bytes.
fn parse_sized(file: FileId, text: &str, diags: &mut Diagnostics, size: usize) -> Table {
    let cuts = if text.len() >= size {
        pieces(text, size)
    } else {
        Vec::new()
    };
    if !cuts.is_empty() {
        let mut bounds = Vec::with_capacity(cuts.len() + 2);
        bounds.push(0);
        bounds.extend(cuts);
        bounds.push(text.len());
        let mut table = Table::default();
        let mut clean = true;
        for w in bounds.windows(2) {
            let mut piece_diags = Diagnostics::default();
            let piece = parse_whole(file, &text[w[0]..w[1]], w[0], &mut piece_diags);
            if piece_diags.iter().next().is_some() || !merge(&mut table, piece) {
                clean = false;
                break;
            }
        }
        if clean {
            return table;
        }
    }
    parse_whole(file, text, 0, diags)
}

/// Where a long file can be cut into pieces of about `size` bytes, each cut at the start
/// of a `[table]` or `[[table]]` header line: none when it cannot be cut safely.
///
/// The pieces are parsed alone and their tables merged, which gives what parsing the file
/// whole gives as long as no table is written to from two pieces except as the implicit
/// parent of headers (`stages` in `[stages.a]` and `[stages.b]`). So no header's path may
/// equal, or be a prefix of, a header's path in another piece, and no header after the
/// first piece may start with a key of the file's top-level key-values (which could be an
/// inline table or a dotted key). The file is read with the TOML lexer (strings and
/// multi-line arrays are not mistaken for headers); anything it does not expect means no
/// cuts.
fn pieces(text: &str, size: usize) -> Vec<usize> {
    use toml_parser::lexer::TokenKind as T;
    // Each header: its line's start and its path.
    let mut headers: Vec<(usize, Vec<String>)> = Vec::new();
    let mut root_keys: Vec<String> = Vec::new();
    // Each token this loop takes starts a line (but for whitespace and comments): the inner
    // loops take the rest of the line.
    let mut tokens = toml_parser::Source::new(text).lex();
    while let Some(token) = tokens.next() {
        let span = token.span();
        match token.kind() {
            T::Whitespace | T::Comment | T::Newline => {}
            T::LeftSquareBracket => {
                // A header: `[` (or `[[`) path `]` (or `]]`), then the end of the line.
                let mut close = None;
                for t in tokens.by_ref() {
                    match t.kind() {
                        T::RightSquareBracket if close.is_none() => close = Some(t.span().start()),
                        T::Newline | T::Eof => break,
                        _ => {}
                    }
                }
                let Some(close) = close else {
                    return Vec::new();
                };
                let inner = text[span.end()..close].trim_start_matches('[');
                headers.push((line_start_of(text, span.start()), dotted(inner)));
            }
            T::Eof => break,
            _ => {
                // A key-value: its value runs to the end of the line, or on while brackets
                // are open (multi-line arrays and inline tables).
                let key_start = span.start();
                let mut key_end = None;
                let mut depth: i64 = 0;
                let mut ended = false;
                for t in tokens.by_ref() {
                    match t.kind() {
                        T::Equals if key_end.is_none() => key_end = Some(t.span().start()),
                        T::LeftSquareBracket | T::LeftCurlyBracket => depth += 1,
                        T::RightSquareBracket | T::RightCurlyBracket => depth -= 1,
                        T::Newline if depth <= 0 => {
                            ended = true;
                            break;
                        }
                        T::Eof => {
                            ended = true;
                            break;
                        }
                        _ => {}
                    }
                }
                let (Some(key_end), true) = (key_end, ended) else {
                    return Vec::new();
                };
                if headers.is_empty() {
                    if let Some(first) = dotted(&text[key_start..key_end]).into_iter().next() {
                        root_keys.push(first);
                    }
                }
            }
        }
    }
    // Cut greedily where the piece has grown to `size`, but not before a header under a
    // header of the piece (a loop's body goes with its loop).
    let mut cuts = Vec::new();
    let mut piece_of = Vec::with_capacity(headers.len());
    let mut piece_start = 0;
    let mut in_piece: std::collections::HashSet<&[String]> = std::collections::HashSet::new();
    for (start, path) in &headers {
        let under = (1..=path.len()).any(|n| in_piece.contains(&path[..n]));
        if *start - piece_start >= size && *start > 0 && !under {
            cuts.push(*start);
            piece_start = *start;
            in_piece.clear();
        }
        in_piece.insert(path);
        piece_of.push(cuts.len());
    }
    if cuts.is_empty() {
        return cuts;
    }
    // Check the pieces: every full path and every proper prefix, with its piece.
    let mut full: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut prefixes: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    const SHARED: usize = usize::MAX;
    for ((_, path), &piece) in headers.iter().zip(&piece_of) {
        if piece > 0 && path.first().is_some_and(|k| root_keys.contains(k)) {
            return Vec::new();
        }
        let key = path.join("\u{0}");
        match full.get(&key) {
            Some(&p) if p != piece => return Vec::new(),
            _ => {
                full.insert(key, piece);
            }
        }
        for n in 1..path.len() {
            let key = path[..n].join("\u{0}");
            match prefixes.get(&key) {
                Some(&p) if p != piece => {
                    prefixes.insert(key, SHARED);
                }
                Some(_) => {}
                None => {
                    prefixes.insert(key, piece);
                }
            }
        }
    }
    for ((_, path), &piece) in headers.iter().zip(&piece_of) {
        let key = path.join("\u{0}");
        // A header that is the parent of a header in another piece.
        if prefixes.get(&key).is_some_and(|&p| p != piece) {
            return Vec::new();
        }
        // A header under a header of another piece.
        for n in 1..path.len() {
            if full
                .get(&path[..n].join("\u{0}"))
                .is_some_and(|&p| p != piece)
            {
                return Vec::new();
            }
        }
    }
    cuts
}

/// The start of the line that holds byte `pos`.
fn line_start_of(text: &str, pos: usize) -> usize {
    text[..pos].rfind('\n').map_or(0, |i| i + 1)
}

/// Merges the table of a later piece into the tables of the pieces before it: new keys go
/// at the end, in order, and a table both hold (the implicit parent of headers) is merged
/// in turn. Returns false on anything else both hold (which [`pieces`] rules out).
fn merge(into: &mut Table, from: Table) -> bool {
    if into.entries.is_empty() {
        *into = from;
        return true;
    }
    let incoming: std::collections::HashMap<&str, usize> = from
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.key.as_str(), i))
        .collect();
    // Where each incoming key already is, found with one pass over the existing keys.
    let mut found: Vec<Option<usize>> = vec![None; from.entries.len()];
    for (i, e) in into.entries.iter().enumerate() {
        if let Some(&j) = incoming.get(e.key.as_str()) {
            found[j] = Some(i);
        }
    }
    drop(incoming);
    for (entry, at) in from.entries.into_iter().zip(found) {
        match at {
            None => into.entries.push(entry),
            Some(i) => match (&mut into.entries[i].value.kind, entry.value.kind) {
                (ValueKind::Table(old), ValueKind::Table(new)) => {
                    if !merge(old, new) {
                        return false;
                    }
                }
                _ => return false,
            },
        }
    }
    true
}

/// Parses TOML text whole (`base`: where it starts in its file, for the spans).
fn parse_whole(file: FileId, text: &str, base: usize, diags: &mut Diagnostics) -> Table {
    let at = At { file, base };
    let (doc, errors) = DeTable::parse_recoverable(text);
    let failed = !errors.is_empty();
    // Headers of tables defined twice: the keys under them only echo that error.
    let mut twice_headers = Vec::new();
    for err in errors {
        let span = err.span().map(|r| at.span(r));
        let message = err.message().trim().to_string();
        if let (Some(range), true) = (err.span(), message == "duplicate key") {
            let line_start = text[..range.start].rfind('\n').map_or(0, |i| i + 1);
            let in_header = text[line_start..].trim_start().starts_with('[');
            if !in_header {
                if let Some((header, _)) = header_before(text, line_start) {
                    if twice_headers.contains(&header) {
                        continue;
                    }
                }
            } else {
                twice_headers.push(line_start);
            }
            if let Some(d) = duplicate_key(at, text, doc.get_ref(), range, in_header) {
                diags.push(d);
                continue;
            }
        }
        diags.push(
            Diagnostic::new(Code::Syntax, span, format!("invalid TOML: {message}"))
                .help("fix the TOML syntax; https://toml.io describes it"),
        );
    }
    if failed {
        // A partly parsed document would only add noise on top of the syntax errors.
        return Table::default();
    }
    convert_table(at, doc.get_ref(), diags)
}

/// Where a parsed text is in its file: spans of the text are moved by `base`.
#[derive(Clone, Copy)]
struct At {
    file: FileId,
    base: usize,
}

impl At {
    fn span(self, r: std::ops::Range<usize>) -> Span {
        Span::new(self.file, r.start + self.base..r.end + self.base)
    }
}

/// Splits a dotted key (`a."b.c".d`) into its parts, unquoted.
fn dotted(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    for ch in text.chars() {
        match (quote, ch) {
            (None, '"' | '\'') => quote = Some(ch),
            (Some(q), c) if c == q => quote = None,
            (None, '.') => parts.push(std::mem::take(&mut cur).trim().to_string()),
            (None, c) if c.is_whitespace() => {}
            (_, c) => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        parts.push(cur.trim().to_string());
    }
    parts
}

/// Finds the `[table]` header in force at byte `pos`: its line start and its path.
fn header_before(text: &str, pos: usize) -> Option<(usize, Vec<String>)> {
    let mut end = pos;
    loop {
        let upto = text.get(..end)?;
        let upto = upto.strip_suffix('\n').unwrap_or(upto);
        let start = upto.rfind('\n').map_or(0, |i| i + 1);
        let line = text[start..end].trim();
        if let Some(inner) = line.strip_prefix('[') {
            let inner = inner.trim_start_matches('[');
            let inner = inner.split(']').next().unwrap_or("");
            return Some((start, dotted(inner)));
        }
        if start == 0 {
            return None;
        }
        end = start;
    }
}

/// Reports a key defined twice by name, pointing at its first definition too.
fn duplicate_key(
    at: At,
    text: &str,
    doc: &DeTable<'_>,
    range: std::ops::Range<usize>,
    in_header: bool,
) -> Option<Diagnostic> {
    let line_start = text[..range.start].rfind('\n').map_or(0, |i| i + 1);
    let key = dotted(text.get(range.clone())?).join(".");
    let mut path = if in_header {
        let (_, parts) = header_before(text, range.end)?;
        let last = parts.iter().rposition(|p| *p == key)?;
        parts[..=last].to_vec()
    } else if text
        .get(line_start..range.start)?
        .contains(['=', '{', '[', ','])
    {
        // Inside an inline table or array: name the key alone.
        return Some(
            Diagnostic::new(
                Code::Syntax,
                at.span(range),
                format!("invalid TOML: `{key}` is written twice in this inline table"),
            )
            .label("written again here")
            .help("a TOML key is written once per table: keep one of them"),
        );
    } else {
        let mut path = header_before(text, line_start)
            .map(|(_, p)| p)
            .unwrap_or_default();
        path.extend(dotted(text.get(line_start..range.start)?));
        path.push(key);
        path
    };
    path.retain(|p| !p.is_empty());
    let name = path.join(".");
    let mut d = Diagnostic::new(
        Code::Syntax,
        at.span(range.clone()),
        format!("invalid TOML: `{name}` is defined twice"),
    )
    .label("defined again here");
    if in_header {
        // The first definition: an earlier header naming the same table.
        let header = text[line_start..].lines().next().unwrap_or("").trim();
        let mut pos = 0;
        for line in text[..line_start].split_inclusive('\n') {
            let trimmed = line.trim();
            if dotted(trimmed.trim_matches(['[', ']'])) == dotted(header.trim_matches(['[', ']']))
                && trimmed.starts_with('[')
            {
                let lead = line.len() - line.trim_start().len();
                return Some(
                    d.related(
                        at.span(pos + lead..pos + lead + trimmed.len()),
                        "first defined here",
                    )
                    .help("a TOML table is written once: merge the two, or rename one"),
                );
            }
            pos += line.len();
        }
    }
    // The partly parsed document holds the first definition.
    let mut table = doc;
    for (i, part) in path.iter().enumerate() {
        let Some((k, v)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == part) else {
            break;
        };
        if i + 1 == path.len() {
            if k.span() != range {
                d = d.related(at.span(k.span()), "first defined here");
            }
            break;
        }
        match v.get_ref() {
            DeValue::Table(t) => table = t,
            _ => break,
        }
    }
    Some(d.help(if in_header {
        "a TOML table is written once: merge the two, or rename one"
    } else {
        "a TOML key is written once per table: keep one of them"
    }))
}

fn convert_table(at: At, table: &DeTable<'_>, diags: &mut Diagnostics) -> Table {
    let mut out = Table::default();
    for (key, value) in table {
        if let Some(value) = convert(at, value.get_ref(), value.span(), diags) {
            let key_text: &Cow<'_, str> = key.get_ref();
            out.entries.push(Entry {
                key: key_text.to_string(),
                key_span: at.span(key.span()),
                value,
            });
        }
    }
    out
}

fn convert(
    at: At,
    value: &DeValue<'_>,
    range: std::ops::Range<usize>,
    diags: &mut Diagnostics,
) -> Option<Value> {
    let span = at.span(range);
    let kind = match value {
        DeValue::String(s) => ValueKind::Str(s.to_string()),
        DeValue::Integer(i) => match i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()) {
            Ok(n) => ValueKind::Int(n),
            Err(_) => {
                diags.push(
                    Diagnostic::new(Code::InvalidValue, span, "integer out of range")
                        .help("use a number between -2^63 and 2^63-1"),
                );
                return None;
            }
        },
        DeValue::Float(f) => {
            let text = f.as_str().replace('_', "");
            let parsed = match text.as_str() {
                "inf" | "+inf" => Some(f64::INFINITY),
                "-inf" => Some(f64::NEG_INFINITY),
                "nan" | "+nan" | "-nan" => Some(f64::NAN),
                other => other.parse::<f64>().ok(),
            };
            match parsed {
                Some(v) if v.is_finite() => ValueKind::Float(v),
                _ => {
                    diags.push(
                        Diagnostic::new(
                            Code::UnsupportedValue,
                            span,
                            "infinite or NaN floats are not supported",
                        )
                        .help("write a finite number"),
                    );
                    return None;
                }
            }
        }
        DeValue::Boolean(b) => ValueKind::Bool(*b),
        DeValue::Datetime(_) => {
            diags.push(
                Diagnostic::new(
                    Code::UnsupportedValue,
                    span,
                    "date-time values are not used in workflows",
                )
                .help("quote it to make it a string"),
            );
            return None;
        }
        DeValue::Array(items) => ValueKind::Array(
            items
                .iter()
                .filter_map(|v| convert(at, v.get_ref(), v.span(), diags))
                .collect(),
        ),
        DeValue::Table(t) => ValueKind::Table(convert_table(at, t, diags)),
    };
    Some(Value { span, kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a parse gives: the table and the messages.
    fn both(text: &str, size: Option<usize>) -> (Table, Vec<String>) {
        let mut diags = Diagnostics::default();
        let table = match size {
            Some(size) => parse_sized(FileId(0), text, &mut diags, size),
            None => parse_whole(FileId(0), text, 0, &mut diags),
        };
        let messages = diags.iter().map(|d| format!("{d:?}")).collect();
        (table, messages)
    }

    /// Every TOML file of the project (presets, fixtures, examples, tests).
    fn project_files() -> Vec<(std::path::PathBuf, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut out = Vec::new();
        let mut dirs = vec![
            root.join("workflows"),
            root.join("tests"),
            root.join("examples"),
        ];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "toml") {
                    if let Ok(text) = std::fs::read_to_string(&path) {
                        out.push((path, text));
                    }
                }
            }
        }
        out
    }

    /// A long workflow with what could trip a cut: loops with bodies, multi-line arrays and
    /// strings, a multi-line string holding a line that looks like a header, comments.
    fn long_workflow(stages: usize) -> String {
        let mut t = String::from(
            "# a workflow\nname = \"long\"\n\n[agents.bot]\nkind = \"command\"\n\
             argv = [\n  \"cat\",\n]\n",
        );
        for i in 0..stages {
            t.push_str(&format!(
                "\n[stages.s{i}]  # stage {i}\nkind = \"agent\"\nagent = \"bot\"\n\
                 prompt = \"\"\"\n[stages.fake{i}]\nnot a header\n\"\"\"\n\
                 needs = [\n  \"s{}\", # the one before\n]\n",
                i.saturating_sub(1)
            ));
            if i % 7 == 0 {
                t.push_str(&format!(
                    "\n[stages.l{i}]\nkind = \"loop\"\nmax_iterations = 2\n\
                     \n[stages.l{i}.stages.a]\nkind = \"agent\"\nagent = \"bot\"\n\
                     prompt = 'x'\nwhen = {{ a = 1 }}\n"
                ));
            }
        }
        t
    }

    #[test]
    fn a_file_parsed_in_pieces_gives_what_the_whole_file_gives() {
        let files = project_files();
        assert!(files.len() > 20, "found {} files", files.len());
        for (path, text) in &files {
            for size in [1, 200, 4096] {
                assert_eq!(
                    both(text, Some(size)),
                    both(text, None),
                    "{} in pieces of {size} bytes",
                    path.display()
                );
            }
        }
        let long = long_workflow(300);
        // Cut anywhere it may be: before every header (the agent, each stage, each loop) but
        // a loop's body.
        let cuts = pieces(&long, 1);
        assert_eq!(cuts.len(), 1 + 300 + 300_usize.div_ceil(7), "{cuts:?}");
        assert_eq!(both(&long, Some(1)), both(&long, None));
        let cuts = pieces(&long, 4096);
        assert!(cuts.len() > 5, "{cuts:?}");
        for &cut in &cuts {
            // Each cut is at a real header line, never inside a string.
            assert!(long[cut..].starts_with("[stages.s") || long[cut..].starts_with("[stages.l"));
            assert!(long[..cut].ends_with('\n'));
        }
        let (table, messages) = both(&long, Some(4096));
        assert!(messages.is_empty(), "{messages:?}");
        assert_eq!((table.clone(), messages), both(&long, None));
        // Each stage is there once, in order.
        let Some(Value {
            kind: ValueKind::Table(stages),
            ..
        }) = table.get("stages")
        else {
            panic!("no stages");
        };
        assert_eq!(stages.entries.len(), 300 + 300_usize.div_ceil(7));
        assert_eq!(stages.entries[0].key, "s0");
        assert_eq!(stages.entries.last().map(|e| e.key.as_str()), Some("s299"));
    }

    #[test]
    fn no_cut_where_a_table_would_be_written_from_two_pieces() {
        // A header under a header of an earlier piece (loop bodies).
        assert!(pieces("[a]\nk = 1\n[b]\nk = 1\n[a.c]\nk = 1\n", 1).is_empty());
        // A header that is the parent of an earlier piece's header.
        assert!(pieces("[a.c]\nk = 1\n[b]\nk = 1\n[a]\nk = 1\n", 1).is_empty());
        // The same table twice (an error the whole file reports), or arrays of tables.
        assert!(pieces("[a]\nk = 1\n[b]\nk = 1\n[a]\nj = 1\n", 1).is_empty());
        assert!(pieces("[[a]]\nk = 1\n[b]\nk = 1\n[[a]]\nk = 2\n", 1).is_empty());
        // A top-level key (a dotted key or an inline table) that a later header extends.
        assert!(pieces("a.x = 1\n[b]\nk = 1\n[a.c]\nk = 1\n", 1).is_empty());
        assert!(pieces("a = { x = 1 }\n[b]\nk = 1\n[a.c]\nk = 1\n", 1).is_empty());
        // Siblings under an implicit parent may be cut apart.
        let text = "[a.b]\nk = 1\n[a.c]\nk = 1\n[[d]]\nk = 1\n";
        assert_eq!(pieces(text, 1), [12, 24]);
        assert_eq!(both(text, Some(1)), both(text, None));
    }

    #[test]
    fn a_problem_in_a_piece_is_reported_as_for_the_whole_file() {
        let mut long = long_workflow(100);
        long.push_str(
            "\n[stages.bad]\nkind = \"agent\"\nkind = \"command\"\nx = 99999999999999999999\n",
        );
        long.push_str("\n[stages.s3]\nkind = \"agent\"\n");
        let (_, messages) = both(&long, Some(1024));
        assert!(!messages.is_empty());
        assert_eq!(both(&long, Some(1024)), both(&long, None));
    }
}

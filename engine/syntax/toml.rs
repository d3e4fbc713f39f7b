//! Reads TOML workflow files into the shared syntax tree, reporting every syntax error.

use std::borrow::Cow;

use toml::de::{DeTable, DeValue};

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::source::{FileId, Span};
use crate::syntax::tree::{Entry, Table, Value, ValueKind};

/// Parses TOML text into a table, recovering from errors where the parser can.
pub fn parse(file: FileId, text: &str, diags: &mut Diagnostics) -> Table {
    let (doc, errors) = DeTable::parse_recoverable(text);
    let failed = !errors.is_empty();
    // Headers of tables defined twice: the keys under them only echo that error.
    let mut twice_headers = Vec::new();
    for err in errors {
        let span = err.span().map(|r| Span::new(file, r));
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
            if let Some(d) = duplicate_key(file, text, doc.get_ref(), range, in_header) {
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
    convert_table(file, doc.get_ref(), diags)
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
    file: FileId,
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
                Span::new(file, range),
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
        Span::new(file, range.clone()),
        format!("invalid TOML: `{name}` is defined twice"),
    )
    .label("defined again here");
    if in_header {
        // The first definition: an earlier header naming the same table.
        let header = text[line_start..].lines().next().unwrap_or("").trim();
        let mut at = 0;
        for line in text[..line_start].split_inclusive('\n') {
            let trimmed = line.trim();
            if dotted(trimmed.trim_matches(['[', ']'])) == dotted(header.trim_matches(['[', ']']))
                && trimmed.starts_with('[')
            {
                let lead = line.len() - line.trim_start().len();
                return Some(
                    d.related(
                        Span::new(file, at + lead..at + lead + trimmed.len()),
                        "first defined here",
                    )
                    .help("a TOML table is written once: merge the two, or rename one"),
                );
            }
            at += line.len();
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
                d = d.related(Span::new(file, k.span()), "first defined here");
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

fn convert_table(file: FileId, table: &DeTable<'_>, diags: &mut Diagnostics) -> Table {
    let mut out = Table::default();
    for (key, value) in table {
        if let Some(value) = convert(file, value.get_ref(), value.span(), diags) {
            let key_text: &Cow<'_, str> = key.get_ref();
            out.entries.push(Entry {
                key: key_text.to_string(),
                key_span: Span::new(file, key.span()),
                value,
            });
        }
    }
    out
}

fn convert(
    file: FileId,
    value: &DeValue<'_>,
    range: std::ops::Range<usize>,
    diags: &mut Diagnostics,
) -> Option<Value> {
    let span = Span::new(file, range);
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
                .filter_map(|v| convert(file, v.get_ref(), v.span(), diags))
                .collect(),
        ),
        DeValue::Table(t) => ValueKind::Table(convert_table(file, t, diags)),
    };
    Some(Value { span, kind })
}

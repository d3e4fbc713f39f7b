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
    for err in errors {
        let span = err.span().map(|r| Span::new(file, r));
        let message = err.message().trim().to_string();
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

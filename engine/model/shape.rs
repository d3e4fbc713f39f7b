//! Checks a syntax tree against the format's spec: unknown keys, wrong types, missing keys.

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Action, MAX_DURATION, RESERVED, is_ident, parse_duration};
use crate::spec::{Field, TableSpec, Ty};
use crate::syntax::tree::{Table, Value, ValueKind};

/// Reports every place where `table` does not fit `spec`, recursively.
pub fn check_table(table: &Table, spec: &'static TableSpec, diags: &mut Diagnostics) {
    if spec.fields.is_empty() {
        return; // free-form (inline JSON Schema)
    }
    let kind = spec
        .kind_key
        .and_then(|key| table.get(key))
        .and_then(Value::as_str);
    for entry in &table.entries {
        let Some(field) = spec.field(&entry.key) else {
            let keys = spec
                .fields
                .iter()
                .filter(|f| applies(f, kind))
                .map(|f| f.key);
            diags.push(
                Diagnostic::new(
                    Code::UnknownKey,
                    entry.key_span,
                    format!("unknown key `{}` in {}", entry.key, spec.name),
                )
                .label("not a key of this table")
                .suggest(&entry.key, keys)
                .help_or(format!(
                    "the keys of {} are: {}",
                    spec.name,
                    key_list(spec, kind)
                )),
            );
            continue;
        };
        if let Some(kind) = kind {
            if !applies(field, Some(kind)) {
                diags.push(
                    Diagnostic::new(
                        Code::KeyNotForKind,
                        entry.key_span,
                        format!(
                            "`{}` does not apply to {} of kind `{kind}`",
                            entry.key,
                            crate::diag::article(spec.name)
                        ),
                    )
                    .help(format!(
                        "`{}` applies to kinds: {}",
                        entry.key,
                        field.kinds.join(", ")
                    )),
                );
                continue;
            }
        }
        check_value(&entry.value, &field.ty, &entry.key, diags);
    }
    for field in spec.fields.iter().filter(|f| f.required) {
        if table.get(field.key).is_none() {
            diags.push(Diagnostic::new(
                Code::MissingKey,
                None,
                format!("missing key `{}` in {}", field.key, spec.name),
            ));
        }
    }
}

/// Like [`check_table`], but points missing-key errors at the table's own span.
pub fn check_value_table(
    value: &Value,
    spec: &'static TableSpec,
    what: &str,
    diags: &mut Diagnostics,
) {
    let Some(table) = value.as_table() else {
        diags.push(wrong_type(value, "a table", what));
        return;
    };
    let mut inner = Diagnostics::default();
    check_table(table, spec, &mut inner);
    for mut d in inner.into_sorted() {
        if d.span.is_none() {
            d.span = Some(value.span);
            d.label = Some(format!("in this {}", spec.name));
        }
        diags.push(d);
    }
}

fn applies(field: &Field, kind: Option<&str>) -> bool {
    field.kinds.is_empty() || kind.is_none_or(|k| field.kinds.contains(&k))
}

fn key_list(spec: &TableSpec, kind: Option<&str>) -> String {
    spec.fields
        .iter()
        .filter(|f| applies(f, kind))
        .map(|f| f.key)
        .collect::<Vec<_>>()
        .join(", ")
}

fn wrong_type(value: &Value, expected: &str, key: &str) -> Diagnostic {
    Diagnostic::new(
        Code::WrongType,
        value.span,
        format!("`{key}` must be {expected}, not {}", value.type_name()),
    )
    .label(format!("expected {expected}"))
}

fn check_value(value: &Value, ty: &Ty, key: &str, diags: &mut Diagnostics) {
    match ty {
        Ty::Str | Ty::Template | Ty::Expr => {
            if value.as_str().is_none() {
                diags.push(wrong_type(value, "a string", key));
            }
        }
        Ty::Label => match value.as_str() {
            Some(s) if crate::spec::is_label(s) => {}
            Some(s) => diags.push(
                Diagnostic::new(Code::InvalidValue, value.span, format!("`{s}` is not a label"))
                    .label("expected a label")
                    .help("a label is ASCII letters, digits and `-`, `_`, `.`, `:`, `/`, as a worker's `--labels` gives them"),
            ),
            None => diags.push(wrong_type(value, "a string", key)),
        },
        Ty::Enum(options) => match value.as_str() {
            Some(s) if options.contains(&s) => {}
            Some(s) => diags.push(
                Diagnostic::new(Code::InvalidValue, value.span, format!("`{s}` is not a valid value for `{key}`"))
                    .label(format!("expected one of: {}", options.join(", ")))
                    .suggest(s, options.iter().copied()),
            ),
            None => diags.push(wrong_type(value, "a string", key)),
        },
        Ty::Count => match &value.kind {
            ValueKind::Int(n) if *n >= 0 => {}
            ValueKind::Int(_) => diags.push(
                Diagnostic::new(Code::InvalidValue, value.span, format!("`{key}` cannot be negative")).label("must be 0 or more"),
            ),
            ValueKind::Str(s) if s.contains("{{") => {}
            ValueKind::Str(_) => diags.push(
                Diagnostic::new(Code::WrongType, value.span, format!("`{key}` must be an integer"))
                    .label("expected an integer")
                    .help("write a number, or a template over params such as \"{{ params.max_attempts }}\""),
            ),
            _ => diags.push(wrong_type(value, "an integer", key)),
        },
        Ty::Int => {
            if value.as_int().is_none() {
                diags.push(wrong_type(value, "an integer", key));
            }
        }
        Ty::Number => {
            if !matches!(value.kind, ValueKind::Int(_) | ValueKind::Float(_)) {
                diags.push(wrong_type(value, "a number", key));
            }
        }
        Ty::Bool => {
            if value.as_bool().is_none() {
                diags.push(wrong_type(value, "a boolean", key));
            }
        }
        Ty::Duration => match &value.kind {
            ValueKind::Int(n) if u64::try_from(*n).is_ok_and(|n| n > MAX_DURATION.as_secs()) => {
                diags.push(too_long(value.span, &n.to_string()));
            }
            ValueKind::Int(n) if *n >= 0 => {}
            ValueKind::Str(s) if !s.contains("{{") && parse_duration(s).is_some_and(|d| d > MAX_DURATION) => {
                diags.push(too_long(value.span, s));
            }
            ValueKind::Str(s) if s.contains("{{") || parse_duration(s).is_some() => {}
            ValueKind::Str(s) => diags.push(
                Diagnostic::new(Code::InvalidValue, value.span, format!("`{s}` is not a duration"))
                    .label("expected a duration")
                    .help("write seconds as a number, or a string such as \"90s\", \"10m\", \"2h\" or \"1h30m\""),
            ),
            _ => diags.push(wrong_type(value, "a duration", key)),
        },
        Ty::Action => match value.as_str() {
            Some(s) if Action::parse(s).is_some() => {}
            Some(s) => diags.push(
                Diagnostic::new(Code::InvalidValue, value.span, format!("`{s}` is not an action"))
                    .label("expected an action")
                    .help("an action is `continue`, `break`, `fail`, `approve`, `reject`, `exit:NAME` or a stage id"),
            ),
            None => diags.push(wrong_type(value, "a string", key)),
        },
        Ty::Any => {}
        Ty::List(item) => match &value.kind {
            ValueKind::Array(items) => {
                for v in items {
                    check_value(v, item, key, diags);
                }
            }
            _ => check_value(value, item, key, diags),
        },
        Ty::Table(spec) => check_value_table(value, spec, key, diags),
        Ty::StrOrTable(spec) => {
            if value.as_str().is_none() {
                check_value_table(value, spec, key, diags);
            }
        }
        Ty::Map(item) => match value.as_table() {
            Some(t) => {
                for e in &t.entries {
                    check_value(&e.value, item, &e.key, diags);
                }
            }
            None => diags.push(wrong_type(value, "a table", key)),
        },
        Ty::Named(spec, _) => match value.as_table() {
            Some(t) => {
                for e in &t.entries {
                    if !is_ident(&e.key) {
                        diags.push(
                            Diagnostic::new(Code::InvalidValue, e.key_span, format!("`{}` is not a valid {} name", e.key, spec.name))
                                .help("names start with an ASCII letter (a-z, A-Z) or `_` and contain only ASCII letters, digits, `_` and `-`"),
                        );
                    } else if RESERVED.contains(&e.key.as_str()) && spec.name == "stage" {
                        diags.push(
                            Diagnostic::new(Code::ReservedName, e.key_span, format!("`{}` is a reserved word and cannot be a stage id", e.key))
                                .help("choose another id"),
                        );
                    }
                    check_value_table(&e.value, spec, &e.key, diags);
                }
            }
            None => diags.push(wrong_type(value, "a table", key)),
        },
        Ty::Tables(spec, _) => match &value.kind {
            ValueKind::Array(items) => {
                for v in items {
                    check_value_table(v, spec, key, diags);
                }
            }
            ValueKind::Table(_) => check_value_table(value, spec, key, diags),
            _ => diags.push(wrong_type(value, "an array of tables", key)),
        },
    }
}

/// A duration longer than [`MAX_DURATION`].
fn too_long(span: crate::source::Span, written: &str) -> Diagnostic {
    Diagnostic::new(
        Code::InvalidValue,
        span,
        format!("`{written}` is longer than the longest duration ralph-flow takes (366 days)"),
    )
    .label("too long")
    .help("write at most \"366d\"; for no limit, leave the key out")
}

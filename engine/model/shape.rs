//! Checks a syntax tree against the format's spec: unknown keys, wrong types, missing keys.

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{ACTION_WORDS, Action, MAX_DURATION, RESERVED, is_ident, parse_duration};
use crate::spec::{ACTION, Field, TableSpec, Ty};
use crate::syntax::tree::{Table, Value, ValueKind};

/// What to write instead of a wrong `value` of `table`.`key` (`table` is
/// [`ACTION`] for an action), in TOML and in KDL: the sentence of a well-known wrong value
/// (see [`crate::spec::WellKnown`]), else "did you mean" the closest candidate, if one is close.
pub fn hint<'a>(
    table: &str,
    key: &str,
    value: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<(String, String)> {
    if let Some(w) = crate::spec::well_known(table, key, value) {
        return Some(w.advice(key));
    }
    crate::diag::did_you_mean(value, candidates).map(|h| (h.clone(), h))
}

/// Sets the fix of a diagnostic whose advice is a [`hint`]: the "did you mean" replacement,
/// when the hint is one (not a well-known value's sentence).
pub fn hint_fix<'a>(
    d: Diagnostic,
    table: &str,
    key: &str,
    value: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Diagnostic {
    if crate::spec::well_known(table, key, value).is_some() {
        return d;
    }
    match crate::diag::closest(value, candidates) {
        Some(best) => d.replacing(value, best),
        None => d,
    }
}

/// A hint followed by the list of what is allowed (the list alone without a hint).
pub fn with_list(hint: Option<(String, String)>, list: &str) -> (String, String) {
    let join = |hint: String| {
        let sep = if hint.ends_with('?') { " " } else { "; " };
        format!("{hint}{sep}{list}")
    };
    match hint {
        Some((toml, kdl)) => (join(toml), join(kdl)),
        None => (list.to_string(), list.to_string()),
    }
}

/// Sets a diagnostic's help to a hint of [`hint`] or [`with_list`], when there is one.
pub fn help_hint(d: Diagnostic, hint: Option<(String, String)>) -> Diagnostic {
    match hint {
        Some((toml, kdl)) if toml == kdl => d.help(toml),
        Some((toml, kdl)) => d.help_syntax(toml, kdl),
        None => d,
    }
}

/// Reports every place where `table` does not fit `spec`, recursively.
pub fn check_table(table: &Table, spec: &'static TableSpec, diags: &mut Diagnostics) {
    if spec.fields.is_empty() {
        return; // free-form (inline JSON Schema)
    }
    // A kind that is not one of the kinds was reported on its own: which keys apply to the
    // kind the author meant is not known, so none is reported as not applying.
    let kind = spec
        .kind_key
        .and_then(|key| Some((spec.field(key)?, table.get(key)?.as_str()?)))
        .filter(|(field, kind)| !matches!(field.ty, Ty::Enum(kinds) if !kinds.contains(kind)))
        .map(|(_, kind)| kind);
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
        check_value(&entry.value, &field.ty, spec.name, &entry.key, diags);
    }
    for field in spec.fields.iter().filter(|f| f.required) {
        if table.get(field.key).is_none() {
            let mut d = Diagnostic::new(
                Code::MissingKey,
                None,
                format!("missing key `{}` in {}", field.key, spec.name),
            );
            if let Some(value) = placeholder(&field.ty) {
                d = d.adding_key(None, field.key, value);
            }
            diags.push(d);
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

/// A value to write for a missing key until the author writes the right one, written alike
/// in TOML and KDL: the first of an enum's values, else an empty text or zero; `None` for a
/// table or a boolean.
fn placeholder(ty: &Ty) -> Option<String> {
    match ty {
        Ty::Enum(options) => Some(
            options
                .first()
                .map_or_else(|| "\"\"".to_string(), |o| format!("\"{o}\"")),
        ),
        Ty::Count | Ty::Int | Ty::Number => Some("0".to_string()),
        Ty::Bool | Ty::Any | Ty::Table(_) | Ty::Map(_) | Ty::Named(..) | Ty::Tables(..) => None,
        Ty::List(item) => placeholder(item),
        _ => Some("\"\"".to_string()),
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

fn check_value(value: &Value, ty: &Ty, table: &str, key: &str, diags: &mut Diagnostics) {
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
            Some(s) => diags.push(hint_fix(
                help_hint(
                    Diagnostic::new(Code::InvalidValue, value.span, format!("`{s}` is not a valid value for `{key}`"))
                        .label(format!("expected one of: {}", options.join(", "))),
                    hint(table, key, s, options.iter().copied()),
                ),
                table,
                key,
                s,
                options.iter().copied(),
            )),
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
            Some(s) => diags.push(hint_fix(
                help_hint(
                    Diagnostic::new(Code::InvalidValue, value.span, format!("`{s}` is not an action"))
                        .label("expected an action"),
                    Some(with_list(
                        hint(ACTION, key, s, ACTION_WORDS.iter().copied()),
                        "an action is `continue`, `break`, `fail`, `approve`, `reject`, `exit:NAME` or a stage id",
                    )),
                ),
                ACTION,
                key,
                s,
                ACTION_WORDS.iter().copied(),
            )),
            None => diags.push(wrong_type(value, "a string", key)),
        },
        Ty::Any => {}
        Ty::List(item) => match &value.kind {
            ValueKind::Array(items) => {
                for v in items {
                    check_value(v, item, table, key, diags);
                }
            }
            _ => check_value(value, item, table, key, diags),
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
                    check_value(&e.value, item, table, &e.key, diags);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{FileId, Span};
    use crate::spec::{WELL_KNOWN, WORKFLOW};

    type EnumKey = (&'static str, &'static str, &'static [&'static str]);

    /// Every key of a fixed set of values, as (table, key, values), found by walking the spec
    /// from the top: a key added later is covered without being listed here.
    fn enum_keys() -> Vec<EnumKey> {
        fn walk(spec: &'static TableSpec, seen: &mut Vec<&'static str>, out: &mut Vec<EnumKey>) {
            if seen.contains(&spec.name) {
                return;
            }
            seen.push(spec.name);
            for f in spec.fields {
                visit(&f.ty, spec.name, f.key, seen, out);
            }
        }
        fn visit(
            ty: &'static Ty,
            table: &'static str,
            key: &'static str,
            seen: &mut Vec<&'static str>,
            out: &mut Vec<EnumKey>,
        ) {
            match ty {
                Ty::Enum(options) => out.push((table, key, options)),
                Ty::List(item) | Ty::Map(item) => visit(item, table, key, seen, out),
                Ty::Table(t) | Ty::StrOrTable(t) | Ty::Named(t, _) | Ty::Tables(t, _) => {
                    walk(t, seen, out);
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(&WORKFLOW, &mut Vec::new(), &mut out);
        out
    }

    fn string(s: &str) -> Value {
        Value::new(
            Span::new(FileId(0), 0..s.len()),
            ValueKind::Str(s.to_string()),
        )
    }

    fn check_one(ty: &Ty, table: &str, key: &str, value: &str) -> Vec<Diagnostic> {
        let mut diags = Diagnostics::default();
        check_value(&string(value), ty, table, key, &mut diags);
        diags.into_sorted()
    }

    #[test]
    fn every_enum_key_is_found() {
        let keys: Vec<(&str, &str)> = enum_keys().iter().map(|(t, k, _)| (*t, *k)).collect();
        for expected in [
            ("agent", "kind"),
            ("stage", "kind"),
            ("param", "type"),
            ("param", "items"),
            ("agent", "structured_output"),
            ("agent", "prompt_via"),
            ("agent", "api"),
            ("output", "extract"),
            ("aggregate", "mode"),
            ("worktree", "cleanup"),
        ] {
            assert!(keys.contains(&expected), "{expected:?} in {keys:?}");
        }
        // A level or a workflow's policy: checked by check::policy, not by the shape.
        assert!(!keys.contains(&("agent", "permissions")));
    }

    /// A typo of each value of each enum key gets "did you mean" that value, and every wrong
    /// value the list of allowed ones.
    #[test]
    fn every_enum_key_suggests_and_lists() {
        for (table, key, options) in enum_keys() {
            let ty = Ty::Enum(options);
            for option in options {
                // One letter doubled: one edit away.
                let last = option.chars().last().unwrap_or('x');
                let typo = format!("{option}{last}");
                let diags = check_one(&ty, table, key, &typo);
                assert_eq!(diags.len(), 1, "{table}.{key} = {typo}");
                let d = &diags[0];
                assert_eq!(d.code, Code::InvalidValue);
                assert_eq!(
                    d.label.as_deref(),
                    Some(format!("expected one of: {}", options.join(", ")).as_str()),
                    "{table}.{key} = {typo}"
                );
                assert_eq!(
                    d.help.as_deref(),
                    Some(format!("did you mean `{option}`?").as_str()),
                    "{table}.{key} = {typo}"
                );
            }
            let far = check_one(&ty, table, key, "zzzzzzzzzzzz");
            assert!(far[0].help.is_none(), "{table}.{key}: {:?}", far[0].help);
            assert!(
                far[0]
                    .label
                    .as_deref()
                    .is_some_and(|l| l.contains(options[0]))
            );
        }
    }

    /// Every well-known wrong value is not valid, recommends a valid one, and gets its sentence
    /// (in each syntax) instead of a "did you mean".
    #[test]
    fn well_known_values_get_their_sentence() {
        let keys = enum_keys();
        let mut seen = std::collections::HashSet::new();
        for w in WELL_KNOWN {
            for wrong in w.wrong {
                assert_eq!(
                    *wrong,
                    wrong.to_lowercase().replace(['_', '.', ' '], "-"),
                    "written as compared"
                );
            }
            if w.table == ACTION {
                assert!(
                    w.right.is_empty()
                        || ACTION_WORDS.contains(&w.right)
                        || w.right.starts_with("exit:"),
                    "{}",
                    w.right
                );
                for wrong in w.wrong {
                    assert!(seen.insert((w.table, "", *wrong)), "{wrong} twice");
                    assert!(!ACTION_WORDS.contains(wrong));
                    let diags = check_one(&Ty::Action, "stage", "on_fail", &format!("{wrong}!"));
                    assert_eq!(diags.len(), 1);
                }
                continue;
            }
            assert!(!w.keys.is_empty());
            if w.table == "agent" && w.keys == ["permissions"] {
                // `permissions` names a level or a workflow's policy: not an enum of the
                // shape check; check::policy gives the sentence (RF075) and its tests hold it.
                assert!(crate::spec::PERMISSIONS.contains(&w.right), "{}", w.right);
                continue;
            }
            for key in w.keys {
                let (_, _, options) = keys
                    .iter()
                    .find(|(t, k, _)| *t == w.table && k == key)
                    .unwrap_or_else(|| panic!("{}.{key} is not an enum key", w.table));
                assert!(
                    options.contains(&w.right),
                    "{} for {}.{key}",
                    w.right,
                    w.table
                );
                let (toml, kdl) = w.advice(key);
                assert!(toml.contains(&format!("\"{}\"", w.right)), "{toml}");
                for wrong in w.wrong {
                    assert!(
                        seen.insert((w.table, *key, *wrong)),
                        "{wrong} twice for {key}"
                    );
                    assert!(!options.contains(wrong), "{wrong} is valid for {key}");
                    // As written by people: underscores and capitals.
                    let written = wrong.replace('-', "_").to_uppercase();
                    let diags = check_one(&Ty::Enum(options), w.table, key, &written);
                    assert_eq!(diags.len(), 1);
                    assert_eq!(diags[0].help.as_deref(), Some(toml.as_str()), "{written}");
                    let kdl_help = diags[0].help_kdl.as_deref().unwrap_or(toml.as_str());
                    assert_eq!(kdl_help, kdl);
                    assert!(!kdl.contains(" = "), "{kdl}");
                }
            }
        }
    }

    #[test]
    fn the_sentences_people_look_for() {
        let help = |table, key, value: &str| {
            let options = enum_keys()
                .into_iter()
                .find(|(t, k, _)| *t == table && *k == key)
                .map(|(_, _, o)| o)
                .unwrap_or_default();
            check_one(&Ty::Enum(options), table, key, value)[0]
                .help
                .clone()
                .unwrap_or_default()
        };
        for v in ["claude-code", "claude_code", "anthropic-claude"] {
            assert!(
                help("agent", "kind", v)
                    .contains("the claude CLI agent (Claude Code) is `kind = \"claude\"`"),
                "{v}"
            );
        }
        assert_eq!(
            help("param", "type", "integer"),
            "whole numbers are `type = \"int\"`"
        );
        assert_eq!(
            help("param", "type", "boolean"),
            "true or false is `type = \"bool\"`"
        );
        assert_eq!(help("param", "type", "str"), "text is `type = \"string\"`");
        assert!(help("param", "type", "number").contains("`type = \"float\"`"));
        assert_eq!(
            help("agent", "kind", "ollama"),
            "an ollama server speaks the OpenAI API: use `kind = \"openai\"` with `base_url = \"http://localhost:11434/v1\"`"
        );
        assert!(help("agent", "kind", "lmstudio").contains("http://localhost:1234/v1"));
        assert!(help("agent", "kind", "vllm").contains("http://localhost:8000/v1"));
        assert!(help("agent", "kind", "llama.cpp").contains("http://localhost:8080/v1"));
        for (wrong, right) in [
            ("gpt", "openai"),
            ("openai-compatible", "openai"),
            ("gemini-cli", "gemini"),
            ("codex-cli", "codex"),
            ("qwen-code", "qwen"),
            ("opencode-ai", "opencode"),
        ] {
            assert!(
                help("agent", "kind", wrong).contains(&format!("`kind = \"{right}\"`")),
                "{wrong}"
            );
        }
    }

    /// A kind that is not one of the kinds is the only error: its keys are not also reported
    /// as not applying to it.
    #[test]
    fn a_wrong_kind_reports_once() {
        let text = "[agents.a]\nkind = \"claude-code\"\npermissions = \"edit\"\n\n[stages.s]\nkind = \"shell\"\nargv = [\"true\"]\nok_codes = [0]\n";
        let mut diags = Diagnostics::default();
        let root = crate::syntax::parse(FileId(0), text, crate::syntax::Format::Toml, &mut diags);
        assert!(!diags.has_errors());
        check_table(&root, &WORKFLOW, &mut diags);
        let codes: Vec<Code> = diags.into_sorted().iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::InvalidValue, Code::InvalidValue]);
    }
}

//! Reads KDL (v2) workflow files into the shared syntax tree.
//!
//! The mapping follows the spec of each table: a scalar key is a node with one argument
//! (`max_iterations 5`); a list is a node with arguments (`needs "plan" "review"`); a table is
//! a node with properties and/or children; a keyed collection uses its singular name with the
//! id as argument (`stage "review" kind="agent" { ... }`); an array of tables repeats a node
//! (`escalation when="..." run="oracle"`). Free-form values (param defaults, inline JSON
//! Schemas) map children to tables (`key {}` is an empty table), several arguments to
//! arrays, `-` children to arrays, and a bare `key` to an empty array.

use kdl::{KdlDocument, KdlEntry, KdlNode, KdlValue};

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::source::{FileId, Span};
use crate::spec::{TableSpec, Ty, WORKFLOW};
use crate::syntax::tree::{Entry, Table, Value, ValueKind};

mod errors;

/// Parses KDL text into a table, reporting each syntax mistake once, in words of our own
/// (see [`errors`]).
pub fn parse(file: FileId, text: &str, diags: &mut Diagnostics) -> Table {
    match KdlDocument::parse_v2(text) {
        Ok(doc) => {
            let mut cx = Cx { file, text, diags };
            cx.document(&doc, Some(&WORKFLOW))
        }
        Err(err) => {
            for m in errors::explain(text, &err.diagnostics) {
                let span = Span::new(file, m.range.clone());
                let mut d = Diagnostic::new(Code::Syntax, span, m.message);
                if let Some(quoted) = m.quoted {
                    d.fix = Some(Box::new(crate::diag::Fix::Replace {
                        at: Some(span),
                        old: text.get(m.range).unwrap_or_default().to_string(),
                        new: quoted,
                    }));
                }
                if !m.label.is_empty() {
                    d = d.label(m.label);
                }
                diags.push(d.help(m.help));
            }
            Table::default()
        }
    }
}

struct Cx<'a> {
    file: FileId,
    text: &'a str,
    diags: &'a mut Diagnostics,
}

impl Cx<'_> {
    fn span(&self, s: miette::SourceSpan) -> Span {
        Span::new(self.file, s.offset()..s.offset() + s.len())
    }

    /// Converts the nodes of a document into a table, against `spec` when it is known.
    fn document(&mut self, doc: &KdlDocument, spec: Option<&'static TableSpec>) -> Table {
        let mut table = Table::default();
        for node in doc.nodes() {
            self.node_into(&mut table, node, spec);
        }
        table
    }

    fn node_into(&mut self, table: &mut Table, node: &KdlNode, spec: Option<&'static TableSpec>) {
        let mut name = node.name().value();
        let key_span = self.span(node.name().span());
        // `name: "x"`, the YAML or JSON habit: said once, then read as the key it was meant to be.
        if let Some(key) = name
            .strip_suffix(':')
            .filter(|k| !k.is_empty() && !k.contains(':'))
        {
            if bare(node.name().repr()) {
                self.diags.push(
                    Diagnostic::new(
                        Code::Syntax,
                        key_span,
                        format!("KDL does not put `:` after a node's name: write `{key}`, not `{name}`"),
                    )
                    .label("remove this `:`")
                    .help(format!(
                        "a node's values follow its name after a space: `{key} \"...\"`; a property is written `key=value`"
                    )),
                );
                name = key;
            }
        }
        let node_span = self.span(node.span());
        // A key whose singular is its own name (`escalation`, `policy`) is an array of tables
        // or a keyed collection: each node appends one item.
        let field = spec
            .and_then(|s| s.fields.iter().find(|f| f.key == name))
            .filter(|f| {
                !matches!(f.ty, Ty::Tables(_, singular) | Ty::Named(_, singular) if singular == name)
            });
        // A keyed collection written with its plural name and an id (`stages "plan" ...`,
        // the TOML habit): said once, then read as the singular node it was meant to be.
        let plural_with_id = field.and_then(|f| match f.ty {
            Ty::Named(_, singular) if singular != name => Some(singular),
            _ => None,
        });
        let plural_with_id = plural_with_id.filter(|_| {
            node.entries()
                .first()
                .is_some_and(|e| e.name().is_none() && matches!(e.value(), KdlValue::String(_)))
        });
        if let Some(singular) = plural_with_id {
            self.diags.push(
                Diagnostic::new(
                    Code::UnknownKey,
                    key_span,
                    format!("in KDL, each of the `{name}` is a `{singular}` node"),
                )
                .label(format!("read as `{singular}`"))
                .help(format!(
                    "write `{singular} \"ID\" ...` (the singular), once per item; `{name}` is the TOML table's name"
                )),
            );
            name = singular;
        }
        let field = field.filter(|_| plural_with_id.is_none());
        if let Some(field) = field {
            let value = self.typed(node, &field.ty);
            self.insert(table, name, key_span, value);
            return;
        }
        // A singular node of a keyed collection or an array of tables.
        let collection = spec.and_then(|s| {
            s.fields.iter().find(|f| match &f.ty {
                Ty::Named(_, singular) | Ty::Tables(_, singular) => *singular == name,
                _ => false,
            })
        });
        if let Some(field) = collection {
            match &field.ty {
                Ty::Named(item, _) => {
                    let (id, id_span, rest) = match node.entries().split_first() {
                        Some((first, rest)) if first.name().is_none() => match first.value() {
                            KdlValue::String(s) => (s.clone(), self.span(first.span()), rest),
                            _ => {
                                self.missing_id(node, key_span);
                                return;
                            }
                        },
                        _ => {
                            self.missing_id(node, key_span);
                            return;
                        }
                    };
                    let value = Value::new(
                        node_span,
                        ValueKind::Table(self.table_of(rest, node.children(), Some(item))),
                    );
                    let coll = self.collection(table, field.key, key_span);
                    if let Some(prev) = coll.entry(&id) {
                        let first = prev.key_span;
                        self.diags.push(
                            Diagnostic::new(
                                Code::Duplicate,
                                id_span,
                                format!("{} `{id}` is defined twice", item.name),
                            )
                            .label("defined again here")
                            .related(first, "first defined here")
                            .help("give each one its own id"),
                        );
                        return;
                    }
                    coll.entries.push(Entry {
                        key: id,
                        key_span: id_span,
                        value,
                    });
                }
                Ty::Tables(item, _) => {
                    let value = Value::new(
                        node_span,
                        ValueKind::Table(self.table_of(
                            node.entries(),
                            node.children(),
                            Some(item),
                        )),
                    );
                    let slot = match table.entries.iter_mut().position(|e| e.key == field.key) {
                        Some(i) => &mut table.entries[i].value,
                        None => {
                            table.entries.push(Entry {
                                key: field.key.to_string(),
                                key_span,
                                value: Value::new(node_span, ValueKind::Array(Vec::new())),
                            });
                            let last = table.entries.len() - 1;
                            &mut table.entries[last].value
                        }
                    };
                    if let ValueKind::Array(items) = &mut slot.kind {
                        items.push(value);
                    }
                }
                _ => {}
            }
            return;
        }
        // Unknown to the spec, or free-form: convert generically; the shape check judges it.
        let value = self.generic(node);
        self.insert(table, name, key_span, value);
    }

    fn missing_id(&mut self, node: &KdlNode, key_span: Span) {
        let name = node.name().value();
        self.diags.push(
            Diagnostic::new(
                Code::MissingKey,
                key_span,
                format!("`{name}` needs its id as the first argument"),
            )
            .help(format!("write it as `{name} \"my-id\" {{ ... }}`")),
        );
    }

    fn collection<'t>(&mut self, table: &'t mut Table, key: &str, key_span: Span) -> &'t mut Table {
        let i = match table.entries.iter().position(|e| e.key == key) {
            Some(i) => i,
            None => {
                table.entries.push(Entry {
                    key: key.to_string(),
                    key_span,
                    value: Value::new(key_span, ValueKind::Table(Table::default())),
                });
                table.entries.len() - 1
            }
        };
        if !matches!(table.entries[i].value.kind, ValueKind::Table(_)) {
            table.entries[i].value.kind = ValueKind::Table(Table::default());
        }
        match &mut table.entries[i].value.kind {
            ValueKind::Table(t) => t,
            _ => unreachable!("just made a table"),
        }
    }

    fn insert(&mut self, table: &mut Table, key: &str, key_span: Span, value: Option<Value>) {
        let Some(value) = value else { return };
        if let Some(prev) = table.entry(key) {
            let first = prev.key_span;
            self.diags.push(
                Diagnostic::new(Code::Duplicate, key_span, format!("`{key}` is set twice"))
                    .label("set again here")
                    .related(first, "first set here")
                    .help("keep one of them"),
            );
            return;
        }
        table.entries.push(Entry {
            key: key.to_string(),
            key_span,
            value,
        });
    }

    fn scalar(&mut self, entry: &KdlEntry) -> Option<Value> {
        let span = self.span(entry.span());
        let kind = match entry.value() {
            // `needs build, test`: a bare word may hold a comma, but here it separates values.
            KdlValue::String(s) if s.len() > 1 && s.ends_with(',') && bare_value(entry) => {
                let end = span.end as usize;
                self.diags.push(
                    Diagnostic::new(
                        Code::Syntax,
                        Span::new(self.file, end.saturating_sub(1)..end),
                        "KDL separates values with spaces, not commas",
                    )
                    .label("remove this comma")
                    .help(format!(
                        "write `{}`",
                        errors::line_without_commas(self.text, end)
                    )),
                );
                ValueKind::Str(s.trim_end_matches(',').to_string())
            }
            // `'text'`: a bare word may hold quotes, but here they were meant to quote it.
            KdlValue::String(s)
                if s.len() > 2 && s.starts_with('\'') && s.ends_with('\'') && bare_value(entry) =>
            {
                let inner = &s[1..s.len() - 1];
                self.diags.push(
                    Diagnostic::new(
                        Code::Syntax,
                        span,
                        format!("KDL quotes text with double quotes: write `{}`", quoted(inner)),
                    )
                    .label("single quotes are part of a bare word in KDL")
                    .help("KDL strings are written \"...\" (or #\"...\"# for raw text); `'` is an ordinary character"),
                );
                ValueKind::Str(inner.to_string())
            }
            KdlValue::String(s) => ValueKind::Str(s.clone()),
            KdlValue::Integer(i) => match i64::try_from(*i) {
                Ok(n) => ValueKind::Int(n),
                Err(_) => {
                    self.diags.push(
                        Diagnostic::new(Code::InvalidValue, span, "integer out of range")
                            .help("use a number between -2^63 and 2^63-1"),
                    );
                    return None;
                }
            },
            KdlValue::Float(f) if f.is_finite() => ValueKind::Float(*f),
            KdlValue::Float(_) => {
                self.diags.push(
                    Diagnostic::new(
                        Code::UnsupportedValue,
                        span,
                        "infinite or NaN floats are not supported",
                    )
                    .help("write a finite number"),
                );
                return None;
            }
            KdlValue::Bool(b) => ValueKind::Bool(*b),
            KdlValue::Null => {
                self.diags.push(
                    Diagnostic::new(
                        Code::UnsupportedValue,
                        span,
                        "#null is not used in workflows",
                    )
                    .help("leave the key out instead"),
                );
                return None;
            }
        };
        Some(Value::new(span, kind))
    }

    /// Several words where one text is expected (`description hello world`, or the words
    /// after `description=hello`): one syntax error that says how to quote them, and the text
    /// they were meant to be. `None` when none of them is a plain word.
    fn words(&mut self, key: &str, entries: &[&KdlEntry]) -> Option<Value> {
        if !entries
            .iter()
            .any(|e| matches!(e.value(), KdlValue::String(_)) && bare_value(e))
        {
            return None;
        }
        // A number among the words (`build 2 things`) is a word as written.
        let texts: Vec<String> = entries
            .iter()
            .map(|e| match e.value() {
                KdlValue::String(s) => s.clone(),
                other => e
                    .format()
                    .map_or_else(|| other.to_string(), |f| f.value_repr.trim().to_string()),
            })
            .collect();
        let (first, last) = (entries.first()?, entries.last()?);
        let start = self.span(first.span()).start as usize;
        let end = self.span(last.span()).end as usize;
        let span = Span::new(self.file, start..end);
        let text = texts.join(" ");
        // `'hello world'`: single quotes do not quote in KDL, but they were meant to.
        let text = match text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
            Some(inner) => inner.to_string(),
            None => text,
        };
        let quoted = quoted(&text);
        let written = if key.ends_with('=') {
            format!("{key}{quoted}")
        } else {
            format!("{key} {quoted}")
        };
        // The fix: the words as written (after the property's `=`), replaced by the quoted
        // text.
        let raw = self.text.get(start..end).unwrap_or_default();
        let mut from = start + (raw.len() - raw.trim_start().len());
        if key.ends_with('=') {
            if let Some(eq) = self.text.get(from..end).and_then(|r| r.find('=')) {
                from += eq + 1;
            }
        }
        let words = self.text.get(from..end).unwrap_or_default().trim();
        let fix = crate::diag::Fix::Replace {
            at: Some(Span::new(self.file, from..from + words.len())),
            old: words.to_string(),
            new: quoted.clone(),
        };
        let mut d = Diagnostic::new(
            Code::Syntax,
            span,
            format!("text with spaces must be quoted: write `{written}`"),
        );
        d.fix = Some(Box::new(fix));
        self.diags.push(
            d
            .label(format!("{} separate values", entries.len()))
            .help(format!(
                "KDL reads unquoted words as separate values, and `{}` takes one text: put the whole text in quotes",
                key.trim_end_matches('=')
            )),
        );
        Some(Value::new(span, ValueKind::Str(text)))
    }

    /// Converts a node whose key is known to have type `ty`.
    fn typed(&mut self, node: &KdlNode, ty: &Ty) -> Option<Value> {
        let span = self.span(node.span());
        let (args, has_props) = arguments(node);
        match ty {
            Ty::List(_) if node.children().is_none() && !has_props => {
                let items = args.iter().filter_map(|e| self.scalar(e)).collect();
                Some(Value::new(span, ValueKind::Array(items)))
            }
            Ty::Table(spec) if args.is_empty() => {
                let t = self.table_of(node.entries(), node.children(), Some(spec));
                Some(Value::new(span, ValueKind::Table(t)))
            }
            Ty::Map(_) if args.is_empty() => {
                let t = self.table_of(node.entries(), node.children(), None);
                Some(Value::new(span, ValueKind::Table(t)))
            }
            Ty::Named(..) | Ty::Tables(..) => self.generic(node),
            Ty::StrOrTable(_) if args.len() == 1 && !has_props && node.children().is_none() => {
                self.scalar(args[0])
            }
            Ty::StrOrTable(_) if args.len() > 1 && !has_props && node.children().is_none() => self
                .words(node.name().value(), &args)
                .or_else(|| self.generic(node)),
            Ty::StrOrTable(_) | Ty::Any => self.generic(node),
            Ty::Str
            | Ty::Template
            | Ty::Expr
            | Ty::Label
            | Ty::Enum(_)
            | Ty::Duration
            | Ty::Action
                if args.len() > 1 && !has_props && node.children().is_none() =>
            {
                self.words(node.name().value(), &args)
                    .or_else(|| self.generic(node))
            }
            _ if args.len() == 1 && !has_props && node.children().is_none() => self.scalar(args[0]),
            _ => self.generic(node),
        }
    }

    /// Builds a table from properties and children.
    fn table_of(
        &mut self,
        entries: &[KdlEntry],
        children: Option<&KdlDocument>,
        spec: Option<&'static TableSpec>,
    ) -> Table {
        let mut table = Table::default();
        let mut rest = entries;
        while let Some((e, after)) = rest.split_first() {
            rest = after;
            match e.name() {
                Some(name) => {
                    let key_span = self.span(name.span());
                    // `description=do the work`: the words after a bare value belong to it.
                    let words = after
                        .iter()
                        .take_while(|w| {
                            w.name().is_none()
                                && matches!(w.value(), KdlValue::String(_))
                                && bare_value(w)
                        })
                        .count();
                    let value =
                        if words > 0 && bare_value(e) && matches!(e.value(), KdlValue::String(_)) {
                            let mut all = vec![e];
                            all.extend(&after[..words]);
                            rest = &after[words..];
                            let key = format!("{}=", name.value());
                            self.words(&key, &all)
                        } else {
                            self.scalar(e)
                        };
                    self.insert(&mut table, name.value(), key_span, value);
                }
                None => {
                    let span = self.span(e.span());
                    self.diags.push(
                        Diagnostic::new(Code::WrongType, span, "unexpected argument")
                            .label("this node takes properties and children, not arguments")
                            .help("write it as `key=value` or as a child node"),
                    );
                }
            }
        }
        if let Some(children) = children {
            for node in children.nodes() {
                self.node_into(&mut table, node, spec);
            }
        }
        table
    }

    /// Converts a node with no spec: children make a table (or an array, when all are `-`),
    /// several arguments an array, one argument a scalar.
    fn generic(&mut self, node: &KdlNode) -> Option<Value> {
        let span = self.span(node.span());
        let (args, has_props) = arguments(node);
        if let Some(children) = node.children() {
            if !children.nodes().is_empty()
                && children.nodes().iter().all(|n| n.name().value() == "-")
            {
                let items = children
                    .nodes()
                    .iter()
                    .filter_map(|n| self.generic(n))
                    .collect();
                return Some(Value::new(span, ValueKind::Array(items)));
            }
        }
        if node.children().is_none() && !has_props && args.is_empty() {
            // A bare `key` is an empty list; an empty table is written `key {}`.
            return Some(Value::new(span, ValueKind::Array(Vec::new())));
        }
        if node.children().is_some() || has_props {
            let t = self.table_of(node.entries(), node.children(), None);
            return Some(Value::new(span, ValueKind::Table(t)));
        }
        if args.len() == 1 {
            return self.scalar(args[0]);
        }
        let items = args.iter().filter_map(|e| self.scalar(e)).collect();
        Some(Value::new(span, ValueKind::Array(items)))
    }
}

/// Whether a name or value was written as a bare word (not quoted, not a raw string).
fn bare(repr: Option<&str>) -> bool {
    repr.is_some_and(|r| !r.starts_with(['"', '#']))
}

/// Whether an entry's value was written as a bare word.
fn bare_value(entry: &KdlEntry) -> bool {
    bare(entry.format().map(|f| f.value_repr.as_str()))
}

/// A KDL quoted string holding `text`.
fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A node's arguments (its entries without a name), and whether it has properties too.
fn arguments(node: &KdlNode) -> (Vec<&KdlEntry>, bool) {
    let args = node
        .entries()
        .iter()
        .filter(|e| e.name().is_none())
        .collect();
    let has_props = node.entries().iter().any(|e| e.name().is_some());
    (args, has_props)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> (Table, Vec<Diagnostic>) {
        let mut diags = Diagnostics::default();
        let table = parse(FileId(0), text, &mut diags);
        (table, diags.into_sorted())
    }

    fn stage<'t>(table: &'t Table, id: &str) -> &'t Table {
        match table.get("stages").map(|v| &v.kind) {
            Some(ValueKind::Table(stages)) => match stages.get(id).map(|v| &v.kind) {
                Some(ValueKind::Table(t)) => t,
                other => panic!("stage {id}: {other:?}"),
            },
            other => panic!("stages: {other:?}"),
        }
    }

    /// KDL v2 allows spaces around a property's `=`: `kind = "command"` is `kind="command"`.
    #[test]
    fn spaces_around_a_property_equals_sign_are_fine() {
        let (table, diags) = parsed("stage \"b\" kind = \"command\" {\n    argv \"make\"\n}\n");
        assert!(diags.is_empty(), "{diags:?}");
        assert!(matches!(
            stage(&table, "b").get("kind").map(|v| &v.kind),
            Some(ValueKind::Str(k)) if k == "command"
        ));
    }

    /// Bare words are strings in KDL v2: `needs build test` needs two stages.
    #[test]
    fn bare_word_arguments_are_strings() {
        let (table, diags) =
            parsed("stage \"t\" kind=\"command\" {\n    needs build test\n    argv make\n}\n");
        assert!(diags.is_empty(), "{diags:?}");
        let Some(ValueKind::Array(needs)) = stage(&table, "t").get("needs").map(|v| &v.kind) else {
            panic!("needs is a list");
        };
        let names: Vec<&ValueKind> = needs.iter().map(|v| &v.kind).collect();
        assert!(
            matches!(names[..], [ValueKind::Str(a), ValueKind::Str(b)] if a == "build" && b == "test"),
            "{names:?}"
        );
    }

    /// Every KDL file of the project parses without a syntax error: the checks of unquoted
    /// words, commas and quotes have no false positives there.
    #[test]
    fn the_project_kdl_files_have_no_syntax_errors() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut dirs = vec![
            root.join("workflows"),
            root.join("examples"),
            root.join("tests/fixtures/check/valid"),
        ];
        let mut seen = 0;
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for path in entries.flatten().map(|e| e.path()) {
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "kdl") {
                    let text = std::fs::read_to_string(&path).expect("a KDL file");
                    let (_, diags) = parsed(&text);
                    let syntax: Vec<&Diagnostic> =
                        diags.iter().filter(|d| d.code == Code::Syntax).collect();
                    assert!(syntax.is_empty(), "{}: {syntax:?}", path.display());
                    seen += 1;
                }
            }
        }
        assert!(seen > 10, "only {seen} KDL files found");
    }

    /// Cut anywhere, or with a character dropped, a workflow gives syntax errors in our own
    /// words (never the parser's), each with a hint, and never a panic.
    #[test]
    fn any_cut_or_dropped_character_is_explained_in_our_words() {
        let text = "// a workflow\nname \"cut\"\ndescription #\"raw \\d\"#\nagent \"c\" kind=\"claude\"\n\
                    stage \"plan\" kind=\"agent\" agent=\"c\" {\n    prompt \"\"\"\n        Plan {it}.\n        \"\"\"\n\
                    \x20   output extract=\"regex\" pattern=#\"(?P<n>\\d+) é\"# /* note } */\n    retries 2\n}\n\
                    stage \"build\" kind=\"command\" timeout=\"10m\" {\n    needs \"plan\"\n    argv \"make\" \"a\\\"b\"\n}\n";
        let phrases = [
            "not quoted string",
            "not closed",
            "Expected",
            "not EOF",
            "value terminator",
            "not node name",
        ];
        let mut variants: Vec<String> = Vec::new();
        for (i, c) in text.char_indices() {
            variants.push(text[..i].to_string());
            variants.push(format!("{}{}", &text[..i], &text[i + c.len_utf8()..]));
        }
        for variant in variants {
            let (_, diags) = parsed(&variant);
            for d in diags.iter().filter(|d| d.code == Code::Syntax) {
                for p in phrases {
                    assert!(!d.message.contains(p), "{variant:?}: {d:?}");
                }
                assert!(
                    d.help.as_deref().is_some_and(|h| !h.is_empty()),
                    "{variant:?}: {d:?}"
                );
            }
        }
    }
}

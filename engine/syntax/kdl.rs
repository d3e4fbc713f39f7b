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

/// Parses KDL text into a table, reporting every syntax error the parser finds.
pub fn parse(file: FileId, text: &str, diags: &mut Diagnostics) -> Table {
    match KdlDocument::parse_v2(text) {
        Ok(doc) => {
            let mut cx = Cx { file, diags };
            cx.document(&doc, Some(&WORKFLOW))
        }
        Err(err) => {
            let mut found: Vec<(Span, String, Option<String>)> = err
                .diagnostics
                .iter()
                .map(|d| {
                    let mut message = d
                        .message
                        .clone()
                        .unwrap_or_else(|| "invalid KDL".to_string());
                    if let Some(label) = &d.label {
                        if !message.contains(label.as_str()) {
                            message = format!("{message}: {label}");
                        }
                    }
                    let span = Span::new(file, d.span.offset()..d.span.offset() + d.span.len());
                    (span, message, d.help.clone())
                })
                .collect();
            found.sort_by_key(|(span, _, _)| (span.start, span.end));
            for (span, message, help) in first_errors(text, found) {
                diags.push(syntax_error(text, span, &message, help));
            }
            if err.diagnostics.is_empty() {
                diags.push(Diagnostic::new(
                    Code::Syntax,
                    Span::new(file, 0..0),
                    "invalid KDL",
                ));
            }
            Table::default()
        }
    }
}

/// Keeps the syntax errors worth reading: the parser, once thrown off, reports echoes of one
/// mistake (an unclosed block, the rest of a line, a whole file read inside out after a
/// newline in a string). Kept: the first error of each line, unless it is only an echo
/// ("no closing `}`", "expected end of document") of an earlier error; nothing after a
/// newline in a single-line string, which puts every later quote out of step.
fn first_errors(
    text: &str,
    found: Vec<(Span, String, Option<String>)>,
) -> Vec<(Span, String, Option<String>)> {
    const ECHOES: &[&str] = &[
        "No closing '}'",
        "Closing '}' was not found",
        "Expected end of document",
        "Found invalid node name",
    ];
    let line = |span: Span| {
        let end = (span.start as usize).min(text.len());
        text.as_bytes()[..end]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
    };
    let mut kept: Vec<(Span, String, Option<String>)> = Vec::new();
    for (span, message, help) in found {
        if let Some((last, last_message, _)) = kept.last() {
            if last_message.contains("Unexpected newline in single-line quoted string")
                || line(*last) == line(span)
                || ECHOES.iter().any(|e| message.contains(e))
            {
                continue;
            }
        }
        kept.push((span, message, help));
    }
    kept
}

/// Builds the diagnostic for one KDL syntax error, recognising KDL v1 spellings.
fn syntax_error(text: &str, span: Span, message: &str, help: Option<String>) -> Diagnostic {
    let written = text.get(span.range()).unwrap_or("");
    if let Some(word) = ["true", "false", "null"].iter().find(|w| written == **w) {
        return Diagnostic::new(
            Code::Syntax,
            span,
            format!("invalid KDL: `{word}` is the KDL v1 spelling; KDL v2 writes `#{word}`"),
        )
        .label(format!("write `#{word}`"))
        .help("KDL v2 spells its keywords `#true`, `#false` and `#null`; a bare word is a string, and `true`, `false` and `null` may not be bare words");
    }
    if written.starts_with("r\"") || written.starts_with("r#") {
        return Diagnostic::new(
            Code::Syntax,
            span,
            "invalid KDL: `r\"...\"` is a KDL v1 raw string; KDL v2 writes `#\"...\"#`",
        )
        .label("KDL v1 raw string")
        .help("write the raw string as #\"...\"# (add more `#` on both sides if the text holds `\"#`)");
    }
    if message.contains("Unexpected newline in single-line quoted string") {
        return Diagnostic::new(Code::Syntax, span, format!("invalid KDL: {message}"))
            .label("the string is still open here")
            .help("close the string on its line, write the line break as \\n, or use a multi-line string: \"\"\" on its own line, the text, then \"\"\" on its own line (later errors are not reported: they are likely echoes of this one)");
    }
    if message.contains("No closing '}'") {
        return Diagnostic::new(Code::Syntax, span, format!("invalid KDL: {message}"))
            .label("this `{` is never closed")
            .help("add the `}` that closes this block; the errors that follow from it are not reported");
    }
    Diagnostic::new(Code::Syntax, span, format!("invalid KDL: {message}")).help(
        help.unwrap_or_else(|| "fix the KDL syntax; https://kdl.dev describes KDL v2".to_string()),
    )
}

struct Cx<'a> {
    file: FileId,
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
        let name = node.name().value();
        let key_span = self.span(node.name().span());
        let node_span = self.span(node.span());
        // A key whose singular is its own name (`escalation`) is an array of tables: each
        // node appends one item.
        let field = spec
            .and_then(|s| s.fields.iter().find(|f| f.key == name))
            .filter(|f| !matches!(f.ty, Ty::Tables(_, singular) if singular == name));
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
        let mut name = name;
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

    /// Converts a node whose key is known to have type `ty`.
    fn typed(&mut self, node: &KdlNode, ty: &Ty) -> Option<Value> {
        let span = self.span(node.span());
        let args: Vec<&KdlEntry> = node
            .entries()
            .iter()
            .filter(|e| e.name().is_none())
            .collect();
        let has_props = node.entries().iter().any(|e| e.name().is_some());
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
            Ty::StrOrTable(_) | Ty::Any => self.generic(node),
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
        for e in entries {
            match e.name() {
                Some(name) => {
                    let key_span = self.span(name.span());
                    let value = self.scalar(e);
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
        let args: Vec<&KdlEntry> = node
            .entries()
            .iter()
            .filter(|e| e.name().is_none())
            .collect();
        let has_props = node.entries().iter().any(|e| e.name().is_some());
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

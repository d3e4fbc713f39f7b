//! Writes a workflow syntax tree back out as TOML or KDL v2 text.
//!
//! Both writers are the inverse of the readers in [`super::toml`] and [`super::kdl`]: the text
//! they produce parses back to the same tree (spans aside), in the same key order with the one
//! TOML exception below.
//!
//! TOML: keyed collections (`stages`, `agents`, `params`, ...) become `[stages.review]`
//! sections, nested bodies `[stages.loop.stages.driver]`, arrays of tables `[[...]]` and short
//! tables inline (`budget = { tokens = 1000 }`). TOML puts a table's plain keys before its
//! sections, so a table that comes before a plain key is written inline, or as dotted keys
//! (`output.extract = "json"`) when it is long. The one change of order: in a table with fixed
//! keys (the top level, a stage), a keyed collection that comes before plain keys moves after
//! them, so that it can still be written as sections (the order of its items is kept).
//!
//! KDL: the mapping of [`super::kdl`], driven by the spec. A scalar key is `key value`; a
//! `Ty::List` is a node with arguments (`needs "a" "b"`; one item is a node with one argument,
//! which the reader always takes as an array of one, so one-element lists are lossless); a
//! `Ty::Table` or `Ty::Map` is a node with properties and children; a `Ty::Named` collection is
//! one `singular "id" { ... }` node per item, among the parent's nodes; a `Ty::Tables` array is
//! repeated `singular { ... }` nodes; everything else is generic: a table is a node with
//! children, an array of two or more scalars a node with arguments, any other array a node
//! with `-` children, a scalar a node with one argument. The leading short scalars of a table
//! become properties (`stage "review" kind="agent" { ... }`). An array of tables whose singular
//! is its own key (`escalation`) is written as repeated nodes of that name. An empty array is
//! a bare node (`default`), an empty table a node with empty braces (`default {}`).
//!
//! What does not round-trip exactly:
//! - KDL: a plain scalar written for a `Ty::List` key (`needs = "plan"`) reads back as an
//!   array of one (`["plan"]`), unless it is among the leading properties of its node (never at
//!   the top level, which has no node). Lowering treats both the same.
//! - KDL, rarer: a generic table whose child nodes are all named `-` reads back as an array;
//!   and in trees that fail the shape check anyway, an unknown key named like a collection's
//!   singular (`stage` at the top level) reads back as an item of that collection, and an
//!   array (other than one of two or more scalars) under a `Ty::Table` or `Ty::Map` key does
//!   not read back.
//! - Both: NaN and infinite floats, which neither reader accepts.

use std::fmt::Write as _;

use kdl::{KdlDocument, KdlEntry, KdlEntryFormat, KdlIdentifier, KdlNode, KdlValue};

use crate::spec::{TableSpec, Ty, WORKFLOW};
use crate::syntax::tree::{Entry, Table, Value, ValueKind};

/// Longest line the TOML writer aims for when it puts a value on one line.
const TOML_WIDTH: usize = 80;
/// Most characters of properties the KDL writer puts on one node.
const KDL_PROPS_WIDTH: usize = 60;
/// Longest string the KDL writer puts in a property.
const KDL_PROP_STR: usize = 40;

// ---------------------------------------------------------------------------------------------
// TOML
// ---------------------------------------------------------------------------------------------

/// Renders a workflow tree as TOML that parses back to the same tree.
pub fn to_toml(root: &Table) -> String {
    let mut w = TomlWriter { out: String::new() };
    w.section(&mut Vec::new(), Header::Root, root, Ctx::Fields(&WORKFLOW));
    w.out
}

/// Renders a workflow tree as TOML, starting with a `#:schema URL` line for editors.
pub fn to_toml_with_schema(root: &Table, schema_url: &str) -> String {
    let url: String = schema_url.chars().filter(|c| !c.is_control()).collect();
    format!("#:schema {}\n\n{}", url.trim(), to_toml(root))
}

/// What the spec says about the keys of a table being written.
#[derive(Clone, Copy)]
enum Ctx {
    /// A table with the fields of this spec.
    Fields(&'static TableSpec),
    /// A keyed collection whose items have this spec.
    Items(&'static TableSpec),
    /// Free-form (maps, param defaults, inline schemas, unknown keys).
    Generic,
}

impl Ctx {
    /// The context of the value under `key`.
    fn child(self, key: &str) -> Ctx {
        match self {
            Ctx::Fields(spec) => match spec.field(key).map(|f| &f.ty) {
                Some(Ty::Table(t) | Ty::Tables(t, _)) => Ctx::Fields(t),
                Some(Ty::Named(t, _)) => Ctx::Items(t),
                _ => Ctx::Generic,
            },
            Ctx::Items(t) => Ctx::Fields(t),
            Ctx::Generic => Ctx::Generic,
        }
    }
}

/// How a section starts.
#[derive(Clone, Copy, PartialEq)]
enum Header {
    Root,
    Table,
    ArrayItem,
}

struct TomlWriter {
    out: String,
}

impl TomlWriter {
    /// Writes a table as a section (`[path]` or `[[path]]`) followed by its subsections.
    fn section(&mut self, path: &mut Vec<String>, header: Header, table: &Table, ctx: Ctx) {
        let entries = ordered(table, ctx);
        // Only a trailing run of tables and arrays of tables can become subsections.
        let split = trailing_sections(&entries);
        let mut inline_end = split;
        while inline_end < entries.len()
            && prefers_inline(&entries[inline_end].key, &entries[inline_end].value, ctx)
        {
            inline_end += 1;
        }
        let write_header = match header {
            Header::Root => false,
            Header::ArrayItem => true,
            // A table with only subsections is created by their headers.
            Header::Table => inline_end > 0 || entries.is_empty(),
        };
        if write_header {
            if !self.out.is_empty() {
                self.out.push('\n');
            }
            let path = path.join(".");
            if header == Header::ArrayItem {
                let _ = writeln!(self.out, "[[{path}]]");
            } else {
                let _ = writeln!(self.out, "[{path}]");
            }
        }
        for e in &entries[..inline_end] {
            self.key_value(&toml_key(&e.key), &e.value);
        }
        for e in &entries[inline_end..] {
            path.push(toml_key(&e.key));
            let sub = ctx.child(&e.key);
            match &e.value.kind {
                ValueKind::Table(t) => self.section(path, Header::Table, t, sub),
                ValueKind::Array(items) => {
                    for item in items {
                        if let ValueKind::Table(t) = &item.kind {
                            self.section(path, Header::ArrayItem, t, sub);
                        }
                    }
                }
                _ => {}
            }
            path.pop();
        }
    }

    /// Writes `key = value`; a long table becomes dotted keys (`key.sub = ...`).
    fn key_value(&mut self, key: &str, value: &Value) {
        match &value.kind {
            ValueKind::Table(t) if !t.entries.is_empty() && !fits_inline(key, value) => {
                for e in &t.entries {
                    self.key_value(&format!("{key}.{}", toml_key(&e.key)), &e.value);
                }
            }
            _ => {
                let _ = writeln!(self.out, "{key} = {}", toml_inline(value, 0));
            }
        }
    }
}

/// Returns the entries in the order they are written: as they are, except that in a table
/// with fixed keys, keyed collections followed by plain keys move after them (their items
/// keep their order), so that they can be written as sections.
fn ordered(table: &Table, ctx: Ctx) -> Vec<&Entry> {
    let entries: Vec<&Entry> = table.entries.iter().collect();
    if !matches!(ctx, Ctx::Fields(_)) {
        return entries;
    }
    let split = trailing_sections(&entries);
    let is_collection =
        |e: &&Entry| matches!(ctx.child(&e.key), Ctx::Items(_)) && headerable(&e.value);
    let (moved, kept): (Vec<&Entry>, Vec<&Entry>) =
        entries[..split].iter().copied().partition(is_collection);
    kept.into_iter()
        .chain(moved)
        .chain(entries[split..].iter().copied())
        .collect()
}

/// Returns where the trailing run of entries that can be sections starts.
fn trailing_sections(entries: &[&Entry]) -> usize {
    let mut split = entries.len();
    while split > 0 && headerable(&entries[split - 1].value) {
        split -= 1;
    }
    split
}

/// Tells whether a value can be written as a section: a table or a non-empty array of tables.
fn headerable(value: &Value) -> bool {
    match &value.kind {
        ValueKind::Table(_) => true,
        ValueKind::Array(items) => {
            !items.is_empty() && items.iter().all(|v| matches!(v.kind, ValueKind::Table(_)))
        }
        _ => false,
    }
}

/// Tells whether a table (or array of tables) that could be a section reads better inline.
fn prefers_inline(key: &str, value: &Value, ctx: Ctx) -> bool {
    // Keyed collections and their items always get sections.
    if matches!(ctx, Ctx::Items(_)) || matches!(ctx.child(key), Ctx::Items(_)) {
        return false;
    }
    fits_inline(&toml_key(key), value)
}

/// Tells whether `key = value` fits on one short line.
fn fits_inline(key: &str, value: &Value) -> bool {
    let text = toml_inline(value, 0);
    !text.contains('\n') && key.len() + 3 + text.len() <= TOML_WIDTH
}

/// Renders a value inline; long arrays are spread over lines, indented by `depth` levels.
fn toml_inline(value: &Value, depth: usize) -> String {
    match &value.kind {
        ValueKind::Array(items) => {
            let rendered: Vec<String> = items.iter().map(|v| toml_inline(v, depth + 1)).collect();
            let one_line = format!("[{}]", rendered.join(", "));
            if !one_line.contains('\n') && one_line.len() + depth * 4 <= TOML_WIDTH - 8 {
                return one_line;
            }
            let indent = "    ".repeat(depth + 1);
            let mut text = String::from("[\n");
            for item in rendered {
                let _ = writeln!(text, "{indent}{item},");
            }
            text.push_str(&"    ".repeat(depth));
            text.push(']');
            text
        }
        _ => to_toml_value(value).to_string(),
    }
}

/// Converts a tree value into a `toml` value.
fn to_toml_value(value: &Value) -> toml::Value {
    match &value.kind {
        ValueKind::Str(s) => toml::Value::String(s.clone()),
        ValueKind::Int(i) => toml::Value::Integer(*i),
        ValueKind::Float(f) => toml::Value::Float(*f),
        ValueKind::Bool(b) => toml::Value::Boolean(*b),
        ValueKind::Array(items) => toml::Value::Array(items.iter().map(to_toml_value).collect()),
        ValueKind::Table(t) => toml::Value::Table(
            t.entries
                .iter()
                .map(|e| (e.key.clone(), to_toml_value(&e.value)))
                .collect(),
        ),
    }
}

/// Renders a key with the `toml` crate's own key writer (`toml_writer`): bare when it can be
/// (ASCII letters, digits, `-` and `_`), else the plainest quoting that holds it (`"a b"`,
/// `'say "hi"'`, escapes for control characters).
fn toml_key(key: &str) -> String {
    use toml_writer::ToTomlKey as _;
    key.to_toml_key()
}

// ---------------------------------------------------------------------------------------------
// KDL
// ---------------------------------------------------------------------------------------------

/// Renders a workflow tree as KDL v2 text that parses back to the same tree.
pub fn to_kdl(root: &Table) -> String {
    let mut doc = KdlDocument::new();
    for e in &root.entries {
        entry_nodes(doc.nodes_mut(), &e.key, &e.value, Some(&WORKFLOW));
    }
    doc.autoformat();
    fix_reprs(doc.nodes_mut());
    doc.to_string()
}

/// Appends the nodes for `key = value` of a table with the given spec (`None`: free-form).
fn entry_nodes(out: &mut Vec<KdlNode>, key: &str, value: &Value, spec: Option<&'static TableSpec>) {
    let Some(field) = spec.and_then(|s| s.field(key)) else {
        out.push(generic_node(key, value));
        return;
    };
    // A collection whose singular is another key of the table would be misread; one whose
    // singular is its own key (`escalation`) is read as repeated items.
    let singular_free =
        |singular: &str| singular == key || spec.is_some_and(|s| s.field(singular).is_none());
    match (&field.ty, &value.kind) {
        (Ty::Named(item, singular), ValueKind::Table(t))
            if singular_free(singular)
                && !t.entries.is_empty()
                && t.entries.iter().all(|e| is_table(&e.value)) =>
        {
            for e in &t.entries {
                let mut node = KdlNode::new(*singular);
                node.push(KdlEntry::new(e.key.clone()));
                if let ValueKind::Table(body) = &e.value.kind {
                    fill(&mut node, body, Some(item), false);
                }
                out.push(node);
            }
        }
        (Ty::Tables(item, singular), ValueKind::Array(items))
            if singular_free(singular) && !items.is_empty() && items.iter().all(is_table) =>
        {
            for v in items {
                let mut node = KdlNode::new(*singular);
                if let ValueKind::Table(body) = &v.kind {
                    fill(&mut node, body, Some(item), false);
                }
                out.push(node);
            }
        }
        // One item is one argument: the reader takes a list node's arguments as an array
        // even when there is only one, so `needs = ["plan"]` comes back as it was.
        (Ty::List(_), ValueKind::Array(items)) if items.iter().all(is_scalar) => {
            let mut node = KdlNode::new(key);
            for v in items {
                if let Some(s) = kdl_scalar(v) {
                    node.push(KdlEntry::new(s));
                }
            }
            out.push(node);
        }
        (Ty::Table(sub), ValueKind::Table(t)) => {
            let mut node = KdlNode::new(key);
            fill(&mut node, t, Some(sub), true);
            out.push(node);
        }
        (Ty::Map(_), ValueKind::Table(t)) => {
            let mut node = KdlNode::new(key);
            fill(&mut node, t, None, true);
            out.push(node);
        }
        _ => out.push(generic_node(key, value)),
    }
}

/// Builds a free-form node: a table has properties and children, an array of two or more
/// scalars is arguments, any other array `-` children, a scalar one argument.
fn generic_node(key: &str, value: &Value) -> KdlNode {
    let mut node = KdlNode::new(key);
    match &value.kind {
        ValueKind::Table(t) => fill(&mut node, t, None, true),
        ValueKind::Array(items) if items.len() >= 2 && items.iter().all(is_scalar) => {
            for v in items {
                if let Some(s) = kdl_scalar(v) {
                    node.push(KdlEntry::new(s));
                }
            }
        }
        // A bare node is an empty array.
        ValueKind::Array(items) if items.is_empty() => {}
        ValueKind::Array(items) => {
            let children = node.ensure_children();
            for v in items {
                children.nodes_mut().push(generic_node("-", v));
            }
        }
        _ => {
            if let Some(s) = kdl_scalar(value) {
                node.push(KdlEntry::new(s));
            }
        }
    }
    node
}

/// Puts a table into a node: its leading short scalars as properties, the rest as children.
/// `braces` gives an empty table `{}` so that it is not read as an empty list or a scalar.
fn fill(node: &mut KdlNode, table: &Table, spec: Option<&'static TableSpec>, braces: bool) {
    let mut width = 0;
    let mut props = 0;
    for e in &table.entries {
        let Some(len) = prop_len(&e.key, &e.value) else {
            break;
        };
        if width + len > KDL_PROPS_WIDTH {
            break;
        }
        let Some(s) = kdl_scalar(&e.value) else { break };
        width += len;
        props += 1;
        node.push(KdlEntry::new_prop(e.key.clone(), s));
    }
    let rest = &table.entries[props..];
    if !rest.is_empty() || (braces && props == 0) {
        let children = node.ensure_children();
        for e in rest {
            entry_nodes(children.nodes_mut(), &e.key, &e.value, spec);
        }
    }
}

/// The rough width of `key=value` as a property, or `None` when it should be a child.
fn prop_len(key: &str, value: &Value) -> Option<usize> {
    let len = match &value.kind {
        ValueKind::Str(s) if !s.contains(['\n', '\r']) && s.chars().count() <= KDL_PROP_STR => {
            s.len() + 2
        }
        ValueKind::Int(i) => i.to_string().len(),
        ValueKind::Float(f) => format!("{f:?}").len(),
        ValueKind::Bool(_) => 6,
        _ => return None,
    };
    Some(key.len() + 2 + len)
}

fn is_scalar(value: &Value) -> bool {
    !matches!(value.kind, ValueKind::Array(_) | ValueKind::Table(_))
}

fn is_table(value: &Value) -> bool {
    matches!(value.kind, ValueKind::Table(_))
}

/// Converts a scalar into a KDL value.
fn kdl_scalar(value: &Value) -> Option<KdlValue> {
    match &value.kind {
        ValueKind::Str(s) => Some(KdlValue::String(s.clone())),
        ValueKind::Int(i) => Some(KdlValue::Integer(i128::from(*i))),
        ValueKind::Float(f) => Some(KdlValue::Float(*f)),
        ValueKind::Bool(b) => Some(KdlValue::Bool(*b)),
        ValueKind::Array(_) | ValueKind::Table(_) => None,
    }
}

/// Quotes the names and strings that the `kdl` crate (6.7) would write in a form its own
/// parser rejects: control and bidi characters, `\u{85}`, `\u{2028}` and bare strings such
/// as `-.5`. Runs after `autoformat`, which would reset these representations.
fn fix_reprs(nodes: &mut [KdlNode]) {
    for node in nodes {
        fix_ident(node.name_mut());
        for entry in node.entries_mut() {
            if let Some(name) = entry.name_mut() {
                fix_ident(name);
            }
            if let KdlValue::String(s) = entry.value() {
                let rendered = entry.value().to_string();
                let ok = KdlEntry::parse(&rendered)
                    .is_ok_and(|e| e.name().is_none() && e.value().as_string() == Some(s.as_str()));
                if !ok {
                    let value_repr = kdl_quote(s);
                    entry.set_format(KdlEntryFormat {
                        value_repr,
                        leading: " ".into(),
                        ..Default::default()
                    });
                }
            }
        }
        if let Some(children) = node.children_mut() {
            fix_reprs(children.nodes_mut());
        }
    }
}

fn fix_ident(ident: &mut KdlIdentifier) {
    let rendered = ident.to_string();
    if KdlIdentifier::parse(&rendered).is_ok_and(|i| i.value() == ident.value()) {
        return;
    }
    let repr = kdl_quote(ident.value());
    ident.set_repr(repr);
}

/// A quoted KDL v2 string that escapes every character a literal may not contain.
fn kdl_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control()
                || matches!(c, '\u{200E}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}' | '\u{FEFF}') =>
            {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;
    use crate::source::FileId;
    use crate::syntax::{Format, parse};

    /// A tree without spans, compared in order (floats by their bits, so `-0.0` counts).
    #[derive(Debug, PartialEq)]
    enum Plain {
        Str(String),
        Int(i64),
        Float(u64),
        Bool(bool),
        Array(Vec<Plain>),
        Table(Vec<(String, Plain)>),
    }

    fn plain_table(t: &Table) -> Plain {
        Plain::Table(
            t.entries
                .iter()
                .map(|e| (e.key.clone(), plain(&e.value)))
                .collect(),
        )
    }

    fn plain(v: &Value) -> Plain {
        match &v.kind {
            ValueKind::Str(s) => Plain::Str(s.clone()),
            ValueKind::Int(i) => Plain::Int(*i),
            ValueKind::Float(f) => Plain::Float(f.to_bits()),
            ValueKind::Bool(b) => Plain::Bool(*b),
            ValueKind::Array(a) => Plain::Array(a.iter().map(plain).collect()),
            ValueKind::Table(t) => plain_table(t),
        }
    }

    fn parse_ok(text: &str, format: Format) -> Table {
        let mut diags = Diagnostics::default();
        let tree = parse(FileId(0), text, format, &mut diags);
        let diags = diags.into_sorted();
        assert!(
            diags.is_empty(),
            "{format:?} did not parse: {:#?}\n--- text ---\n{text}",
            diags.iter().map(|d| &d.message).collect::<Vec<_>>()
        );
        tree
    }

    /// Checks that the tree survives both writers.
    fn assert_round_trips(tree: &Table) {
        let expected = plain_table(tree);
        let kdl = to_kdl(tree);
        assert_eq!(
            plain_table(&parse_ok(&kdl, Format::Kdl)),
            expected,
            "KDL round trip\n--- KDL ---\n{kdl}"
        );
        let toml = to_toml(tree);
        assert_eq!(
            plain_table(&parse_ok(&toml, Format::Toml)),
            expected,
            "TOML round trip\n--- TOML ---\n{toml}"
        );
    }

    const REVIEW_LOOP: &str = r#"
name = "review-loop"
version = "1.0"
description = "Plan, implement and review until approved."
max_concurrency = 4

[budget]
tokens = 2000000
cost_usd = 12.5
on_exceeded = "fail"

[params.task]
type = "string"
description = "What to build"

[params.max_rounds]
type = "int"
default = 5

[params.ratio]
type = "float"
default = 1.0
choices = [0.5, 1.0, 2.0]

[params.targets]
type = "list"
default = ["src"]
choices = [["src"], ["src", "tests"]]

[agents.claude]
kind = "claude"
model = "opus"
args = ["--verbose"]
env = { ANTHROPIC_LOG = "debug", "weird key" = "x y", "1st" = "one" }
timeout = "10m"
fallbacks = ["local"]

[agents.local]
kind = "command"
command = ["my-agent", "--prompt-file", "{{ prompt_file }}"]
prompt_via = "file"

[exits.blocked]
code = 3
message = "blocked: {{ outputs.review.reason }}"

[stages.plan]
kind = "agent"
agent = "claude"
prompt = """
Plan the work for: {{ params.task }}
Write "PLAN:" then the plan; use a \\ if you must.
\tIndented with a tab.
"""
output = { extract = "markers", markers = { plan = { prefix = "PLAN:" }, files = { prefix = "FILE:", many = true, values = ["a"] } } }

[stages.build]
kind = "loop"
needs = ["plan"]
max_iterations = "{{ params.max_rounds }}"
until = "outputs.review.verdict == 'approve'"
on_exhausted = "exit:blocked"
worktree = { branch = "ralph/{{ run.id }}", cleanup = "always" }
stuck = { on = "outputs.review.findings", repeats = 3 }

[[stages.build.escalation]]
when = "iteration >= 3"
run = ["oracle"]
description = "ask for help"

[[stages.build.escalation]]
when = "iteration >= 5"
run = ["oracle", "human"]

[stages.build.stages.implement]
kind = "agent"
agent = "claude"
prompt_file = "prompts/implement.md"
retries = 0

[stages.build.stages.test]
kind = "check"
needs = ["implement"]
argv = ["cargo", "test"]
env = { RUST_BACKTRACE = "1" }
pass_codes = [0]
on_fail = "continue"

[stages.build.stages.review]
kind = "agent"
needs = ["implement", "test"]
agent = "claude"
prompt = "Review it."
feedback = "{{ outputs.review.findings }}"
route = { on = "verdict", cases = { approve = "break", revise = "continue", "needs human" = "exit:blocked" }, default = "fail" }

[stages.build.stages.review.output]
extract = "json"
files = ["review.md"]

[stages.build.stages.review.output.schema]
type = "object"
required = ["verdict"]
additionalProperties = false

[stages.build.stages.review.output.schema.properties.verdict]
type = "string"
enum = ["approve", "revise", "needs human"]

[stages.build.stages.review.output.schema.properties.findings]
type = "array"
items = { type = "object", properties = { file = { type = "string" }, line = { type = "integer", minimum = 1 } } }
maxItems = 50
examples = [[{ file = "a.rs", line = 3 }], {}, [[1], [2, 3]], [[true]]]
"-" = { "-" = 1, x = 2 }

[stages.build.stages.oracle]
kind = "gate"
message = "Stuck after {{ iteration }} rounds."
timeout = 3600
on_timeout = "reject"

[stages.build.stages.human]
kind = "gate"

[stages.fanout]
kind = "for_each"
needs = ["build"]
over = "params.targets"
as = "target"
max_concurrency = 2
aggregate = { mode = "worst", field = "status", order = ["ok", "warn", "error"] }
result = "lint"

[stages.fanout.stages.lint]
kind = "command"
argv = ["cargo", "clippy", "--", "{{ target }}"]
ok_codes = [0, 1]
timeout = 90
"#;

    /// Keys in an order TOML sections cannot express (tables before plain keys), written in
    /// KDL with repeated `escalation` nodes.
    const ORDER_KDL: &str = r#"
name "ordered"
stage "review" {
    route on="verdict" {
        cases approve="break" revise="continue"
    }
    kind "agent"
    output {
        schema {
            type "object"
            properties {
                verdict {
                    type "string"
                    enum "approve" "revise"
                    description "The reviewer's verdict, one of the values of the enum above, nothing else."
                }
            }
            required {
                - "verdict"
            }
        }
        extract "json"
    }
    escalation when="x"
    agent "claude"
    prompt "Review\nthe \"work\"."
}
stage "loop" kind="loop" max_iterations=3 {
    escalation when="a" run="b"
    escalation when="a long condition that makes this escalation too long for one line" {
        run "b" "c"
    }
    stages {
    }
    max_concurrency 1
}
max_concurrency 2
description "set at the end"
"#;

    #[test]
    fn toml_workflow_round_trips_through_both_writers() {
        let tree = parse_ok(REVIEW_LOOP, Format::Toml);
        assert_round_trips(&tree);
    }

    #[test]
    fn kdl_workflow_round_trips_through_both_writers() {
        let tree = parse_ok(ORDER_KDL, Format::Kdl);
        let kdl = to_kdl(&tree);
        assert_eq!(
            plain_table(&parse_ok(&kdl, Format::Kdl)),
            plain_table(&tree),
            "{kdl}"
        );
        // TOML keeps the order too, except that keyed collections move after plain keys.
        let toml = to_toml(&tree);
        let mut expected = tree.clone();
        move_to_end(&mut expected, "stages");
        let stages = expected
            .entries
            .iter_mut()
            .find(|e| e.key == "stages")
            .and_then(|e| as_table_mut(&mut e.value));
        let looped = stages
            .and_then(|s| s.entries.iter_mut().find(|e| e.key == "loop"))
            .and_then(|e| as_table_mut(&mut e.value));
        move_to_end(looped.expect("the loop stage"), "stages");
        let back = parse_ok(&toml, Format::Toml);
        assert_eq!(plain_table(&back), plain_table(&expected), "{toml}");
        assert!(toml.lines().any(|l| l == "[stages.review]"), "{toml}");
        assert!(
            toml.contains("\noutput.schema.type = \"object\"\n"),
            "{toml}"
        );
        // And from that TOML to KDL and back.
        assert_round_trips(&back);
    }

    fn move_to_end(table: &mut Table, key: &str) {
        let i = table
            .entries
            .iter()
            .position(|e| e.key == key)
            .expect("the key");
        let entry = table.entries.remove(i);
        table.entries.push(entry);
    }

    fn as_table_mut(value: &mut Value) -> Option<&mut Table> {
        match &mut value.kind {
            ValueKind::Table(t) => Some(t),
            _ => None,
        }
    }

    #[test]
    fn keyed_collections_are_toml_sections() {
        let toml = to_toml(&parse_ok(REVIEW_LOOP, Format::Toml));
        for header in [
            "[params.task]",
            "[agents.claude]",
            "[stages.plan]",
            "[stages.build.stages.review]",
            "[[stages.build.escalation]]",
        ] {
            assert!(
                toml.lines().any(|l| l == header),
                "missing {header} in\n{toml}"
            );
        }
        assert!(!toml.lines().any(|l| l == "[stages]"), "{toml}");
    }

    #[test]
    fn kdl_uses_singular_nodes_and_list_arguments() {
        let kdl = to_kdl(&parse_ok(REVIEW_LOOP, Format::Toml));
        assert!(
            kdl.contains("stage plan kind=agent") || kdl.contains("stage \"plan\" kind=\"agent\""),
            "{kdl}"
        );
        assert!(
            kdl.contains("needs implement test") || kdl.contains("needs \"implement\" \"test\""),
            "{kdl}"
        );
        assert!(
            !kdl.lines().any(|l| l.trim_start().starts_with("stages ")),
            "{kdl}"
        );
    }

    #[test]
    fn tricky_scalars_round_trip() {
        let text = r##"
name = "tricky"
description = "quote \" backslash \\ newline \n tab \t cr \r esc \u001b[0m nul \u0000 del \u007f nel \u0085 ls \u2028 bom \ufeff bidi \u200e end"

[params."-.5"]
type = "float"
default = -0.0
choices = [1.0, 0.5, 1e-7, 1e300, -2.5e-300, 123456789.0]
description = "-.5"

[params.big]
type = "int"
default = -9223372036854775808
choices = [9223372036854775807, 0, -1]

[params.strs]
type = "list"
default = ["", " ", "true", "#null", "1.0", "-", "a=b", "é", "x\u0085y", "\u000b"]

[params."weird \"key\"\n"]
type = "bool"
default = false

[params."\u0001"]
type = "string"
default = { "a b" = { "" = true, "\u200f" = [true] } }
"##;
        let tree = parse_ok(text, Format::Toml);
        assert_round_trips(&tree);
    }

    #[test]
    fn keys_are_bare_when_they_can_be_and_quoted_otherwise() {
        for (key, written) in [
            ("review_2-B", "review_2-B"),
            ("007", "007"),
            ("", "\"\""),
            ("a b", "\"a b\""),
            ("a.b", "\"a.b\""),
            ("é", "\"é\""),
            ("🦀 crab", "\"🦀 crab\""),
            ("say \"hi\"", "'say \"hi\"'"),
            ("it's", "\"it's\""),
            ("both ' and \"", "\"both ' and \\\"\""),
            ("back\\slash", "'back\\slash'"),
            ("line\nbreak", "\"line\\nbreak\""),
            ("tab\tkept", "\"tab\\tkept\""),
            ("nul\u{0}", "\"nul\\u0000\""),
            ("[x]", "\"[x]\""),
            ("a=b", "\"a=b\""),
            ("#", "\"#\""),
        ] {
            assert_eq!(super::toml_key(key), written, "the key {key:?}");
        }
        // Each reads back as the key it was, as a section, a dotted key and an inline key.
        let mut text = String::from("name = \"keys\"\n");
        for (i, key) in [
            "",
            "a b",
            "a.b",
            "é",
            "🦀",
            "say \"hi\"",
            "it's",
            "both ' and \"",
            "back\\slash",
            "line\nbreak",
            "nul\u{0}",
            "[x]",
            "plain",
        ]
        .iter()
        .enumerate()
        {
            let (k, kx) = (super::toml_key(key), super::toml_key(&format!("{key}x")));
            text.push_str(&format!(
                "[params.{k}]\ntype = \"string\"\ndefault = {{ {k} = {i}, {kx} = {{ {k} = true }} }}\n"
            ));
        }
        let tree = parse_ok(&text, Format::Toml);
        let params = tree
            .get("params")
            .and_then(Value::as_table)
            .expect("params");
        assert_eq!(params.entries.len(), 13, "{text}");
        assert_eq!(params.entries[4].key, "🦀");
        assert_eq!(params.entries[10].key, "nul\u{0}");
        assert_round_trips(&tree);
        // A long table of awkward keys followed by a plain key is written as dotted keys, and
        // as a section when nothing follows it.
        let long: String = (0..12)
            .map(|i| format!("\"key {i}.x\" = \"{}\", ", "v".repeat(8)))
            .collect();
        let long = long.trim_end_matches(", ");
        let tree = parse_ok(
            &format!(
                "name = \"x\"\n[params.p]\ntype = \"string\"\ndefault = {{ {long} }}\ndescription = \"d\"\n"
            ),
            Format::Toml,
        );
        let toml = to_toml(&tree);
        assert!(toml.contains("\ndefault.\"key 0.x\" = "), "{toml}");
        assert_round_trips(&tree);
        let tree = parse_ok(
            &format!("name = \"x\"\n[params.p]\ntype = \"string\"\ndefault = {{ {long} }}\n"),
            Format::Toml,
        );
        let toml = to_toml(&tree);
        assert!(
            toml.contains("\n[params.p.default]\n\"key 0.x\" = "),
            "{toml}"
        );
        assert_round_trips(&tree);
    }

    #[test]
    fn single_items_and_scalars_in_lists() {
        // A list of one is one argument, and reads back as an array of one.
        let tree = parse_ok("name = \"x\"\ninclude = [\"base.toml\"]\n", Format::Toml);
        let kdl = to_kdl(&tree);
        assert!(
            kdl.contains("include base.toml") || kdl.contains("include \"base.toml\""),
            "{kdl}"
        );
        assert_round_trips(&tree);
        // A plain scalar in a list key survives as a property at the start of a node...
        let tree = parse_ok(
            "name = \"x\"\n[stages.a]\nneeds = \"b\"\nkind = \"agent\"\n",
            Format::Toml,
        );
        assert_round_trips(&tree);
        // ...but at the top level it comes back as an array of one, which lowering treats alike.
        let tree = parse_ok("name = \"x\"\ninclude = \"base.toml\"\n", Format::Toml);
        let back = parse_ok(&to_kdl(&tree), Format::Kdl);
        let expected = parse_ok("name = \"x\"\ninclude = [\"base.toml\"]\n", Format::Toml);
        assert_eq!(plain_table(&back), plain_table(&expected));
    }

    #[test]
    fn extends_and_overrides_round_trip() {
        let text = r#"
name = "child"
extends = { workflow = "base.toml", params = { rounds = 3, tags = ["a"], nested = { deep = [{ x = 1 }] } } }

[overrides.review]
prompt = "Be strict."
retries = 1
budget = { tokens = 1000, cost_usd = 0.25 }
"#;
        assert_round_trips(&parse_ok(text, Format::Toml));
    }

    #[test]
    fn empty_arrays_and_tables_round_trip() {
        // An empty array is a bare node; an empty table has empty braces.
        let tree = parse_ok(
            "name = \"x\"\n[params.p]\ntype = \"list\"\ndefault = []\n[params.q]\ntype = \"string\"\ndefault = {}\n",
            Format::Toml,
        );
        let back = parse_ok(&to_kdl(&tree), Format::Kdl);
        assert_eq!(plain_table(&back), plain_table(&tree));
        // TOML has one.
        assert_eq!(
            plain_table(&parse_ok(&to_toml(&tree), Format::Toml)),
            plain_table(&tree)
        );
    }

    #[test]
    fn schema_line_comes_first() {
        let tree = parse_ok("name = \"x\"\n", Format::Toml);
        let text = to_toml_with_schema(&tree, "https://example.com/schema.json");
        assert!(
            text.starts_with("#:schema https://example.com/schema.json\n"),
            "{text}"
        );
        assert_eq!(
            plain_table(&parse_ok(&text, Format::Toml)),
            plain_table(&tree)
        );
        assert!(!to_toml(&tree).starts_with('#'));
    }

    #[test]
    fn empty_tree_writes_empty_text() {
        let tree = Table::default();
        assert_eq!(to_toml(&tree), "");
        assert_eq!(
            plain_table(&parse_ok(&to_kdl(&tree), Format::Kdl)),
            plain_table(&tree)
        );
    }
}

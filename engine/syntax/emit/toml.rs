//! The TOML writer: a table as a section with its plain keys, then its subsections (keyed
//! collections as `[stages.review]`, arrays of tables as `[[...]]`); what the spec says about
//! each key decides which.

use std::fmt::Write as _;

use super::toml_layout::{
    fits_inline, ordered, prefers_inline, toml_inline, toml_key, trailing_sections,
};
use crate::spec::{TableSpec, Ty, WORKFLOW};
use crate::syntax::tree::{Table, Value, ValueKind};

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
pub(super) enum Ctx {
    /// A table with the fields of this spec.
    Fields(&'static TableSpec),
    /// A keyed collection whose items have this spec.
    Items(&'static TableSpec),
    /// Free-form (maps, param defaults, inline schemas, unknown keys).
    Generic,
}

impl Ctx {
    /// The context of the value under `key`.
    pub(super) fn child(self, key: &str) -> Ctx {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::Format;
    use crate::syntax::emit::test_support::{REVIEW_LOOP, parse_ok, plain_table};

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
}

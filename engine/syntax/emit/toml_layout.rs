//! How the TOML writer lays a table out: the order of its entries, which tables become
//! sections and which stay inline (on one line, or as dotted keys), and keys and values as
//! TOML text.

use std::fmt::Write as _;

use super::toml::Ctx;
use crate::syntax::tree::{Entry, Table, Value, ValueKind};

/// Longest line the TOML writer aims for when it puts a value on one line.
const TOML_WIDTH: usize = 80;

/// Returns the entries in the order they are written: as they are, except that in a table
/// with fixed keys, keyed collections followed by plain keys move after them (their items
/// keep their order), so that they can be written as sections.
pub(super) fn ordered(table: &Table, ctx: Ctx) -> Vec<&Entry> {
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
pub(super) fn trailing_sections(entries: &[&Entry]) -> usize {
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
pub(super) fn prefers_inline(key: &str, value: &Value, ctx: Ctx) -> bool {
    // Keyed collections and their items always get sections.
    if matches!(ctx, Ctx::Items(_)) || matches!(ctx.child(key), Ctx::Items(_)) {
        return false;
    }
    fits_inline(&toml_key(key), value)
}

/// Tells whether `key = value` fits on one short line.
pub(super) fn fits_inline(key: &str, value: &Value) -> bool {
    let text = toml_inline(value, 0);
    !text.contains('\n') && key.len() + 3 + text.len() <= TOML_WIDTH
}

/// Renders a value inline; long arrays are spread over lines, indented by `depth` levels.
pub(super) fn toml_inline(value: &Value, depth: usize) -> String {
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
pub(super) fn toml_key(key: &str) -> String {
    use toml_writer::ToTomlKey as _;
    key.to_toml_key()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::Format;
    use crate::syntax::emit::test_support::{assert_round_trips, parse_ok};
    use crate::syntax::emit::to_toml;

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
}

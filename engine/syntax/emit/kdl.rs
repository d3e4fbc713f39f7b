//! The KDL writer: the mapping of the reader in `syntax/kdl/`, driven by the spec (named
//! collections as one node per item, lists as arguments, leading short scalars as
//! properties, the rest generic).

use kdl::{KdlDocument, KdlEntry, KdlNode, KdlValue};

use super::kdl_quote::fix_reprs;
use crate::spec::{TableSpec, Ty, WORKFLOW};
use crate::syntax::tree::{Table, Value, ValueKind};

/// Longest string the KDL writer puts in a property.
const KDL_PROP_STR: usize = 40;
/// Keys whose values are sentences: always child nodes, on lines of their own.
const PROSE: [&str; 3] = ["description", "message", "prompt"];

/// Renders a workflow tree as KDL v2 text that parses back to the same tree.
pub fn to_kdl(root: &Table) -> String {
    let mut doc = KdlDocument::new();
    for e in &root.entries {
        entry_nodes(doc.nodes_mut(), &e.key, &e.value, Some(&WORKFLOW));
    }
    doc.autoformat();
    fix_reprs(doc.nodes_mut(), 0);
    space_out(doc.nodes_mut(), Some(&WORKFLOW));
    doc.to_string()
}

/// The node name of a stage.
const STAGE: &str = "stage";

/// Puts blank lines between the groups of a block whose keys `spec` gives (`None`:
/// free-form): around every stage, and where a run of a collection's items (`param`,
/// `agent`, `escalation`, ...) starts or ends. Runs after `autoformat`, which sets each
/// node's leading whitespace to its indentation.
fn space_out(nodes: &mut [KdlNode], spec: Option<&'static TableSpec>) {
    // The items of this block's collections, by node name, with their spec.
    let item = |name: &str| -> Option<&'static TableSpec> {
        spec?.fields.iter().find_map(|f| match &f.ty {
            Ty::Named(item, singular) | Ty::Tables(item, singular) if *singular == name => {
                Some(*item)
            }
            _ => None,
        })
    };
    let mut prev: Option<String> = None;
    for node in nodes {
        let name = node.name().value().to_string();
        let of = item(&name);
        if let Some(p) = &prev {
            let blank =
                name == STAGE || p == STAGE || (name != *p && (of.is_some() || item(p).is_some()));
            if blank && let Some(format) = node.format_mut() {
                format.leading.insert(0, '\n');
            }
        }
        let inner = of.or_else(|| match spec?.field(&name).map(|f| &f.ty) {
            Some(Ty::Table(sub) | Ty::StrOrTable(sub)) => Some(*sub),
            _ => None,
        });
        if let Some(children) = node.children_mut() {
            space_out(children.nodes_mut(), inner);
        }
        prev = Some(name);
    }
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

/// Puts a table into a node: its leading short scalars as properties, the rest as children
/// (the rule is in the module's documentation). `braces` gives an empty table `{}` so that
/// it is not read as an empty list or a scalar.
fn fill(node: &mut KdlNode, table: &Table, spec: Option<&'static TableSpec>, braces: bool) {
    let mut props = 0;
    for e in &table.entries {
        if !is_short(&e.value) || PROSE.contains(&e.key.as_str()) {
            break;
        }
        let Some(s) = kdl_scalar(&e.value) else { break };
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

/// Tells whether a value is short enough to be a property: a number, a boolean or a string
/// of one line and at most [`KDL_PROP_STR`] characters.
fn is_short(value: &Value) -> bool {
    match &value.kind {
        ValueKind::Str(s) => !s.contains(['\n', '\r']) && s.chars().count() <= KDL_PROP_STR,
        ValueKind::Int(_) | ValueKind::Float(_) | ValueKind::Bool(_) => true,
        ValueKind::Array(_) | ValueKind::Table(_) => false,
    }
}

fn is_scalar(value: &Value) -> bool {
    !matches!(value.kind, ValueKind::Array(_) | ValueKind::Table(_))
}

fn is_table(value: &Value) -> bool {
    matches!(value.kind, ValueKind::Table(_))
}

/// Converts a scalar into a KDL value.
pub(super) fn kdl_scalar(value: &Value) -> Option<KdlValue> {
    match &value.kind {
        ValueKind::Str(s) => Some(KdlValue::String(s.clone())),
        ValueKind::Int(i) => Some(KdlValue::Integer(i128::from(*i))),
        ValueKind::Float(f) => Some(KdlValue::Float(*f)),
        ValueKind::Bool(b) => Some(KdlValue::Bool(*b)),
        ValueKind::Array(_) | ValueKind::Table(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::Format;
    use crate::syntax::emit::test_support::{
        REVIEW_LOOP, assert_round_trips, parse_ok, plain_table,
    };

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
}

//! Workflows round-tripped through both writers.

use super::test_support::{REVIEW_LOOP, assert_round_trips, parse_ok, plain_table};
use super::{to_kdl, to_toml};
use crate::syntax::Format;
use crate::syntax::tree::{Table, Value, ValueKind};

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
fn empty_tree_writes_empty_text() {
    let tree = Table::default();
    assert_eq!(to_toml(&tree), "");
    assert_eq!(
        plain_table(&parse_ok(&to_kdl(&tree), Format::Kdl)),
        plain_table(&tree)
    );
}

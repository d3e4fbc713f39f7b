//! Generates the JSON Schema and the Markdown key reference of the workflow format from its spec.
//!
//! Nothing here describes a key by hand: every table, key, type and kind restriction comes
//! from [`crate::spec`], so the schema, the reference and the shape check cannot drift
//! apart.

use serde_json::{Map, Value, json};

use crate::model::RESERVED;
use crate::spec::{Field, STAGE, TableSpec, Ty, WORKFLOW};

/// The `$id` of the generated schema.
pub const SCHEMA_ID: &str = "https://ralph-flow.dev/schemas/workflow.schema.json";

/// The JSON Schema dialect of the generated schema.
const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// An id: a letter or `_`, then letters, digits, `_` or `-` (see [`crate::model::is_ident`]).
const IDENT: &str = "[A-Za-z_][A-Za-z0-9_-]*";

/// A worker label (`spec::is_label`).
const LABEL_PATTERN: &str = "^[A-Za-z0-9_.:/-]+$";

/// Matches any string that contains a template (`{{`).
const TEMPLATE_PATTERN: &str = r"\{\{";

/// Returns every table of the format, depth-first from [`WORKFLOW`], each once (by name).
pub fn all_specs() -> Vec<&'static TableSpec> {
    let mut out = Vec::new();
    walk_spec(&WORKFLOW, &mut out);
    out
}

fn walk_spec(spec: &'static TableSpec, out: &mut Vec<&'static TableSpec>) {
    if out.iter().any(|s| s.name == spec.name) {
        return;
    }
    out.push(spec);
    for field in spec.fields {
        walk_ty(&field.ty, out);
    }
}

fn walk_ty(ty: &'static Ty, out: &mut Vec<&'static TableSpec>) {
    match ty {
        Ty::List(item) | Ty::Map(item) => walk_ty(item, out),
        Ty::Table(spec) | Ty::Named(spec, _) | Ty::Tables(spec, _) | Ty::StrOrTable(spec) => {
            walk_spec(spec, out)
        }
        Ty::Str
        | Ty::Template
        | Ty::Expr
        | Ty::Label
        | Ty::Enum(_)
        | Ty::Count
        | Ty::Int
        | Ty::Number
        | Ty::Bool
        | Ty::Duration
        | Ty::Action
        | Ty::Any => {}
    }
}

/// Returns the JSON Schema (draft 2020-12) of the TOML form of a workflow file.
///
/// The root is the `workflow` table; every other table is a definition under `$defs`, named
/// after its spec, and referenced with local `#/$defs/...` references only.
pub fn workflow_schema() -> Value {
    let mut root = Map::new();
    root.insert("$schema".into(), DIALECT.into());
    root.insert("$id".into(), SCHEMA_ID.into());
    root.insert("title".into(), "ralph-flow workflow".into());
    root.insert(
        "description".into(),
        format!("A ralph-flow workflow file in TOML form. {}", WORKFLOW.doc).into(),
    );
    if let Value::Object(top) = table_schema(&WORKFLOW) {
        for (key, value) in top {
            if key != "description" {
                root.insert(key, value);
            }
        }
    }
    let defs: Map<String, Value> = all_specs()
        .into_iter()
        .filter(|spec| !is_root(spec))
        .map(|spec| (spec.name.to_string(), table_schema(spec)))
        .collect();
    root.insert("$defs".into(), Value::Object(defs));
    Value::Object(root)
}

fn is_root(spec: &TableSpec) -> bool {
    spec.name == WORKFLOW.name
}

/// A reference to the schema of a table.
fn spec_ref(spec: &TableSpec) -> Value {
    let target = if is_root(spec) {
        "#".to_string()
    } else {
        format!("#/$defs/{}", spec.name)
    };
    json!({ "$ref": target })
}

/// The schema of one table: its keys, the required ones, and which keys each kind allows.
fn table_schema(spec: &'static TableSpec) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), "object".into());
    out.insert("description".into(), spec.doc.into());
    if spec.fields.is_empty() {
        // Free-form (an inline JSON Schema): any keys.
        return Value::Object(out);
    }
    let properties: Map<String, Value> = spec
        .fields
        .iter()
        .map(|f| (f.key.to_string(), field_schema(f)))
        .collect();
    out.insert("properties".into(), Value::Object(properties));
    let required: Vec<Value> = spec
        .fields
        .iter()
        .filter(|f| f.required)
        .map(|f| f.key.into())
        .collect();
    if !required.is_empty() {
        out.insert("required".into(), Value::Array(required));
    }
    out.insert("additionalProperties".into(), false.into());
    let by_kind = kind_rules(spec);
    if !by_kind.is_empty() {
        out.insert("allOf".into(), Value::Array(by_kind));
    }
    Value::Object(out)
}

/// For a table with a kind key: one `if kind == K then only K's keys` rule per kind whose keys
/// differ from the table's full set.
fn kind_rules(spec: &'static TableSpec) -> Vec<Value> {
    let Some(kind_key) = spec.kind_key else {
        return Vec::new();
    };
    let Some(Ty::Enum(kinds)) = spec.field(kind_key).map(|f| &f.ty) else {
        return Vec::new();
    };
    kinds
        .iter()
        .filter_map(|kind| {
            let allowed: Vec<&str> = spec
                .fields
                .iter()
                .filter(|f| f.kinds.is_empty() || f.kinds.contains(kind))
                .map(|f| f.key)
                .collect();
            (allowed.len() < spec.fields.len()).then(|| {
                json!({
                    "if": {
                        "properties": { kind_key: { "const": kind } },
                        "required": [kind_key],
                    },
                    "then": { "propertyNames": { "enum": allowed } },
                })
            })
        })
        .collect()
}

/// The schema of one key: its type's schema, with the key's doc as the description.
fn field_schema(field: &Field) -> Value {
    let mut out = Map::new();
    out.insert("description".into(), field.doc.into());
    if let Value::Object(ty) = ty_schema(&field.ty) {
        out.extend(ty);
    }
    Value::Object(out)
}

/// The schema of a value of the given type.
fn ty_schema(ty: &Ty) -> Value {
    match ty {
        Ty::Str | Ty::Template | Ty::Expr => json!({ "type": "string" }),
        Ty::Label => json!({ "type": "string", "pattern": LABEL_PATTERN }),
        Ty::Enum(options) => json!({ "type": "string", "enum": options }),
        Ty::Count => json!({
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": TEMPLATE_PATTERN },
            ]
        }),
        Ty::Int => json!({ "type": "integer" }),
        Ty::Number => json!({ "type": "number" }),
        Ty::Bool => json!({ "type": "boolean" }),
        Ty::Duration => json!({
            "anyOf": [
                { "type": "integer", "minimum": 0, "maximum": crate::model::MAX_DURATION.as_secs() },
                { "type": "string", "pattern": duration_pattern() },
            ]
        }),
        Ty::Action => json!({ "type": "string", "pattern": action_pattern() }),
        Ty::Any => json!({}),
        Ty::List(item) => {
            let item = ty_schema(item);
            json!({ "anyOf": [item.clone(), { "type": "array", "items": item }] })
        }
        Ty::Table(spec) => spec_ref(spec),
        Ty::Map(item) => json!({ "type": "object", "additionalProperties": ty_schema(item) }),
        Ty::Named(spec, _) => {
            let mut names = Map::new();
            names.insert("pattern".into(), ident_pattern().into());
            if spec.name == STAGE.name {
                names.insert("not".into(), json!({ "enum": RESERVED }));
            }
            json!({ "type": "object", "propertyNames": names, "additionalProperties": spec_ref(spec) })
        }
        Ty::Tables(spec, _) => {
            let item = spec_ref(spec);
            json!({ "anyOf": [item.clone(), { "type": "array", "items": item }] })
        }
        Ty::StrOrTable(spec) => json!({ "anyOf": [{ "type": "string" }, spec_ref(spec)] }),
    }
}

/// Matches exactly the ids [`crate::model::is_ident`] accepts.
fn ident_pattern() -> String {
    format!("^{IDENT}$")
}

/// Matches exactly the strings [`crate::model::Action::parse`] accepts.
fn action_pattern() -> String {
    format!("^(continue|break|fail|approve|reject|exit:{IDENT}|{IDENT})$")
}

/// Matches the strings [`crate::model::parse_duration`] accepts (`90`, `90s`, `10m`, `1h30m`,
/// `250ms`, ...), and any string containing a template.
fn duration_pattern() -> String {
    format!(r"^\s*(\+?[0-9]+|([0-9]+[smhd])*[0-9]+(ms|[smhd]))\s*$|{TEMPLATE_PATTERN}")
}

/// Returns the Markdown key reference of the format: one `### name` section per table, in
/// the order of [`all_specs`], with a table of its keys.
pub fn markdown_reference() -> String {
    let mut out = String::new();
    for spec in all_specs() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("### {}\n\n{}\n\n", spec.name, spec.doc));
        if spec.fields.is_empty() {
            out.push_str("Any keys: the table is free-form.\n");
            continue;
        }
        out.push_str("| key | type | required | kinds | description |\n");
        out.push_str("| --- | --- | --- | --- | --- |\n");
        for field in spec.fields {
            let kinds = if field.kinds.is_empty() {
                "all".to_string()
            } else {
                field.kinds.join(", ")
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} |\n",
                field.key,
                cell(&type_name(&field.ty)),
                if field.required { "yes" } else { "no" },
                cell(&kinds),
                cell(field.doc),
            ));
        }
    }
    out
}

/// A short human name of a type, linking to the sections of tables.
pub fn type_name(ty: &Ty) -> String {
    match ty {
        Ty::Str => "string".into(),
        Ty::Template => "template".into(),
        Ty::Expr => "expression".into(),
        Ty::Label => "label".into(),
        Ty::Enum(options) => {
            let options: Vec<String> = options.iter().map(|o| format!("`{o}`")).collect();
            format!("one of: {}", options.join(", "))
        }
        Ty::Count => "count".into(),
        Ty::Int => "integer".into(),
        Ty::Number => "number".into(),
        Ty::Bool => "boolean".into(),
        Ty::Duration => "duration".into(),
        Ty::Action => "action".into(),
        Ty::Any => "any".into(),
        // A single item stands for a list of one (see `lower::texts`), except for `choices`.
        Ty::List(Ty::Any) => "list".into(),
        Ty::List(item) => {
            let one = type_name(item);
            format!("{one} or list of {one}s")
        }
        Ty::Table(spec) => format!("table [{0}](#{0})", spec.name),
        Ty::Map(item) => format!("map of {}", type_name(item)),
        Ty::Named(spec, _) => {
            let plural = match spec.name.strip_suffix('y') {
                Some(stem) => format!("{stem}ies"),
                None => format!("{}s", spec.name),
            };
            format!("named [{plural}](#{})", spec.name)
        }
        Ty::Tables(spec, _) => format!("array of [{0}](#{0})", spec.name),
        Ty::StrOrTable(spec) => format!("string or [table](#{})", spec.name),
    }
}

/// Escapes text for a Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;
    use crate::model::shape::check_table;
    use crate::model::{Action, parse_duration};
    use crate::source::{FileId, Span};
    use crate::syntax::tree::Value as TreeValue;

    fn validator() -> jsonschema::Validator {
        jsonschema::validator_for(&workflow_schema()).expect("the schema compiles")
    }

    fn workflow(stages: Value) -> Value {
        json!({ "name": "x", "stages": stages })
    }

    /// Whether the shape check accepts the instance.
    fn shape_ok(instance: &Value) -> bool {
        let Some(tree) = TreeValue::from_json(instance, Span::new(FileId(0), 0..0)) else {
            return false;
        };
        let Some(table) = tree.as_table() else {
            return false;
        };
        let mut diags = Diagnostics::default();
        check_table(table, &WORKFLOW, &mut diags);
        !diags.has_errors()
    }

    /// Asserts that the schema and the shape check agree on the instance, and returns whether
    /// it is valid.
    fn check(v: &jsonschema::Validator, instance: Value) -> bool {
        let valid = v.is_valid(&instance);
        assert_eq!(
            valid,
            shape_ok(&instance),
            "schema and shape check disagree on {instance}"
        );
        valid
    }

    #[test]
    fn schema_is_a_valid_json_schema() {
        let schema = workflow_schema();
        assert!(jsonschema::meta::is_valid(&schema));
        jsonschema::draft202012::meta::validate(&schema)
            .expect("valid against the 2020-12 meta-schema");
        assert_eq!(schema["$schema"], DIALECT);
        assert_eq!(schema["$id"], SCHEMA_ID);
        validator();
    }

    #[test]
    fn schema_is_deterministic() {
        assert_eq!(workflow_schema().to_string(), workflow_schema().to_string());
        assert_eq!(markdown_reference(), markdown_reference());
    }

    #[test]
    fn every_table_has_a_definition() {
        let schema = workflow_schema();
        for spec in all_specs().into_iter().filter(|s| !is_root(s)) {
            assert!(
                schema["$defs"][spec.name].is_object(),
                "no definition for {}",
                spec.name
            );
        }
        let text = schema.to_string();
        for (i, _) in text.match_indices("\"$ref\":\"") {
            let rest = &text[i + 8..];
            let target = &rest[..rest.find('"').expect("closing quote")];
            let name = target.strip_prefix("#/$defs/").unwrap_or_default();
            assert!(
                target == "#" || schema["$defs"][name].is_object(),
                "dangling $ref {target}"
            );
        }
    }

    #[test]
    fn specs_are_walked_once_each_with_unique_names() {
        let specs = all_specs();
        assert_eq!(specs[0].name, "workflow");
        for spec in &specs {
            assert_eq!(specs.iter().filter(|s| s.name == spec.name).count(), 1);
        }
        for name in [
            "stage",
            "agent",
            "route",
            "output",
            "schema",
            "marker",
            "stuck",
            "escalation",
            "override",
        ] {
            assert!(specs.iter().any(|s| s.name == name), "{name} not reached");
        }
    }

    #[test]
    fn instances_validate_as_expected() {
        let v = validator();
        assert!(check(
            &v,
            workflow(json!({ "a": { "kind": "command", "argv": ["true"] } }))
        ));
        assert!(check(
            &v,
            workflow(json!({ "a": { "kind": "command", "argv": "true" } }))
        ));
        let mut unknown = workflow(json!({ "a": { "kind": "command", "argv": ["true"] } }));
        unknown["bogus"] = json!(1);
        assert!(!check(&v, unknown));
        // Without a name: a file pulled in by `include` (which the schema cannot tell apart).
        assert!(check(&v, json!({ "stages": {} })));
        assert!(!check(&v, json!({ "name": 1, "stages": {} })));
        assert!(!check(
            &v,
            workflow(json!({ "a": { "kind": "agent", "argv": ["true"] } }))
        ));
        assert!(check(
            &v,
            workflow(json!({ "a": { "kind": "agent", "agent": "claude", "prompt": "hi" } }))
        ));
        assert!(!check(&v, workflow(json!({ "a": { "kind": "nope" } }))));
        assert!(!check(&v, workflow(json!({ "a": { "argv": ["true"] } }))));
        assert!(!check(
            &v,
            workflow(json!({ "a b": { "kind": "command", "argv": ["true"] } }))
        ));
        assert!(!check(
            &v,
            workflow(json!({ "loop": { "kind": "command", "argv": ["true"] } }))
        ));
        let looped = json!({
            "fix": {
                "kind": "loop",
                "max_iterations": 5,
                "until": "outputs.review.verdict == 'ok'",
                "on_exhausted": "exit:stuck",
                "stuck": { "on": "outputs.review.findings", "repeats": 3 },
                "escalation": { "when": "iteration > 2", "run": "deep" },
                "stages": {
                    "work": { "kind": "agent", "agent": "claude", "prompt": "fix it", "timeout": "10m" },
                    "review": {
                        "kind": "agent",
                        "agent": "claude",
                        "prompt": "review",
                        "output": { "schema": { "type": "object" }, "extract": "json" },
                        "route": { "on": "verdict", "cases": { "ok": "break", "bad": "work" } },
                    },
                    "deep": { "kind": "group", "stages": { "inner": { "kind": "check", "argv": ["make", "test"] } } },
                },
            }
        });
        assert!(check(&v, workflow(looped)));
        let in_body = |stage: Value| {
            workflow(
                json!({ "l": { "kind": "loop", "max_iterations": 1, "stages": { "s": stage } } }),
            )
        };
        assert!(!check(
            &v,
            in_body(json!({ "kind": "agent", "argv": ["x"] }))
        ));
        assert!(!check(
            &v,
            in_body(json!({ "kind": "command", "argv": ["x"], "extra": 1 }))
        ));
        let max = |n: Value| {
            workflow(json!({ "l": { "kind": "loop", "max_iterations": n, "stages": {} } }))
        };
        assert!(check(&v, max(json!("{{ params.n }}"))));
        assert!(check(&v, max(json!(3))));
        assert!(!check(&v, max(json!(-1))));
        assert!(!check(&v, max(json!("three"))));
        let timeout =
            |t: Value| workflow(json!({ "a": { "kind": "command", "argv": ["x"], "timeout": t } }));
        for ok in [
            json!("10m"),
            json!("90s"),
            json!("1h30m"),
            json!("250ms"),
            json!(90),
            json!("{{ params.t }}"),
        ] {
            assert!(check(&v, timeout(ok)));
        }
        for bad in [
            json!("ten"),
            json!("5m3"),
            json!("m"),
            json!(""),
            json!(-5),
            json!(true),
        ] {
            assert!(!check(&v, timeout(bad)));
        }
        let on_fail =
            |a: &str| workflow(json!({ "a": { "kind": "command", "argv": ["x"], "on_fail": a } }));
        for ok in ["exit:stuck", "continue", "fail", "fix_a", "exit"] {
            assert!(check(&v, on_fail(ok)), "{ok}");
        }
        for bad in ["exit:", "exit:a b", "a b", "", "1abc", "exit:stuck "] {
            assert!(!check(&v, on_fail(bad)), "{bad}");
        }
    }

    #[test]
    fn agent_keys_depend_on_kind() {
        let v = validator();
        let agent = |a: Value| json!({ "name": "x", "agents": { "a": a }, "stages": {} });
        assert!(check(
            &v,
            agent(json!({ "kind": "command", "command": ["my-agent"], "prompt_via": "file" }))
        ));
        assert!(!check(
            &v,
            agent(json!({ "kind": "claude", "command": ["my-agent"] }))
        ));
        assert!(check(
            &v,
            agent(json!({ "kind": "openai", "api": "responses", "max_tokens": 100 }))
        ));
        assert!(!check(
            &v,
            agent(json!({ "kind": "anthropic", "api": "chat" }))
        ));
        assert!(!check(
            &v,
            agent(json!({ "kind": "openai", "api": "other" }))
        ));
    }

    #[test]
    fn toml_form_validates() {
        let text = r#"
            name = "review-loop"
            max_concurrency = 2

            [params.n]
            type = "int"
            default = 3

            [agents.fast]
            kind = "claude"
            model = "sonnet"
            timeout = "5m"

            [exits.stuck]
            code = 3

            [stages.impl]
            kind = "loop"
            max_iterations = "{{ params.n }}"
            worktree = { branch = "ralph/{{ run.id }}" }

            [stages.impl.stages.work]
            kind = "agent"
            agent = "fast"
            prompt_file = "prompts/work.md"

            [[stages.impl.escalation]]
            when = "iteration > 1"
            run = ["work"]
        "#;
        let instance: Value = toml::from_str(text).expect("valid TOML");
        assert!(check(&validator(), instance));
    }

    #[test]
    fn patterns_match_the_parsers() {
        let duration = regex::Regex::new(&duration_pattern()).expect("duration pattern");
        for s in [
            "90",
            "+90",
            "90s",
            "10m",
            "2h",
            "1d",
            "1h30m",
            "250ms",
            "1m250ms",
            " 10m ",
            "",
            "m",
            "ms",
            "5m3",
            "10x",
            "1ms5s",
            "1.5h",
            "-5",
            "{{ params.t }}",
            "ten",
        ] {
            let expected = s.contains("{{") || parse_duration(s).is_some();
            assert_eq!(duration.is_match(s), expected, "duration {s:?}");
        }
        let action = regex::Regex::new(&action_pattern()).expect("action pattern");
        for s in [
            "continue",
            "break",
            "exit:stuck",
            "exit:",
            "exit",
            "goto_x",
            "a-b",
            "a b",
            "-a",
            "_a",
            "exit:1",
            "",
        ] {
            assert_eq!(
                action.is_match(s),
                Action::parse(s).is_some(),
                "action {s:?}"
            );
        }
    }

    #[test]
    fn markdown_mentions_every_key() {
        let md = markdown_reference();
        for spec in all_specs() {
            assert!(
                md.contains(&format!("### {}\n", spec.name)),
                "no section for {}",
                spec.name
            );
            for field in spec.fields {
                assert!(
                    md.contains(&format!("| `{}` |", field.key)),
                    "{}.{} missing",
                    spec.name,
                    field.key
                );
            }
        }
        assert!(md.contains("| `stages` | named [stages](#stage) | no | loop, for_each, group |"));
        assert!(md.contains("| `escalation` | array of [escalation](#escalation) |"));
    }
}

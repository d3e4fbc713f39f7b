//! Hover: a key's reference text, a stage's kind, agent and output fields, a filter's
//! signature, a param's type and default.

use std::path::Path;

use lsp_types::{Hover, HoverContents, HoverParams, MarkupContent, MarkupKind};

use super::World;
use super::analysis::Analysis;
use super::docs::uri_path;
use super::refs::{FileRef, Sym};
use crate::model::jsonschema::type_name;

pub(super) fn hover(world: &World, params: HoverParams) -> Option<Hover> {
    let pos = params.text_document_position_params;
    let path = uri_path(&pos.text_document.uri)?;
    let offset = world.offset(&path, pos.position)?;
    let a = world.analysis_for(&path)?;
    let index = a.index();
    let item = index.at(&path, offset)?;
    let text = describe(world, a, &path, &item.sym)?;
    Some(Hover {
        contents: HoverContents::Markup(MarkupContent {
            kind: MarkupKind::Markdown,
            value: text,
        }),
        range: Some(world.range(&item.path, item.range.clone())),
    })
}

/// The Markdown shown for a name.
fn describe(world: &World, a: &Analysis, from: &Path, sym: &Sym) -> Option<String> {
    Some(match sym {
        Sym::Key(spec, field) => {
            let mut out = format!("**`{}`** — key of `{}`\n\n", field.key, spec.name);
            out.push_str(&format!(
                "type: {}{}\n\n",
                type_name(&field.ty),
                if field.required { " · required" } else { "" }
            ));
            if !field.kinds.is_empty() {
                out.push_str(&format!("for kinds: {}\n\n", field.kinds.join(", ")));
            }
            out.push_str(field.doc);
            out
        }
        Sym::Stage(name) => stage(a, name)?,
        Sym::Param(name) => param(a, name)?,
        Sym::Agent(name) => {
            let wf = a.workflow.as_ref()?;
            let ag = wf.agents.iter().find(|g| g.name.value == *name)?;
            let mut out = format!("**agent `{name}`** ({})", ag.kind.value.as_str());
            if let Some(m) = &ag.model {
                out.push_str(&format!("\n\nmodel: `{}`", m.value));
            }
            if !ag.fallbacks.is_empty() {
                let f: Vec<String> = ag
                    .fallbacks
                    .iter()
                    .map(|f| format!("`{}`", f.value))
                    .collect();
                out.push_str(&format!("\n\nfallbacks: {}", f.join(", ")));
            }
            out
        }
        Sym::Filter(n) => signature(Kind::Filter, n)?,
        Sym::Test(n) => signature(Kind::Test, n)?,
        Sym::Function(n) => signature(Kind::Function, n)?,
        Sym::File(f) => {
            let target = super::navigate::file_target(world, a, from, f)?;
            let what = match f {
                FileRef::PromptFile(_) => "prompt file",
                FileRef::Schema(_) => "output schema",
                FileRef::Workflow(_) => "workflow",
            };
            format!("{what}: `{}`", target.display())
        }
    })
}

fn stage(a: &Analysis, name: &str) -> Option<String> {
    let s = a.stage(name)?;
    let mut out = format!("**stage `{name}`** ({})", s.kind.as_str());
    if let Some(p) = s.parent.and_then(|p| a.stages.get(p)) {
        out.push_str(&format!(" in {} `{}`", p.kind.as_str(), p.id));
    }
    out.push_str("\n\n");
    if let Some(d) = &s.description {
        out.push_str(d);
        out.push_str("\n\n");
    }
    if !s.children.is_empty() {
        let body: Vec<String> = s
            .children
            .iter()
            .filter_map(|c| a.stages.get(*c))
            .map(|c| format!("`{}`", c.id))
            .collect();
        out.push_str(&format!("body: {}\n\n", body.join(", ")));
    }
    if let Some(agent) = &s.agent {
        out.push_str(&format!("agent: `{agent}`\n\n"));
    }
    if let Some(p) = &s.prompt_file {
        let shown = p
            .file_name()
            .map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into());
        out.push_str(&format!("prompt file: `{shown}`\n\n"));
    }
    if let Some(schema) = &s.schema {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(|r| r.as_array())
            .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
            if !props.is_empty() {
                out.push_str(&format!("output (`stages.{name}.output.FIELD`):\n\n"));
                out.push_str("| field | type | description |\n| --- | --- | --- |\n");
                for (field, def) in props {
                    let ty = json_type(def);
                    let req = if required.contains(&field.as_str()) {
                        " (required)"
                    } else {
                        ""
                    };
                    let doc = def
                        .get("description")
                        .and_then(|d| d.as_str())
                        .unwrap_or("")
                        .replace('|', "\\|")
                        .replace('\n', " ");
                    out.push_str(&format!("| `{field}` | {ty}{req} | {doc} |\n"));
                }
            }
        }
    }
    Some(out.trim_end().to_string())
}

/// A JSON Schema's type, in a word or two.
fn json_type(def: &serde_json::Value) -> String {
    let base = match def.get("type") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str())
            .collect::<Vec<_>>()
            .join(" or "),
        _ if def.get("enum").is_some() => "enum".to_string(),
        _ => "any".to_string(),
    };
    if base == "array" {
        if let Some(items) = def.get("items") {
            return format!("array of {}", json_type(items));
        }
    }
    if let Some(values) = def.get("enum").and_then(|e| e.as_array()) {
        let v: Vec<String> = values.iter().map(|x| format!("`{x}`")).collect();
        return format!("{base}: {}", v.join(", "));
    }
    base
}

fn param(a: &Analysis, name: &str) -> Option<String> {
    let wf = a.workflow.as_ref()?;
    let p = wf.params.iter().find(|p| p.name.value == name)?;
    let ty = if p.ty.value == crate::model::ParamType::List {
        format!("list of {}", p.items.as_str())
    } else {
        p.ty.value.as_str().to_string()
    };
    let mut out = format!("**param `{name}`**: {ty}");
    match &p.default {
        Some(d) => out.push_str(&format!("\n\ndefault: `{}`", d.to_json())),
        None => out.push_str("\n\nrequired: no default (set it with `--set`)"),
    }
    if !p.choices.is_empty() {
        let c: Vec<String> = p
            .choices
            .iter()
            .map(|c| format!("`{}`", c.to_json()))
            .collect();
        out.push_str(&format!("\n\nchoices: {}", c.join(", ")));
    }
    if let Some(d) = &p.description {
        out.push_str(&format!("\n\n{}", d.value));
    }
    Some(out)
}

/// What a name in a template is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Filter,
    Test,
    Function,
}

/// The filters, tests and helpers of the template environment (minijinja's built-ins with
/// the features the engine enables, and those `crate::template` registers): signature and a
/// line of doc. A unit test fails when the environment gains one this table lacks.
pub(crate) const SIGNATURES: &[(Kind, &str, &str, &str)] = {
    use Kind::{Filter as F, Function as U, Test as T};
    &[
        (F, "abs", "abs(value)", "The absolute value of a number."),
        (
            F,
            "attr",
            "attr(value, name)",
            "An attribute of an object, by name.",
        ),
        (
            F,
            "batch",
            "batch(value, count, fill_with=none)",
            "Splits a list into lists of `count` items.",
        ),
        (F, "bool", "bool(value)", "The value as a boolean."),
        (
            F,
            "capitalize",
            "capitalize(value)",
            "The first character upper case, the rest lower case.",
        ),
        (
            F,
            "chain",
            "chain(value, *others)",
            "Chains lists (or maps, or strings) into one sequence.",
        ),
        (
            F,
            "count",
            "count(value)",
            "The number of items (an alias of `length`).",
        ),
        (
            F,
            "d",
            "d(value, default=\"\", boolean=false)",
            "Alias of `default`.",
        ),
        (
            F,
            "default",
            "default(value, default=\"\", boolean=false)",
            "The default when the value is undefined (or, with `boolean=true`, false or none).",
        ),
        (
            F,
            "dictsort",
            "dictsort(value, case_sensitive=false, by=\"key\", reverse=false)",
            "The items of a map, sorted.",
        ),
        (F, "e", "e(value)", "Alias of `escape`."),
        (F, "escape", "escape(value)", "Escapes HTML characters."),
        (
            F,
            "first",
            "first(value)",
            "The first item of a list (or character of a string).",
        ),
        (F, "float", "float(value)", "The value as a float."),
        (
            F,
            "format",
            "format(format, *args)",
            "printf-style formatting: `'%s-%d' | format(a, b)`.",
        ),
        (
            F,
            "groupby",
            "groupby(value, attribute, default=none, case_sensitive=false)",
            "Groups a list of objects by an attribute.",
        ),
        (
            F,
            "indent",
            "indent(value, width, indent_first_line=false, indent_blank_lines=false)",
            "Indents every line but the first by `width` spaces.",
        ),
        (F, "int", "int(value)", "The value as an integer."),
        (
            F,
            "items",
            "items(value)",
            "The `[key, value]` pairs of a map.",
        ),
        (
            F,
            "join",
            "join(value, joiner=\"\", attribute=none)",
            "Joins the items of a list into one string.",
        ),
        (
            F,
            "last",
            "last(value)",
            "The last item of a list (or character of a string).",
        ),
        (
            F,
            "length",
            "length(value)",
            "The number of items of a list or map, or characters of a string.",
        ),
        (
            F,
            "lines",
            "lines(value)",
            "The lines of a string, as a list.",
        ),
        (F, "list", "list(value)", "The value as a list."),
        (F, "lower", "lower(value)", "The string in lower case."),
        (
            F,
            "map",
            "map(value, filter_name | attribute=name, *args)",
            "Applies a filter to each item, or takes an attribute of each.",
        ),
        (
            F,
            "max",
            "max(value, case_sensitive=false, attribute=none)",
            "The largest item.",
        ),
        (
            F,
            "min",
            "min(value, case_sensitive=false, attribute=none)",
            "The smallest item.",
        ),
        (F, "pprint", "pprint(value)", "The value pretty-printed."),
        (
            F,
            "reject",
            "reject(value, test_name=none, *args)",
            "The items for which a test fails.",
        ),
        (
            F,
            "rejectattr",
            "rejectattr(value, attribute, test_name=none, *args)",
            "The items whose attribute fails a test.",
        ),
        (
            F,
            "replace",
            "replace(value, from, to, count=none)",
            "Replaces occurrences of a substring.",
        ),
        (
            F,
            "reverse",
            "reverse(value)",
            "The list (or string) reversed.",
        ),
        (
            F,
            "round",
            "round(value, precision=0)",
            "The number rounded.",
        ),
        (
            F,
            "safe",
            "safe(value)",
            "Marks the value as safe (no escaping).",
        ),
        (
            F,
            "select",
            "select(value, test_name=none, *args)",
            "The items for which a test holds (truthy ones without a test).",
        ),
        (
            F,
            "selectattr",
            "selectattr(value, attribute, test_name=none, *args)",
            "The items whose attribute passes a test.",
        ),
        (
            F,
            "slice",
            "slice(value, count, fill_with=none)",
            "Slices a list into `count` columns.",
        ),
        (
            F,
            "sort",
            "sort(value, reverse=false, case_sensitive=false, attribute=none)",
            "The list sorted.",
        ),
        (
            F,
            "split",
            "split(value, split=none, maxsplits=none)",
            "Splits a string (on whitespace without a separator).",
        ),
        (F, "string", "string(value)", "The value as a string."),
        (F, "sum", "sum(value)", "The sum of the items."),
        (F, "title", "title(value)", "Every word capitalized."),
        (
            F,
            "tojson",
            "tojson(value, indent=none)",
            "The value as JSON.",
        ),
        (
            F,
            "trim",
            "trim(value, chars=none)",
            "Whitespace (or the given characters) removed from both ends.",
        ),
        (
            F,
            "unique",
            "unique(value, case_sensitive=false, attribute=none)",
            "The items without duplicates.",
        ),
        (F, "upper", "upper(value)", "The string in upper case."),
        (
            F,
            "zip",
            "zip(value, *others)",
            "Pairs up the items of several lists.",
        ),
        (
            F,
            "spread",
            "spread(list)",
            "ralph-flow: as a whole argv item, one argument per item of the list (never through a shell).",
        ),
        (
            T,
            "boolean",
            "x is boolean",
            "Whether the value is a boolean.",
        ),
        (
            T,
            "defined",
            "x is defined",
            "Whether the value is defined (a skipped stage's output is `none`, which is defined).",
        ),
        (
            T,
            "divisibleby",
            "x is divisibleby(n)",
            "Whether the number is divisible by `n`.",
        ),
        (
            T,
            "endingwith",
            "x is endingwith(suffix)",
            "Whether the string ends with `suffix`.",
        ),
        (
            T,
            "eq",
            "x is eq(other)",
            "Whether the value equals `other` (also `equalto`, `==`).",
        ),
        (
            T,
            "equalto",
            "x is equalto(other)",
            "Whether the value equals `other`.",
        ),
        (
            T,
            "escaped",
            "x is escaped",
            "Whether the value is marked safe.",
        ),
        (T, "even", "x is even", "Whether the number is even."),
        (T, "false", "x is false", "Whether the value is `false`."),
        (
            T,
            "filter",
            "x is filter",
            "Whether a filter of that name exists.",
        ),
        (T, "float", "x is float", "Whether the value is a float."),
        (
            T,
            "ge",
            "x is ge(other)",
            "Whether the value is `>= other`.",
        ),
        (
            T,
            "greaterthan",
            "x is greaterthan(other)",
            "Whether the value is `> other`.",
        ),
        (T, "gt", "x is gt(other)", "Whether the value is `> other`."),
        (T, "in", "x is in(seq)", "Whether the value is in `seq`."),
        (T, "int", "x is int", "Whether the value is an integer."),
        (
            T,
            "integer",
            "x is integer",
            "Whether the value is an integer.",
        ),
        (
            T,
            "iterable",
            "x is iterable",
            "Whether the value can be iterated over.",
        ),
        (
            T,
            "le",
            "x is le(other)",
            "Whether the value is `<= other`.",
        ),
        (
            T,
            "lessthan",
            "x is lessthan(other)",
            "Whether the value is `< other`.",
        ),
        (
            T,
            "lower",
            "x is lower",
            "Whether the string is all lower case.",
        ),
        (T, "lt", "x is lt(other)", "Whether the value is `< other`."),
        (T, "mapping", "x is mapping", "Whether the value is a map."),
        (
            T,
            "ne",
            "x is ne(other)",
            "Whether the value differs from `other`.",
        ),
        (
            T,
            "none",
            "x is none",
            "Whether the value is `none` (a skipped stage's output is).",
        ),
        (T, "number", "x is number", "Whether the value is a number."),
        (T, "odd", "x is odd", "Whether the number is odd."),
        (T, "safe", "x is safe", "Whether the value is marked safe."),
        (
            T,
            "sameas",
            "x is sameas(other)",
            "Whether the value is the same object as `other`.",
        ),
        (
            T,
            "sequence",
            "x is sequence",
            "Whether the value is a list (or another sequence).",
        ),
        (
            T,
            "startingwith",
            "x is startingwith(prefix)",
            "Whether the string starts with `prefix`.",
        ),
        (T, "string", "x is string", "Whether the value is a string."),
        (
            T,
            "test",
            "x is test",
            "Whether a test of that name exists.",
        ),
        (T, "true", "x is true", "Whether the value is `true`."),
        (
            T,
            "undefined",
            "x is undefined",
            "Whether the value is undefined.",
        ),
        (
            T,
            "upper",
            "x is upper",
            "Whether the string is all upper case.",
        ),
        (
            U,
            "range",
            "range(lower=0, upper, step=1)",
            "A list of integers.",
        ),
        (
            U,
            "dict",
            "dict(**kwargs)",
            "A map of the keyword arguments.",
        ),
        (
            U,
            "namespace",
            "namespace(**kwargs)",
            "A mutable object, to carry values out of loops.",
        ),
        (
            U,
            "debug",
            "debug()",
            "The template's context, for debugging.",
        ),
        (
            U,
            "read_file",
            "read_file(path)",
            "ralph-flow: the text of a file of the workspace (or of `file_roots`).",
        ),
        (
            U,
            "file_exists",
            "file_exists(path)",
            "ralph-flow: whether a file of the workspace (or of `file_roots`) exists.",
        ),
        (
            U,
            "glob",
            "glob(pattern)",
            "ralph-flow: the files matching a pattern, sorted.",
        ),
        (
            U,
            "tail",
            "tail(path, n=20)",
            "ralph-flow: the last `n` lines of a file.",
        ),
        (
            U,
            "git_diff",
            "git_diff(base=\"HEAD\")",
            "ralph-flow: `git diff` of the working directory against `base`.",
        ),
        (
            U,
            "git_status",
            "git_status()",
            "ralph-flow: `git status --porcelain` of the working directory.",
        ),
        (
            U,
            "earlier_runs",
            "earlier_runs(stage, n=5)",
            "ralph-flow: the stage's outputs in earlier runs of this workflow, newest first, each `{run, started_at, status, output}`.",
        ),
    ]
};

/// Tells whether a name is a helper of the template environment.
pub(crate) fn is_function(name: &str) -> bool {
    SIGNATURES
        .iter()
        .any(|(k, n, _, _)| *k == Kind::Function && *n == name)
}

fn signature(kind: Kind, name: &str) -> Option<String> {
    let (_, _, sig, doc) = SIGNATURES
        .iter()
        .find(|(k, n, _, _)| *k == kind && *n == name)?;
    let word = match kind {
        Kind::Filter => "filter",
        Kind::Test => "test",
        Kind::Function => "function",
    };
    Some(format!("```jinja\n{sig}\n```\n{word} — {doc}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::filters::{FILTERS, TESTS, UseKind, exists};

    fn names(kind: Kind) -> Vec<&'static str> {
        SIGNATURES
            .iter()
            .filter(|(k, ..)| *k == kind)
            .map(|(_, n, ..)| *n)
            .collect()
    }

    /// The names `crate::template` registers, read from its source: a new helper or filter
    /// there fails this test until the table has it.
    fn registered(call: &str) -> Vec<String> {
        // The helpers of every run: `crate::template`'s, and cross-run memory's.
        let src = concat!(
            include_str!("../template.rs"),
            include_str!("../run/memory.rs")
        );
        let needle = format!("{call}(");
        let mut out = Vec::new();
        let mut rest = src;
        while let Some(at) = rest.find(&needle) {
            rest = &rest[at + needle.len()..];
            let r = rest.trim_start();
            if let Some(q) = r.strip_prefix('"') {
                if let Some(end) = q.find('"') {
                    out.push(q[..end].to_string());
                }
            }
        }
        out
    }

    #[test]
    fn the_table_covers_the_environment() {
        let (filters, tests, functions) = (
            names(Kind::Filter),
            names(Kind::Test),
            names(Kind::Function),
        );
        for f in FILTERS {
            assert!(
                filters.contains(f),
                "filter `{f}` has no signature in hover.rs"
            );
        }
        for t in TESTS {
            assert!(tests.contains(t), "test `{t}` has no signature in hover.rs");
        }
        for f in registered("add_filter") {
            assert!(
                filters.contains(&f.as_str()),
                "filter `{f}` has no signature"
            );
        }
        for t in registered("add_test") {
            assert!(tests.contains(&t.as_str()), "test `{t}` has no signature");
        }
        let fns = registered("add_function");
        assert!(fns.len() >= 7, "{fns:?}");
        for f in fns {
            assert!(
                functions.contains(&f.as_str()),
                "function `{f}` has no signature"
            );
        }
        // And nothing the environment lacks.
        for f in &filters {
            assert!(
                exists(UseKind::Filter, f),
                "`{f}` is no filter of the environment"
            );
        }
        for t in &tests {
            assert!(
                exists(UseKind::Test, t),
                "`{t}` is no test of the environment"
            );
        }
        // The built-in lists are the environment's: a filter minijinja gains is added to
        // them (their own test), and so here.
        let env = crate::template::environment(crate::template::Roots::default(), || {});
        // (`earlier_runs` is added by a run, which has a store.)
        for f in functions.iter().filter(|f| **f != "earlier_runs") {
            let src = format!("{{{{ {f} is defined }}}}");
            let out = env
                .render_str(&src, minijinja::context! {})
                .unwrap_or_default();
            assert_eq!(
                out.to_lowercase(),
                "true",
                "function `{f}` is not in the environment"
            );
        }
    }

    #[test]
    fn signatures_read_as_markdown() {
        let s = signature(Kind::Filter, "join").unwrap_or_default();
        assert!(s.contains("join(value, joiner"), "{s}");
        assert!(signature(Kind::Filter, "nope").is_none());
    }
}

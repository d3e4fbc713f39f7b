//! Output checks: schemas load and are valid, patterns compile, routes and fan-outs agree
//! with the schemas. Also records each stage's output schema for the template check.

use serde_json::{Value as Json, json};

use super::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::fs::base_dir;
use crate::load::Loader;
use crate::model::{AggregateMode, ExtractMode, OutputSpec, SchemaRef, StageBody, StageKind};

/// The schema of what a command stage produces.
pub fn command_schema() -> Json {
    json!({"type": "object", "properties": {
        "exit_code": {"type": "integer"}, "stdout": {"type": "string"}, "stderr": {"type": "string"}
    }})
}

fn builtin_schema(kind: StageKind) -> Option<Json> {
    Some(match kind {
        StageKind::Agent => json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        StageKind::Command => command_schema(),
        StageKind::Check => json!({"type": "object", "properties": {
            "passed": {"type": "boolean"}, "exit_code": {"type": "integer"},
            "stdout": {"type": "string"}, "stderr": {"type": "string"}
        }}),
        StageKind::Gate => json!({"type": "object", "properties": {
            "approved": {"type": "boolean"}, "comment": {"type": "string"}, "by": {"type": "string"}, "at": {"type": "string"}
        }}),
        StageKind::Subflow => json!({"type": "object", "properties": {
            "exit": {"type": "string"}, "code": {"type": "integer"}, "outputs": {"type": "object"}
        }}),
        StageKind::Loop => json!({"type": "object", "properties": {
            "iterations": {"type": "integer"}, "outcome": {"type": "string"},
            "history": {"type": "array", "items": {"type": "object", "properties": {
                "iteration": {"type": "integer"}, "feedback": {"type": "string"}, "outputs": {"type": "object"}
            }}}
        }}),
        StageKind::ForEach | StageKind::Group => json!({"type": "object", "properties": {
            "results": {"type": "array"}, "value": {}
        }}),
    })
}

/// Follows a dotted field path through a schema's `properties`. Fails with the first field
/// that the schema does not define and the fields it does define there.
pub fn walk_schema<'a>(schema: &'a Json, path: &[&str]) -> Result<&'a Json, (String, Vec<String>)> {
    let mut cur = schema;
    for part in path {
        if part.parse::<usize>().is_ok() {
            match cur.get("items") {
                Some(items) => {
                    cur = items;
                    continue;
                }
                None => return Ok(cur),
            }
        }
        let Some(props) = cur.get("properties").and_then(Json::as_object) else {
            return Ok(cur);
        };
        match props.get(*part) {
            Some(next) => cur = next,
            None => return Err(((*part).to_string(), props.keys().cloned().collect())),
        }
    }
    Ok(cur)
}

pub fn check(c: &mut Checked<'_>, loader: &mut Loader<'_>, diags: &mut Diagnostics) {
    for i in 0..c.stages.len() {
        let id = StageId(i);
        let s = c.info(id).stage;
        let schema = match &s.output {
            Some(o) => output_schema(c, s.kind.value, o, loader, diags),
            None => builtin_schema(s.kind.value),
        };
        if let Some(schema) = schema {
            c.schemas.insert(id, schema);
        }
    }
    for i in 0..c.stages.len() {
        let id = StageId(i);
        route(c, id, diags);
        aggregate(c, id, diags);
    }
}

fn output_schema(
    _c: &Checked<'_>,
    kind: StageKind,
    o: &OutputSpec,
    loader: &mut Loader<'_>,
    diags: &mut Diagnostics,
) -> Option<Json> {
    let extract = o.extract.as_ref().map(|e| e.value);
    let mut schema = match &o.schema {
        Some(SchemaRef::File(path)) => {
            let full = base_dir(loader.sources, path.span).join(&path.value);
            let file = loader.read(
                &full,
                Some(path.span),
                Code::MissingSchemaFile,
                "schema file",
            )?;
            let text = loader.sources.get(file).text.clone();
            match serde_json::from_str::<Json>(&text) {
                Ok(v) => validate_schema(
                    v,
                    SchemaAt::File {
                        file,
                        text: &text,
                        named: path.span,
                        named_at: loader.sources.locate(path.span),
                    },
                    diags,
                ),
                Err(err) => {
                    let offset = line_offset(&text, err.line(), err.column());
                    diags.push(
                        Diagnostic::new(
                            Code::MissingSchemaFile,
                            crate::source::Span::new(file, offset..offset),
                            format!("schema file is not valid JSON: {err}"),
                        )
                        .related(path.span, "named here")
                        .help("fix the JSON"),
                    );
                    None
                }
            }
        }
        Some(SchemaRef::Inline(v)) => {
            validate_schema(v.value.clone(), SchemaAt::Inline(v.span), diags)
        }
        None => None,
    };
    if schema.is_some() && matches!(extract, Some(ExtractMode::Text | ExtractMode::Markers)) {
        if let Some(e) = &o.extract {
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    e.span,
                    format!(
                        "`extract = \"{}\"` makes text, which a schema cannot check",
                        e.value
                    ),
                )
                .help("use json, fenced_json or regex with a schema, or remove the schema"),
            );
        }
    }
    if extract == Some(ExtractMode::Regex) {
        match &o.pattern {
            None => diags.push(
                Diagnostic::new(
                    Code::MissingKey,
                    o.span,
                    "`extract = \"regex\"` needs `pattern`",
                )
                .help_syntax(
                    "add pattern = \"(?P<name>...)\"",
                    "add pattern=\"(?P<name>...)\" to the output",
                ),
            ),
            Some(p) => match regex::Regex::new(&p.value) {
                Ok(re) => {
                    if schema.is_none() {
                        let props: serde_json::Map<String, Json> = re
                            .capture_names()
                            .flatten()
                            .map(|n| (n.to_string(), json!({"type": "string"})))
                            .collect();
                        if props.is_empty() {
                            diags.push(
                                Diagnostic::new(
                                    Code::InvalidRegex,
                                    p.span,
                                    "the pattern has no named groups, so it extracts nothing",
                                )
                                .help("name groups as (?P<verdict>...)"),
                            );
                        }
                        schema = Some(json!({"type": "object", "properties": props}));
                    }
                }
                Err(err) => diags.push(
                    Diagnostic::new(
                        Code::InvalidRegex,
                        p.span,
                        format!("invalid regular expression: {err}"),
                    )
                    .help("fix the pattern"),
                ),
            },
        }
    } else if let Some(p) = &o.pattern {
        diags.push(
            Diagnostic::new(
                Code::KeyNotForKind,
                p.span,
                "`pattern` is only used with `extract = \"regex\"`",
            )
            .help_syntax(
                "set extract = \"regex\" or remove pattern",
                "set extract=\"regex\" or remove pattern",
            ),
        );
    }
    let mut marker_props = serde_json::Map::new();
    for m in &o.markers {
        match (&m.prefix, &m.pattern) {
            (None, None) => diags.push(
                Diagnostic::new(
                    Code::MissingKey,
                    m.span,
                    format!("marker `{}` needs `prefix` or `pattern`", m.name.value),
                )
                .help_syntax(
                    "add prefix = \"VERDICT:\"",
                    "add prefix=\"VERDICT:\" to the marker",
                ),
            ),
            (Some(p), Some(_)) => diags.push(
                Diagnostic::new(
                    Code::Duplicate,
                    p.span,
                    "a marker has `prefix` or `pattern`, not both",
                )
                .help("keep one"),
            ),
            (None, Some(p)) => {
                if let Err(err) = regex::Regex::new(&p.value) {
                    diags.push(
                        Diagnostic::new(
                            Code::InvalidRegex,
                            p.span,
                            format!("invalid regular expression: {err}"),
                        )
                        .help("fix the pattern"),
                    );
                }
            }
            (Some(_), None) => {}
        }
        let flag = m
            .pattern
            .as_ref()
            .is_some_and(|p| regex::Regex::new(&p.value).is_ok_and(|r| r.captures_len() == 1));
        let mut item = if flag {
            json!({"type": "boolean"})
        } else {
            json!({"type": "string"})
        };
        if !m.values.is_empty() {
            item = json!({"type": "string", "enum": m.values.iter().map(|v| v.value.clone()).collect::<Vec<_>>()});
        }
        if m.many {
            item = json!({"type": "array", "items": item});
        }
        marker_props.insert(m.name.value.clone(), item);
    }
    let base = schema.or_else(|| match extract {
        Some(ExtractMode::Json | ExtractMode::FencedJson) => Some(json!({})),
        _ => builtin_schema(kind),
    })?;
    if marker_props.is_empty() {
        return Some(base);
    }
    let mut merged = base;
    if let Some(obj) = merged.as_object_mut() {
        let props = obj.entry("properties").or_insert_with(|| json!({}));
        if let Some(p) = props.as_object_mut() {
            for (k, v) in marker_props {
                p.insert(k, v);
            }
        }
    }
    Some(merged)
}

fn line_offset(text: &str, line: usize, col: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    (start + col.saturating_sub(1)).min(text.len())
}

/// Where a schema was written: inline in the workflow, or in a file of its own (then its
/// problems are reported in that file, at the value at fault).
enum SchemaAt<'a> {
    Inline(crate::source::Span),
    File {
        file: crate::source::FileId,
        text: &'a str,
        named: crate::source::Span,
        /// Where the workflow names the file, as `path:line:column`.
        named_at: String,
    },
}

fn validate_schema(schema: Json, at: SchemaAt<'_>, diags: &mut Diagnostics) -> Option<Json> {
    let place = |pointer: &str| match &at {
        SchemaAt::Inline(span) => *span,
        SchemaAt::File { file, text, .. } => {
            let tokens: Vec<String> = pointer
                .split('/')
                .skip(1)
                .map(|t| t.replace("~1", "/").replace("~0", "~"))
                .collect();
            let range = json_locate(text, &tokens).unwrap_or(0..0);
            crate::source::Span::new(*file, range)
        }
    };
    let named = |d: Diagnostic| match &at {
        SchemaAt::File {
            named, named_at, ..
        } => {
            let help = d.help.clone().unwrap_or_default();
            d.related(*named, "the schema is used here").help(format!(
                "{help} (the workflow names this schema at {named_at})"
            ))
        }
        SchemaAt::Inline(_) => d,
    };
    if let Err(err) = jsonschema::meta::validate(&schema) {
        let pointer = err.instance_path().to_string();
        let keyword = pointer.rsplit('/').next().unwrap_or("");
        let message = if keyword == "type" {
            format!("{} is not a JSON Schema type", err.instance())
        } else if pointer.is_empty() {
            format!("not a valid JSON Schema: {err}")
        } else {
            format!("not a valid JSON Schema: `{keyword}` (at `{pointer}`): {err}")
        };
        let help = if keyword == "type" {
            "a type is one of \"string\", \"number\", \"integer\", \"boolean\", \"object\", \"array\", \"null\", or a list of them".to_string()
        } else {
            "fix the schema; ralph-flow validates outputs with JSON Schema draft 2020-12"
                .to_string()
        };
        diags.push(named(
            Diagnostic::new(Code::InvalidSchema, place(&pointer), message)
                .label("not valid here")
                .help(help),
        ));
        return None;
    }
    if let Err(err) = jsonschema::validator_for(&schema) {
        // A `$ref` that points nowhere: point at the reference as written.
        let span = match &at {
            SchemaAt::File { file, text, .. } => {
                let msg = err.to_string();
                let pointer = msg.split('\'').nth(1).unwrap_or("");
                let needle = format!("\"#{pointer}\"");
                match text.find(&needle).filter(|_| !pointer.is_empty()) {
                    Some(i) => crate::source::Span::new(*file, i..i + needle.len()),
                    None => place(""),
                }
            }
            SchemaAt::Inline(span) => *span,
        };
        diags.push(named(
            Diagnostic::new(
                Code::InvalidSchema,
                span,
                format!("the JSON Schema cannot be used: {err}"),
            )
            .help("schemas must be self-contained: refs point inside the schema"),
        ));
        return None;
    }
    Some(schema)
}

/// Finds the byte range of the value at a JSON pointer (as tokens) in JSON text.
fn json_locate(text: &str, path: &[String]) -> Option<std::ops::Range<usize>> {
    let b = text.as_bytes();
    let ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    // Returns the end of the value starting at `i`.
    fn skip(b: &[u8], i: usize) -> Option<usize> {
        let ws = |mut i: usize| {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            i
        };
        match *b.get(i)? {
            b'"' => {
                let mut j = i + 1;
                while j < b.len() {
                    match b[j] {
                        b'\\' => j += 2,
                        b'"' => return Some(j + 1),
                        _ => j += 1,
                    }
                }
                None
            }
            open @ (b'{' | b'[') => {
                let close = if open == b'{' { b'}' } else { b']' };
                let mut j = ws(i + 1);
                if b.get(j) == Some(&close) {
                    return Some(j + 1);
                }
                loop {
                    if open == b'{' {
                        j = ws(skip(b, j)?);
                        j = ws(j + 1); // the colon
                    }
                    j = ws(skip(b, j)?);
                    match *b.get(j)? {
                        b',' => j = ws(j + 1),
                        c if c == close => return Some(j + 1),
                        _ => return None,
                    }
                }
            }
            _ => {
                let mut j = i;
                while j < b.len()
                    && !matches!(b[j], b',' | b'}' | b']')
                    && !b[j].is_ascii_whitespace()
                {
                    j += 1;
                }
                Some(j)
            }
        }
    }
    let mut start = ws(0);
    for token in path {
        match *b.get(start)? {
            b'{' => {
                let mut j = ws(start + 1);
                loop {
                    if b.get(j) != Some(&b'"') {
                        return None;
                    }
                    let key_end = skip(b, j)?;
                    let key: String = serde_json::from_slice(&b[j..key_end]).ok()?;
                    let value = ws(ws(key_end) + 1);
                    if key == *token {
                        start = value;
                        break;
                    }
                    j = ws(skip(b, value)?);
                    if b.get(j) != Some(&b',') {
                        return None;
                    }
                    j = ws(j + 1);
                }
            }
            b'[' => {
                let n: usize = token.parse().ok()?;
                let mut j = ws(start + 1);
                for _ in 0..n {
                    j = ws(skip(b, j)?);
                    if b.get(j) != Some(&b',') {
                        return None;
                    }
                    j = ws(j + 1);
                }
                start = j;
            }
            _ => return None,
        }
    }
    Some(start..skip(b, start)?)
}

fn route(c: &Checked<'_>, id: StageId, diags: &mut Diagnostics) {
    let s = c.info(id).stage;
    let Some(r) = &s.route else { return };
    let Some(schema) = c.schemas.get(&id) else {
        return;
    };
    let path: Vec<&str> = r.on.value.split('.').collect();
    match walk_schema(schema, &path) {
        Err((bad, known)) => diags.push(
            Diagnostic::new(
                Code::UnknownField,
                r.on.span,
                format!(
                    "the output of `{}` has no field `{bad}` to route on",
                    s.id.value
                ),
            )
            .suggest(&bad, known.iter().map(String::as_str))
            .help_or(format!("its fields are: {}", known.join(", "))),
        ),
        Ok(field) => {
            let Some(values) = field.get("enum").and_then(Json::as_array) else {
                return;
            };
            let values: Vec<String> = values
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .collect();
            for (case, _) in &r.cases {
                if !values.contains(&case.value) {
                    diags.push(
                        Diagnostic::new(
                            Code::UnknownField,
                            case.span,
                            format!("`{}` is not a value of `{}`", case.value, r.on.value),
                        )
                        .suggest(&case.value, values.iter().map(String::as_str))
                        .help_or(format!("its values are: {}", values.join(", "))),
                    );
                }
            }
            if r.default.is_none() {
                let missing: Vec<&String> = values
                    .iter()
                    .filter(|v| !r.cases.iter().any(|(c, _)| c.value == **v))
                    .collect();
                if !missing.is_empty() {
                    diags.push(
                        Diagnostic::new(
                            Code::RouteUncovered,
                            r.on.span,
                            format!(
                                "the route has no case for {}",
                                missing
                                    .iter()
                                    .map(|m| format!("`{m}`"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        )
                        .label("those values would fail the stage")
                        .help("add cases for them, or a `default`"),
                    );
                }
            }
        }
    }
}

fn aggregate(c: &Checked<'_>, id: StageId, diags: &mut Diagnostics) {
    let s = c.info(id).stage;
    let (agg, result, over) = match &s.body {
        StageBody::ForEach {
            aggregate,
            result,
            over,
            ..
        } => (aggregate, result, over.as_ref()),
        StageBody::Group {
            aggregate, result, ..
        } => (aggregate, result, None),
        _ => return,
    };
    if let Some(over) = over {
        for_each_over(c, over, diags);
    }
    let Some(agg) = agg else { return };
    let needs_field = agg.mode.value != AggregateMode::Collect;
    let Some(field) = &agg.field else {
        if needs_field {
            diags.push(
                Diagnostic::new(
                    Code::MissingKey,
                    agg.span,
                    format!("aggregate mode `{}` needs `field`", agg.mode.value),
                )
                .help_syntax(
                    "name the output field to compare, such as field = \"severity\"",
                    "name the output field to compare, such as field=\"severity\"",
                ),
            );
        }
        return;
    };
    let result_stage = result
        .as_ref()
        .and_then(|r| c.find(&r.value))
        .or_else(|| c.info(id).children.last().copied());
    let Some(rs) = result_stage else { return };
    let Some(schema) = c.schemas.get(&rs) else {
        return;
    };
    let path: Vec<&str> = field.value.split('.').collect();
    match walk_schema(schema, &path) {
        Err((bad, known)) => diags.push(
            Diagnostic::new(
                Code::UnknownField,
                field.span,
                format!(
                    "the output of `{}` has no field `{bad}`",
                    c.info(rs).stage.id.value
                ),
            )
            .suggest(&bad, known.iter().map(String::as_str))
            .help_or(format!("its fields are: {}", known.join(", "))),
        ),
        Ok(f) => {
            if matches!(agg.mode.value, AggregateMode::Worst | AggregateMode::Best)
                && agg.order.is_empty()
                && f.get("enum").is_none()
            {
                diags.push(
                    Diagnostic::new(Code::MissingKey, agg.span, format!("`{}` needs an order of values", agg.mode.value))
                        .help_syntax(
                            "add order = [\"none\", \"minor\", \"major\"] or give the field an enum in its schema",
                            "add `order \"none\" \"minor\" \"major\"` in the aggregate or give the field an enum in its schema",
                        ),
                );
            }
        }
    }
}

fn for_each_over(c: &Checked<'_>, over: &crate::model::Text, diags: &mut Diagnostics) {
    // Only a plain path `stages.X.output.a.b` can be checked against a schema.
    let path = over.value.trim();
    let Some(rest) = path.strip_prefix("stages.") else {
        return;
    };
    if !rest
        .chars()
        .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-' || ch == '.')
    {
        return;
    }
    let parts: Vec<&str> = rest.split('.').collect();
    if parts.len() < 2 || parts[1] != "output" {
        return;
    }
    let Some(target) = c.find(parts[0]) else {
        return;
    };
    let Some(schema) = c.schemas.get(&target) else {
        return;
    };
    if let Ok(field) = walk_schema(schema, &parts[2..]) {
        let ty = field.get("type");
        let is_array = match ty {
            Some(Json::String(t)) => t == "array",
            Some(Json::Array(ts)) => ts.iter().any(|t| t == "array"),
            None => true,
            _ => false,
        };
        if !is_array {
            diags.push(
                Diagnostic::new(
                    Code::NotAnArray,
                    over.span,
                    format!(
                        "`{}` is not a list: its schema type is {}",
                        path,
                        ty.map_or("unknown".into(), ToString::to_string)
                    ),
                )
                .label("for_each needs a list")
                .help(format!(
                    "fan out over an array field of `{}`'s output",
                    parts[0]
                )),
            );
        }
    }
}

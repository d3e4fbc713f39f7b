//! for_each and group results: `over` names an array when it is a plain path into an output,
//! and an aggregate's field exists in the result stage's output (with an order when needed).

use serde_json::Value as Json;

use super::walk_schema;
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{AggregateMode, StageBody};

pub(super) fn aggregate(c: &Checked<'_>, id: StageId, diags: &mut Diagnostics) {
    let s = c.info(id).stage;
    let (agg, result, over) = match &s.body {
        StageBody::ForEach(f) => (&f.aggregate, &f.result, f.over.as_ref()),
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

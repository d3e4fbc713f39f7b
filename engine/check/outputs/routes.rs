//! Routes against the output schema: the field routed on exists, cases are values of its enum,
//! and every value has a case unless there is a `default`.

use serde_json::Value as Json;

use super::walk_schema;
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};

pub(super) fn route(c: &Checked<'_>, id: StageId, diags: &mut Diagnostics) {
    let s = c.info(id).stage;
    let Some(r) = &s.keys().route else { return };
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

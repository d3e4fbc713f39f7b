//! Param checks: defaults and choices of the right type, and `--set` values.

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::lower::param_value_error;
use crate::model::{ParamType, Workflow};
use crate::params::{ParamValues, convert};
use crate::syntax::tree::{Value, ValueKind};

/// Checks params and computes their values.
pub(super) fn check(
    wf: &Workflow,
    sets: &[(String, String)],
    require: bool,
    diags: &mut Diagnostics,
) -> ParamValues {
    let mut values = ParamValues::new();
    for p in &wf.params {
        let mut default = p.default.clone();
        // A list param accepts a single string as a list of one (KDL writes one argument so).
        if let (
            ParamType::List,
            Some(Value {
                kind: ValueKind::Str(s),
                span,
            }),
        ) = (p.ty.value, &default)
        {
            default = Some(Value::new(
                *span,
                ValueKind::Array(vec![Value::new(*span, ValueKind::Str(s.clone()))]),
            ));
        }
        if let Some(d) = &default {
            match param_value_error(d, p.ty.value, p.items, &p.name.value) {
                Some(err) => diags.push(err.help_or("change the default or the type")),
                None => {
                    values.insert(p.name.value.clone(), d.to_json());
                }
            }
        }
        for c in &p.choices {
            if let Some(err) = param_value_error(c, p.ty.value, p.items, &p.name.value) {
                diags.push(err);
            }
        }
        if let (Some(d), false) = (&default, p.choices.is_empty()) {
            let dj = d.to_json();
            if !p.choices.iter().any(|c| c.to_json() == dj) {
                let best = d.as_str().and_then(|s| {
                    Some((
                        s,
                        crate::diag::closest(s, p.choices.iter().filter_map(Value::as_str))?,
                    ))
                });
                let mut diag = Diagnostic::new(
                    Code::ParamType,
                    d.span,
                    format!(
                        "the default of `{}` is not one of its choices",
                        p.name.value
                    ),
                )
                .help(
                    best.map_or(String::new(), |(_, b)| format!("did you mean `{b}`? "))
                        + "add it to `choices` or change the default",
                );
                if let Some((written, b)) = best {
                    diag = diag.replacing(written, b);
                }
                diags.push(diag);
            }
        }
    }
    for (key, raw) in sets {
        let Some(p) = wf.params.iter().find(|p| p.name.value == *key) else {
            // A param whose type was reported as not one of the types.
            if wf.is_broken(key) {
                continue;
            }
            diags.push(
                Diagnostic::new(
                    Code::UnknownParam,
                    None,
                    format!("--set {key}: the workflow has no param `{key}`"),
                )
                .suggest(key, wf.params.iter().map(|p| p.name.value.as_str()))
                .help_or(format!("its params are: {}", names(wf))),
            );
            continue;
        };
        let Some(v) = convert(raw, p.ty.value, p.items) else {
            diags.push(
                Diagnostic::new(
                    Code::ParamType,
                    p.ty.span,
                    format!(
                        "--set {key}={raw}: `{raw}` is not a valid {}",
                        p.ty.value.as_str()
                    ),
                )
                .label(format!(
                    "`{key}` is declared as {} here",
                    p.ty.value.as_str()
                ))
                .help(format!("pass a value of type {}", p.ty.value.as_str())),
            );
            continue;
        };
        if !p.choices.is_empty() && !p.choices.iter().any(|c| c.to_json() == v) {
            let choices: Vec<String> = p.choices.iter().map(|c| c.to_json().to_string()).collect();
            diags.push(
                Diagnostic::new(
                    Code::ParamType,
                    p.name.span,
                    format!("--set {key}={raw}: not one of the choices"),
                )
                .help(
                    crate::diag::did_you_mean(raw, p.choices.iter().filter_map(Value::as_str))
                        .map_or(String::new(), |h| format!("{h} "))
                        + &format!("choose one of: {}", choices.join(", ")),
                ),
            );
            continue;
        }
        values.insert(key.clone(), v);
    }
    if require {
        for p in &wf.params {
            if !values.contains_key(&p.name.value) {
                diags.push(
                    Diagnostic::new(
                        Code::ParamRequired,
                        p.name.span,
                        format!("param `{}` is required and has no value", p.name.value),
                    )
                    .label("declared here without a default")
                    .help(format!("pass --set {}=VALUE", p.name.value)),
                );
            }
        }
    }
    values
}

fn names(wf: &Workflow) -> String {
    let names: Vec<&str> = wf.params.iter().map(|p| p.name.value.as_str()).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

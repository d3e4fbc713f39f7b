//! Param values: what `--set` gives, converted to each param's type, and the counts and
//! durations of a workflow that templates over params resolve to.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::model::{Count, Dur, MAX_DURATION, ParamType, parse_duration};

/// The value of every param, as JSON, by name.
pub type ParamValues = BTreeMap<String, serde_json::Value>;

/// Splits a `--set key=value` argument.
pub fn parse_set(arg: &str) -> Result<(String, String), SetError> {
    match arg.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(SetError(arg.to_string())),
    }
}

/// Converts a `--set` string into a value of the param's type.
pub fn convert(raw: &str, ty: ParamType, items: ParamType) -> Option<serde_json::Value> {
    Some(match ty {
        ParamType::String => serde_json::Value::String(raw.to_string()),
        ParamType::Int => serde_json::Value::from(raw.trim().parse::<i64>().ok()?),
        ParamType::Float => {
            serde_json::Value::from(raw.trim().parse::<f64>().ok().filter(|f| f.is_finite())?)
        }
        ParamType::Bool => serde_json::Value::Bool(match raw.trim() {
            "true" | "yes" | "1" | "on" => true,
            "false" | "no" | "0" | "off" => false,
            _ => return None,
        }),
        ParamType::List => {
            let fits = |v: &serde_json::Value| match items {
                ParamType::Int => v.is_i64(),
                ParamType::Float => v.is_number(),
                ParamType::Bool => v.is_boolean(),
                _ => v.is_string(),
            };
            if raw.trim().starts_with('[') {
                let v: serde_json::Value = serde_json::from_str(raw).ok()?;
                v.as_array()?.iter().all(fits).then_some(v)?
            } else {
                serde_json::Value::Array(
                    raw.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(|s| convert(s, items, ParamType::String))
                        .collect::<Option<Vec<_>>>()?,
                )
            }
        }
    })
}

/// A `--set` argument that is not `key=value`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not of the form key=value")]
pub struct SetError(pub String);

/// Why a template over params gave no usable value.
#[derive(Debug, thiserror::Error)]
pub enum ParamError {
    /// The template does not render (minijinja's message, with its causes).
    #[error("{}", crate::diag::error_chain(.0))]
    Render(minijinja::Error),
    /// It renders to something that is not a whole number.
    #[error("`{template}` renders to `{rendered}`, which is not a whole number")]
    NotACount { template: String, rendered: String },
    /// It renders to something that is not a duration.
    #[error("`{template}` renders to `{rendered}`, which is not a duration")]
    NotADuration { template: String, rendered: String },
    /// It renders to a duration longer than [`MAX_DURATION`].
    #[error("`{template}` renders to `{rendered}`, longer than the longest duration (366 days)")]
    TooLong { template: String, rendered: String },
}

/// Renders a template over params only (limits, agent names) with the given param values.
pub fn render_params(template: &str, params: &ParamValues) -> Result<String, ParamError> {
    let env = minijinja::Environment::new();
    let ctx =
        minijinja::context! { params => minijinja::Value::from(minijinja::value::Serde(params)) };
    env.render_str(template, ctx)
        .map(|s| s.trim().to_string())
        .map_err(ParamError::Render)
}

/// Resolves a count to a number with the given param values.
pub fn resolve_count(c: &Count, params: &ParamValues) -> Result<u64, ParamError> {
    match c {
        Count::Literal(n) => Ok(*n),
        Count::Template(t) => {
            let s = render_params(t, params)?;
            s.parse().map_err(|_| ParamError::NotACount {
                template: t.clone(),
                rendered: s,
            })
        }
    }
}

/// Resolves a duration with the given param values.
pub fn resolve_duration(d: &Dur, params: &ParamValues) -> Result<Duration, ParamError> {
    match d {
        Dur::Literal(d) | Dur::Written(d, _) => Ok(*d),
        Dur::Template(t) => {
            let s = render_params(t, params)?;
            match parse_duration(&s) {
                Some(d) if d > MAX_DURATION => Err(ParamError::TooLong {
                    template: t.clone(),
                    rendered: s,
                }),
                Some(d) => Ok(d),
                None => Err(ParamError::NotADuration {
                    template: t.clone(),
                    rendered: s,
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_values_convert_by_type() {
        assert_eq!(
            convert("5", ParamType::Int, ParamType::String),
            Some(serde_json::json!(5))
        );
        assert_eq!(convert("five", ParamType::Int, ParamType::String), None);
        assert_eq!(
            convert("yes", ParamType::Bool, ParamType::String),
            Some(serde_json::json!(true))
        );
        assert_eq!(
            convert("a, b", ParamType::List, ParamType::String),
            Some(serde_json::json!(["a", "b"]))
        );
        assert_eq!(
            convert("[\"a\"]", ParamType::List, ParamType::String),
            Some(serde_json::json!(["a"]))
        );
        assert_eq!(convert("[1]", ParamType::List, ParamType::String), None);
        // Typed items: `items = "int"`.
        assert_eq!(
            convert("1, 2,3", ParamType::List, ParamType::Int),
            Some(serde_json::json!([1, 2, 3]))
        );
        assert_eq!(
            convert("[1, 2]", ParamType::List, ParamType::Int),
            Some(serde_json::json!([1, 2]))
        );
        assert_eq!(convert("1, two", ParamType::List, ParamType::Int), None);
        assert!(parse_set("novalue").is_err());
        assert_eq!(
            parse_set("=x").map_err(|e| e.to_string()),
            Err("`=x` is not of the form key=value".to_string())
        );
        assert_eq!(parse_set("a=b=c"), Ok(("a".into(), "b=c".into())));
    }

    #[test]
    fn counts_and_durations_resolve_over_params() {
        let params: ParamValues = [("n".to_string(), serde_json::json!(3))].into();
        let t = |s: &str| Count::Template(s.to_string());
        assert_eq!(
            resolve_count(&t("{{ params.n * 2 }}"), &params).ok(),
            Some(6)
        );
        let e = resolve_count(&t("{{ params.n }}x"), &params).map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err("`{{ params.n }}x` renders to `3x`, which is not a whole number".to_string())
        );
        let d = Dur::Template("{{ params.n }}m".to_string());
        assert_eq!(
            resolve_duration(&d, &params).ok(),
            Some(Duration::from_secs(180))
        );
        assert!(resolve_count(&t("{{ params.n "), &params).is_err());
        let d = Dur::Template("{{ params.n }}000d".to_string());
        let e = resolve_duration(&d, &params).map_err(|e| e.to_string());
        assert!(e.is_err_and(|e| e.contains("longer than the longest duration")));
    }
}

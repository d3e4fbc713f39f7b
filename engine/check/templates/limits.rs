//! Limits written as templates over params (counts and durations): only params may be used,
//! and with the params in force they must render to a valid value.

use super::scan::inline;
use super::{Kind, Scope};
use crate::check::{Checked, ParamValues};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Count, Dur};
use crate::source::{Sources, Span, Spanned};

pub(super) fn count_like(
    c: &Checked<'_>,
    src: &Sources,
    env: &minijinja::Environment<'_>,
    v: Option<&Spanned<Count>>,
    diags: &mut Diagnostics,
) {
    if let Some(Spanned {
        value: value @ Count::Template(t),
        span,
    }) = v
    {
        let resolve = |p: &ParamValues| crate::params::resolve_count(value, p).map(drop);
        limit(c, src, env, t, *span, resolve, "a whole number", diags);
    }
}

pub(super) fn dur_like(
    c: &Checked<'_>,
    src: &Sources,
    env: &minijinja::Environment<'_>,
    v: Option<&Spanned<Dur>>,
    diags: &mut Diagnostics,
) {
    if let Some(Spanned {
        value: value @ Dur::Template(t),
        span,
    }) = v
    {
        let resolve = |p: &ParamValues| crate::params::resolve_duration(value, p).map(drop);
        limit(
            c,
            src,
            env,
            t,
            *span,
            resolve,
            "a duration, such as 90 or \"10m\"",
            diags,
        );
    }
}

/// Checks a limit written as a template: it may use only params, and with the params in
/// force (when they all have values) it must render to a valid value.
#[allow(clippy::too_many_arguments)]
fn limit(
    c: &Checked<'_>,
    src: &Sources,
    env: &minijinja::Environment<'_>,
    template: &str,
    span: Span,
    resolve: impl Fn(&ParamValues) -> Result<(), crate::params::ParamError>,
    makes: &str,
    diags: &mut Diagnostics,
) {
    let before = diags.error_count();
    let text = Spanned::new(template.to_string(), span);
    inline(c, src, env, &text, Kind::Template, Scope::Params, diags);
    if diags.error_count() == before && params_known(c, template) {
        if let Err(e) = resolve(&c.params) {
            diags.push(
                Diagnostic::new(
                    Code::InvalidValue,
                    span,
                    format!("with the params in force, {e}"),
                )
                .help(format!("give the param a value that makes {makes}")),
            );
        }
    }
}

/// Tells whether every param a template uses has a value (required params may be unset at check).
fn params_known(c: &Checked<'_>, template: &str) -> bool {
    let env = minijinja::Environment::new();
    env.template_from_str(template).is_ok_and(|t| {
        t.undeclared_variables(true).iter().all(|v| {
            v.strip_prefix("params.")
                .is_none_or(|p| c.params.contains_key(p))
        })
    })
}

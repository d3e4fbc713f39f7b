//! Settings that can never work, though each is valid on its own: a gate nobody can answer,
//! parallel items that check out one branch, a command line written as one argv item, and a
//! loop's exit condition that reads nothing the loop changes.
//!
//! Each is a warning with its own code: the workflow runs, but not as its author meant.

mod argv;
mod branches;
mod exits;
mod gates;

use super::Checked;
use crate::diag::Diagnostics;

/// Runs every check of this module.
pub(super) fn check(c: &Checked<'_>, diags: &mut Diagnostics) {
    gates::check(c, diags);
    branches::check(c, diags);
    argv::check(c, diags);
    exits::check(c, diags);
}

/// The variables an expression reads, as dotted paths (`stages.review.output.verdict`);
/// `None` when it does not parse (reported elsewhere).
fn expression_vars(expr: &str) -> Option<std::collections::HashSet<String>> {
    let env = minijinja::Environment::new();
    let e = env.compile_expression(expr).ok()?;
    Some(e.undeclared_variables(true))
}

/// The variables a template reads, as dotted paths; `None` when it does not parse.
fn template_vars(template: &str) -> Option<std::collections::HashSet<String>> {
    let env = minijinja::Environment::new();
    let t = env.template_from_str(template).ok()?;
    Some(t.undeclared_variables(true))
}

/// The first part of a dotted path.
fn root(var: &str) -> &str {
    var.split('.').next().unwrap_or(var)
}

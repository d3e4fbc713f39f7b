//! Template and expression checks: syntax, and that every variable names something visible.
//!
//! Here: the workflow-level places that hold templates (agents, the worktree, exit messages,
//! limits). `stage.rs` walks a stage's; `scan.rs` compiles each text and hands its variables
//! to `variables.rs` (`stages.X` to `stage_refs.rs`) and its filters to `filter_uses.rs`;
//! `syntax.rs` explains syntax errors; `limits.rs` checks limits written over params;
//! `agent_choices.rs` an agent named by a param.

mod agent_choices;
mod filter_uses;
mod limits;
mod scan;
mod stage;
mod stage_refs;
mod syntax;
pub(super) mod variables;

use super::scope::Site;
use super::{Checked, StageId};
use crate::diag::Diagnostics;
use crate::load::Loader;
use crate::source::Span;
use limits::{count_like, dur_like};
use scan::inline;

/// What a piece of text is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Template,
    Expr,
}

/// Who may be referenced.
#[derive(Clone, Copy)]
enum Scope {
    /// Only params (and run metadata): limits and agent settings, fixed when the run starts.
    Params,
    /// Everything visible at a site.
    At(Site),
    /// At a site, with the stage's own `output` too.
    WithOutput(Site),
    /// Params, run and any stage (exit messages, evaluated when the run ends).
    End,
}

struct Text<'a> {
    source: &'a str,
    /// Where the text came from: an inline string (span of the value) or a whole file.
    span: Span,
    in_file: bool,
}

pub(super) fn check(c: &mut Checked<'_>, loader: &mut Loader<'_>, diags: &mut Diagnostics) {
    let env = minijinja::Environment::new();
    let wf = c.workflow;
    let params = Scope::Params;
    for a in &wf.agents {
        for t in a
            .model
            .iter()
            .chain(&a.args)
            .chain(a.env.iter().map(|(_, v)| v))
            .chain(&a.command)
        {
            inline(c, loader.sources, &env, t, Kind::Template, params, diags);
        }
        count_like(c, loader.sources, &env, a.context_window.as_ref(), diags);
        count_like(c, loader.sources, &env, a.max_tokens.as_ref(), diags);
        dur_like(c, loader.sources, &env, a.timeout.as_ref(), diags);
        dur_like(c, loader.sources, &env, a.idle_timeout.as_ref(), diags);
    }
    if let Some(w) = &wf.worktree {
        for x in std::iter::once(&w.branch).chain(&w.base) {
            inline(c, loader.sources, &env, x, Kind::Template, params, diags);
        }
    }
    for e in &wf.exits {
        if let Some(m) = &e.message {
            inline(
                c,
                loader.sources,
                &env,
                m,
                Kind::Template,
                Scope::End,
                diags,
            );
        }
    }
    for r in &wf.resources {
        count_like(c, loader.sources, &env, Some(&r.capacity), diags);
    }
    count_like(c, loader.sources, &env, wf.max_concurrency.as_ref(), diags);
    if let Some(b) = &wf.budget {
        count_like(c, loader.sources, &env, b.tokens.as_ref(), diags);
    }
    for i in 0..c.stages.len() {
        stage::stage(c, StageId(i), loader, &env, diags);
    }
}

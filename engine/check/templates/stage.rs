//! The templates and expressions of one stage, each checked with what is visible where it is
//! evaluated; a prompt file is read and checked whole, a subflow's params against its file.

use super::agent_choices::agent_choices;
use super::filter_uses::ARGV_ITEM;
use super::limits::{count_like, dur_like};
use super::scan::{check_text, inline};
use super::{Kind, Scope, Text};
use crate::check::scope::Site;
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::fs::base_dir;
use crate::load::Loader;
use crate::model::{BodyText, StageBody};
use crate::source::{Span, Spanned};

pub(super) fn stage(
    c: &mut Checked<'_>,
    id: StageId,
    loader: &mut Loader<'_>,
    env: &minijinja::Environment<'_>,
    diags: &mut Diagnostics,
) {
    let s = c.info(id).stage;
    let here = Scope::At(Site::Stage(id));
    let own = Scope::WithOutput(Site::Stage(id));
    let src = &*loader.sources;
    let t = |c: &Checked<'_>, text: &Spanned<String>, scope: Scope, diags: &mut Diagnostics| {
        inline(c, src, env, text, Kind::Template, scope, diags)
    };
    let e = |c: &Checked<'_>, text: &Spanned<String>, scope: Scope, diags: &mut Diagnostics| {
        inline(c, src, env, text, Kind::Expr, scope, diags)
    };
    if let Some(w) = &s.keys().when {
        e(c, w, here, diags);
    }
    if let Some(f) = &s.keys().feedback {
        t(c, f, own, diags);
    }
    if let Some(p) = &s.keys().priority {
        e(c, p, here, diags);
    }
    for d in [&s.keys().timeout, &s.keys().idle_timeout] {
        dur_like(c, src, env, d.as_ref(), diags);
    }
    count_like(c, src, env, s.keys().retries.as_ref(), diags);
    if let Some(b) = &s.keys().budget {
        count_like(c, src, env, b.tokens.as_ref(), diags);
    }
    if let Some(o) = &s.keys().output {
        for f in &o.files {
            t(c, f, own, diags);
        }
    }
    for text in s.body.texts() {
        match text {
            BodyText::Template(x) => t(c, x, here, diags),
            BodyText::Argv(x) => {
                ARGV_ITEM.with(|f| f.set(true));
                t(c, x, here, diags);
                ARGV_ITEM.with(|f| f.set(false));
            }
            BodyText::Verdict(x) => e(c, x, own, diags),
            BodyText::AgentName(x) => {
                t(c, x, Scope::Params, diags);
                agent_choices(c, x, diags);
            }
        }
    }
    let prompt_file = s.body.prompt_file().cloned();
    match &s.body {
        StageBody::Loop(l) => {
            let crate::model::LoopBody {
                until,
                stuck,
                escalation,
                max_iterations,
                worktree,
                ..
            } = &**l;
            let end = Scope::At(Site::BodyEnd(id));
            if let Some(u) = until {
                e(c, u, end, diags);
            }
            if let Some(st) = stuck {
                e(c, &st.on, end, diags);
                count_like(c, src, env, st.repeats.as_ref(), diags);
            }
            for rule in escalation {
                let site = rule
                    .run
                    .iter()
                    .filter_map(|r| c.find(&r.value))
                    .find(|r| c.info(*r).parent == Some(id))
                    .map_or(Site::BodyEnd(id), Site::Stage);
                e(c, &rule.when, Scope::At(site), diags);
            }
            count_like(c, src, env, max_iterations.as_ref(), diags);
            if let Some(w) = worktree {
                for x in std::iter::once(&w.branch).chain(&w.base) {
                    t(c, x, Scope::At(Site::Region(id)), diags);
                }
            }
        }
        StageBody::ForEach(f) => {
            let crate::model::ForEachBody {
                over,
                key,
                max_concurrency,
                worktree,
                ..
            } = &**f;
            if let Some(o) = over {
                e(c, o, Scope::At(Site::Region(id)), diags);
            }
            let item = Scope::At(Site::Stage(
                c.info(id).children.first().copied().unwrap_or(id),
            ));
            if let Some(k) = key {
                e(c, k, item, diags);
            }
            if let Some(w) = worktree {
                for x in std::iter::once(&w.branch).chain(&w.base) {
                    t(c, x, item, diags);
                }
            }
            count_like(c, src, env, max_concurrency.as_ref(), diags);
        }
        StageBody::Group {
            max_concurrency, ..
        } => count_like(c, src, env, max_concurrency.as_ref(), diags),
        _ => {}
    }
    if let StageBody::Subflow {
        workflow: Some(w),
        params,
    } = &s.body
    {
        subflow(loader, w, params, diags);
    }
    if let Some(pf) = prompt_file {
        let path = loader.prompt_file(&c.workflow.prompt_path, &pf);
        if let Some(file) =
            loader.read(&path, Some(pf.span), Code::MissingPromptFile, "prompt file")
        {
            let text = loader.sources.get(file).text.clone();
            let whole = Span::new(file, 0..text.len());
            check_text(
                c,
                loader.sources,
                env,
                &Text {
                    source: &text,
                    span: whole,
                    in_file: true,
                },
                Kind::Template,
                here,
                diags,
            );
            c.prompt_files.insert(id, (path, text.to_string()));
        }
    }
}

/// Loads a subflow's file (its own problems are reported by the loader) and checks that the
/// params given to it exist there and that its required params are given.
fn subflow(
    loader: &mut Loader<'_>,
    w: &Spanned<String>,
    params: &[(Spanned<String>, Spanned<String>)],
    diags: &mut Diagnostics,
) {
    let path = base_dir(loader.sources, w.span).join(&w.value);
    let Some(sub) = loader.load(&path, Some(w.span)) else {
        return;
    };
    for (k, _) in params {
        if !sub.params.iter().any(|p| p.name.value == k.value) {
            diags.push(
                Diagnostic::new(
                    Code::UnknownParam,
                    k.span,
                    format!("the subflow `{}` has no param `{}`", w.value, k.value),
                )
                .suggest(&k.value, sub.params.iter().map(|p| p.name.value.as_str())),
            );
        }
    }
    for p in &sub.params {
        if p.default.is_none() && !params.iter().any(|(k, _)| k.value == p.name.value) {
            diags.push(
                Diagnostic::new(
                    Code::ParamRequired,
                    w.span,
                    format!(
                        "the subflow's param `{}` is required and not given",
                        p.name.value
                    ),
                )
                .help(format!("add `{}` to this stage's params", p.name.value)),
            );
        }
    }
}

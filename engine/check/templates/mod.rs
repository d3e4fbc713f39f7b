//! Template and expression checks: syntax, and that every variable names something visible.

use std::collections::HashSet;

use super::filters::{self, Use, UseKind};
use super::scope::{Site, maybe_skipped_at, runs_only_after, share_loop, upstream};
use super::{Checked, ParamValues, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::fs::base_dir;
use crate::load::Loader;
use crate::model::{Count, Dur, StageBody, StageKind};
use crate::source::{Sources, Span, Spanned};

/// Helper functions templates may call; the run side provides them.
pub const HELPERS: &[&str] = &[
    "read_file",
    "glob",
    "git_diff",
    "git_status",
    "tail",
    "file_exists",
    "earlier_runs",
];
/// Functions minijinja itself provides.
const BUILTINS: &[&str] = &[
    "range",
    "dict",
    "namespace",
    "debug",
    "true",
    "false",
    "none",
    "True",
    "False",
    "None",
];
/// The attributes of `stages.ID`.
pub const STAGE_ATTRS: &[&str] = &[
    "output", "history", "last", "status", "ran", "feedback", "attempts", "usage", "settled",
];
/// The attributes of `run`.
pub const RUN_ATTRS: &[&str] = &["id", "dir", "workflow", "started_at", "stage_dir", "cwd"];
/// The loop variables.
pub const LOOP_VARS: &[&str] = &["iteration", "max_iterations", "feedback", "history"];

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

pub fn check(c: &mut Checked<'_>, loader: &mut Loader<'_>, diags: &mut Diagnostics) {
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
        stage(c, StageId(i), loader, &env, diags);
    }
}

fn stage(
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
    if let Some(w) = &s.when {
        e(c, w, here, diags);
    }
    if let Some(f) = &s.feedback {
        t(c, f, own, diags);
    }
    if let Some(p) = &s.priority {
        e(c, p, here, diags);
    }
    for d in [&s.timeout, &s.idle_timeout] {
        dur_like(c, src, env, d.as_ref(), diags);
    }
    count_like(c, src, env, s.retries.as_ref(), diags);
    if let Some(b) = &s.budget {
        count_like(c, src, env, b.tokens.as_ref(), diags);
    }
    if let Some(o) = &s.output {
        for f in &o.files {
            t(c, f, own, diags);
        }
    }
    let mut prompt_file = None;
    match &s.body {
        StageBody::Agent {
            agent,
            prompt,
            prompt_file: file,
        } => {
            if let Some(a) = agent {
                if a.value.contains("{{") {
                    t(c, a, Scope::Params, diags);
                    agent_choices(c, a, diags);
                }
            }
            if let Some(p) = prompt {
                t(c, p, here, diags);
            }
            prompt_file = file.clone();
        }
        StageBody::Command(cmd)
        | StageBody::Check {
            command: Some(cmd), ..
        } => {
            for a in &cmd.argv {
                ARGV_ITEM.with(|f| f.set(true));
                t(c, a, here, diags);
                ARGV_ITEM.with(|f| f.set(false));
            }
            for a in cmd
                .cwd
                .iter()
                .chain(&cmd.stdin)
                .chain(cmd.env.iter().map(|(_, v)| v))
            {
                t(c, a, here, diags);
            }
        }
        _ => {}
    }
    match &s.body {
        StageBody::Check {
            expect: Some(x), ..
        } => e(c, x, own, diags),
        StageBody::Gate { message, show, .. } => {
            for m in message.iter().chain(show) {
                t(c, m, here, diags);
            }
        }
        StageBody::Subflow { params, .. } => {
            for (_, v) in params {
                t(c, v, here, diags);
            }
        }
        StageBody::Loop {
            until,
            stuck,
            escalation,
            max_iterations,
            worktree,
            ..
        } => {
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
        StageBody::ForEach {
            over,
            key,
            max_concurrency,
            worktree,
            ..
        } => {
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

fn agent_choices(c: &Checked<'_>, a: &Spanned<String>, diags: &mut Diagnostics) {
    // `{{ params.X }}` naming an agent, possibly with text around it (`driver_{{ params.X }}`):
    // every choice of X, with that text around it, must be an agent.
    let text = a.value.trim();
    let (Some(open), Some(close)) = (text.find("{{"), text.find("}}")) else {
        return;
    };
    if close < open || text[close + 2..].contains("{{") {
        return;
    }
    let (prefix, suffix) = (&text[..open], &text[close + 2..]);
    let Some(param) = text[open + 2..close].trim().strip_prefix("params.") else {
        return;
    };
    let Some(p) = c.workflow.params.iter().find(|p| p.name.value == param) else {
        return;
    };
    let values: Vec<serde_json::Value> = if p.choices.is_empty() {
        p.default
            .iter()
            .map(crate::syntax::tree::Value::to_json)
            .collect()
    } else {
        p.choices
            .iter()
            .map(crate::syntax::tree::Value::to_json)
            .collect()
    };
    for v in values {
        let value = v.as_str().unwrap_or_default();
        let name = format!("{prefix}{value}{suffix}");
        let name = name.as_str();
        if !c.workflow.agents.iter().any(|x| x.name.value == name) {
            let message = if name == value {
                format!("param `{param}` can be `{name}`, which is not an agent")
            } else {
                format!("param `{param}` can be `{value}`, which names `{name}`: not an agent")
            };
            diags.push(
                Diagnostic::new(Code::UnknownAgent, a.span, message)
                    .suggest(
                        name,
                        c.workflow.agents.iter().map(|x| x.name.value.as_str()),
                    )
                    .help_or("make every choice of the param the name of an agent"),
            );
        }
    }
    if p.choices.is_empty() {
        diags.push(
            Diagnostic::new(
                Code::UnknownAgent,
                a.span,
                format!(
                    "param `{param}` names an agent but has no `choices`, so any value could be set"
                ),
            )
            .severity_warning()
            .help_syntax(
                "add choices = [...] listing the agents it may name",
                "add choices \"...\" \"...\" listing the agents it may name",
            ),
        );
    }
}

fn count_like(
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

fn dur_like(
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

fn inline(
    c: &Checked<'_>,
    src: &Sources,
    env: &minijinja::Environment<'_>,
    t: &Spanned<String>,
    kind: Kind,
    scope: Scope,
    diags: &mut Diagnostics,
) {
    check_text(
        c,
        src,
        env,
        &Text {
            source: &t.value,
            span: t.span,
            in_file: false,
        },
        kind,
        scope,
        diags,
    );
}

/// Maps a byte range of the text to a span in its file.
fn map(src: &Sources, text: &Text<'_>, range: std::ops::Range<usize>) -> Span {
    if text.in_file {
        return Span::new(text.span.file, range);
    }
    let raw = src.slice(text.span);
    let kdl = crate::syntax::Format::from_path(&src.get(text.span.file).path)
        == crate::syntax::Format::Kdl;
    if let Some(r) = crate::syntax::strings::map_range(raw, kdl, text.source, range.clone()) {
        let start = text.span.start as usize;
        return Span::new(text.span.file, start + r.start..start + r.end);
    }
    match raw.find(text.source) {
        Some(base) if !text.source.is_empty() => {
            let start = text.span.start as usize + base;
            Span::new(
                text.span.file,
                start + range.start..start + range.end.min(text.source.len()),
            )
        }
        _ => text.span,
    }
}

fn locate(src: &Sources, text: &Text<'_>, needle: &str) -> Span {
    match text.source.find(needle) {
        Some(i) => map(src, text, i..i + needle.len()),
        None => text.span,
    }
}

fn check_text(
    c: &Checked<'_>,
    src: &Sources,
    env: &minijinja::Environment<'_>,
    text: &Text<'_>,
    kind: Kind,
    scope: Scope,
    diags: &mut Diagnostics,
) {
    let vars: HashSet<String> = match kind {
        Kind::Template => match env.template_from_str(text.source) {
            Ok(t) => t.undeclared_variables(true),
            Err(err) => {
                syntax_error(src, text, &err, Code::TemplateSyntax, diags);
                return;
            }
        },
        Kind::Expr => {
            if text.source.trim().is_empty() {
                diags.push(
                    Diagnostic::new(Code::ExpressionSyntax, text.span, "the expression is empty")
                        .help("write a condition such as `iteration > 1`"),
                );
                return;
            }
            match env.compile_expression(text.source) {
                Ok(e) => e.undeclared_variables(true),
                Err(err) => {
                    syntax_error(src, text, &err, Code::ExpressionSyntax, diags);
                    return;
                }
            }
        }
    };
    let mut vars: Vec<String> = vars.into_iter().collect();
    vars.sort();
    let guarded: HashSet<String> = vars
        .iter()
        .filter_map(|v| {
            let parts: Vec<&str> = v.split('.').collect();
            (parts.len() >= 3 && parts[0] == "stages" && matches!(parts[2], "ran" | "status"))
                .then(|| parts[1].to_string())
        })
        .collect();
    for var in &vars {
        variable(c, src, text, var, scope, &guarded, diags);
    }
    let uses = match kind {
        Kind::Template => filters::in_template(text.source),
        Kind::Expr => filters::in_expression(text.source),
    };
    for u in &uses {
        filter_or_test(src, text, u, diags);
        if u.kind == UseKind::Filter && text.source.get(u.range.clone()) == Some("spread") {
            spread_in_place(src, text, u, diags);
        }
    }
}

thread_local! {
    /// Set while a command's argv item is checked: the only place `spread` may stand.
    static ARGV_ITEM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `spread` makes one argument per item, so it must be a whole argv item by itself.
fn spread_in_place(src: &Sources, text: &Text<'_>, u: &Use, diags: &mut Diagnostics) {
    static WHOLE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^\s*\{\{[^{}]*\|\s*spread\s*\}\}\s*$").expect("the pattern is valid")
    });
    let message = if !ARGV_ITEM.with(std::cell::Cell::get) {
        "`spread` gives one argument per item, so it only works in a command's argv"
    } else if !WHOLE.is_match(text.source) {
        "`spread` must be the whole argv item"
    } else {
        return;
    };
    diags.push(
        Diagnostic::new(Code::InvalidValue, map(src, text, u.range.clone()), message)
            .label("spreads a list")
            .help("write the list as an argv item of its own: \"{{ params.paths | spread }}\"; elsewhere, use `join(' ')` for one text"),
    );
}

/// Reports a filter or test that the run's environment does not have (minijinja finds out
/// only when it renders, in the middle of a run).
fn filter_or_test(src: &Sources, text: &Text<'_>, u: &Use, diags: &mut Diagnostics) {
    let Some(name) = text.source.get(u.range.clone()) else {
        return;
    };
    if filters::exists(u.kind, name) {
        return;
    }
    let word = u.kind.word();
    let mut d = Diagnostic::new(
        Code::UnknownFilter,
        map(src, text, u.range.clone()),
        format!("there is no {word} `{name}`"),
    )
    .label(format!("unknown {word}"));
    let other = match u.kind {
        UseKind::Filter => UseKind::Test,
        UseKind::Test => UseKind::Filter,
    };
    d = if filters::exists(other, name) {
        d.help(match u.kind {
            UseKind::Filter => format!("`{name}` is a test: write `is {name}`"),
            UseKind::Test => format!("`{name}` is a filter: write `| {name}`"),
        })
    } else {
        d.suggest(name, filters::known(u.kind)).help_or(format!(
            "templates have minijinja's built-in {word}s: https://docs.rs/minijinja/latest/minijinja/{word}s/index.html"
        ))
    };
    diags.push(d);
}

fn syntax_error(
    src: &Sources,
    text: &Text<'_>,
    err: &minijinja::Error,
    code: Code,
    diags: &mut Diagnostics,
) {
    let detail = err
        .detail()
        .map(str::to_string)
        .unwrap_or_else(|| err.kind().to_string());
    let what = if code == Code::TemplateSyntax {
        "template"
    } else {
        "expression"
    };
    let at_end = err
        .range()
        .is_none_or(|r| r.end >= text.source.trim_end().len());
    let mut d = None;
    if code == Code::TemplateSyntax && at_end {
        // The parser found out at the end of the text; the mistake is where the unclosed
        // block or delimiter was opened.
        if let Some((range, opened)) = unclosed(text.source) {
            let closer = match opened.as_str() {
                "{{" => "`}}`".to_string(),
                "{%" => "`%}`".to_string(),
                "{#" => "`#}`".to_string(),
                block => format!("`{{% end{block} %}}`"),
            };
            let label = if opened.starts_with('{') {
                format!("`{opened}` opened here is never closed")
            } else {
                format!("this `{opened}` block is never closed")
            };
            d = Some(
                Diagnostic::new(
                    code,
                    map(src, text, range),
                    format!("invalid {what}: {detail}"),
                )
                .label(label)
                .help(format!("close it with {closer}")),
            );
        }
    }
    let d = d.unwrap_or_else(|| {
        let span = err.range().map_or(text.span, |r| map(src, text, r));
        let help = syntax_hint(code, text.source, &detail);
        Diagnostic::new(code, span, format!("invalid {what}: {detail}"))
            .label("here")
            .help(help)
    });
    diags.push(d);
}

/// A hint for a template or expression syntax error, by what went wrong.
fn syntax_hint(code: Code, source: &str, detail: &str) -> String {
    if code == Code::ExpressionSyntax && (source.contains("{{") || source.contains("{%")) {
        return "conditions and expressions are written without {{ }} or {% %}: `stages.review.output.verdict == \"ok\"`".into();
    }
    if detail.contains("unknown statement") {
        return "a block is `{% if %}`, `{% for %}`, `{% set %}`, `{% with %}`, `{% filter %}` or `{% macro %}`; a value is written `{{ name }}`".into();
    }
    if detail.contains("unexpected end of") || detail.contains("unexpected end") {
        return "something opened is not closed: `{{` needs `}}`, `{%` needs `%}`, a block needs its `{% end... %}`, a string its quote".into();
    }
    if detail.contains("unexpected `}`") || detail.contains("unexpected }") {
        return "a `{{ ... }}` holds one expression; check its brackets and quotes".into();
    }
    if detail.contains("unexpected end of block")
        || detail.contains("endif")
        || detail.contains("endfor")
    {
        return "each `{% if %}` ends with `{% endif %}` and each `{% for %}` with `{% endfor %}`, in order".into();
    }
    if code == Code::ExpressionSyntax {
        return "an expression is minijinja (Jinja2) syntax: `a == \"b\"`, `x and not y`, `n > 2`, `name is defined`".into();
    }
    "templates are minijinja (Jinja2) syntax: `{{ value }}`, `{% if cond %}...{% endif %}`, `{% for x in xs %}...{% endfor %}`".into()
}

/// Finds what a template leaves open at its end: the innermost unclosed block tag (`if`,
/// `for`, ...) or an unclosed `{{`, `{%` or `{#`, with its range in the template.
fn unclosed(source: &str) -> Option<(std::ops::Range<usize>, String)> {
    const BLOCKS: &[&str] = &[
        "if",
        "for",
        "macro",
        "call",
        "filter",
        "with",
        "raw",
        "block",
        "autoescape",
    ];
    let mut stack: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    let mut i = 0;
    while let Some(pos) = source[i..].find('{').map(|p| p + i) {
        let rest = &source[pos..];
        let (open, close) = match rest.get(..2) {
            Some("{{") => ("{{", "}}"),
            Some("{%") => ("{%", "%}"),
            Some("{#") => ("{#", "#}"),
            _ => {
                i = pos + 1;
                continue;
            }
        };
        let Some(end) = rest[2..].find(close).map(|e| pos + 2 + e + 2) else {
            return Some((pos..pos + 2, open.to_string()));
        };
        if open == "{%" {
            let inner = source[pos + 2..end - 2]
                .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
            let word = inner.split_whitespace().next().unwrap_or("");
            if word == "raw" {
                // Everything up to `{% endraw %}` is text.
                match source[end..].find("endraw") {
                    Some(e) => {
                        i = end + e;
                        continue;
                    }
                    None => return Some((pos..end, "raw".into())),
                }
            }
            if let Some(block) = word.strip_prefix("end") {
                if stack.last().is_some_and(|(_, b)| b == block) {
                    stack.pop();
                }
            } else if BLOCKS.contains(&word) || (word == "set" && !inner.contains('=')) {
                stack.push((pos..end, word.to_string()));
            }
        }
        i = end;
    }
    stack.pop()
}

fn variable(
    c: &Checked<'_>,
    src: &Sources,
    text: &Text<'_>,
    var: &str,
    scope: Scope,
    guarded: &HashSet<String>,
    diags: &mut Diagnostics,
) {
    let parts: Vec<&str> = var.split('.').collect();
    let root = parts[0];
    let span = locate(src, text, var);
    let site = match scope {
        Scope::At(s) | Scope::WithOutput(s) => Some(s),
        Scope::Params | Scope::End => None,
    };
    if HELPERS.contains(&root) || BUILTINS.contains(&root) {
        return;
    }
    match root {
        "params" => {
            if let Some(name) = parts.get(1) {
                if !c.workflow.params.iter().any(|p| p.name.value == *name) {
                    diags.push(
                        Diagnostic::unknown(
                            Code::UnknownParam,
                            locate(src, text, &format!("params.{name}")),
                            "param",
                            name,
                            c.workflow.params.iter().map(|p| p.name.value.as_str()),
                        )
                        .help_or_syntax(
                            format!("declare it under [params.{name}] with its type"),
                            format!("declare it with param \"{name}\" type=\"...\""),
                        ),
                    );
                }
            }
            return;
        }
        "run" => {
            if let Some(attr) = parts.get(1) {
                if !RUN_ATTRS.contains(attr) {
                    diags.push(
                        Diagnostic::new(
                            Code::UnknownVariable,
                            span,
                            format!("`run` has no `{attr}`"),
                        )
                        .suggest(attr, RUN_ATTRS.iter().copied())
                        .help_or(format!("run has: {}", RUN_ATTRS.join(", "))),
                    );
                }
            }
            return;
        }
        _ => {}
    }
    if matches!(scope, Scope::Params) {
        if crate::suggest::closest(root, ["params", "run"]).is_some() {
            diags.push(unknown(var, span, &["params", "run"]));
            return;
        }
        diags.push(
            Diagnostic::new(
                Code::NotParamsOnly,
                span,
                format!("`{root}` is not known when the run starts"),
            )
            .label("only params and run are available here")
            .help("limits and agent settings are fixed when the run starts; use params"),
        );
        return;
    }
    if root == "stages" {
        stage_ref(c, src, text, &parts, site, guarded, diags);
        return;
    }
    let Some(site) = site else {
        diags.push(unknown(var, span, &["params", "stages", "run"]));
        return;
    };
    let at = site.stage();
    let loops: Vec<StageId> = {
        let mut l: Vec<StageId> = c
            .ancestors(at)
            .into_iter()
            .filter(|a| c.info(*a).stage.kind.value == StageKind::Loop)
            .collect();
        if matches!(site, Site::BodyEnd(_)) {
            l.insert(0, at);
        }
        l
    };
    let items: Vec<(String, StageId)> = {
        let mut anc = c.ancestors(at);
        if matches!(site, Site::BodyEnd(_)) {
            anc.insert(0, at);
        }
        anc.into_iter()
            .filter_map(|a| match &c.info(a).stage.body {
                StageBody::ForEach { as_name, .. } => Some((
                    as_name
                        .as_ref()
                        .map_or("item".to_string(), |n| n.value.clone()),
                    a,
                )),
                _ => None,
            })
            .collect()
    };
    match root {
        "attempt" => {}
        "output" if matches!(scope, Scope::WithOutput(_)) => {}
        "output" => diags.push(
            Diagnostic::new(Code::UnknownVariable, span, "`output` is only available in a stage's `feedback`, `files` and a check's `expect`")
                .help(format!("use `stages.{}.output` after the stage has run", c.info(at).stage.id.value)),
        ),
        r if LOOP_VARS.contains(&r) => {
            if loops.is_empty() {
                diags.push(
                    Diagnostic::new(Code::LoopVarOutsideLoop, span, format!("`{r}` is a loop variable, but this is not inside a loop"))
                        .help_syntax("loop variables exist only in the body of a `kind = \"loop\"` stage", "loop variables exist only in the body of a `kind=\"loop\"` stage"),
                );
            }
        }
        "loops" => match parts.get(1) {
            Some(name) if loops.iter().any(|l| c.info(*l).stage.id.value == *name) => {
                if let Some(attr) = parts.get(2) {
                    if !LOOP_VARS.contains(attr) {
                        diags.push(Diagnostic::new(Code::UnknownVariable, span, format!("a loop has no `{attr}`")).help(format!("loops have: {}", LOOP_VARS.join(", "))));
                    }
                }
            }
            Some(name) => diags.push(
                Diagnostic::new(Code::LoopVarOutsideLoop, span, format!("`{name}` is not a loop around this place"))
                    .suggest(name, loops.iter().map(|l| c.info(*l).stage.id.value.as_str()))
                    .help_or("`loops.NAME` names an enclosing loop"),
            ),
            None => {}
        },
        "index" if !items.is_empty() => {}
        r if items.iter().any(|(n, _)| n == r) => {}
        r => {
            let mut known: Vec<&str> = vec!["params", "stages", "run", "attempt"];
            if !loops.is_empty() {
                known.extend(LOOP_VARS);
                known.push("loops");
            }
            known.extend(items.iter().map(|(n, _)| n.as_str()));
            let in_some_foreach = c.stages.iter().any(|s| match &s.stage.body {
                StageBody::ForEach { as_name, .. } => as_name.as_ref().map_or("item", |n| n.value.as_str()) == r,
                _ => false,
            });
            if r == "item" && !items.is_empty() {
                let (name, fe) = &items[0];
                let fe = c.info(*fe).stage;
                let rest = var.strip_prefix("item").unwrap_or("");
                diags.push(
                    Diagnostic::new(Code::UnknownVariable, span, format!("there is no `item` here: the for_each `{}` names its item `{name}`", fe.id.value))
                        .label(format!("write `{name}{rest}`"))
                        .help(format!("`as` names the item variable; it is `item` only when `as` is left out (did you mean `{name}{rest}`?)")),
                );
            } else if in_some_foreach || r == "index" {
                diags.push(
                    Diagnostic::new(Code::LoopVarOutsideLoop, span, format!("`{r}` is a for_each variable, but this is not inside that for_each"))
                        .help("item variables exist only in the body of their for_each"),
                );
            } else {
                diags.push(unknown(var, span, &known));
            }
        }
    }
}

/// Reports a variable `var` (`root.rest...`) whose root names nothing, suggesting the closest
/// of the `known` roots with the rest of the path kept (`param.x` → `params.x`).
fn unknown(var: &str, span: Span, known: &[&str]) -> Diagnostic {
    let (name, rest) = var.split_once('.').map_or((var, ""), |(r, t)| (r, t));
    let d = Diagnostic::new(
        Code::UnknownVariable,
        span,
        format!("unknown variable `{name}`"),
    )
    .label("names no param, loop variable, stage or helper");
    let d = match crate::suggest::closest(name, known.iter().copied()) {
        Some(best) if !rest.is_empty() => d.help(format!("did you mean `{best}.{rest}`?")),
        Some(best) => d.help(format!("did you mean `{best}`?")),
        None => d,
    };
    d.help_or("templates see params.*, stages.*, run.*, attempt, loop variables, item variables and helper functions")
}

fn stage_ref(
    c: &Checked<'_>,
    src: &Sources,
    text: &Text<'_>,
    parts: &[&str],
    site: Option<Site>,
    guarded: &HashSet<String>,
    diags: &mut Diagnostics,
) {
    let Some(name) = parts.get(1) else { return };
    let span = locate(src, text, &format!("stages.{name}"));
    let Some(target) = c.find(name) else {
        diags.push(Diagnostic::unknown(
            Code::UnknownStage,
            span,
            "stage",
            name,
            c.by_id.keys().copied(),
        ));
        return;
    };
    let Some(attr) = parts.get(2) else { return };
    if !STAGE_ATTRS.contains(attr) {
        diags.push(
            Diagnostic::new(
                Code::UnknownVariable,
                locate(src, text, &parts[..3].join(".")),
                format!("a stage has no `{attr}`"),
            )
            .suggest(attr, STAGE_ATTRS.iter().copied())
            .help_or(format!("stages have: {}", STAGE_ATTRS.join(", "))),
        );
        return;
    }
    let Some(site) = site else { return }; // exit messages see every stage
    let at = site.stage();
    let ups = upstream(c, site);
    let in_foreach_body = |x: StageId| {
        c.ancestors(x)
            .into_iter()
            .find(|a| c.info(*a).stage.kind.value == StageKind::ForEach)
            .filter(|f| {
                !(c.ancestors(at).contains(f) || matches!(site, Site::BodyEnd(_)) && *f == at)
            })
    };
    match *attr {
        "output" | "feedback" | "attempts" => {
            if let Some(f) = in_foreach_body(target) {
                diags.push(
                    Diagnostic::new(Code::NotUpstream, span, format!("stage `{name}` runs once per item of `{}`; there is no single output here", c.info(f).stage.id.value))
                        .help(format!("use `stages.{}.output.results`, the fan-in of the items", c.info(f).stage.id.value)),
                );
                return;
            }
            if !ups.contains(&target) {
                let me = &c.info(at).stage.id.value;
                let mut d = Diagnostic::new(
                    Code::NotUpstream,
                    span,
                    format!("stage `{name}` has not run when `{me}` uses its {attr}"),
                )
                .label("not upstream of this place");
                d = if share_loop(c, at, target) {
                    d.help(format!("add `{name}` to needs, or read the previous iteration with `stages.{name}.last`"))
                } else {
                    d.help(format!(
                        "add `{name}` (or a stage after it) to `needs` of `{me}`"
                    ))
                };
                diags.push(d);
                return;
            }
            // A stage's own `when` is no guard for what it reads itself.
            let own_when = c
                .info(at)
                .stage
                .when
                .as_ref()
                .is_some_and(|w| w.span == text.span);
            let guard = guarded.contains(*name) || when_mentions(c, at, name, own_when);
            let implied =
                matches!(site, Site::Stage(_) | Site::Region(_)) && runs_only_after(c, at, target);
            if *attr == "output" && maybe_skipped_at(c, target, site) && !guard && !implied {
                diags.push(
                    Diagnostic::new(Code::MaybeSkipped, span, format!("stage `{name}` may have been skipped here, leaving its output empty"))
                        .label("may not have run")
                        .help(if text.source.contains("{{") || text.source.contains("{%") {
                            format!("guard the use with `{{% if stages.{name}.ran %}}` (or in `when`), or give a default with `| default(...)` after checking `stages.{name}.ran`")
                        } else {
                            format!("guard it in the expression: `stages.{name}.ran and ...` (a skipped stage's output is empty, so the rest would read nothing)")
                        }),
                );
            }
            if *attr == "output" && parts.len() > 3 {
                field(c, src, text, target, &parts[3..], diags);
            }
        }
        "settled"
            if c.info(target).stage.kind.value != StageKind::ForEach
                || !c.ancestors(at).contains(&target) =>
        {
            diags.push(
                Diagnostic::new(
                    Code::NotUpstream,
                    span,
                    format!("`stages.{name}.settled` is only read inside the body of the for_each `{name}`"),
                )
                .help("`settled` lists the items of a for_each that have settled, for the items that run after them; after the for_each, read `stages.NAME.output.results`"),
            );
        }
        "history" | "last" if !ups.contains(&target) && !share_loop(c, at, target) => {
            diags.push(
                Diagnostic::new(Code::NotUpstream, span, format!("stage `{name}` is not upstream and not in the same loop, so it has no {attr} here"))
                    .help("history is available for stages upstream or in an enclosing loop's body"),
            );
        }
        _ => {}
    }
}

fn when_mentions(c: &Checked<'_>, at: StageId, name: &str, skip_own: bool) -> bool {
    let needle = format!("stages.{name}.");
    let own = (!skip_own).then_some(at);
    own.into_iter().chain(c.ancestors(at)).any(|s| {
        c.info(s)
            .stage
            .when
            .as_ref()
            .is_some_and(|w| w.value.contains(&needle))
    })
}

fn field(
    c: &Checked<'_>,
    src: &Sources,
    text: &Text<'_>,
    target: StageId,
    path: &[&str],
    diags: &mut Diagnostics,
) {
    let Some(schema) = c.schemas.get(&target) else {
        return;
    };
    if let Err((bad, known)) = super::outputs::walk_schema(schema, path) {
        let name = &c.info(target).stage.id.value;
        let full = format!("stages.{name}.output.{}", path.join("."));
        diags.push(
            Diagnostic::new(
                Code::UnknownField,
                locate(src, text, &full),
                format!("the output of `{name}` has no field `{bad}`"),
            )
            .label("not in the output schema")
            .suggest(&bad, known.iter().map(String::as_str))
            .help_or(if known.is_empty() {
                "the schema defines no fields here".to_string()
            } else {
                format!("its fields are: {}", known.join(", "))
            }),
        );
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

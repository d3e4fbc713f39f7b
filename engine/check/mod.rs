//! Static checks of a loaded workflow: every problem at once, each with a code and a span.
//!
//! **Invariant:** check does no I/O beyond reading the workflow's own files (prompt files and
//! output schemas, through the [`Loader`]).

mod budgets;
pub(crate) mod filters;
mod graph;
mod never;
pub mod notify;
pub mod outputs;
mod params;
mod policy;
mod refs;
pub mod scope;
pub mod skips;
mod subflows;
mod templates;

/// What templates may name: filters, tests, helpers, the attributes of `stages.ID` and
/// `run`, the loop variables (for the language server's completion).
pub(crate) mod vocabulary {
    pub(crate) use super::filters::{FILTERS, TESTS};
    pub(crate) use super::templates::variables::{HELPERS, LOOP_VARS, RUN_ATTRS, STAGE_ATTRS};
}

use std::collections::HashMap;
use std::path::PathBuf;

use crate::diag::{Diagnostic, Diagnostics};
use crate::load::Loader;
use crate::model::{Stage, StageKind, Workflow};

pub use crate::params::ParamValues;

pub use crate::model::StageId;

/// One stage with its place in the tree of regions.
#[derive(Debug)]
pub struct StageInfo<'w> {
    pub stage: &'w Stage,
    /// The loop, for_each or group whose body holds this stage; `None` at the top level.
    pub parent: Option<StageId>,
    /// The body stages, for regions.
    pub children: Vec<StageId>,
    /// Resolved `needs`.
    pub needs: Vec<StageId>,
}

/// A workflow that passed the checks, with its stages indexed and its files loaded.
#[derive(Debug)]
pub struct Checked<'w> {
    pub workflow: &'w Workflow,
    pub stages: Vec<StageInfo<'w>>,
    pub top: Vec<StageId>,
    pub by_id: HashMap<&'w str, StageId>,
    /// The output schema of each stage, when one is known.
    /// Each stage's output schema; stages with the same built-in schema share one.
    pub schemas: HashMap<StageId, std::sync::Arc<serde_json::Value>>,
    /// The text of each stage's prompt file.
    pub prompt_files: HashMap<StageId, (PathBuf, String)>,
    /// The param values in force (defaults, then `--set`).
    pub params: ParamValues,
    /// Whether each stage may be skipped in a run (see [`scope::conditional`]).
    pub conditional: Vec<bool>,
    /// Whether each stage may be skipped within its own body (see
    /// [`scope::compute_skips`]).
    pub skippable: Vec<bool>,
    /// The stages of the same body whose route goes to a stage (edges of the body's graph,
    /// followed backwards by [`scope::is_upstream`]); most stages have none.
    pub routed_from: HashMap<StageId, Vec<StageId>>,
    /// What [`scope::is_upstream`]'s searches learned: for a stage, whether it comes before
    /// each stage searched from (see `scope::reaches_back`).
    pub reaches: std::cell::RefCell<HashMap<StageId, HashMap<StageId, bool>>>,
    /// What [`scope::runs_only_after`] learned: for a target, whether each stage asked about
    /// runs only after it.
    pub only_after: std::cell::RefCell<HashMap<StageId, HashMap<StageId, bool>>>,
    /// The stages those searches visited, counted (a test holds it linear in the reads).
    pub search_steps: std::cell::Cell<u64>,
}

impl<'w> Checked<'w> {
    /// The agents an agent stage can call: its agent (its name rendered over the params) and
    /// the fallbacks that take over, each once; with the span of the stage's `agent`.
    pub(crate) fn stage_agents(
        &self,
        stage: &Stage,
    ) -> Vec<(&'w crate::model::Agent, crate::source::Span)> {
        let crate::model::StageBody::Agent {
            agent: Some(name), ..
        } = &stage.body
        else {
            return Vec::new();
        };
        let rendered = crate::params::render_params(&name.value, &self.params)
            .unwrap_or_else(|_| name.value.clone());
        let agents = &self.workflow.agents;
        let Some(first) = agents.iter().position(|a| a.name.value == rendered) else {
            return Vec::new();
        };
        self.workflow
            .fallback_chain(first)
            .into_iter()
            .map(|i| (&agents[i], name.span))
            .collect()
    }

    /// Returns a stage's info.
    pub fn info(&self, id: StageId) -> &StageInfo<'w> {
        &self.stages[id.0]
    }

    /// Returns the stages of a region's body (or of the top level for `None`).
    pub fn body(&self, region: Option<StageId>) -> &[StageId] {
        match region {
            Some(r) => &self.stages[r.0].children,
            None => &self.top,
        }
    }

    /// Returns the chain of enclosing regions of a stage, innermost first.
    pub fn ancestors(&self, id: StageId) -> Vec<StageId> {
        let mut out = Vec::new();
        let mut cur = self.stages[id.0].parent;
        while let Some(p) = cur {
            out.push(p);
            cur = self.stages[p.0].parent;
        }
        out
    }

    /// Returns the innermost enclosing loop of a stage.
    pub fn enclosing_loop(&self, id: StageId) -> Option<StageId> {
        self.ancestors(id)
            .into_iter()
            .find(|a| self.stages[a.0].stage.kind().value == StageKind::Loop)
    }

    /// Looks a stage up by id.
    pub fn find(&self, name: &str) -> Option<StageId> {
        self.by_id.get(name).copied()
    }
}

/// Runs every check. Returns the checked workflow when there are no errors; the diagnostics
/// (errors and warnings) are always added to `diags`.
pub fn check<'w>(
    workflow: &'w Workflow,
    loader: &mut Loader<'_>,
    sets: &[(String, String)],
    require_params: bool,
    diags: &mut Diagnostics,
) -> Option<Checked<'w>> {
    let checked = check_all(workflow, loader, sets, require_params, diags);
    (!diags.has_errors()).then_some(checked)
}

/// Runs every check, as [`check`], and returns what it learned even when there are errors:
/// the language server reads stages, output schemas and prompt files of a workflow that is
/// half written.
pub fn check_all<'w>(
    workflow: &'w Workflow,
    loader: &mut Loader<'_>,
    sets: &[(String, String)],
    require_params: bool,
    diags: &mut Diagnostics,
) -> Checked<'w> {
    let mut found = Diagnostics::default();
    let mut checked = index(workflow, &mut found);
    checked.params = params::check(workflow, sets, require_params, &mut found);
    refs::check(&mut checked, &mut found);
    (checked.conditional, checked.skippable, checked.routed_from) = scope::compute_skips(&checked);
    graph::check(&checked, &mut found);
    never::check(&checked, &mut found);
    outputs::check(&mut checked, loader, &mut found);
    budgets::check(&checked, &mut found);
    templates::check(&mut checked, loader, &mut found);
    skips::check(&checked, &mut found);
    subflows::check(&checked, loader, &mut found);
    prompt_dirs(workflow, loader, &mut found);
    secret_names(workflow, &mut found);
    notify::check(&workflow.notify, &mut found);
    policy::check(&checked, &mut found);
    for mut d in found.into_sorted() {
        if !is_cascade(workflow, &d) {
            d.fit_syntax(loader.sources);
            diags.push(d);
        }
    }
    checked
}

/// Warns about `prompt_path` directories that hold no files: a misspelt directory would
/// otherwise only show as the preset's own prompts being used.
fn prompt_dirs(workflow: &Workflow, loader: &Loader<'_>, diags: &mut Diagnostics) {
    for d in &workflow.prompt_path {
        let dir = crate::fs::normalize(&crate::fs::base_dir(loader.sources, d.span).join(&d.value));
        if crate::fs::is_builtin(&dir) || !loader.fs.list(&dir).is_empty() {
            continue;
        }
        diags.push(
            Diagnostic::new(
                crate::diag::Code::EmptyPromptDir,
                d.span,
                format!(
                    "prompt directory `{}` does not exist or holds no files, so none of its prompts replaces one",
                    d.value
                ),
            )
            .label("no prompt files here")
            .help("check the path (it is relative to this file); `ralph-flow init` points here before the directory exists: create it and add a file named like one of the preset's prompts to replace that prompt"),
        );
    }
}

/// Every name in `secrets` must be one an environment variable can have.
fn secret_names(workflow: &Workflow, diags: &mut Diagnostics) {
    for name in &workflow.secrets {
        let ok = name
            .value
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name
                .value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok {
            diags.push(
                Diagnostic::new(
                    crate::diag::Code::InvalidValue,
                    name.span,
                    "an entry of `secrets` that is not the name of an environment variable",
                )
                .label("not a variable name")
                .help("`secrets` lists the names of environment variables (letters, digits and `_`, not starting with a digit), such as `DEPLOY_KEY`; never the values"),
            );
        }
    }
}

/// Tells whether a diagnostic only repeats an earlier one: a reference to a name whose
/// definition had an error (the definition's error is the one worth reading).
fn is_cascade(workflow: &Workflow, d: &Diagnostic) -> bool {
    d.subject
        .as_deref()
        .is_some_and(|name| workflow.is_broken(name))
}

fn index<'w>(workflow: &'w Workflow, diags: &mut Diagnostics) -> Checked<'w> {
    let mut checked = Checked {
        workflow,
        stages: Vec::new(),
        top: Vec::new(),
        by_id: HashMap::new(),
        schemas: HashMap::new(),
        prompt_files: HashMap::new(),
        params: ParamValues::default(),
        conditional: Vec::new(),
        skippable: Vec::new(),
        routed_from: HashMap::new(),
        reaches: std::cell::RefCell::default(),
        only_after: std::cell::RefCell::default(),
        search_steps: std::cell::Cell::new(0),
    };
    fn walk<'w>(
        stages: &'w [Stage],
        parent: Option<StageId>,
        c: &mut Checked<'w>,
        diags: &mut Diagnostics,
    ) -> Vec<StageId> {
        let mut ids = Vec::new();
        for stage in stages {
            let id = StageId(c.stages.len());
            c.stages.push(StageInfo {
                stage,
                parent,
                children: Vec::new(),
                needs: Vec::new(),
            });
            if let Some(prev) = c.by_id.get(stage.id.value.as_str()) {
                let first = c.stages[prev.0].stage.id.span;
                diags.push(
                    Diagnostic::new(
                        crate::diag::Code::Duplicate,
                        stage.id.span,
                        format!("stage `{}` is defined twice", stage.id.value),
                    )
                    .label("defined again here")
                    .related(first, "first defined here")
                    .help("stage ids are unique across the whole workflow, bodies included"),
                );
            } else {
                c.by_id.insert(stage.id.value.as_str(), id);
            }
            let children = walk(stage.children(), Some(id), c, diags);
            c.stages[id.0].children = children;
            ids.push(id);
        }
        ids
    }
    checked.top = walk(&workflow.stages, None, &mut checked, diags);
    checked
}

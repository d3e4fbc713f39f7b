//! Subflows that call each other in a circle: a run would start child runs without end.
//!
//! Each subflow stage's workflow file is loaded (through the [`Loader`], so only the
//! workflow's own files are read) and its subflows are followed in turn. The problems of the
//! files reached this way are not reported here: the direct child's are reported where its
//! params are checked, the others' when those files are checked themselves.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::Checked;
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::fs::base_dir;
use crate::fs::{normalize, relative};
use crate::load::Loader;
use crate::model::{Stage, StageBody, Workflow};
use crate::source::Spanned;

/// How deep subflows are followed; a longer chain of distinct files is not looked into.
const MAX_DEPTH: usize = 64;

pub(super) fn check(c: &Checked<'_>, loader: &mut Loader<'_>, diags: &mut Diagnostics) {
    let root = normalize(&loader.sources.get(c.workflow.file).path);
    // Files whose subflows were followed already: a circle through them is reported once.
    let mut done = HashSet::new();
    for info in &c.stages {
        let StageBody::Subflow {
            workflow: Some(w), ..
        } = &info.stage.body
        else {
            continue;
        };
        let mut chain = vec![root.clone()];
        let Some(circle) = follow(loader, w, &mut chain, &mut done) else {
            continue;
        };
        let names: Vec<String> = circle.iter().map(|p| shown(p)).collect();
        let through_here = circle.first() == Some(&root);
        let message = if through_here {
            format!(
                "subflows call each other in a circle: {}",
                names.join(" → ")
            )
        } else {
            format!(
                "the subflow `{}` leads to subflows that call each other in a circle: {}",
                w.value,
                names.join(" → ")
            )
        };
        diags.push(
            Diagnostic::new(Code::FileCycle, w.span, message)
                .label("starts the circle")
                .help("a subflow must not call, directly or through other subflows, a workflow that calls it; remove one of the subflow stages of the circle"),
        );
    }
}

/// Follows the subflow named by `w` (written in the last file of `chain`) and the subflows it
/// calls, depth first. Returns the first circle found, as the files from the one called again
/// back to itself.
fn follow(
    loader: &mut Loader<'_>,
    w: &Spanned<String>,
    chain: &mut Vec<PathBuf>,
    done: &mut HashSet<PathBuf>,
) -> Option<Vec<PathBuf>> {
    let path = normalize(&base_dir(loader.sources, w.span).join(&w.value));
    if let Some(pos) = chain.iter().position(|p| *p == path) {
        let mut circle = chain[pos..].to_vec();
        circle.push(path);
        return Some(circle);
    }
    if chain.len() > MAX_DEPTH || !done.insert(path.clone()) {
        return None;
    }
    let sub = load_quietly(loader, &path)?;
    let mut calls = Vec::new();
    subflow_files(&sub.stages, &mut calls);
    chain.push(path);
    let found = calls
        .iter()
        .find_map(|next| follow(loader, next, chain, done));
    chain.pop();
    found
}

/// Loads a workflow file without reporting its problems.
fn load_quietly(loader: &mut Loader<'_>, path: &Path) -> Option<Workflow> {
    let saved = std::mem::take(&mut *loader.diags);
    let sub = loader.load(path, None);
    *loader.diags = saved;
    sub
}

/// Collects the `workflow` of every subflow stage, bodies included.
fn subflow_files(stages: &[Stage], out: &mut Vec<Spanned<String>>) {
    for s in stages {
        if let StageBody::Subflow {
            workflow: Some(w), ..
        } = &s.body
        {
            out.push(w.clone());
        }
        subflow_files(s.children(), out);
    }
}

fn shown(path: &Path) -> String {
    relative(path).display().to_string()
}

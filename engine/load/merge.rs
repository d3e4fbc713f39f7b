//! Merging loaded files into one workflow: an include adds its definitions (a name defined
//! twice is an error), an extending file replaces or adds to its base's.

use super::overrides::{apply_override, find_stage};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{Named, Workflow};
use crate::source::{Span, Spanned};

fn duplicate(kind: &str, name: &Spanned<String>, first: Span, diags: &mut Diagnostics, help: &str) {
    diags.push(
        Diagnostic::new(
            Code::Duplicate,
            name.span,
            format!("{kind} `{}` is defined twice", name.value),
        )
        .label("defined again here")
        .related(first, "first defined here")
        .help(help.to_string()),
    );
}

/// Adds included definitions; a name defined in both files is an error.
fn add_all<T: Named>(into: &mut Vec<T>, from: Vec<T>, kind: &str, diags: &mut Diagnostics) {
    for item in from {
        if let Some(prev) = into.iter().find(|p| p.name().value == item.name().value) {
            let first = prev.name().span;
            duplicate(
                kind,
                item.name(),
                first,
                diags,
                "each name may be defined in only one of the included files",
            );
        } else {
            into.push(item);
        }
    }
}

/// Adds definitions of an extending file, replacing the base's definitions of the same name.
fn replace_all<T: Named>(base: &mut Vec<T>, child: Vec<T>) {
    for item in child {
        base.retain(|b| b.name().value != item.name().value);
        base.push(item);
    }
}

pub(super) fn merge_include(wf: &mut Workflow, inc: Workflow, diags: &mut Diagnostics) {
    wf.broken.extend(inc.broken.iter().cloned());
    add_all(&mut wf.params, inc.params, "param", diags);
    add_all(&mut wf.agents, inc.agents, "agent", diags);
    add_all(&mut wf.resources, inc.resources, "resource", diags);
    add_all(&mut wf.exits, inc.exits, "exit", diags);
    add_all(&mut wf.stages, inc.stages, "stage", diags);
    add_all(&mut wf.notify, inc.notify, "notifier", diags);
    add_all(&mut wf.policies, inc.policies, "policy", diags);
    wf.prompt_path.extend(inc.prompt_path);
    wf.file_roots.extend(inc.file_roots);
    add_secrets(&mut wf.secrets, inc.secrets);
}

/// Adds the names of `secrets` lists not listed already (the first listing is kept: a name
/// listed by a base, an include and the file itself is one secret).
fn add_secrets(into: &mut Vec<Spanned<String>>, from: Vec<Spanned<String>>) {
    for name in from {
        if !into.iter().any(|n| n.value == name.value) {
            into.push(name);
        }
    }
}

/// Merges a file into the base it extends: the child's agents replace the base's agents of
/// the same name, its params add to (or redefine) the base's, `extends.params` set the base's
/// param defaults, its stages are added, and its overrides change the base's stages.
pub(super) fn merge_extends(
    mut base: Workflow,
    child: Workflow,
    diags: &mut Diagnostics,
) -> Workflow {
    let ext = child.extends.clone();
    base.broken.extend(child.broken.iter().cloned());
    if let Some(ext) = &ext {
        for (name, value) in &ext.params {
            match base.params.iter_mut().find(|p| p.name.value == name.value) {
                Some(p) => p.default = Some(value.clone()),
                None => diags.push(
                    Diagnostic::new(
                        Code::UnknownParam,
                        name.span,
                        format!("the base workflow has no param `{}`", name.value),
                    )
                    .suggest(
                        &name.value,
                        base.params.iter().map(|p| p.name.value.as_str()),
                    ),
                ),
            }
        }
    }
    replace_all(&mut base.params, child.params);
    replace_all(&mut base.agents, child.agents);
    replace_all(&mut base.resources, child.resources);
    replace_all(&mut base.exits, child.exits);
    replace_all(&mut base.notify, child.notify);
    replace_all(&mut base.policies, child.policies);
    for o in &child.overrides {
        apply_override(&mut base.stages, o, diags);
    }
    for stage in child.stages {
        if let Some(prev) = find_stage(&base.stages, &stage.id.value) {
            let first = prev.id.span;
            duplicate(
                "stage",
                &stage.id,
                first,
                diags,
                "to change a stage of the base workflow, use [overrides.ID]",
            );
        } else {
            base.stages.push(stage);
        }
    }
    let mut prompt_path = child.prompt_path;
    prompt_path.append(&mut base.prompt_path);
    base.prompt_path = prompt_path;
    base.file_roots.extend(child.file_roots);
    add_secrets(&mut base.secrets, child.secrets);
    base.worktree = child.worktree.or(base.worktree);
    base.sources = child.sources;
    base.file = child.file;
    base.name = child.name;
    base.version = child.version.or(base.version);
    base.description = child.description.or(base.description);
    base.extends = ext;
    base.max_concurrency = child.max_concurrency.or(base.max_concurrency);
    base.budget = child.budget.or(base.budget);
    base
}

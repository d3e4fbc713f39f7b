//! Worktrees of items that run at once: each needs a branch of its own (git checks a branch
//! out in one worktree at a time), so a branch name that does not depend on the item makes
//! the second item fail.

use super::{root, template_vars};
use crate::check::{Checked, StageId};
use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::model::{ForEachBody, StageKind};

pub(super) fn check(c: &Checked<'_>, diags: &mut Diagnostics) {
    for (i, info) in c.stages.iter().enumerate() {
        let id = StageId(i);
        let s = info.stage;
        let Some(w) = s.body.worktree() else {
            continue;
        };
        let Some(vars) = template_vars(&w.branch.value) else {
            continue;
        };
        let roots: Vec<&str> = vars.iter().map(|v| root(v)).collect();
        // The for_each stages whose items run this worktree: the stage itself, and those
        // around it (a loop's worktree is made once per item of each).
        let mut fanouts: Vec<StageId> = Vec::new();
        if s.kind().value == StageKind::ForEach {
            fanouts.push(id);
        }
        fanouts.extend(
            c.ancestors(id)
                .into_iter()
                .filter(|a| c.info(*a).stage.kind().value == StageKind::ForEach),
        );
        // `index` is the innermost for_each's.
        for (k, f) in fanouts.iter().enumerate() {
            let fe = c.info(*f).stage;
            let Some(body) = fe.body.as_for_each() else {
                continue;
            };
            let var = body.as_name.as_ref().map_or("item", |n| n.value.as_str());
            let per_item = roots.contains(&var) || (k == 0 && roots.contains(&"index"));
            if per_item || !parallel(c, body) {
                continue;
            }
            let whose = if *f == id {
                String::from("every item")
            } else {
                format!("every item of for_each `{}`", fe.id.value)
            };
            let mut d = Diagnostic::new(
                Code::SharedBranch,
                w.branch.span,
                format!(
                    "{whose} gets the same worktree branch `{}`, but items run at once: git checks a branch out in one worktree at a time, so the second item fails",
                    w.branch.value
                ),
            )
            .label(format!("does not use `{var}`"));
            if let Some(m) = &body.max_concurrency {
                d = d.related(m.span, "items run at once");
            }
            let example = format!("{}/{{{{ {var}.id }}}}", branch_stem(&w.branch.value));
            diags.push(d.help_syntax(
                format!(
                    "name the branch after the item, such as branch = \"{example}\" (or use `index`), or set max_concurrency = 1 on `{}` to run the items one at a time",
                    fe.id.value
                ),
                format!(
                    "name the branch after the item, such as branch=\"{example}\" (or use `index`), or set max_concurrency=1 on `{}` to run the items one at a time",
                    fe.id.value
                ),
            ));
        }
    }
}

/// Whether a for_each may run two items at once: no `max_concurrency` (every item at once)
/// or one above 1 with the params in force (a template that does not render says nothing).
fn parallel(c: &Checked<'_>, body: &ForEachBody) -> bool {
    match &body.max_concurrency {
        None => true,
        Some(m) => crate::params::resolve_count(&m.value, &c.params).is_ok_and(|n| n > 1),
    }
}

/// The text of a branch name before its first template, without a trailing `/` or `-`, for
/// an example (`work` for `work`, `ticket` for `ticket/{{ run.id }}`).
fn branch_stem(branch: &str) -> &str {
    let head = branch.split("{{").next().unwrap_or(branch);
    let head = head.trim_end_matches(['/', '-', '_']);
    if head.is_empty() { "work" } else { head }
}
